/*
 * hca_compat.h - the UCX versions the module builds against, and the one
 * place that knows how their internal APIs differ.  Every version switch of
 * the module is here, keyed on UCT_VERNO_MAJOR/MINOR (uct/api/version.h of
 * the UCX being built against); md, iface and ep code use only what this
 * header defines.
 *
 * Built and tested: 1.13.1 (Debian 12), 1.18.1 (Debian 13) and 1.22.0, each
 * against its own source tree (configure --with-ucx-src).  Each switch names
 * the first release that has the change as UCX's NEWS file (1.22.0) dates
 * it; where NEWS is silent, the first release of ours that has it (1.18 or
 * 1.22) and the ones in between are untested.  A wrong guess is a compile
 * error (an initialiser or a signature that does not match), never a silent
 * difference: the ops tables use designated initialisers.
 */
#ifndef UCT_HCA_COMPAT_H
#define UCT_HCA_COMPAT_H

#include <uct/api/version.h>
#include <uct/base/uct_iface.h>
#include <uct/base/uct_md.h>
#include <string.h>

#define UCT_HCA_UCX_VERSION(_major, _minor)  (((_major) << 8) | (_minor))
#define UCT_HCA_UCX_AT_LEAST(_major, _minor) \
    (UCT_HCA_UCX_VERSION(UCT_VERNO_MAJOR, UCT_VERNO_MINOR) >= \
     UCT_HCA_UCX_VERSION(_major, _minor))

#if !UCT_HCA_UCX_AT_LEAST(1, 13)
#  error "hca needs UCX 1.13 or later"
#endif

/* ------------------------------------------------------------ switches */

/* md ops mem_reg(md, address, length, const uct_md_mem_reg_params_t*,
 * memh_p); 1.13: unsigned flags.  [NEWS 1.14.0: "Added new uct_mem_reg_v2()
 * API"; uct/base/uct_md.h uct_md_mem_reg_func_t] */
#define UCT_HCA_HAVE_MEM_REG_PARAMS      UCT_HCA_UCX_AT_LEAST(1, 14)

/* md ops mkey_pack(md, memh, address, length, params, buffer), mem_attach
 * after it, is_sockaddr_accessible gone.  [NEWS 1.14.0: "Added new
 * uct_md_mem_attach() API"; uct/base/uct_md.h struct uct_md_ops] */
#define UCT_HCA_HAVE_MKEY_PACK_RANGE     UCT_HCA_UCX_AT_LEAST(1, 14)

/* md ops query fills uct_md_attr_v2_t (flat: no "cap." level).  [NEWS
 * 1.14.0: "Added new uct_md_query_v2() API"; uct/base/uct_md.h
 * uct_md_query_func_t] */
#define UCT_HCA_HAVE_MD_ATTR_V2          UCT_HCA_UCX_AT_LEAST(1, 14)

/* UCT_MD_FLAG_INVALIDATE split into INVALIDATE_RMA and INVALIDATE_AMO (v2
 * md flags).  UCP >= 1.15 asks for INVALIDATE_RMA on the rendezvous lanes of
 * an ep with the PEER error mode (ucp/wireup/select.c,
 * ucp_wireup_add_bw_lanes) and packs rkeys with
 * UCT_MD_MKEY_PACK_FLAG_INVALIDATE_RMA when the md has it
 * (ucp/core/ucp_context.c).  [NEWS 1.15.0: "Split
 * UCT_MD_MKEY_PACK_FLAG_INVALIDATE into two flags for RMA and AMO"] */
#define UCT_HCA_HAVE_INVALIDATE_RMA_AMO  UCT_HCA_UCX_AT_LEAST(1, 15)

/* uct_iface_internal_ops_t: ep_connect_to_ep_v2, iface_is_reachable_v2 and
 * ep_is_connected.  UCP asks reachability through uct_iface_is_reachable_v2,
 * which calls the internal op (uct/base/uct_iface.c), so it must be set.
 * [NEWS 1.15.0: "Added base implementation of is_reachable_v2 API using
 * intra/inter flag"] */
#define UCT_HCA_HAVE_REACHABLE_V2        UCT_HCA_UCX_AT_LEAST(1, 15)

/* UCT_IFACE_FLAG_INTER_NODE: UCP marks an ep intra-node when one of its
 * lanes lacks it (ucp/wireup/select.c, ucp_wireup_select_lanes' key flags)
 * and packs only such transports in a "network only" worker address
 * (ucp/core/ucp_worker.c).  [1.15: came with the is_reachable_v2 scope] */
#define UCT_HCA_HAVE_INTER_NODE_FLAG     UCT_HCA_UCX_AT_LEAST(1, 15)

/* uct_component_t.rkey_compare after rkey_release.  [NEWS 1.16.0: "Added
 * ucp_rkey_compare API"; uct/base/uct_component.h] */
#define UCT_HCA_HAVE_RKEY_COMPARE        UCT_HCA_UCX_AT_LEAST(1, 16)

/* UCT_IFACE_MPOOL_CONFIG_FIELDS takes a maximal chunk size and a grow
 * factor.  [1.18.1 has it, 1.13.1 not; uct/base/uct_iface.h] */
#define UCT_HCA_HAVE_MPOOL_CHUNK_FIELDS  UCT_HCA_UCX_AT_LEAST(1, 18)

/* component rkey_unpack(component, buffer, const uct_rkey_unpack_params_t*,
 * rkey_p, handle_p).  [NEWS 1.19.0: "Defined uct_rkey_unpack_v2 API to
 * support passing sys-dev"; uct/base/uct_component.h] */
#define UCT_HCA_HAVE_RKEY_UNPACK_PARAMS  UCT_HCA_UCX_AT_LEAST(1, 19)

/* md ops mem_alloc(md, length_p, address_p, mem_type, sys_dev, flags, name,
 * memh_p) and mem_query filling uct_md_mem_attr_v2_t.  [1.22.0 has it,
 * 1.18.1 not; NEWS 1.19.0-1.20.0 bring the device API it belongs to:
 * assumed 1.19; uct/base/uct_md.h] */
#define UCT_HCA_HAVE_MEM_ALLOC_SYS_DEV   UCT_HCA_UCX_AT_LEAST(1, 19)

/* md ops mem_query fills uct_md_mem_attr_v2_t; 1.18: uct_md_mem_attr_t.
 * [1.22.0 has it, 1.18.1 not: assumed 1.19 with mem_alloc's sys_dev;
 * uct/base/uct_md.h uct_md_mem_query_func_t] */
#define UCT_HCA_HAVE_MEM_ATTR_V2         UCT_HCA_UCX_AT_LEAST(1, 19)

/* uct_iface_internal_ops_t.ep_invalidate(ep, const
 * uct_ep_invalidate_params_t*); 1.18: (ep, unsigned flags).  [1.22.0 has
 * it, 1.18.1 not: assumed 1.19; uct/base/uct_iface.h] */
#define UCT_HCA_HAVE_EP_INVALIDATE_PARAMS UCT_HCA_UCX_AT_LEAST(1, 19)

/* uct_ep_check may be given a completion: UCT_EP_KEEPALIVE_CHECK_PARAM
 * checks only the flags (an answer given at once needs no completion, as in
 * uct/sm/mm/base/mm_ep.c, uct_mm_ep_check); 1.18 rejects a completion.
 * [1.22.0 has it, 1.18.1 not: assumed 1.19; uct/base/uct_iface.h] */
#define UCT_HCA_HAVE_EP_CHECK_COMP       UCT_HCA_UCX_AT_LEAST(1, 19)

/* ucs_rcache_get(rcache, address, length, alignment, prot, arg, region_p),
 * and ucs_rcache_params_t without alignment/max_alignment (the alignment
 * is the caller's, per region); used by contrib/bench/hca_reg_bench.c.
 * [1.18.1 has it, 1.13.1 not: assumed 1.14; ucs/memory/rcache.h] */
#define UCT_HCA_HAVE_RCACHE_GET_ALIGNMENT UCT_HCA_UCX_AT_LEAST(1, 14)

/* ucs_align_up, ucs_roundup_pow2 and the other pointer arithmetic moved
 * from ucs/sys/math.h to ucs/sys/ptr_arith.h.  [1.18.1 has it, 1.13.1 not:
 * assumed 1.14] */
#define UCT_HCA_HAVE_PTR_ARITH_H         UCT_HCA_UCX_AT_LEAST(1, 14)

/* UCX's stubs (ucs/sys/stubs.h) are declared with "(void)" parameters:
 * assigned to an op they are incompatible pointer types.  hca defines its
 * own stubs with each op's signature instead of casting. */

/* uct_iface_internal_ops_t.iface_query_v2 (first entry): uct_iface_query_v2
 * calls it; UCX's own transports set uct_iface_base_query_v2.  [1.22.0 has
 * it, 1.18.1 not; uct/base/uct_iface.h] */
#define UCT_HCA_HAVE_IFACE_QUERY_V2      UCT_HCA_UCX_AT_LEAST(1, 19)

/* UCP plans with protocols v2 by default: it picks get bcopy or zero-copy
 * per size from the estimate_perf figures (hca_perf.c), so cap.get.min_zcopy
 * need not steer it, and must not: v2 then also keeps the tag rendezvous'
 * get zero-copy off below it (measured on 1.22: tag_lat 7000 B 0.82 ->
 * 1.58 us with 8k).  Before, protocols v1 put get zero-copy at reg_cost
 * over a copy's cost.  [NEWS 1.16.0; docs/UCP-PROTOCOLS.md] */
#define UCT_HCA_UCP_PROTO_V2_DEFAULT     UCT_HCA_UCX_AT_LEAST(1, 16)

/* uct_perf_attr_t.flags and UCT_PERF_ATTR_FIELD_FLAGS: UCP asks whether tx
 * and rx share resources (UCT_PERF_ATTR_FLAGS_TX_RX_SHARED) to give the AM
 * lane a path of its own, for peers of address version >= 17
 * (ucp/wireup/select.c, ucp_wireup_iface_get_perf_attr_flags).  [1.18.1 has
 * it, 1.13.1 not: assumed 1.17 with that address version;
 * uct/api/v2/uct_v2.h] */
#define UCT_HCA_HAVE_PERF_ATTR_FLAGS     UCT_HCA_UCX_AT_LEAST(1, 17)

/* uct_perf_attr_t.path_bandwidth and UCT_PERF_ATTR_FIELD_PATH_BANDWIDTH
 * (the bandwidth of one path of the iface; UCP divides it by the bandwidth
 * for a lane's path ratio, ucp/proto/proto_common.c,
 * ucp_proto_common_get_lane_perf).  [1.22.0 has it, 1.18.1 not: assumed
 * 1.19; uct/api/v2/uct_v2.h] */
#define UCT_HCA_HAVE_PERF_ATTR_PATH_BW   UCT_HCA_UCX_AT_LEAST(1, 19)

/* ------------------------------------------------------------ md */

#if UCT_HCA_HAVE_MEM_REG_PARAMS
#  define UCT_HCA_MEM_REG_PARAMS_ARG  const uct_md_mem_reg_params_t *params
#  define UCT_HCA_MEM_REG_FLAGS \
    UCT_MD_MEM_REG_FIELD_VALUE(params, flags, FIELD_FLAGS, 0)
#else
#  define UCT_HCA_MEM_REG_PARAMS_ARG  unsigned params_flags
#  define UCT_HCA_MEM_REG_FLAGS       (params_flags)
#endif

/* the extra leading parameters of mkey_pack (note the trailing comma) */
#if UCT_HCA_HAVE_MKEY_PACK_RANGE
#  define UCT_HCA_MKEY_PACK_RANGE_ARGS  void *address, size_t length,
/* no exported memory handles */
static inline ucs_status_t
uct_hca_mem_attach(uct_md_h md, const void *mkey_buffer,
                   uct_md_mem_attach_params_t *params, uct_mem_h *memh_p)
{
    return UCS_ERR_UNSUPPORTED;
}
#  define UCT_HCA_MD_OPS_VERSIONED \
    .mem_attach             = uct_hca_mem_attach,
#else
#  define UCT_HCA_MKEY_PACK_RANGE_ARGS
/* hca has no sockaddr connection manager */
static inline int
uct_hca_is_sockaddr_accessible(uct_md_h md, const ucs_sock_addr_t *sockaddr,
                               uct_sockaddr_accessibility_t mode)
{
    return 0;
}
#  define UCT_HCA_MD_OPS_VERSIONED \
    .is_sockaddr_accessible = uct_hca_is_sockaddr_accessible,
#endif

#if UCT_HCA_HAVE_MEM_ALLOC_SYS_DEV
#  define UCT_HCA_MEM_ALLOC_SYS_DEV_ARG  ucs_sys_device_t sys_dev,
#else
#  define UCT_HCA_MEM_ALLOC_SYS_DEV_ARG
#endif

#if UCT_HCA_HAVE_MEM_ATTR_V2
typedef uct_md_mem_attr_v2_t uct_hca_mem_attr_t;
#else
typedef uct_md_mem_attr_t uct_hca_mem_attr_t;
#endif

/* The md attributes its query fills: UCT_HCA_MD_CAP(attr, flags) names the
 * capability fields (attr->cap.flags in 1.13); rkey_packed_size, reg_cost
 * and local_cpus have the same names in both. */
#if UCT_HCA_HAVE_MD_ATTR_V2
typedef uct_md_attr_v2_t uct_hca_md_attr_t;
#  define UCT_HCA_MD_CAP(_attr, _field)  ((_attr)->_field)
/* The md's query fills every field (uct_md_query_v2 copies them by the
 * caller's mask): UCX's defaults first, as its own mds do
 * (uct/tcp/tcp_md.c).  Host registrations may be cached by UCP's rcache,
 * as mm's are (uct/sm/mm/base/mm_md.c): a deregistration through hca's own
 * cache is as cheap as a hit, and an unmapped range is revoked either way. */
static inline void uct_hca_md_attr_init(uct_hca_md_attr_t *attr)
{
    uct_md_base_md_query(attr);
    attr->cache_mem_types = UCS_BIT(UCS_MEMORY_TYPE_HOST);
}
/* UCP's rcache caches them, so the md's own cache is off by default: with
 * both, a user who turns UCP's off (UCX_RCACHE_ENABLE=n) still had keys
 * outlive their deregistration (UCX 1.22's
 * test_ucp_peer_failure_rndv_abort.get_zcopy_memory_invalidation_no_rcache:
 * UCP deregisters without INVALIDATE and expects the peer's get to fail),
 * and a hit cost two lookups.  UCX's IB md has no cache of its own either
 * (UCX 1.22, uct/ib/base/ib_md.c). */
#  define UCT_HCA_MD_RCACHE_DEFAULT "n"
#else
typedef uct_md_attr_t uct_hca_md_attr_t;
#  define UCT_HCA_MD_CAP(_attr, _field)  ((_attr)->cap._field)
/* uct_md_query fills component_name after the md's query */
static inline void uct_hca_md_attr_init(uct_hca_md_attr_t *attr)
{
    memset(&attr->cap, 0, sizeof(attr->cap));
}
/* UCP 1.13 caches no registration: the md's own cache is what keeps a
 * zero-copy operation from registering its buffer each time */
#  define UCT_HCA_MD_RCACHE_DEFAULT "y"
#endif

/* Every key of hca is invalidated for every kind of remote access at once
 * (hca_mr_revoke: RMA and atomics alike), so both halves of the split flag
 * are true. */
#if UCT_HCA_HAVE_INVALIDATE_RMA_AMO
#  define UCT_HCA_MD_FLAGS_VERSIONED \
    (UCT_MD_FLAG_INVALIDATE_RMA | UCT_MD_FLAG_INVALIDATE_AMO)
#else
#  define UCT_HCA_MD_FLAGS_VERSIONED  0
#endif

#if UCT_HCA_HAVE_RKEY_COMPARE
#  define UCT_HCA_COMPONENT_VERSIONED \
    .rkey_compare       = uct_base_rkey_compare,
#else
#  define UCT_HCA_COMPONENT_VERSIONED
#endif

#if UCT_HCA_HAVE_RKEY_UNPACK_PARAMS
#  define UCT_HCA_RKEY_UNPACK_PARAMS_ARG \
    const uct_rkey_unpack_params_t *unpack_params,
#else
#  define UCT_HCA_RKEY_UNPACK_PARAMS_ARG
#endif

/* ------------------------------------------------------------ ucs */

#if UCT_HCA_HAVE_PTR_ARITH_H
#  include <ucs/sys/ptr_arith.h>
#else
#  include <ucs/sys/math.h>
#endif

#if UCT_HCA_HAVE_RCACHE_GET_ALIGNMENT
#  define UCT_HCA_RCACHE_PARAMS_SET_ALIGNMENT(_params, _align, _max_align)
#  define UCT_HCA_RCACHE_GET(_rcache, _addr, _len, _align, _prot, _arg, \
                             _region_p) \
    ucs_rcache_get(_rcache, _addr, _len, _align, _prot, _arg, _region_p)
#else
#  define UCT_HCA_RCACHE_PARAMS_SET_ALIGNMENT(_params, _align, _max_align) \
    do { \
        (_params)->alignment     = (_align); \
        (_params)->max_alignment = (_max_align); \
    } while (0)
#  define UCT_HCA_RCACHE_GET(_rcache, _addr, _len, _align, _prot, _arg, \
                             _region_p) \
    ucs_rcache_get(_rcache, _addr, _len, _prot, _arg, _region_p)
#endif

/* ------------------------------------------------------------ iface */

#if UCT_HCA_HAVE_MPOOL_CHUNK_FIELDS
/* UCX's own transports' defaults (uct/sm/mm/base/mm_iface.c): chunks up to
 * 128 MiB, each as large as the one before */
#  define UCT_HCA_IFACE_MPOOL_CONFIG_FIELDS(_prefix, _max, _grow, _name, \
                                            _offset, _desc) \
    UCT_IFACE_MPOOL_CONFIG_FIELDS(_prefix, _max, _grow, 128m, 1.0, _name, \
                                  _offset, _desc)
#else
#  define UCT_HCA_IFACE_MPOOL_CONFIG_FIELDS(_prefix, _max, _grow, _name, \
                                            _offset, _desc) \
    UCT_IFACE_MPOOL_CONFIG_FIELDS(_prefix, _max, _grow, _name, _offset, _desc)
#endif

#if UCT_HCA_HAVE_INTER_NODE_FLAG
#  define UCT_HCA_IFACE_FLAG_INTER_NODE  UCT_IFACE_FLAG_INTER_NODE
#else
#  define UCT_HCA_IFACE_FLAG_INTER_NODE  0
#endif

/* version-neutral checks that the adapters below call (hca_iface.c,
 * hca_ep.c) */
int uct_hca_iface_is_reachable(const uct_iface_h tl_iface,
                               const uct_device_addr_t *dev_addr,
                               const uct_iface_addr_t *iface_addr);
int uct_hca_ep_is_connected_to(const uct_ep_h tl_ep,
                               const uct_device_addr_t *dev_addr,
                               const uct_iface_addr_t *iface_addr);

#if UCT_HCA_HAVE_REACHABLE_V2
/* hca connects to ifaces only (no UCT_IFACE_FLAG_CONNECT_TO_EP) */
static inline ucs_status_t
uct_hca_ep_connect_to_ep_v2(uct_ep_h ep, const uct_device_addr_t *device_addr,
                            const uct_ep_addr_t *ep_addr,
                            const uct_ep_connect_to_ep_params_t *params)
{
    return UCS_ERR_UNSUPPORTED;
}

/* As UCX's own transports do (uct/tcp/tcp_iface.c,
 * uct_tcp_iface_is_reachable_v2): addresses first, then ours, then the
 * scope (UCT_IFACE_REACHABILITY_SCOPE_DEVICE: the same device only). */
static inline int
uct_hca_iface_is_reachable_v2(const uct_iface_h tl_iface,
                              const uct_iface_is_reachable_params_t *params)
{
    if (!uct_iface_is_reachable_params_addrs_valid(params)) {
        return 0;
    }
    if (!uct_hca_iface_is_reachable(tl_iface, params->device_addr,
                                    params->iface_addr)) {
        /* UCP prints it after "Destination is unreachable" */
        uct_iface_fill_info_str_buf(params, "no hca fabric reaches the peer");
        return 0;
    }
    return uct_iface_scope_is_reachable(tl_iface, params);
}

/* An ep is connected to the iface whose addresses UCP gives: hca connects
 * to ifaces only (uct/base/uct_iface.c, uct_base_ep_is_connected, re-asks
 * reachability; hca compares with the ep's own peer). */
static inline int
uct_hca_ep_is_connected(const uct_ep_h tl_ep,
                        const uct_ep_is_connected_params_t *params)
{
    const uint64_t need = UCT_EP_IS_CONNECTED_FIELD_DEVICE_ADDR |
                          UCT_EP_IS_CONNECTED_FIELD_IFACE_ADDR;

    if ((params->field_mask & need) != need) {
        return 0;
    }
    return uct_hca_ep_is_connected_to(tl_ep, params->device_addr,
                                      params->iface_addr);
}

#  define UCT_HCA_IFACE_INTERNAL_OPS_REACHABLE \
    .ep_connect_to_ep_v2   = uct_hca_ep_connect_to_ep_v2, \
    .iface_is_reachable_v2 = uct_hca_iface_is_reachable_v2, \
    .ep_is_connected       = uct_hca_ep_is_connected,
#else
#  define UCT_HCA_IFACE_INTERNAL_OPS_REACHABLE
#endif

#if UCT_HCA_HAVE_EP_INVALIDATE_PARAMS
#  define UCT_HCA_EP_INVALIDATE_PARAMS_ARG \
    const uct_ep_invalidate_params_t *params
#else
#  define UCT_HCA_EP_INVALIDATE_PARAMS_ARG  unsigned flags
#endif

#if UCT_HCA_HAVE_EP_CHECK_COMP
#  define UCT_HCA_EP_CHECK_PARAMS(_flags, _comp) \
    UCT_EP_KEEPALIVE_CHECK_PARAM(_flags)
#else
#  define UCT_HCA_EP_CHECK_PARAMS(_flags, _comp) \
    UCT_EP_KEEPALIVE_CHECK_PARAM(_flags, _comp)
#endif

#if UCT_HCA_HAVE_IFACE_QUERY_V2
#  define UCT_HCA_IFACE_INTERNAL_OPS_QUERY_V2 \
    .iface_query_v2        = uct_iface_base_query_v2,
#else
#  define UCT_HCA_IFACE_INTERNAL_OPS_QUERY_V2
#endif

/* estimate_perf's fields that only some versions have (hca_perf.c) */
#if UCT_HCA_HAVE_PERF_ATTR_PATH_BW
#  define UCT_HCA_PERF_ATTR_SET_PATH_BANDWIDTH(_attr, _bw) \
    do { \
        if ((_attr)->field_mask & UCT_PERF_ATTR_FIELD_PATH_BANDWIDTH) { \
            (_attr)->path_bandwidth = (_bw); \
        } \
    } while (0)
#else
#  define UCT_HCA_PERF_ATTR_SET_PATH_BANDWIDTH(_attr, _bw) do { } while (0)
#endif

#if UCT_HCA_HAVE_PERF_ATTR_FLAGS
#  define UCT_HCA_PERF_ATTR_SET_FLAGS(_attr, _flags) \
    do { \
        if ((_attr)->field_mask & UCT_PERF_ATTR_FIELD_FLAGS) { \
            (_attr)->flags = (_flags); \
        } \
    } while (0)
#else
#  define UCT_HCA_PERF_ATTR_SET_FLAGS(_attr, _flags) do { } while (0)
#endif

#define UCT_HCA_IFACE_INTERNAL_OPS_VERSIONED \
    UCT_HCA_IFACE_INTERNAL_OPS_QUERY_V2 \
    UCT_HCA_IFACE_INTERNAL_OPS_REACHABLE

#endif
