/*
 * hca_iface.c - the hca interface: resources, capabilities, addresses,
 * progress (completions, receives, pending, flush and error reports) and
 * wakeup events.  Registers the transport with UCX when loaded.
 */
#include "hca_uct.h"

#include <stdlib.h>
#include <strings.h>

#include <ucs/arch/cpu.h>
#include <ucs/debug/log.h>
#include <ucs/sys/string.h>
#include <ucs/time/time.h>
#include <string.h>

#define UCT_HCA_POLL_BATCH 16

static UCS_CLASS_DECLARE_DELETE_FUNC(uct_hca_iface_t, uct_iface_t);

#if !UCT_HCA_UCP_PROTO_V2_DEFAULT
/* UCP of this version runs protocols v2: UCX_PROTO_ENABLE as UCP reads it
 * from the environment (a boolean as ucs_config_sscanf_bool takes it; a
 * ucx.conf setting is not seen here). */
static int uct_hca_ucp_proto_v2_requested(void)
{
    const char *v = getenv("UCX_PROTO_ENABLE");

    return (v != NULL) &&
           (!strcasecmp(v, "y") || !strcasecmp(v, "yes") ||
            !strcasecmp(v, "on") || !strcmp(v, "1"));
}
#endif

/* cap.get.min_zcopy: see GET_MIN_ZCOPY below */
#if UCT_HCA_UCP_PROTO_V2_DEFAULT
#  define UCT_HCA_GET_MIN_ZCOPY_DEFAULT "0"
#else
#  define UCT_HCA_GET_MIN_ZCOPY_DEFAULT "8k"
#endif

static ucs_config_field_t uct_hca_iface_config_table[] = {
    /* buffers allocated through the iface are device memory, which peers
     * reach with plain loads/stores (as UCX's posix transport does) */
    {"", "ALLOC=md,mmap,heap", NULL,
     ucs_offsetof(uct_hca_iface_config_t, super),
     UCS_CONFIG_TYPE_TABLE(uct_iface_config_table)},

    {"SEG_SIZE", "8k",
     "Size of a receive descriptor: the largest active message (zcopy)\n"
     "and the bounce buffer of put/get bcopy.",
     ucs_offsetof(uct_hca_iface_config_t, seg_size), UCS_CONFIG_TYPE_MEMUNITS},

    {"RX_QUEUE_LEN", "256",
     "Receive descriptors posted per interface.",
     ucs_offsetof(uct_hca_iface_config_t, rx_queue_len), UCS_CONFIG_TYPE_UINT},

    {"TX_QUEUE_LEN", "256",
     "Send queue depth of every endpoint.",
     ucs_offsetof(uct_hca_iface_config_t, tx_queue_len), UCS_CONFIG_TYPE_UINT},

    {"TX_CQ_LEN", "1024",
     "Signalled operations in flight per interface (completion queue room).",
     ucs_offsetof(uct_hca_iface_config_t, tx_cq_len), UCS_CONFIG_TYPE_UINT},

    UCT_HCA_IFACE_MPOOL_CONFIG_FIELDS("", -1, 128, "send/receive",
                                  ucs_offsetof(uct_hca_iface_config_t, mp),
                                  ""),

    /* UCP 1.13 puts its get zero-copy threshold at reg_cost over the
     * cost of a copy (~130 B with the registration cache), and it charges
     * get bcopy a copy that hca's does not make: against the peer's
     * device memory get_bcopy unpacks straight from our mapping.  Below
     * this size bcopy is measured as fast or faster for either kind of
     * target memory (docs/PERF.md, issue 26), so zero-copy is offered
     * only from here; get_zcopy still accepts any length.  Protocols v2
     * (the default from 1.16) choose by cost themselves: 0 there. */
    {"GET_MIN_ZCOPY", UCT_HCA_GET_MIN_ZCOPY_DEFAULT,
     "Smallest get the interface reports for zero-copy (cap.get.min_zcopy):\n"
     "UCP uses get bcopy below it.",
     ucs_offsetof(uct_hca_iface_config_t, get_min_zcopy),
     UCS_CONFIG_TYPE_MEMUNITS},

    {NULL}
};

static ucs_status_t uct_hca_iface_query(uct_iface_h tl_iface,
                                        uct_iface_attr_t *attr)
{
    uct_hca_iface_t *iface = ucs_derived_of(tl_iface, uct_hca_iface_t);
    size_t seg_size        = iface->config.seg_size;
    unsigned inl           = iface->config.max_inline;
    hca_device_attr_t dattr;

    hca_device_query(iface->md->dev, &dattr);
    uct_base_iface_query(&iface->super, attr);

    (void)uct_hca_paths_packed(&iface->md->addr, &attr->iface_addr_len);
    attr->device_addr_len = sizeof(uct_hca_device_addr_t);
    attr->ep_addr_len     = 0;
    attr->max_conn_priv   = 0;
    attr->cap.flags       = UCT_IFACE_FLAG_CONNECT_TO_IFACE |
                            UCT_IFACE_FLAG_AM_SHORT | UCT_IFACE_FLAG_AM_BCOPY |
                            UCT_IFACE_FLAG_AM_ZCOPY |
                            UCT_IFACE_FLAG_PUT_SHORT |
                            UCT_IFACE_FLAG_PUT_BCOPY |
                            UCT_IFACE_FLAG_PUT_ZCOPY |
                            UCT_IFACE_FLAG_GET_ZCOPY |
                            UCT_IFACE_FLAG_ATOMIC_CPU |
                            UCT_IFACE_FLAG_PENDING | UCT_IFACE_FLAG_CB_SYNC |
                            UCT_IFACE_FLAG_ERRHANDLE_PEER_FAILURE |
                            UCT_IFACE_FLAG_EP_CHECK;
    /* other hosts are reached when the context has a tcp listener
     * (UCX_HCA_FABRIC=auto or tcp, not shm) */
    if (iface->md->addr.net.family != HCA_NET_NONE) {
        attr->cap.flags  |= UCT_HCA_IFACE_FLAG_INTER_NODE;
    }
    if (iface->config.get_bcopy) {
        attr->cap.flags  |= UCT_IFACE_FLAG_GET_BCOPY;
    }
    attr->cap.event_flags = UCT_IFACE_FLAG_EVENT_SEND_COMP |
                            UCT_IFACE_FLAG_EVENT_RECV |
                            UCT_IFACE_FLAG_EVENT_FD;

    /* every atomic ends as a CPU atomic instruction on the target memory */
    attr->cap.atomic32.op_flags  =
    attr->cap.atomic64.op_flags  = UCS_BIT(UCT_ATOMIC_OP_ADD) |
                                   UCS_BIT(UCT_ATOMIC_OP_AND) |
                                   UCS_BIT(UCT_ATOMIC_OP_OR) |
                                   UCS_BIT(UCT_ATOMIC_OP_XOR);
    attr->cap.atomic32.fop_flags =
    attr->cap.atomic64.fop_flags = UCS_BIT(UCT_ATOMIC_OP_ADD) |
                                   UCS_BIT(UCT_ATOMIC_OP_AND) |
                                   UCS_BIT(UCT_ATOMIC_OP_OR) |
                                   UCS_BIT(UCT_ATOMIC_OP_XOR) |
                                   UCS_BIT(UCT_ATOMIC_OP_SWAP) |
                                   UCS_BIT(UCT_ATOMIC_OP_CSWAP);

    /* up to a bounce buffer, not the inline size: see put_short (UCP
     * sends a put up to this as put_short, one copy into device memory) */
    attr->cap.put.max_short       = seg_size;
    attr->cap.put.max_bcopy       = seg_size;
    attr->cap.put.min_zcopy       = 0;
    attr->cap.put.max_zcopy       = dattr.max_msg_size;
    attr->cap.put.opt_zcopy_align = 1;
    attr->cap.put.align_mtu       = 1;
    attr->cap.put.max_iov         = UCT_HCA_MAX_IOV;

    attr->cap.get.max_short       = 0;
    attr->cap.get.max_bcopy       = seg_size;
    attr->cap.get.min_zcopy       = iface->config.get_min_zcopy;
    attr->cap.get.max_zcopy       = dattr.max_msg_size;
    attr->cap.get.opt_zcopy_align = 1;
    attr->cap.get.align_mtu       = 1;
    attr->cap.get.max_iov         = UCT_HCA_MAX_IOV;

    /* the 8-byte AM header included, as in mm and rc (UCP subtracts it) */
    attr->cap.am.max_short        = inl;
    attr->cap.am.max_bcopy        = seg_size;
    attr->cap.am.min_zcopy        = 0;
    attr->cap.am.max_zcopy        = seg_size;
    attr->cap.am.opt_zcopy_align  = 1;
    attr->cap.am.align_mtu        = 1;
    attr->cap.am.max_hdr          = 128;
    attr->cap.am.max_iov          = UCT_HCA_MAX_IOV;

    /* latency, bandwidth, overhead and priority: hca_perf.c */
    uct_hca_iface_query_perf(iface, attr);
    return UCS_OK;
}

static ucs_status_t uct_hca_iface_get_device_address(uct_iface_h tl_iface,
                                                     uct_device_addr_t *addr)
{
    uct_hca_iface_t *iface = ucs_derived_of(tl_iface, uct_hca_iface_t);

    uct_hca_device_addr_t *devaddr = (uct_hca_device_addr_t*)addr;

    devaddr->host       = iface->md->addr.host;
    devaddr->net_family = iface->md->addr.net.family;
    memcpy(devaddr->net_addr, iface->md->addr.net.addr,
           sizeof(devaddr->net_addr));
    return UCS_OK;
}

static ucs_status_t uct_hca_iface_get_address(uct_iface_h tl_iface,
                                              uct_iface_addr_t *addr)
{
    uct_hca_iface_t *iface       = ucs_derived_of(tl_iface, uct_hca_iface_t);
    uct_hca_iface_addr_t *ifaddr = (uct_hca_iface_addr_t*)addr;

    ifaddr->pid    = iface->md->addr.pid;
    ifaddr->ctx_id = iface->md->addr.ctx_id;
    ifaddr->qpn      = hca_qp_num(iface->tgt_qp);
    ifaddr->net_port = iface->md->addr.net.port;
    ifaddr->secret   = iface->md->addr.secret;
    ifaddr->n_paths_more = (uint8_t)uct_hca_paths_packed(&iface->md->addr,
                                                         NULL);
    uint8_t *p = (uint8_t*)(ifaddr + 1);
    for (unsigned i = 0; i < ifaddr->n_paths_more; ++i) {
        const hca_net_addr_t *net = &iface->md->addr.net_more[i];
        p[0] = net->family;
        memcpy(p + 1, &net->port, 2);
        memcpy(p + 3, net->addr, (net->family == HCA_NET_IPV6) ? 16 : 4);
        p += uct_hca_path_packed_len(net);
    }
    return UCS_OK;
}

int uct_hca_iface_is_reachable(const uct_iface_h tl_iface,
                               const uct_device_addr_t *dev_addr,
                               const uct_iface_addr_t *iface_addr)
{
    uct_hca_iface_t *iface = ucs_derived_of(tl_iface, uct_hca_iface_t);

    const uct_hca_iface_addr_t *ifaddr = (const uct_hca_iface_addr_t*)
                                         iface_addr;
    hca_port_addr_t addr;

    if ((dev_addr == NULL) || (iface_addr == NULL)) {
        return 0;
    }
    /* the device knows which of its fabrics reaches that context */
    uct_hca_port_addr(&addr, (const uct_hca_device_addr_t*)dev_addr, ifaddr);
    return hca_port_addr_reachable(iface->md->dev, &addr);
}

/* ---------------------------------------------------------------- rx */

static void uct_hca_rx_desc_init(uct_iface_h tl_iface, void *obj,
                                 uct_mem_h memh)
{
    uct_hca_rx_desc_t *desc = obj;

    desc->lkey = ((uct_hca_memh_t*)memh)->lkey;
}

static void uct_hca_tx_op_init(uct_iface_h tl_iface, void *obj,
                               uct_mem_h memh)
{
    uct_hca_op_t *op = obj;

    op->lkey = ((uct_hca_memh_t*)memh)->lkey;
}

static void *uct_hca_rx_data(uct_hca_iface_t *iface, uct_hca_rx_desc_t *desc)
{
    return UCS_PTR_BYTE_OFFSET(desc + 1, iface->rx_headroom);
}

static int uct_hca_iface_post_rx(uct_hca_iface_t *iface,
                                 uct_hca_rx_desc_t *desc)
{
    hca_recv_wr_t *bad;
    hca_sge_t sge = {
        .addr   = (uintptr_t)uct_hca_rx_data(iface, desc),
        .length = (uint32_t)iface->config.seg_size,
        .lkey   = desc->lkey,
    };
    hca_recv_wr_t wr = {
        .wr_id   = (uintptr_t)desc,
        .sg_list = &sge,
        .num_sge = 1,
    };

    return hca_post_recv(iface->tgt_qp, &wr, &bad);
}

static void uct_hca_iface_release_desc(uct_recv_desc_t *self, void *desc)
{
    /* desc is what the AM handler kept: just after our header */
    ucs_mpool_put(UCS_PTR_BYTE_OFFSET(desc, -sizeof(uct_hca_rx_desc_t)));
}

static void uct_hca_iface_handle_recv(uct_hca_iface_t *iface,
                                      const hca_wc_t *wc)
{
    uct_hca_rx_desc_t *desc = (uct_hca_rx_desc_t*)(uintptr_t)wc->wr_id;
    void *data              = uct_hca_rx_data(iface, desc);
    ucs_status_t status;

    if (ucs_unlikely(wc->status != HCA_WC_SUCCESS)) {
        if (wc->status != HCA_WC_WR_FLUSH_ERR) {
            ucs_warn("hca: receive failed: %s",
                     hca_wc_status_str(wc->status));
            uct_hca_iface_post_rx(iface, desc);
        } else {
            ucs_mpool_put(desc);
        }
        return;
    }

    if (ucs_unlikely(wc->imm_data >= UCT_AM_ID_MAX)) {
        ucs_warn("hca: dropped an active message with id %u", wc->imm_data);
        uct_hca_iface_post_rx(iface, desc);
        return;
    }
    uct_iface_trace_am(&iface->super, UCT_AM_TRACE_TYPE_RECV,
                       (uint8_t)wc->imm_data, data, wc->byte_len, "RX");
    status = uct_iface_invoke_am(&iface->super, (uint8_t)wc->imm_data, data,
                                 wc->byte_len, UCT_CB_PARAM_FLAG_DESC);
    if (status == UCS_INPROGRESS) {
        /* the handler keeps it: give the queue a fresh one */
        desc->release = &iface->release_desc;
        desc          = ucs_mpool_get_inline(&iface->rx_mp);
        if (desc == NULL) {
            ucs_error("hca: out of receive descriptors");
            return;
        }
    }
    uct_hca_iface_post_rx(iface, desc);
}

/* ---------------------------------------------------------------- progress */

/* A completion of the target QP's receive side (else: an ep's send) */
static UCS_F_ALWAYS_INLINE int uct_hca_wc_is_recv(const hca_wc_t *wc)
{
    return (wc->opcode == HCA_WC_RECV) ||
           (wc->opcode == HCA_WC_RECV_RDMA_WITH_IMM);
}

static void uct_hca_iface_handle_send(uct_hca_iface_t *iface,
                                      const hca_wc_t *wc)
{
    uct_hca_op_t *op    = (uct_hca_op_t*)(uintptr_t)wc->wr_id;
    uct_hca_ep_t *ep    = iface->ep_by_qp[HCA_QPN_INDEX(wc->qp_num)];
    ucs_status_t status = uct_hca_status(wc->status);

    if (op != NULL) {
        if (ucs_unlikely(op->ep == NULL)) {
            /* its ep's destroy completed it: the descriptor comes back */
            iface->tx_credits++;
            ucs_mpool_put_inline(op);
            return;
        }
        ucs_list_del(&op->outstanding);
    }
    if ((ep != NULL) && (hca_qp_num(ep->qp) != wc->qp_num)) {
        ep = NULL; /* its ep is gone: what it left completes cancelled */
    }
    if (ucs_unlikely(status != UCS_OK) && (ep != NULL)) {
        if ((status == UCS_ERR_CANCELED) && (ep->status == UCS_OK)) {
            /* flushed ahead of the WR that failed: the device reports the
             * SQ in post order, and a later WR may fail while earlier ones
             * still wait for their answers (a dead tcp connection).  The
             * QP's error is the ep's failure, not a cancel of ours. */
            ucs_status_t cause = uct_hca_status(hca_qp_error(ep->qp));
            if ((cause != UCS_OK) && (cause != UCS_ERR_CANCELED)) {
                status = cause;
            }
        }
        if (status != UCS_ERR_CANCELED) {
            uct_hca_iface_schedule_err(iface, ep, status);
        } else if (UCS_STATUS_IS_ERR(ep->status) &&
                   (ep->status != UCS_ERR_CANCELED)) {
            /* flushed behind the failure: the ep's error, as rc
             * completes every outstanding operation of a failed ep */
            status = ep->status;
        }
    }
    if (op != NULL) {
        iface->tx_credits++;
        uct_hca_ep_complete_op(iface, op, status);
    }
}

void uct_hca_iface_schedule_err(uct_hca_iface_t *iface, uct_hca_ep_t *ep,
                                ucs_status_t status)
{
    if (ep->status == UCS_ERR_CANCELED) {
        /* the user cancelled it (flush with UCT_FLUSH_FLAG_CANCEL) and is
         * closing it: a failure found meanwhile is not reported, as rc */
        return;
    }
    if (ep->status == UCS_OK) {
        ep->status = status;
    }
    if (!ep->err_reported && !ep->err_pending) {
        ep->err_pending = 1;
        iface->failed_eps++;
    }
}

/* Reports failed eps to UCX from progress, never from inside a send. */
static void uct_hca_iface_report_errors(uct_hca_iface_t *iface)
{
    uct_hca_ep_t *ep, *failed;

    while (iface->failed_eps != 0) {
        /* from the start each time: the handler may destroy any ep */
        failed = NULL;
        ucs_list_for_each(ep, &iface->ep_list, list) {
            if (ep->err_pending) {
                failed = ep;
                break;
            }
        }
        if (failed == NULL) {
            break;
        }
        failed->err_pending  = 0;
        failed->err_reported = 1;
        iface->failed_eps--;
        uct_iface_handle_ep_err(&iface->super.super, &failed->super.super,
                                failed->status);
    }
}

/* AMs read in the target's ring: no descriptor, so the handler gets no
 * UCT_CB_PARAM_FLAG_DESC and copies what it keeps. */
static UCS_F_ALWAYS_INLINE unsigned
uct_hca_iface_poll_inplace(uct_hca_iface_t *iface)
{
    unsigned count = 0;
    hca_recv_msg_t msg;

    while ((count < UCT_HCA_POLL_BATCH) &&
           hca_recv_peek(iface->tgt_qp, &msg)) {
        if (ucs_unlikely(msg.imm_data >= UCT_AM_ID_MAX)) {
            ucs_warn("hca: dropped an active message with id %u",
                     msg.imm_data);
            hca_recv_release(iface->tgt_qp, &msg);
            continue;
        }
        uct_iface_trace_am(&iface->super, UCT_AM_TRACE_TYPE_RECV,
                           (uint8_t)msg.imm_data, (void*)msg.data,
                           msg.byte_len, "RX");
        uct_iface_invoke_am(&iface->super, (uint8_t)msg.imm_data,
                            (void*)msg.data, msg.byte_len, 0);
        hca_recv_release(iface->tgt_qp, &msg);
        ++count;
    }
    return count;
}

/* Every UCT_HCA_PEER_CHECK_MS: did a peer's process die?  Without it a
 * sender into a dead peer's ring (tag eager traffic) or its device memory
 * noticed only when the ring filled, or at UCP's keepalive (18-20 s).
 * Only the eps of this iface are checked, and only after the device found
 * a dead peer (one kill(pid, 0) per peer per interval otherwise). */
#define UCT_HCA_PEER_CHECK_MS 100

static UCS_F_NOINLINE void uct_hca_iface_check_peers(uct_hca_iface_t *iface)
{
    ucs_time_t now = ucs_get_time();
    uct_hca_ep_t *ep;
    uint64_t dead;

    if (now < iface->next_peer_check) {
        return;
    }
    iface->next_peer_check = now + ucs_time_from_msec(UCT_HCA_PEER_CHECK_MS);
    dead = hca_device_check_peers(iface->md->dev);
    if (dead == iface->dead_peers) {
        return;
    }
    iface->dead_peers = dead;
    ucs_list_for_each(ep, &iface->ep_list, list) {
        if (ep->status == UCS_OK) {
            uct_hca_ep_peer_check(ep);
        }
    }
}

unsigned uct_hca_iface_progress(uct_iface_h tl_iface)
{
    uct_hca_iface_t *iface = ucs_derived_of(tl_iface, uct_hca_iface_t);
    hca_wc_t wc[UCT_HCA_POLL_BATCH];
    unsigned count;
    uct_hca_ep_t *ep, *tmp;
    ucs_queue_head_t due;
    int n;

    count = uct_hca_iface_poll_inplace(iface);
    n = hca_cq_poll(iface->cq, UCT_HCA_POLL_BATCH, wc);
    if (count == 0) {
        /* the CQ's poll read our sockets (tcp): a message it put into the
         * ring is delivered now, not at the next progress, whose fabric
         * poll would come before the reply on the critical path */
        count = uct_hca_iface_poll_inplace(iface);
    }
    if (ucs_unlikely(n < 0)) {
        ucs_fatal("hca: completion queue overflow on %s",
                  hca_device_name(iface->md->dev));
    }
    for (int i = 0; i < n; ++i) {
        if (uct_hca_wc_is_recv(&wc[i])) {
            uct_hca_iface_handle_recv(iface, &wc[i]);
        } else {
            uct_hca_iface_handle_send(iface, &wc[i]);
        }
    }
    count += (unsigned)n;

    if (!ucs_list_is_empty(&iface->flush_eps)) {
        ucs_queue_head_init(&due);
        ucs_list_for_each_safe(ep, tmp, &iface->flush_eps, flush_list) {
            uct_hca_ep_flush_progress(ep, &due);
        }
        uct_hca_ep_flush_complete(&due); /* no ep is touched after this */
    }
    ucs_arbiter_dispatch(&iface->arbiter, 1, uct_hca_ep_process_pending,
                         &count);
    /* the clock is read once per 1024 calls only */
    if (ucs_unlikely((++iface->progress_calls & 1023) == 0)) {
        uct_hca_iface_check_peers(iface);
    }
    if (ucs_unlikely(iface->failed_eps != 0)) {
        uct_hca_iface_report_errors(iface);
    }
    return count;
}

/* ---------------------------------------------------------------- flush */

static ucs_status_t uct_hca_iface_flush(uct_iface_h tl_iface, unsigned flags,
                                        uct_completion_t *comp)
{
    uct_hca_iface_t *iface = ucs_derived_of(tl_iface, uct_hca_iface_t);
    uct_hca_ep_t *ep;

    if (comp != NULL) {
        return UCS_ERR_UNSUPPORTED;
    }
    /* uct.h: OK or INPROGRESS only (UCP's worker flush fails on anything
     * else).  Requests in pending queues are the caller's; they are waited
     * for, as rc does, not reported as a lack of resources.  A failed ep's
     * queue is descheduled and does not hold the flush. */
    if (!ucs_arbiter_is_empty(&iface->arbiter)) {
        return UCS_INPROGRESS;
    }
    ucs_list_for_each(ep, &iface->ep_list, list) {
        if (hca_qp_outstanding(ep->qp) != 0) {
            return UCS_INPROGRESS;
        }
    }
    return UCS_OK;
}

static ucs_status_t uct_hca_iface_fence(uct_iface_h tl_iface, unsigned flags)
{
    uct_hca_iface_t *iface = ucs_derived_of(tl_iface, uct_hca_iface_t);
    uct_hca_ep_t *ep;

    ucs_list_for_each(ep, &iface->ep_list, list) {
        ep->send_flags |= HCA_SEND_FENCE;
    }
    return UCS_OK;
}

/* ---------------------------------------------------------------- events */

static ucs_status_t uct_hca_iface_event_fd_get(uct_iface_h tl_iface,
                                               int *fd_p)
{
    uct_hca_iface_t *iface = ucs_derived_of(tl_iface, uct_hca_iface_t);

    *fd_p = hca_cq_fd(iface->cq);
    return UCS_OK;
}

static ucs_status_t uct_hca_iface_event_arm(uct_iface_h tl_iface,
                                            unsigned events)
{
    uct_hca_iface_t *iface = ucs_derived_of(tl_iface, uct_hca_iface_t);

    hca_cq_ack_events(iface->cq);
    if (!ucs_arbiter_is_empty(&iface->arbiter) || iface->failed_eps ||
        !ucs_list_is_empty(&iface->flush_eps)) {
        return UCS_ERR_BUSY;
    }
    return (hca_cq_arm(iface->cq) == 0) ? UCS_OK : UCS_ERR_BUSY;
}

/* ---------------------------------------------------------------- class */

static void uct_hca_iface_progress_enable(uct_iface_h tl_iface,
                                          unsigned flags)
{
    uct_hca_iface_t *iface = ucs_derived_of(tl_iface, uct_hca_iface_t);

    uct_base_iface_progress_enable_cb(&iface->super,
                                      (ucs_callback_t)uct_hca_iface_progress,
                                      flags);
}

static uct_iface_ops_t uct_hca_iface_ops = {
    .ep_am_short              = uct_hca_ep_am_short,
    .ep_am_short_iov          = uct_hca_ep_am_short_iov,
    .ep_am_bcopy              = uct_hca_ep_am_bcopy,
    .ep_am_zcopy              = uct_hca_ep_am_zcopy,
    .ep_put_short             = uct_hca_ep_put_short,
    .ep_put_bcopy             = uct_hca_ep_put_bcopy,
    .ep_put_zcopy             = uct_hca_ep_put_zcopy,
    .ep_get_bcopy             = uct_hca_ep_get_bcopy,
    .ep_get_zcopy             = uct_hca_ep_get_zcopy,
    .ep_atomic_cswap64        = uct_hca_ep_atomic_cswap64,
    .ep_atomic_cswap32        = uct_hca_ep_atomic_cswap32,
    .ep_atomic64_post         = uct_hca_ep_atomic64_post,
    .ep_atomic32_post         = uct_hca_ep_atomic32_post,
    .ep_atomic64_fetch        = uct_hca_ep_atomic64_fetch,
    .ep_atomic32_fetch        = uct_hca_ep_atomic32_fetch,
    .ep_pending_add           = uct_hca_ep_pending_add,
    .ep_pending_purge         = uct_hca_ep_pending_purge,
    .ep_flush                 = uct_hca_ep_flush,
    .ep_fence                 = uct_hca_ep_fence,
    .ep_check                 = uct_hca_ep_check,
    .ep_create                = UCS_CLASS_NEW_FUNC_NAME(uct_hca_ep_t),
    .ep_destroy               = UCS_CLASS_DELETE_FUNC_NAME(uct_hca_ep_t),
    .iface_flush              = uct_hca_iface_flush,
    .iface_fence              = uct_hca_iface_fence,
    .iface_progress_enable    = uct_hca_iface_progress_enable,
    .iface_progress_disable   = uct_base_iface_progress_disable,
    .iface_progress           = uct_hca_iface_progress,
    .iface_event_fd_get       = uct_hca_iface_event_fd_get,
    .iface_event_arm          = uct_hca_iface_event_arm,
    .iface_close              = UCS_CLASS_DELETE_FUNC_NAME(uct_hca_iface_t),
    .iface_query              = uct_hca_iface_query,
    .iface_get_device_address = uct_hca_iface_get_device_address,
    .iface_get_address        = uct_hca_iface_get_address,
    .iface_is_reachable       = uct_hca_iface_is_reachable,
};

/* No VFS entries, no ep attributes to query, and no emulated transport
 * error (UCX's tests use ep_invalidate; a real peer failure is reported). */
static void uct_hca_iface_vfs_refresh(uct_iface_h iface)
{
}

static ucs_status_t uct_hca_ep_query(uct_ep_h ep, uct_ep_attr_t *ep_attr)
{
    return UCS_ERR_UNSUPPORTED;
}

static ucs_status_t uct_hca_ep_invalidate(uct_ep_h ep,
                                          UCT_HCA_EP_INVALIDATE_PARAMS_ARG)
{
    return UCS_ERR_UNSUPPORTED;
}

static uct_iface_internal_ops_t uct_hca_iface_internal_ops = {
    .iface_estimate_perf = uct_hca_iface_estimate_perf,
    .iface_vfs_refresh   = uct_hca_iface_vfs_refresh,
    .ep_query            = uct_hca_ep_query,
    .ep_invalidate       = uct_hca_ep_invalidate,
    UCT_HCA_IFACE_INTERNAL_OPS_VERSIONED
};

static ucs_status_t uct_hca_iface_create_qps(uct_hca_iface_t *iface,
                                             const uct_hca_iface_config_t
                                             *config)
{
    hca_srq_init_attr_t srq_attr = {.max_wr = 1, .max_sge = 1};
    hca_qp_init_attr_t qp_attr   = {0};
    hca_qp_attr_t attr           = {0};
    int rc;

    rc = hca_cq_create(iface->md->dev,
                       (int)(config->rx_queue_len + config->tx_cq_len),
                       &iface->cq);
    if (rc != 0) {
        return UCS_ERR_NO_RESOURCE;
    }
    rc = hca_cq_create(iface->md->dev, 1, &iface->ep_rx_cq);
    if (rc != 0) {
        return UCS_ERR_NO_RESOURCE;
    }
    rc = hca_srq_create(iface->md->pd, &srq_attr, &iface->ep_srq);
    if (rc != 0) {
        return UCS_ERR_NO_RESOURCE;
    }
    qp_attr.send_cq      = iface->cq;
    qp_attr.recv_cq      = iface->cq;
    qp_attr.max_send_wr  = 1;
    qp_attr.max_recv_wr  = config->rx_queue_len;
    qp_attr.max_send_sge = 1;
    qp_attr.max_recv_sge = 1;
    /* AMs that fit a ring slot are handled where they landed (one copy
     * end to end); posted descriptors take the larger ones */
    qp_attr.create_flags = HCA_QP_CREATE_RECV_INPLACE;
    rc = hca_qp_create(iface->md->pd, &qp_attr, &iface->tgt_qp);
    if (rc != 0) {
        return UCS_ERR_NO_RESOURCE;
    }
    attr.qp_state = HCA_QPS_INIT;
    attr.access   = HCA_ACCESS_REMOTE_WRITE | HCA_ACCESS_REMOTE_READ |
                    HCA_ACCESS_REMOTE_ATOMIC;
    rc = hca_qp_modify(iface->tgt_qp, &attr,
                       HCA_QP_ATTR_STATE | HCA_QP_ATTR_ACCESS);
    if (rc == 0) {
        attr.qp_state    = HCA_QPS_RTR;
        attr.dest        = iface->md->addr;
        attr.dest_qp_num = HCA_QPN_ANY;
        rc = hca_qp_modify(iface->tgt_qp, &attr,
                           HCA_QP_ATTR_STATE | HCA_QP_ATTR_DEST);
    }
    return (rc == 0) ? UCS_OK : UCS_ERR_IO_ERROR;
}

static void uct_hca_iface_destroy_qps(uct_hca_iface_t *iface)
{
    if (iface->tgt_qp != NULL) {
        hca_qp_destroy(iface->tgt_qp);
    }
    if (iface->ep_srq != NULL) {
        hca_srq_destroy(iface->ep_srq);
    }
    if (iface->ep_rx_cq != NULL) {
        hca_cq_destroy(iface->ep_rx_cq);
    }
    if (iface->cq != NULL) {
        hca_cq_destroy(iface->cq);
    }
}

static UCS_CLASS_INIT_FUNC(uct_hca_iface_t, uct_md_h tl_md,
                           uct_worker_h worker,
                           const uct_iface_params_t *params,
                           const uct_iface_config_t *tl_config)
{
    const uct_hca_iface_config_t *config =
            ucs_derived_of(tl_config, uct_hca_iface_config_t);
    uct_hca_md_t *md = ucs_derived_of(tl_md, uct_hca_md_t);
    size_t payload_offset, align, align_offset;
    hca_device_attr_t dattr;
    ucs_status_t status;
    unsigned i;

    UCS_CLASS_CALL_SUPER_INIT(uct_base_iface_t, &uct_hca_iface_ops,
                              &uct_hca_iface_internal_ops, tl_md, worker,
                              params, tl_config
                              UCS_STATS_ARG((params->field_mask &
                                             UCT_IFACE_PARAM_FIELD_STATS_ROOT) ?
                                            params->stats_root : NULL)
                              UCS_STATS_ARG(UCT_HCA_NAME));

    hca_device_query(md->dev, &dattr);
    self->md                  = md;
    self->rx_headroom         = (params->field_mask &
                                 UCT_IFACE_PARAM_FIELD_RX_HEADROOM) ?
                                params->rx_headroom : 0;
    self->config.seg_size     = config->seg_size;
    self->config.rx_queue_len = config->rx_queue_len;
    self->config.tx_queue_len = config->tx_queue_len;
    /* inline data is copied into every WQE's inline buffer: keep that
     * small; larger AM/put bcopy still go out in one ring slot from the
     * registered bounce buffer */
    self->config.max_inline   = ucs_min(dattr.max_inline_data,
                                        UCT_HCA_MAX_INLINE);
    self->config.max_zcopy    = dattr.max_msg_size;
    self->config.get_min_zcopy = ucs_min(config->get_min_zcopy,
                                         dattr.max_msg_size);
    self->config.get_bcopy     = 1;
#if !UCT_HCA_UCP_PROTO_V2_DEFAULT
    if (uct_hca_ucp_proto_v2_requested()) {
        /* UCP 1.13-1.15's protocols v2 pick get/bcopy for any datatype,
         * and its send function takes contiguous data only
         * (ucp/rma/get_offload.c: no datatype check; the iov get then
         * aborts in datatype_iter.inl, "dt_class == UCP_DATATYPE_CONTIG";
         * 1.16 gave that protocol a dt_mask).  Zero-copy takes every
         * datatype at every size: it is what those versions get here. */
        self->config.get_bcopy     = 0;
        self->config.get_min_zcopy = 0;
    }
#endif
    self->config.bcopy_in_slot = (config->seg_size <=
                                  dattr.max_inline_data);
    self->tx_credits          = config->tx_cq_len;
    self->failed_eps          = 0;
    self->progress_calls      = 0;
    self->next_peer_check     = 0;
    self->dead_peers          = 0;
    self->cq                  = NULL;
    self->ep_srq              = NULL;
    self->ep_rx_cq            = NULL;
    self->tgt_qp              = NULL;
    self->release_desc.cb     = uct_hca_iface_release_desc;
    ucs_list_head_init(&self->ep_list);
    ucs_list_head_init(&self->flush_eps);
    ucs_arbiter_init(&self->arbiter);

    if ((config->seg_size < 64) || (config->seg_size > UINT32_MAX) ||
        (config->rx_queue_len == 0) || (config->tx_queue_len == 0) ||
        (config->tx_cq_len == 0)) {
        ucs_error("hca: invalid SEG_SIZE/RX_QUEUE_LEN/TX_QUEUE_LEN/TX_CQ_LEN");
        return UCS_ERR_INVALID_PARAM;
    }

    self->ep_by_qp = ucs_calloc(UCT_HCA_MAX_EPS, sizeof(*self->ep_by_qp),
                                "hca_ep_by_qp");
    if (self->ep_by_qp == NULL) {
        return UCS_ERR_NO_MEMORY;
    }

    /* am_alignment applies to AMs delivered in a descriptor
     * (UCT_CB_PARAM_FLAG_DESC); the ones read in place carry no flag */
    payload_offset = sizeof(uct_hca_rx_desc_t) + self->rx_headroom;
    status = uct_iface_param_am_alignment(params, config->seg_size,
                                          payload_offset, payload_offset,
                                          &align, &align_offset);
    if (status != UCS_OK) {
        goto err_free_map;
    }
    status = uct_iface_mpool_init(&self->super, &self->rx_mp,
                                  payload_offset + config->seg_size,
                                  align_offset, align, &config->mp,
                                  config->rx_queue_len, uct_hca_rx_desc_init,
                                  "hca_rx_desc");
    if (status != UCS_OK) {
        goto err_free_map;
    }
    status = uct_iface_mpool_init(&self->super, &self->tx_mp,
                                  sizeof(uct_hca_op_t) + config->seg_size,
                                  sizeof(uct_hca_op_t),
                                  UCS_SYS_CACHE_LINE_SIZE, &config->mp, 128,
                                  uct_hca_tx_op_init, "hca_tx_op");
    if (status != UCS_OK) {
        goto err_rx_mp;
    }

    status = uct_hca_iface_create_qps(self, config);
    if (status != UCS_OK) {
        goto err_qps;
    }

    for (i = 0; i < config->rx_queue_len; ++i) {
        uct_hca_rx_desc_t *desc = ucs_mpool_get(&self->rx_mp);
        if ((desc == NULL) || (uct_hca_iface_post_rx(self, desc) != 0)) {
            if (desc != NULL) {
                ucs_mpool_put(desc);
            }
            ucs_error("hca: cannot post receive descriptors");
            status = UCS_ERR_NO_MEMORY;
            goto err_qps;
        }
    }
    ucs_debug("hca: iface %p on %s, target qpn 0x%x", self,
              hca_device_name(md->dev), hca_qp_num(self->tgt_qp));
    return UCS_OK;

err_qps:
    uct_hca_iface_destroy_qps(self);
    ucs_mpool_cleanup(&self->tx_mp, 0);
err_rx_mp:
    ucs_mpool_cleanup(&self->rx_mp, 0);
err_free_map:
    ucs_free(self->ep_by_qp);
    return status;
}

static UCS_CLASS_CLEANUP_FUNC(uct_hca_iface_t)
{
    uct_base_iface_progress_disable(&self->super.super,
                                    UCT_PROGRESS_SEND | UCT_PROGRESS_RECV);
    /* the target QP's receive descriptors come back flushed; operations
     * of eps destroyed since the last progress give their descriptors
     * back (their completions were called by the destroy) */
    hca_qp_modify(self->tgt_qp,
                  &(hca_qp_attr_t){.qp_state = HCA_QPS_ERR},
                  HCA_QP_ATTR_STATE);
    {
        hca_wc_t wc[UCT_HCA_POLL_BATCH];
        int n;
        while ((n = hca_cq_poll(self->cq, UCT_HCA_POLL_BATCH, wc)) > 0) {
            for (int i = 0; i < n; ++i) {
                if (uct_hca_wc_is_recv(&wc[i])) {
                    ucs_mpool_put((void*)(uintptr_t)wc[i].wr_id);
                } else {
                    uct_hca_iface_handle_send(self, &wc[i]);
                }
            }
        }
    }
    uct_hca_iface_destroy_qps(self);
    ucs_mpool_cleanup(&self->tx_mp, 1);
    ucs_mpool_cleanup(&self->rx_mp, 0);
    ucs_arbiter_cleanup(&self->arbiter);
    ucs_free(self->ep_by_qp);
}

UCS_CLASS_DEFINE(uct_hca_iface_t, uct_base_iface_t);

static UCS_CLASS_DEFINE_NEW_FUNC(uct_hca_iface_t, uct_iface_t, uct_md_h,
                                 uct_worker_h, const uct_iface_params_t*,
                                 const uct_iface_config_t*);
static UCS_CLASS_DEFINE_DELETE_FUNC(uct_hca_iface_t, uct_iface_t);

static ucs_status_t
uct_hca_query_tl_devices(uct_md_h tl_md,
                         uct_tl_device_resource_t **tl_devices_p,
                         unsigned *num_tl_devices_p)
{
    uct_hca_md_t *md = ucs_derived_of(tl_md, uct_hca_md_t);
    uct_tl_device_resource_t *device;

    device = ucs_calloc(1, sizeof(*device), "hca_device");
    if (device == NULL) {
        return UCS_ERR_NO_MEMORY;
    }
    ucs_snprintf_zero(device->name, sizeof(device->name), "%s",
                      hca_device_name(md->dev));
    /* A device that reaches other hosts is a network device, as rc's and
     * tcp's are: UCP packs only NET devices into the addresses it gives
     * peers on other hosts (UCP_WORKER_ADDRESS_FLAG_NET_ONLY, which Open
     * MPI's pml ucx uses for remote ranks), and UCX_NET_DEVICES selects
     * it.  Without a listener (UCX_HCA_FABRIC=shm, or none could be made)
     * it serves this host only, as mm does. */
    device->type       = (md->addr.net.family != HCA_NET_NONE) ?
                         UCT_DEVICE_TYPE_NET : UCT_DEVICE_TYPE_SHM;
    device->sys_device = UCS_SYS_DEVICE_ID_UNKNOWN;
    *tl_devices_p      = device;
    *num_tl_devices_p  = 1;
    return UCS_OK;
}

UCT_TL_DEFINE_ENTRY(&uct_hca_component, hca, uct_hca_query_tl_devices,
                    uct_hca_iface_t, "HCA_", uct_hca_iface_config_table,
                    uct_hca_iface_config_t);

/* A constructor, not UCS_MODULE_INIT: under LD_PRELOAD into stock UCX 1.13
 * only ELF constructors run. */
UCT_SINGLE_TL_INIT(&uct_hca_component, hca, ctor,,)
