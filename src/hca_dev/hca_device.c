/*
 * hca_device.c - device list, open/close/query, and the context object
 * that peers map (MPT, published QP table, notify table, service ring).
 *
 * There is one device per NUMA node ("hca0" on a single-node machine):
 * its rings and buffers are allocated on that node.
 */
#include "hca_util.h"
#include "hca_log.h"
#include "hca_state.h"
#include "hca_base.h"
#include "hca_registry.h"
#include "hca_obj.h"
#include "hca_counters.h"

#include <errno.h>
#include <numa.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static _Atomic uint32_t hca_next_ctx_id = 0;
static pthread_once_t   hca_self_clean  = PTHREAD_ONCE_INIT;

/* Objects named with our pid belong to an earlier process that had it:
 * removed once, before this process creates any (threads may open
 * devices concurrently). */
static void hca_reclaim_self(void)
{
    hca_memobj_reclaim(hca_ns_inode("pid"), (uint32_t)getpid(), 1);
}

static int hca_num_devices(void)
{
    if (numa_available() < 0) {
        return 1;
    }
    return numa_num_configured_nodes() > 0 ? numa_num_configured_nodes()
                                           : 1;
}

int hca_get_device_list(char (*names)[HCA_DEVNAME_MAX], int max)
{
    int n = hca_num_devices();

    for (int i = 0; (i < n) && (i < max); ++i) {
        snprintf(names[i], HCA_DEVNAME_MAX, "hca%d", i);
    }
    return n;
}

static size_t hca_align_up(size_t v)
{
    return (v + HCA_CACHE_LINE - 1) & ~(size_t)(HCA_CACHE_LINE - 1);
}

static int hca_ctx_create(hca_device_t *dev)
{
    size_t off = hca_align_up(sizeof(hca_ctx_hdr_t));
    size_t mpt_off, qp_off, notify_off, svc_off, cnt_off, map_off, busy_off;
    size_t export_off;
    size_t total;
    char name[HCA_OBJ_NAME_MAX];
    int rc;

    mpt_off    = off;
    off        = hca_align_up(off + sizeof(hca_mpt_entry_t) * HCA_MAX_MR);
    qp_off     = off;
    off        = hca_align_up(off +
                              sizeof(hca_qp_pub_t) * (HCA_MAX_QP + 1));
    notify_off = off;
    off        = hca_align_up(off + sizeof(hca_notify_t) * HCA_MAX_CQ);
    svc_off    = off;
    off        = hca_align_up(off + hca_ring_bytes(HCA_SVC_SLOTS,
                                                   sizeof(hca_svc_req_t)));
    cnt_off    = off;
    off        = hca_align_up(off + sizeof(hca_counters_t));
    map_off    = off;
    off        = hca_align_up(off + sizeof(hca_mapper_t) * HCA_MAX_MAPPERS);
    busy_off   = off;
    off        = hca_align_up(off + sizeof(hca_busy_t) * (HCA_MAX_QP + 1));
    export_off = off;
    total      = off + sizeof(hca_export_entry_t) * HCA_MAX_EXPORT;

    hca_ctx_name(name, sizeof(name), dev->pidns, dev->pid, dev->ctx_id);
    rc = hca_memobj_create(&dev->ctx, name, total, dev->numa_node);
    if (rc != 0) {
        return rc;
    }

    dev->hdr    = (hca_ctx_hdr_t*)dev->ctx.addr;
    dev->mpt    = (hca_mpt_entry_t*)((uint8_t*)dev->ctx.addr + mpt_off);
    dev->qp_pub = (hca_qp_pub_t*)((uint8_t*)dev->ctx.addr + qp_off);
    dev->notify = (hca_notify_t*)((uint8_t*)dev->ctx.addr + notify_off);
    dev->svc_cnt = (hca_counters_t*)((uint8_t*)dev->ctx.addr + cnt_off);
    dev->mappers = (hca_mapper_t*)((uint8_t*)dev->ctx.addr + map_off);
    dev->busy    = (hca_busy_t*)((uint8_t*)dev->ctx.addr + busy_off);
    dev->exports = (hca_export_entry_t*)((uint8_t*)dev->ctx.addr +
                                         export_off);
    hca_ring_init(&dev->svc, (uint8_t*)dev->ctx.addr + svc_off,
                  HCA_SVC_SLOTS, sizeof(hca_svc_req_t), HCA_NOTIFY_SVC);

    dev->probe_value      = ((uint64_t)dev->pid << 32) ^ dev->start_time ^
                            0x5ca1ab1e0ddba11ull;
    dev->hdr->version     = HCA_WIRE_VERSION;
    dev->hdr->pid         = dev->pid;
    dev->hdr->ctx_id      = dev->ctx_id;
    dev->hdr->start_time  = dev->start_time;
    dev->hdr->max_mr      = HCA_MAX_MR;
    dev->hdr->max_qp      = HCA_MAX_QP;
    dev->hdr->max_cq      = HCA_MAX_CQ;
    dev->hdr->max_dm      = HCA_MAX_DM;
    dev->hdr->mpt_offset  = mpt_off;
    dev->hdr->qp_offset   = qp_off;
    dev->hdr->notify_offset = notify_off;
    dev->hdr->svc_offset  = svc_off;
    dev->hdr->counters_offset = cnt_off;
    dev->hdr->mappers_offset  = map_off;
    dev->hdr->busy_offset     = busy_off;
    dev->hdr->export_offset   = export_off;
    dev->hdr->name_nonce      = dev->name_nonce;
    dev->hdr->single_copy = (uint32_t)dev->single_copy;
    dev->hdr->probe_addr  = (uint64_t)(uintptr_t)&dev->probe_value;
    dev->hdr->probe_value = dev->probe_value;
    return 0; /* published by hca_ctx_publish(), once the fabrics filled in
                 their part */
}

/* Magic last: peers validate it before anything else. */
static void hca_ctx_publish(hca_device_t *dev)
{
    atomic_thread_fence(memory_order_release);
    dev->hdr->magic = HCA_WIRE_MAGIC;
}

/* The fabric mode asked for: the attribute, else $HCA_FABRIC, else auto.
 * -EINVAL for a value that names no mode. */
static int hca_fabric_mode_get(const hca_open_attr_t *attr,
                               hca_fabric_mode_t *mode_p)
{
    static const char *const names[HCA_FABRIC_MODE_LAST] = {
        [HCA_FABRIC_MODE_AUTO] = "auto",
        [HCA_FABRIC_MODE_SHM]  = "shm",
        [HCA_FABRIC_MODE_TCP]  = "tcp",
    };
    const char *env = getenv("HCA_FABRIC");

    if ((unsigned)attr->fabric >= HCA_FABRIC_MODE_LAST) {
        return -EINVAL;
    }
    *mode_p = attr->fabric;
    if ((attr->fabric != HCA_FABRIC_MODE_AUTO) || (env == NULL) ||
        (*env == '\0')) {
        return 0;
    }
    for (int m = 0; m < HCA_FABRIC_MODE_LAST; ++m) {
        if (strcmp(env, names[m]) == 0) {
            *mode_p = (hca_fabric_mode_t)m;
            return 0;
        }
    }
    hca_log("HCA_FABRIC=%s: expected auto, shm or tcp", env);
    return -EINVAL;
}

int hca_device_open(const char *name, unsigned flags, hca_device_t **dev_p)
{
    hca_open_attr_t attr = {.flags = flags};

    return hca_device_open_attr(name, &attr, dev_p);
}

int hca_device_open_attr(const char *name, const hca_open_attr_t *attr,
                         hca_device_t **dev_p)
{
    unsigned flags = attr->flags;
    hca_fabric_mode_t mode;
    hca_device_t *dev;
    uint32_t ctx_id;
    int index, pos = 0, rc;

    if ((name == NULL) || (sscanf(name, "hca%d%n", &index, &pos) != 1) ||
        (name[pos] != '\0') || (index < 0) || (index >= hca_num_devices())) {
        return -ENODEV;
    }

    if ((flags & ~(unsigned)(HCA_OPEN_NO_SINGLE_COPY |
                             HCA_OPEN_NO_MEMBARRIER)) ||
        (attr->port_min > attr->port_max) ||
        (hca_fabric_mode_get(attr, &mode) != 0)) {
        return -EINVAL;
    }
    dev = calloc(1, sizeof(*dev));
    if (dev == NULL) {
        return -ENOMEM;
    }
    dev->fabric_mode = mode;
    dev->open_attr   = *attr;
    if (attr->net_devices != NULL) {
        snprintf(dev->net_devices, sizeof(dev->net_devices), "%s",
                 attr->net_devices);
    }
    dev->open_attr.net_devices = (attr->net_devices != NULL) ?
                                 dev->net_devices : NULL;
    snprintf(dev->name, sizeof(dev->name), "hca%d", index);
    dev->flags     = flags;
    dev->trace     = (getenv("HCA_TRACE") != NULL) &&
                     (atoi(getenv("HCA_TRACE")) > 0);
    dev->export_on = (getenv("HCA_EXPORT") == NULL) ||
                     (atoi(getenv("HCA_EXPORT")) != 0);
    dev->numa_node = (numa_available() >= 0) ? index : -1;
    dev->pid       = (uint32_t)getpid();
    dev->pidns     = hca_ns_inode("pid");
    pthread_once(&hca_self_clean, hca_reclaim_self);
    ctx_id         = atomic_fetch_add(&hca_next_ctx_id, 1);
    dev->ctx_id    = ctx_id;
    dev->send_sock = -1;
    dev->next_pd   = 1;
    dev->next_dm_id   = 1;
    dev->next_ring_id = 1;
    pthread_mutex_init(&dev->lock, NULL);
    hca_fault_init(&dev->fault);

    rc = hca_host_id_get(&dev->host);
    dev->host_key = hca_host_key(&dev->host);
    if (rc == 0) {
        rc = hca_proc_start_time(dev->pid, &dev->start_time);
    }
    dev->claim_mark = hca_claim_mark(dev->pid, dev->start_time);
    if (rc != 0) {
        goto err_free;
    }

    /* Under Yama ptrace_scope 1 single copy needs the target's consent,
     * as UCX's cma transport gives it. */
    dev->single_copy = !(flags & HCA_OPEN_NO_SINGLE_COPY);
    if (dev->single_copy) {
        (void)prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    }

    hca_memobj_reclaim(dev->pidns, dev->pid, 0); /* dead owners' objects */

    dev->mpt_tag = calloc(HCA_MAX_MR, sizeof(*dev->mpt_tag));
    dev->mrs     = calloc(HCA_MAX_MR, sizeof(*dev->mrs));
    dev->qps     = calloc(HCA_MAX_QP + 1, sizeof(*dev->qps));
    dev->qp_gen  = calloc(HCA_MAX_QP + 1, sizeof(*dev->qp_gen));
    dev->cqs     = calloc(HCA_MAX_CQ, sizeof(*dev->cqs));
    if (!dev->mpt_tag || !dev->mrs || !dev->qps || !dev->qp_gen ||
        !dev->cqs) {
        rc = -ENOMEM;
        goto err_free;
    }

    /* random first tags (as rxe does): keys of different contexts and runs
     * differ, so a key from elsewhere is very unlikely to match */
    if (getrandom(&dev->name_nonce, sizeof(dev->name_nonce), 0) !=
        (ssize_t)sizeof(dev->name_nonce)) {
        dev->name_nonce = (uint32_t)(hca_now_ns() * 2654435761u) ^ dev->pid;
    }
    if (getrandom(dev->mpt_tag, HCA_MAX_MR, 0) != HCA_MAX_MR) {
        for (uint32_t i = 0; i < HCA_MAX_MR; ++i) {
            dev->mpt_tag[i] = (uint8_t)((dev->pid * 2654435761u) >> 24) ^
                              (uint8_t)i ^ (uint8_t)ctx_id;
        }
    }

    dev->send_sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC |
                            SOCK_NONBLOCK, 0);
    if (dev->send_sock < 0) {
        rc = -errno;
        goto err_free;
    }

    /* another user may have planted our context's name: take the next
     * context id (it is in our address, whatever it is) */
    for (int tries = 0; tries < 64; ++tries) {
        rc = hca_ctx_create(dev);
        if (rc != -EEXIST) {
            break;
        }
        hca_log("the name of context %u of pid %u is taken by another "
                "user: trying the next", dev->ctx_id, dev->pid);
        dev->ctx_id = atomic_fetch_add(&hca_next_ctx_id, 1);
    }
    if (rc != 0) {
        goto err_close_sock;
    }
    /* the names our consumers' wakeup sockets bind (the context id is
     * final now) */
    dev->notify_self.pidns = dev->pidns;
    dev->notify_self.pid   = dev->pid;
    dev->notify_self.ctx   = dev->ctx_id;
    dev->notify_self.nonce = dev->name_nonce;

    hca_stats_open(dev);
    rc = hca_fabric_open(dev);
    if (rc != 0) {
        goto err_destroy_ctx;
    }
    hca_ctx_publish(dev);

    *dev_p = dev;
    return 0;

err_destroy_ctx:
    hca_memobj_destroy(&dev->host_stats);
    hca_memobj_destroy(&dev->ctx);
err_close_sock:
    close(dev->send_sock);
err_free:
    free(dev->mpt_tag);
    free(dev->mrs);
    free(dev->qps);
    free(dev->qp_gen);
    free(dev->cqs);
    pthread_mutex_destroy(&dev->lock);
    free(dev);
    return rc;
}

int hca_device_close(hca_device_t *dev)
{
    hca_dm_t *dm;

    if (dev == NULL) {
        return -EINVAL;
    }
    hca_fabric_close(dev);
    hca_exports_destroy(dev);
    /* device memory the user did not free: its objects must not outlive
     * the context */
    while ((dm = dev->dm_list) != NULL) {
        dev->dm_list = dm->next;
        hca_memobj_destroy(&dm->obj);
        free(dm);
    }
    hca_stats_close(dev);
    dev->hdr->magic = 0;
    hca_memobj_destroy(&dev->ctx);
    close(dev->send_sock);
    free(dev->mpt_tag);
    free(dev->mrs);
    free(dev->qps);
    free(dev->qp_gen);
    free(dev->cqs);
    pthread_mutex_destroy(&dev->lock);
    free(dev);
    return 0;
}

const char *hca_device_name(hca_device_t *dev)
{
    return dev->name;
}

int hca_device_query(hca_device_t *dev, hca_device_attr_t *attr)
{
    uint64_t guid = 0xcbf29ce484222325ull; /* FNV-1a of the host id */

    memset(attr, 0, sizeof(*attr));
    for (size_t i = 0; i < sizeof(dev->host.boot_id); ++i) {
        guid = (guid ^ dev->host.boot_id[i]) * 0x100000001b3ull;
    }
    guid = (guid ^ dev->host.net_ns) * 0x100000001b3ull;

    snprintf(attr->name, sizeof(attr->name), "%s", dev->name);
    attr->node_guid       = guid ^ (uint64_t)dev->numa_node;
    attr->vendor_id       = 0x4843; /* "HC" */
    attr->hw_ver          = 1;
    snprintf(attr->fw_ver, sizeof(attr->fw_ver), "%d.%d",
             HCA_DEV_API_VERSION, HCA_WIRE_VERSION);
    attr->numa_node       = dev->numa_node;
    attr->phys_port_cnt   = 1;
    attr->max_pd          = HCA_MAX_PD;
    attr->max_mr          = HCA_MAX_MR - 1;
    attr->max_mr_size     = UINT64_MAX >> 1;
    attr->max_qp          = HCA_MAX_QP - 1;
    attr->max_qp_wr       = HCA_MAX_QP_WR;
    attr->max_sge         = HCA_MAX_SGE;
    attr->max_cq          = HCA_MAX_CQ;
    attr->max_cqe         = HCA_MAX_CQE;
    attr->max_srq         = HCA_MAX_SRQ;
    attr->max_srq_wr      = HCA_MAX_QP_WR;
    attr->max_inline_data = HCA_SLOT_PAYLOAD;
    attr->max_msg_size    = HCA_MAX_MSG;
    attr->max_dm          = HCA_MAX_DM;
    attr->max_dm_size     = HCA_MAX_DM_SIZE;
    attr->atomic_caps     = HCA_ATOMIC_CAP_32 | HCA_ATOMIC_CAP_64 |
                            HCA_ATOMIC_CAP_GLOB | HCA_ATOMIC_CAP_BITOPS;
    attr->max_qp_rd_atom  = HCA_MAX_QP_RD_ATOM;
    return 0;
}

int hca_port_query(hca_device_t *dev, uint8_t port_num,
                   hca_port_attr_t *attr)
{
    if (port_num != 1) {
        return -EINVAL;
    }
    memset(attr, 0, sizeof(*attr));
    attr->state       = HCA_PORT_ACTIVE;
    attr->fabric      = HCA_FABRIC_SHM;
    attr->mtu         = HCA_SLOT_PAYLOAD;
    attr->max_msg_sz  = (uint32_t)HCA_MAX_MSG;
    attr->single_copy = (uint32_t)dev->single_copy;
    attr->fabric_mode = dev->fabric_mode;
    if (dev->fabric_mode == HCA_FABRIC_MODE_TCP) {
        attr->fabric = HCA_FABRIC_TCP;
    }
    for (int t = 0; t < HCA_FABRIC_LAST; ++t) {
        if (dev->fabric_open[t]) {
            dev->fabric_ops[t].port_query(dev, attr);
        }
    }
    return 0;
}

void hca_port_address(hca_device_t *dev, hca_port_addr_t *addr)
{
    memset(addr, 0, sizeof(*addr));
    addr->host   = dev->host_key;
    addr->pid    = dev->pid;
    addr->ctx_id = dev->ctx_id;
    for (int t = 0; t < HCA_FABRIC_LAST; ++t) {
        if (dev->fabric_open[t]) {
            dev->fabric_ops[t].address(dev, addr);
        }
    }
}

int hca_port_addr_reachable(hca_device_t *dev, const hca_port_addr_t *addr)
{
    return hca_fabric_for_addr(dev, addr) != NULL;
}

uint64_t hca_device_check_peers(hca_device_t *dev)
{
    for (int t = 0; t < HCA_FABRIC_LAST; ++t) {
        if (dev->fabric_open[t]) {
            (void)dev->fabric_ops[t].check_peers(dev);
        }
    }
    return atomic_load(&dev->dead_peers);
}
