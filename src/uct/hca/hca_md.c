/*
 * hca_md.c - the UCT component "hca" and its memory domain: registration
 * (device MRs), allocation (device memory that peers map), rkeys, and
 * rkey_ptr for device memory.
 *
 * Registration needs no pinning (requesters check the MPT, the kernel's
 * single copy faults pages in), so it costs a table insert; but UCP
 * registers and deregisters a user buffer around every zero-copy
 * operation, and a deregistration fences peers' accesses: the md keeps
 * registrations in a cache (hca_rcache.c).
 */
#include "hca_uct.h"

#include <ucs/debug/log.h>
#include <ucs/sys/math.h>
#include <ucs/sys/string.h>
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

static const char *uct_hca_fabric_names[] = {
    [HCA_FABRIC_MODE_AUTO] = "auto",
    [HCA_FABRIC_MODE_SHM]  = "shm",
    [HCA_FABRIC_MODE_TCP]  = "tcp",
    [HCA_FABRIC_MODE_LAST] = NULL
};

static ucs_config_field_t uct_hca_md_config_table[] = {
    {"", "", NULL, ucs_offsetof(uct_hca_md_config_t, super),
     UCS_CONFIG_TYPE_TABLE(uct_md_config_table)},

    {"DEVICE", "hca0",
     "The hca device whose context holds the memory registrations.",
     ucs_offsetof(uct_hca_md_config_t, device), UCS_CONFIG_TYPE_STRING},

    {"SINGLE_COPY", "y",
     "Move RDMA data with one copy (process_vm_readv/writev) when the\n"
     "kernel permits it; otherwise through the target's responder.",
     ucs_offsetof(uct_hca_md_config_t, single_copy), UCS_CONFIG_TYPE_BOOL},

    {"FABRIC", "auto",
     "Which fabric carries the traffic: auto (shared memory to processes of\n"
     "this host, tcp to other hosts), shm (this host only) or tcp (every peer,\n"
     "this host's too: for tests and benchmarks).",
     ucs_offsetof(uct_hca_md_config_t, fabric),
     UCS_CONFIG_TYPE_ENUM(uct_hca_fabric_names)},

    {"NET_DEVICES", "all",
     "Interfaces or addresses (comma separated) the tcp fabric listens on:\n"
     "each usable one is a path (up to 4), and a QP whose path fails moves\n"
     "to another; \"all\": one path, the first interface that is up, not\n"
     "loopback and has an address, else loopback (as UCX's tcp chooses).",
     ucs_offsetof(uct_hca_md_config_t, net_devices), UCS_CONFIG_TYPE_STRING},

    {"NET_PORT_RANGE", "0-0",
     "Port range of the tcp fabric's listener; 0-0: an ephemeral port.",
     ucs_offsetof(uct_hca_md_config_t, port_range), UCS_CONFIG_TYPE_RANGE_SPEC},

    {"RETRY_TIMEOUT", "10s",
     "Over the tcp fabric, a peer from which nothing arrives for this long\n"
     "fails its endpoints (RETRY_EXC_ERR): a lost connection is dialled again\n"
     "and its unanswered operations sent again until then; a peer that is\n"
     "silent (not even its keepalives) counts the same.  The default is what\n"
     "an rc endpoint gives with UCX's defaults (RC_RETRY_COUNT 7 x\n"
     "RC_TIMEOUT 1s, about 8.6 s), and half of UCP's keepalive interval.",
     ucs_offsetof(uct_hca_md_config_t, retry_timeout), UCS_CONFIG_TYPE_TIME},

    {"PEER_TIMEOUT", "0s",
     "The first name of RETRY_TIMEOUT; when set (not 0) it is used instead.",
     ucs_offsetof(uct_hca_md_config_t, peer_timeout), UCS_CONFIG_TYPE_TIME},

    {"RCACHE", UCT_HCA_MD_RCACHE_DEFAULT,
     "Keep registrations of user memory in a cache of the md's own:\n"
     "UCP registers a buffer around every zero-copy operation.  A cached\n"
     "region stays registered (its rkey valid) after deregistration until it\n"
     "is evicted, unmapped, or deregistered with the INVALIDATE flag.\n"
     "The default is on where UCP has no cache of its own for hca (UCX\n"
     "1.13), off where it has (UCX_RCACHE_ENABLE then decides).",
     ucs_offsetof(uct_hca_md_config_t, rcache), UCS_CONFIG_TYPE_BOOL},

    {"RCACHE_MAX_REGIONS", "4096",
     "Most regions the registration cache holds (idle ones are evicted,\n"
     "least recently used first).",
     ucs_offsetof(uct_hca_md_config_t, rcache_max_regions),
     UCS_CONFIG_TYPE_UINT},

    {"RCACHE_MAX_SIZE", "inf",
     "Most bytes the registration cache's regions cover in all.",
     ucs_offsetof(uct_hca_md_config_t, rcache_max_size),
     UCS_CONFIG_TYPE_MEMUNITS},

    {"STATS", "n",
     "Print this process's device counters (operations and bytes by opcode)\n"
     "to stderr when the memory domain closes: proof of which transport\n"
     "carried the traffic.",
     ucs_offsetof(uct_hca_md_config_t, stats), UCS_CONFIG_TYPE_BOOL},

    {NULL}
};

static ucs_status_t uct_hca_md_query(uct_md_h tl_md, uct_hca_md_attr_t *attr)
{
    uct_hca_md_t *md = ucs_derived_of(tl_md, uct_hca_md_t);

    uct_hca_md_attr_init(attr);
    /* No UCT_MD_FLAG_RKEY_PTR, although uct_rkey_ptr works for device
     * memory: UCP 1.13 takes REG|RKEY_PTR to mean "any registered memory
     * can be mapped" and then runs every rendezvous through rkey_ptr, which
     * fails with UCS_ERR_UNREACHABLE for plain (malloc) memory. */
    UCT_HCA_MD_CAP(attr, flags)            = UCT_MD_FLAG_REG |
                                             UCT_MD_FLAG_ALLOC |
                                             UCT_MD_FLAG_NEED_RKEY |
                                             UCT_MD_FLAG_NEED_MEMH |
                                             UCT_MD_FLAG_INVALIDATE |
                                             UCT_HCA_MD_FLAGS_VERSIONED;
    UCT_HCA_MD_CAP(attr, reg_mem_types)    = UCS_BIT(UCS_MEMORY_TYPE_HOST);
    UCT_HCA_MD_CAP(attr, alloc_mem_types)  = UCS_BIT(UCS_MEMORY_TYPE_HOST);
    UCT_HCA_MD_CAP(attr, access_mem_types) = UCS_BIT(UCS_MEMORY_TYPE_HOST);
    UCT_HCA_MD_CAP(attr, detect_mem_types) = 0;
    UCT_HCA_MD_CAP(attr, max_alloc)        = 1ull << 36;
    UCT_HCA_MD_CAP(attr, max_reg)          = SIZE_MAX;
    attr->rkey_packed_size                 = sizeof(uct_hca_packed_rkey_t);
    attr->reg_cost                         = ucs_linear_func_make(md->reg_cost,
                                                                  0);
    memset(&attr->local_cpus, 0xff, sizeof(attr->local_cpus));
    return UCS_OK;
}

static unsigned uct_hca_md_access(void)
{
    return HCA_ACCESS_LOCAL_WRITE | HCA_ACCESS_REMOTE_WRITE |
           HCA_ACCESS_REMOTE_READ | HCA_ACCESS_REMOTE_ATOMIC;
}

static ucs_status_t uct_hca_mem_reg(uct_md_h tl_md, void *address,
                                    size_t length,
                                    UCT_HCA_MEM_REG_PARAMS_ARG,
                                    uct_mem_h *memh_p)
{
    uct_hca_md_t *md = ucs_derived_of(tl_md, uct_hca_md_t);
    uint64_t flags   = UCT_HCA_MEM_REG_FLAGS;
    uct_hca_memh_t *memh;
    ucs_status_t status;
    int rc;

    if ((md->rcache != NULL) && (length != 0)) {
        status = uct_hca_rcache_get(md->rcache, address, length, &memh, &rc);
        if (status == UCS_OK) {
            *memh_p = memh;
            return UCS_OK;
        }
        if (status != UCS_ERR_NO_RESOURCE) {
            goto err;
        }
        /* every cached region is in use: this one goes uncached */
    }
    memh = ucs_calloc(1, sizeof(*memh), "hca_memh");
    if (memh == NULL) {
        return UCS_ERR_NO_MEMORY;
    }
    rc = hca_mr_reg(md->pd, address, length, uct_hca_md_access(), &memh->mr);
    if (rc != 0) {
        ucs_free(memh);
        goto err;
    }
    memh->lkey = hca_mr_lkey(memh->mr);
    *memh_p    = memh;
    return UCS_OK;

err:
    uct_md_log_mem_reg_error(flags, "hca: failed to register %p..%p: %s",
                             address, UCS_PTR_BYTE_OFFSET(address, length),
                             strerror(-rc));
    return (rc == -ENOMEM) ? UCS_ERR_NO_MEMORY : UCS_ERR_IO_ERROR;
}

static ucs_status_t uct_hca_mem_dereg(uct_md_h tl_md,
                                      const uct_md_mem_dereg_params_t *params)
{
    uct_hca_md_t *md = ucs_derived_of(tl_md, uct_hca_md_t);
    uct_hca_memh_t *memh;
    unsigned flags;

    UCT_MD_MEM_DEREG_CHECK_PARAMS(params, 1);
    memh  = params->memh;
    flags = UCT_MD_MEM_DEREG_FIELD_VALUE(params, flags, FIELD_FLAGS, 0);
    if (memh->dm != NULL) {
        return UCS_ERR_INVALID_PARAM; /* allocated: use mem_free */
    }
    if (flags & UCT_MD_MEM_DEREG_FLAG_INVALIDATE) {
        /* whatever UCX's own parameter check was compiled with: the
         * completion is invoked below */
        if (UCT_MD_MEM_DEREG_FIELD_VALUE(params, comp, FIELD_COMPLETION,
                                         NULL) == NULL) {
            return UCS_ERR_INVALID_PARAM;
        }
        if (UCT_HCA_HAVE_INVALIDATE_RMA_AMO && ENABLE_PARAMS_CHECK &&
            !memh->inv_packed) {
            /* no invalidatable key packed: refused as UCX's IB md refuses
             * it, in the builds that check parameters (without the
             * check, the deregistration goes on and invalidates) */
            return UCS_ERR_INVALID_PARAM;
        }
    }
    if (memh->entry != NULL) {
        /* stays registered in the cache; invalidated, it is deregistered
         * at its last holder's put, which then invokes the completion once
         * for each invalidating deregistration (as UCX's IB md) */
        uct_hca_rcache_put(md->rcache, memh,
                           flags & UCT_MD_MEM_DEREG_FLAG_INVALIDATE,
                           (flags & UCT_MD_MEM_DEREG_FLAG_INVALIDATE) ?
                           params->comp : NULL);
        return UCS_OK;
    }
    /* hca_mr_dereg invalidates the key and waits for accesses in flight:
     * once it returns, no peer can touch the memory */
    hca_mr_dereg(memh->mr);
    ucs_free(memh);
    if (flags & UCT_MD_MEM_DEREG_FLAG_INVALIDATE) {
        uct_invoke_completion(params->comp, UCS_OK);
    }
    return UCS_OK;
}

static ucs_status_t uct_hca_mem_alloc(uct_md_h tl_md, size_t *length_p,
                                      void **address_p,
                                      ucs_memory_type_t mem_type,
                                      UCT_HCA_MEM_ALLOC_SYS_DEV_ARG
                                      unsigned flags, const char *alloc_name,
                                      uct_mem_h *memh_p)
{
    uct_hca_md_t *md = ucs_derived_of(tl_md, uct_hca_md_t);
    size_t length    = ucs_align_up(ucs_max(*length_p, 1), ucs_get_page_size());
    uct_hca_memh_t *memh;
    int rc;

    if (mem_type != UCS_MEMORY_TYPE_HOST) {
        return UCS_ERR_UNSUPPORTED;
    }
    memh = ucs_calloc(1, sizeof(*memh), "hca_memh");
    if (memh == NULL) {
        return UCS_ERR_NO_MEMORY;
    }
    rc = hca_dm_alloc(md->dev, length, &memh->dm);
    if (rc != 0) {
        ucs_debug("hca: device memory of %zu bytes for %s: %s", length,
                  alloc_name, strerror(-rc));
        ucs_free(memh);
        return UCS_ERR_NO_MEMORY;
    }
    rc = hca_mr_reg(md->pd, hca_dm_addr(memh->dm), length,
                    uct_hca_md_access(), &memh->mr);
    if (rc != 0) {
        hca_dm_free(memh->dm);
        ucs_free(memh);
        return UCS_ERR_IO_ERROR;
    }
    memh->lkey = hca_mr_lkey(memh->mr);
    *length_p  = length;
    *address_p = hca_dm_addr(memh->dm);
    *memh_p    = memh;
    return UCS_OK;
}

static ucs_status_t uct_hca_mem_free(uct_md_h tl_md, uct_mem_h tl_memh)
{
    uct_hca_md_t *md     = ucs_derived_of(tl_md, uct_hca_md_t);
    uct_hca_memh_t *memh = tl_memh;

    if (md->rcache != NULL) {
        /* registrations of user buffers inside it hold the device memory */
        uct_hca_rcache_flush_range(md->rcache, hca_dm_addr(memh->dm),
                                   hca_dm_length(memh->dm));
    }
    hca_mr_dereg(memh->mr);
    /* a registration inside it still held (UCP's rcache keeps regions
     * inside memory we allocated): the memory goes with the last of them */
    (void)hca_dm_free(memh->dm);
    ucs_free(memh);
    return UCS_OK;
}

static ucs_status_t
uct_hca_mkey_pack(uct_md_h tl_md, uct_mem_h tl_memh,
                  UCT_HCA_MKEY_PACK_RANGE_ARGS
                  const uct_md_mkey_pack_params_t *params, void *rkey_buffer)
{
    uct_hca_md_t *md             = ucs_derived_of(tl_md, uct_hca_md_t);
    uct_hca_memh_t *memh         = tl_memh;
    uct_hca_packed_rkey_t *rkey  = rkey_buffer;
    uint64_t dm_base             = 0;

#if UCT_HCA_HAVE_INVALIDATE_RMA_AMO
    if ((params->field_mask & UCT_MD_MKEY_PACK_FIELD_FLAGS) &&
        (params->flags & (UCT_MD_MKEY_PACK_FLAG_INVALIDATE_RMA |
                          UCT_MD_MKEY_PACK_FLAG_INVALIDATE_AMO))) {
        memh->inv_packed = 1;
    }
#endif
    rkey->rkey      = hca_mr_rkey(memh->mr);
    rkey->dm_id     = hca_mr_dm_id(memh->mr, &dm_base);
    rkey->pid       = md->addr.pid;
    rkey->ctx_id    = md->addr.ctx_id;
    rkey->dm_base   = dm_base;
    rkey->host_hash = md->host_hash;
    return UCS_OK;
}

/* ------------------------------------------------ peer device memory cache */

/* Device memory of peers mapped for rkey_ptr (a view: the memory and its
 * owner's MPT, so every pointer is checked), one per segment, shared by
 * every rkey that names it. */
typedef struct uct_hca_rmap {
    struct uct_hca_rmap *next;
    uint32_t             pid, ctx_id, dm_id;
    hca_dm_view_t       *view;
    unsigned             refs;
} uct_hca_rmap_t;

/* Mapped on the first rkey_ptr only: UCP unpacks an rkey for every
 * rendezvous, and mapping there (shm_open + mmap + munmap) cost ~30 us. */
typedef struct uct_hca_rkey_handle {
    uct_hca_rmap_t        *map;     /* NULL until rkey_ptr needs it */
    uct_hca_packed_rkey_t  packed;
} uct_hca_rkey_handle_t;

static pthread_mutex_t uct_hca_rmap_lock = PTHREAD_MUTEX_INITIALIZER;

/* This host's identity hash, read once (rkey_unpack is on UCP's
 * rendezvous path). */
static uint64_t       uct_hca_host_hash_val;
static pthread_once_t uct_hca_host_hash_once = PTHREAD_ONCE_INIT;

static void uct_hca_host_hash_init(void)
{
    hca_host_id_t host;

    uct_hca_host_hash_val = (hca_host_id_get(&host) == 0) ?
                            hca_host_key(&host) : 0;
}

static uint64_t uct_hca_local_hash(void)
{
    pthread_once(&uct_hca_host_hash_once, uct_hca_host_hash_init);
    return uct_hca_host_hash_val;
}
static uct_hca_rmap_t *uct_hca_rmaps     = NULL;

static uct_hca_rmap_t *uct_hca_rmap_get(const uct_hca_packed_rkey_t *rkey)
{
    hca_port_addr_t addr;
    uct_hca_rmap_t *map;

    pthread_mutex_lock(&uct_hca_rmap_lock);
    for (map = uct_hca_rmaps; map != NULL; map = map->next) {
        if ((map->pid == rkey->pid) && (map->ctx_id == rkey->ctx_id) &&
            (map->dm_id == rkey->dm_id)) {
            map->refs++;
            goto out;
        }
    }
    map = ucs_calloc(1, sizeof(*map), "hca_rmap");
    if (map == NULL) {
        goto out;
    }
    memset(&addr, 0, sizeof(addr));
    addr.host   = uct_hca_local_hash();
    addr.pid    = rkey->pid;
    addr.ctx_id = rkey->ctx_id;
    if (hca_dm_view_open(&addr, rkey->dm_id, &map->view) != 0) {
        ucs_free(map);
        map = NULL;
        goto out;
    }
    map->pid      = rkey->pid;
    map->ctx_id   = rkey->ctx_id;
    map->dm_id    = rkey->dm_id;
    map->refs     = 1;
    map->next     = uct_hca_rmaps;
    uct_hca_rmaps = map;
out:
    pthread_mutex_unlock(&uct_hca_rmap_lock);
    return map;
}

static void uct_hca_rmap_put(uct_hca_rmap_t *map)
{
    uct_hca_rmap_t **pp;

    pthread_mutex_lock(&uct_hca_rmap_lock);
    if (--map->refs == 0) {
        for (pp = &uct_hca_rmaps; *pp != map; pp = &(*pp)->next) {
        }
        *pp = map->next;
        hca_dm_view_close(map->view);
        ucs_free(map);
    }
    pthread_mutex_unlock(&uct_hca_rmap_lock);
}

static ucs_status_t uct_hca_rkey_unpack(uct_component_t *component,
                                        const void *rkey_buffer,
                                        UCT_HCA_RKEY_UNPACK_PARAMS_ARG
                                        uct_rkey_t *rkey_p, void **handle_p)
{
    const uct_hca_packed_rkey_t *packed = rkey_buffer;
    uct_hca_rkey_handle_t *handle       = NULL;

    if ((packed->dm_id != 0) && (packed->host_hash == uct_hca_local_hash())) {
        handle = ucs_malloc(sizeof(*handle), "hca_rkey_handle");
        if (handle != NULL) {
            handle->map    = NULL;
            handle->packed = *packed;
        }
    }
    *rkey_p   = packed->rkey;
    *handle_p = handle;
    return UCS_OK;
}

static ucs_status_t uct_hca_rkey_ptr(uct_component_t *component,
                                     uct_rkey_t rkey, void *tl_handle,
                                     uint64_t remote_addr,
                                     void **local_addr_p)
{
    uct_hca_rkey_handle_t *handle = tl_handle;

    if (handle == NULL) {
        return UCS_ERR_UNREACHABLE; /* not device memory of this host */
    }
    if (handle->map == NULL) {
        handle->map = uct_hca_rmap_get(&handle->packed);
        if (handle->map == NULL) {
            return UCS_ERR_UNREACHABLE; /* its owner freed it or exited */
        }
    }
    /* the key, its state, the rights and the range, as for any access:
     * a stale or wrong key gives no pointer */
    if (hca_dm_view_ptr(handle->map->view, (uint32_t)rkey, remote_addr,
                        local_addr_p) != 0) {
        return UCS_ERR_INVALID_ADDR;
    }
    return UCS_OK;
}

static ucs_status_t uct_hca_rkey_release(uct_component_t *component,
                                         uct_rkey_t rkey, void *tl_handle)
{
    uct_hca_rkey_handle_t *handle = tl_handle;

    if (handle != NULL) {
        if (handle->map != NULL) {
            uct_hca_rmap_put(handle->map);
        }
        ucs_free(handle);
    }
    return UCS_OK;
}

/* ---------------------------------------------------------------- md */

/* One line per memory domain:
 *   "hca: pid P ctx C host H: OP=ops/bytes ... responder_ops=N errors=N
 *    rcache_hits=N rcache_misses=N rcache_evictions=N rcache_unmapped=N
 *    shm:OP=ops/bytes ... tcp:OP=ops/bytes ..."
 * the requester's WRs by opcode, then again by the fabric that carried
 * them (shm: this host; tcp: other hosts).  hca-run --verbose sums them. */
static void uct_hca_md_print_stats(uct_hca_md_t *md)
{
    char line[4096];
    char host[256];
    size_t len = 0;
    hca_counters_t cnt;

    /* pids repeat across hosts: the host name tells the processes apart */
    if ((gethostname(host, sizeof(host)) != 0) || (host[0] == '\0')) {
        ucs_strncpy_zero(host, "?", sizeof(host));
    }
    host[sizeof(host) - 1] = '\0';
    for (char *c = host; *c != '\0'; ++c) {
        if ((*c == ' ') || (*c == ':')) {
            *c = '_'; /* the line's separators */
        }
    }
    hca_device_counters(md->dev, &cnt);
    len += snprintf(line + len, sizeof(line) - len, "hca: pid %u ctx %u host %s:",
                    md->addr.pid, md->addr.ctx_id, host);
    for (int op = 0; op < HCA_WR_OPCODE_LAST; ++op) {
        if ((cnt.tx_ops[op] == 0) || (len >= sizeof(line))) {
            continue;
        }
        len += snprintf(line + len, sizeof(line) - len, " %s=%llu/%llu",
                        hca_wr_opcode_str((hca_wr_opcode_t)op),
                        (unsigned long long)cnt.tx_ops[op],
                        (unsigned long long)cnt.tx_bytes[op]);
    }
    if (len < sizeof(line)) {
        snprintf(line + len, sizeof(line) - len,
                 " responder_ops=%llu errors=%llu",
                 (unsigned long long)cnt.responder_ops,
                 (unsigned long long)(cnt.errors[HCA_WC_REM_ACCESS_ERR] +
                                      cnt.errors[HCA_WC_RETRY_EXC_ERR] +
                                      cnt.errors[HCA_WC_REM_OP_ERR]));
        len += strlen(line + len);
    }
    if ((md->rcache != NULL) && (len < sizeof(line))) {
        uct_hca_rcache_stats_t rs;

        uct_hca_rcache_get_stats(md->rcache, &rs);
        snprintf(line + len, sizeof(line) - len,
                 " rcache_hits=%llu rcache_misses=%llu rcache_evictions=%llu"
                 " rcache_unmapped=%llu rcache_full=%llu",
                 (unsigned long long)rs.hits, (unsigned long long)rs.misses,
                 (unsigned long long)rs.evictions,
                 (unsigned long long)rs.unmapped,
                 (unsigned long long)rs.full);
        len += strlen(line + len);
    }
    for (int f = 0; f < HCA_FABRIC_LAST; ++f) {
        for (int op = 0; op < HCA_WR_OPCODE_LAST; ++op) {
            if ((cnt.fabric_tx_ops[f][op] == 0) || (len >= sizeof(line))) {
                continue;
            }
            len += snprintf(line + len, sizeof(line) - len, " %s:%s=%llu/%llu",
                            hca_fabric_type_str((hca_fabric_type_t)f),
                            hca_wr_opcode_str((hca_wr_opcode_t)op),
                            (unsigned long long)cnt.fabric_tx_ops[f][op],
                            (unsigned long long)cnt.fabric_tx_bytes[f][op]);
        }
    }
    fprintf(stderr, "%s\n", line);
}

static void uct_hca_md_close(uct_md_h tl_md)
{
    uct_hca_md_t *md = ucs_derived_of(tl_md, uct_hca_md_t);

    if (md->stats) {
        uct_hca_md_print_stats(md);
    }
    if (md->rcache != NULL) {
        uct_hca_rcache_destroy(md->rcache);
    }
    hca_pd_dealloc(md->pd);
    hca_device_close(md->dev);
    ucs_free(md);
}

/* What hca's md does not do: no advice, no memory types but host memory
 * (nothing to detect or query), no sockaddr connection manager. */
static ucs_status_t uct_hca_mem_advise(uct_md_h md, uct_mem_h memh,
                                       void *addr, size_t length,
                                       unsigned advice)
{
    return UCS_ERR_UNSUPPORTED;
}

static ucs_status_t uct_hca_mem_query(uct_md_h md, const void *address,
                                      size_t length,
                                      uct_hca_mem_attr_t *mem_attr)
{
    return UCS_ERR_UNSUPPORTED;
}

static ucs_status_t uct_hca_detect_memory_type(uct_md_h md, const void *addr,
                                               size_t length,
                                               ucs_memory_type_t *mem_type_p)
{
    return UCS_ERR_UNSUPPORTED;
}

static ucs_status_t uct_hca_cm_open(uct_component_t *component,
                                    uct_worker_h worker,
                                    const uct_cm_config_t *config,
                                    uct_cm_h *cm_p)
{
    return UCS_ERR_UNSUPPORTED;
}

static void uct_hca_md_vfs_init(uct_md_h md)
{
}

static uct_md_ops_t uct_hca_md_ops = {
    .close                  = uct_hca_md_close,
    .query                  = uct_hca_md_query,
    .mem_alloc              = uct_hca_mem_alloc,
    .mem_free               = uct_hca_mem_free,
    .mem_advise             = uct_hca_mem_advise,
    .mem_reg                = uct_hca_mem_reg,
    .mem_dereg              = uct_hca_mem_dereg,
    .mem_query              = uct_hca_mem_query,
    .mkey_pack              = uct_hca_mkey_pack,
    .detect_memory_type     = uct_hca_detect_memory_type,
    UCT_HCA_MD_OPS_VERSIONED
};

/* The registration cost UCP's thresholds use (reg_cost): what a
 * registration plus deregistration costs through this md, measured
 * (docs/PERF.md "Registration cache"): a cache hit and put, or a device
 * registration and a fenced deregistration. */
#define UCT_HCA_REG_COST_CACHED   25e-9
#define UCT_HCA_REG_COST_UNCACHED 200e-9

static void uct_hca_md_rcache_init(uct_hca_md_t *md,
                                   const uct_hca_md_config_t *config)
{
    ucs_status_t status;

    md->reg_cost = UCT_HCA_REG_COST_UNCACHED;
    if (!config->rcache) {
        return;
    }
    status = uct_hca_rcache_create(md->pd, uct_hca_md_access(),
                                   config->rcache_max_regions,
                                   config->rcache_max_size, &md->rcache);
    if (status != UCS_OK) {
        /* without memory events a cached key could outlive its memory */
        ucs_diag("hca: no registration cache (%s); UCX_HCA_RCACHE=n hides "
                 "this", ucs_status_string(status));
        md->rcache = NULL;
        return;
    }
    md->reg_cost = UCT_HCA_REG_COST_CACHED;
}

static ucs_status_t uct_hca_md_open(uct_component_t *component,
                                    const char *md_name,
                                    const uct_md_config_t *tl_config,
                                    uct_md_h *md_p)
{
    const uct_hca_md_config_t *config = ucs_derived_of(tl_config,
                                                       uct_hca_md_config_t);
    hca_open_attr_t attr = {
        .flags           = config->single_copy ? 0 : HCA_OPEN_NO_SINGLE_COPY,
        .fabric          = (hca_fabric_mode_t)config->fabric,
        .net_devices     = config->net_devices,
        .port_min        = (uint16_t)config->port_range.first,
        .port_max        = (uint16_t)config->port_range.last,
        .peer_timeout_ms = (uint32_t)(((config->peer_timeout > 0) ?
                                       config->peer_timeout :
                                       config->retry_timeout) * 1e3),
    };
    uct_hca_md_t *md;
    int rc;

    if ((config->port_range.first > UINT16_MAX) ||
        (config->port_range.last > UINT16_MAX)) {
        ucs_error("hca: UCX_HCA_NET_PORT_RANGE %u-%u: ports are 16 bits",
                  config->port_range.first, config->port_range.last);
        return UCS_ERR_INVALID_PARAM;
    }
    md = ucs_calloc(1, sizeof(*md), "hca_md");
    if (md == NULL) {
        return UCS_ERR_NO_MEMORY;
    }
    rc = hca_device_open_attr(config->device, &attr, &md->dev);
    if (rc != 0) {
        ucs_error("hca: cannot open device '%s': %s", config->device,
                  strerror(-rc));
        ucs_free(md);
        return UCS_ERR_NO_DEVICE;
    }
    rc = hca_pd_alloc(md->dev, &md->pd);
    if (rc != 0) {
        hca_device_close(md->dev);
        ucs_free(md);
        return UCS_ERR_NO_RESOURCE;
    }
    hca_port_address(md->dev, &md->addr);
    uct_hca_md_rcache_init(md, config);
    md->tcp_only        = (attr.fabric == HCA_FABRIC_MODE_TCP) ||
                          ((attr.fabric == HCA_FABRIC_MODE_AUTO) &&
                           (getenv("HCA_FABRIC") != NULL) &&
                           !strcmp(getenv("HCA_FABRIC"), "tcp"));
    md->host_hash       = md->addr.host;
    md->stats           = config->stats;
    md->super.ops       = &uct_hca_md_ops;
    md->super.component = &uct_hca_component;
    *md_p               = &md->super;
    return UCS_OK;
}

extern uct_tl_t UCT_TL_NAME(hca);

uct_component_t uct_hca_component = {
    .query_md_resources = uct_md_query_single_md_resource,
    .md_open            = uct_hca_md_open,
    .cm_open            = uct_hca_cm_open,
    .rkey_unpack        = uct_hca_rkey_unpack,
    .rkey_ptr           = uct_hca_rkey_ptr,
    .rkey_release       = uct_hca_rkey_release,
    UCT_HCA_COMPONENT_VERSIONED
    .name               = UCT_HCA_NAME,
    .md_config          = {
        .name           = "hca memory domain",
        .prefix         = "HCA_",
        .table          = uct_hca_md_config_table,
        .size           = sizeof(uct_hca_md_config_t),
    },
    .cm_config          = UCS_CONFIG_EMPTY_GLOBAL_LIST_ENTRY,
    .tl_list            = UCT_COMPONENT_TL_LIST_INITIALIZER(&uct_hca_component),
    .flags              = 0,
    .md_vfs_init        = uct_hca_md_vfs_init
};
