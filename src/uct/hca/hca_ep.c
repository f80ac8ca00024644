/*
 * hca_ep.c - hca endpoints: one QP connected to a remote iface's target
 * QP.  Every UCT operation becomes one work request.
 *
 * Completion rules: short and bcopy puts, AM short/bcopy up to the inline
 * size, and posted atomics are unsignalled - on the intra-host paths the
 * device has placed them when the post returns.  Zero-copy operations,
 * gets, fetching atomics and bounce-buffer sends are signalled; the CQE
 * (wr_id = uct_hca_op_t) completes them from progress.
 */
#include "hca_uct.h"
#include "hca_trace.h"

#include <uct/base/uct_iov.inl>
#include <ucs/debug/log.h>
#include <errno.h>

static UCS_F_ALWAYS_INLINE uct_hca_iface_t *uct_hca_ep_iface(uct_hca_ep_t *ep)
{
    return ucs_derived_of(ep->super.super.iface, uct_hca_iface_t);
}

/*
 * What a post on a failed ep returns.  Until the failure is reported (from
 * progress), a post without a completion (AM and put short, inline bcopy,
 * atomic posts) is accepted and lost, as one into a dead peer's ring (mm)
 * or socket buffer (tcp): the caller learns of the failure from the error
 * callback, not from a send (UCX's test_uct_peer_failure_keepalive.
 * killed_post_am).  As many as the send queue holds, then NO_RESOURCE, as
 * on a full ring: a caller that sends until it is refused stops, and its
 * pending requests wait for the purge that follows the report.  A post
 * with a completion, and every post after the report, returns the failure.
 */
static UCS_F_NOINLINE ucs_status_t uct_hca_ep_failed_post(uct_hca_ep_t *ep,
                                                          int has_comp)
{
    if (has_comp || ep->err_reported || !ep->err_pending) {
        return ep->status;
    }
    if (ep->lost_posts < uct_hca_ep_iface(ep)->config.tx_queue_len) {
        ep->lost_posts++;
        return UCS_OK;
    }
    ep->no_resource = 1;
    return UCS_ERR_NO_RESOURCE;
}

/* A post the device refused (-errno). */
static UCS_F_NOINLINE ucs_status_t uct_hca_ep_post_error(uct_hca_ep_t *ep,
                                                         int rc, int has_comp)
{
    ucs_status_t status = uct_hca_errno_status(rc);

    if (status == UCS_ERR_NO_RESOURCE) {
        ep->no_resource = 1;
        return status;
    }
    if (rc == -ECONNRESET) {
        /* the peer is gone: the ep fails, the error reaches UCX from
         * progress, and every operation after it returns the same status */
        uct_hca_iface_schedule_err(uct_hca_ep_iface(ep), ep, status);
        return uct_hca_ep_failed_post(ep, has_comp);
    }
    return status; /* a request the device rejects: the ep stays usable */
}

/* The QP is in ERR but no error completion was polled yet: fail the ep now
 * with the error that completion will carry, so that a caller sending
 * until the send stops returning UCS_OK terminates (posts into a QP in
 * ERR are accepted and flushed, as on verbs). */
static UCS_F_NOINLINE ucs_status_t uct_hca_ep_qp_failed(uct_hca_ep_t *ep,
                                                        int has_comp)
{
    ucs_status_t status = uct_hca_status(hca_qp_error(ep->qp));

    if (status == UCS_ERR_CANCELED) {
        /* moved to ERR by us (flush cancel, destroy): nothing to report */
        if (ep->status == UCS_OK) {
            ep->status = UCS_ERR_CANCELED;
        }
        return ep->status;
    }
    uct_hca_iface_schedule_err(uct_hca_ep_iface(ep), ep, status);
    return uct_hca_ep_failed_post(ep, has_comp);
}

/* Posts one WR; has_comp: the caller's operation has a completion (what
 * a failed ep answers: uct_hca_ep_failed_post). */
static UCS_F_ALWAYS_INLINE ucs_status_t
uct_hca_ep_post_ex(uct_hca_ep_t *ep, hca_send_wr_t *wr, int has_comp)
{
    hca_send_wr_t *bad;
    int rc;

    if (ucs_unlikely(ep->status != UCS_OK)) {
        return uct_hca_ep_failed_post(ep, has_comp);
    }
    if (ucs_unlikely(!ucs_arbiter_group_is_empty(&ep->arb_group) &&
                     !ep->in_pending)) {
        /* queued sends go first: a new one must not overtake them */
        return UCS_ERR_NO_RESOURCE;
    }
    if (ucs_unlikely(hca_qp_state(ep->qp) == HCA_QPS_ERR)) {
        return uct_hca_ep_qp_failed(ep, has_comp);
    }
    wr->send_flags |= ep->send_flags;
    rc = hca_post_send(ep->qp, wr, &bad);
    if (ucs_likely(rc == 0)) {
        ep->send_flags = 0;
        return UCS_OK;
    }
    return uct_hca_ep_post_error(ep, rc, has_comp);
}

/* A WR with HCA_SEND_DEFER_SIGNAL carries a completion (post_op's); one
 * without is complete when posted. */
static UCS_F_ALWAYS_INLINE ucs_status_t
uct_hca_ep_post(uct_hca_ep_t *ep, hca_send_wr_t *wr)
{
    return uct_hca_ep_post_ex(ep, wr, !!(wr->send_flags &
                                         HCA_SEND_DEFER_SIGNAL));
}

/* The direct send path may be tried: not failed, and not overtaking the
 * pending queue. */
static UCS_F_ALWAYS_INLINE int uct_hca_ep_direct_ok(uct_hca_ep_t *ep)
{
    return ucs_likely(ep->status == UCS_OK) &&
           (ucs_arbiter_group_is_empty(&ep->arb_group) || ep->in_pending);
}

/* A slot of the target's ring through the QP's fast send path (cached at
 * connect: one call into the device).  0, -EBUSY (the path does not
 * apply: post a WR), -EAGAIN (full) or -ECONNRESET (full, peer gone). */
static UCS_F_ALWAYS_INLINE int
uct_hca_ep_reserve(uct_hca_ep_t *ep, uint32_t length_hint,
                   hca_send_slot_t *slot)
{
    int rc = ep->fast->send_reserve(ep->qp, length_hint, slot);

    if (ucs_unlikely(rc == -EAGAIN)) {
        rc = hca_qp_send_blocked(ep->qp);
    }
    return rc;
}

/* Publishes a reserved ring slot as the AM; the send is then complete
 * (an idle send queue also satisfies a pending fence). */
static UCS_F_ALWAYS_INLINE void
uct_hca_ep_am_commit(uct_hca_ep_t *ep, hca_send_slot_t *slot, uint8_t id,
                     size_t length)
{
    ep->fast->send_commit(ep->qp, slot, (uint32_t)length, HCA_WR_SEND_WITH_IMM, id);
    ep->send_flags = 0;
}

/* An AM gathered from SGEs straight into a slot of the target's ring.
 * 0 sent; -EBUSY the direct path does not apply (post a WR); else the
 * device's answer for uct_hca_ep_post_error(). */
static UCS_F_ALWAYS_INLINE int
uct_hca_ep_am_direct_sge(uct_hca_ep_t *ep, uint8_t id, const hca_sge_t *sge,
                         int num_sge, size_t length)
{
    hca_send_slot_t slot;
    uint8_t *p;
    int rc;

    if (!uct_hca_ep_direct_ok(ep)) {
        return -EBUSY;
    }
    rc = uct_hca_ep_reserve(ep, (uint32_t)length, &slot);
    if (ucs_unlikely(rc != 0)) {
        return rc;
    }
    if (ucs_unlikely(length > slot.max_length)) {
        ep->fast->send_cancel(ep->qp, &slot); /* seg_size above the slot */
        return -EBUSY;
    }
    p = slot.data;
    for (int i = 0; i < num_sge; ++i) {
        if (sge[i].length != 0) { /* a zero-length header may be NULL */
            memcpy(p, (void*)(uintptr_t)sge[i].addr, sge[i].length);
            p += sge[i].length;
        }
    }
    uct_hca_ep_am_commit(ep, &slot, id, length);
    return 0;
}

/* A signalled operation descriptor, or NULL if none may be in flight. */
static UCS_F_ALWAYS_INLINE uct_hca_op_t *
uct_hca_ep_op_get(uct_hca_ep_t *ep, uct_hca_op_type_t type,
                  uct_completion_t *comp)
{
    uct_hca_iface_t *iface = uct_hca_ep_iface(ep);
    uct_hca_op_t *op;

    if (ucs_unlikely(ep->status != UCS_OK) &&
        (ep->err_reported || !ep->err_pending)) {
        /* failed and reported (or cancelled): uct_hca_ep_no_op() tells
         * the status; before the report the post decides
         * (uct_hca_ep_failed_post) */
        return NULL;
    }
    if (ucs_unlikely(iface->tx_credits == 0)) {
        ep->no_resource = 1;
        return NULL;
    }
    op = ucs_mpool_get_inline(&iface->tx_mp);
    if (ucs_unlikely(op == NULL)) {
        ep->no_resource = 1; /* pending_add must queue, not answer BUSY */
        return NULL;
    }
    op->type = type;
    op->ep   = ep;
    op->comp = comp;
    return op;
}

/* Why uct_hca_ep_op_get() found no descriptor: the ep failed (what a post
 * then returns: uct_hca_ep_failed_post), or no resources */
static UCS_F_ALWAYS_INLINE ucs_status_t uct_hca_ep_no_op(uct_hca_ep_t *ep,
                                                         int has_comp)
{
    if (ucs_unlikely(ep->status != UCS_OK)) {
        return uct_hca_ep_failed_post(ep, has_comp);
    }
    return UCS_ERR_NO_RESOURCE;
}

/* pack_cb wrote more than a bounce buffer holds: the op goes back */
static UCS_F_NOINLINE ucs_status_t
uct_hca_ep_bcopy_overrun(uct_hca_op_t *op, const char *what, size_t length,
                         size_t seg_size)
{
    ucs_mpool_put_inline(op);
    ucs_error("%s: packed %zu bytes, above seg_size %zu", what, length,
              seg_size);
    return UCS_ERR_INVALID_PARAM;
}

/* What a finished op leaves behind: unpacked data, the fetched value. */
static UCS_F_ALWAYS_INLINE void uct_hca_ep_finish_op(uct_hca_op_t *op,
                                                     ucs_status_t status)
{
    switch (op->type) {
    case UCT_HCA_OP_GET_BCOPY:
        if (status == UCS_OK) {
            op->unpack_cb(op->unpack_arg, uct_hca_op_buffer(op), op->length);
        }
        break;
    case UCT_HCA_OP_FETCH:
        if (status == UCS_OK) {
            if (op->size == sizeof(uint32_t)) {
                *(uint32_t*)op->result = (uint32_t)op->value;
            } else {
                *(uint64_t*)op->result = op->value;
            }
        }
        break;
    default:
        break;
    }
}

/* Posts a signalled WR for op; releases op on failure. */
static UCS_F_ALWAYS_INLINE ucs_status_t
uct_hca_ep_post_op(uct_hca_ep_t *ep, hca_send_wr_t *wr, uct_hca_op_t *op)
{
    uct_hca_iface_t *iface = uct_hca_ep_iface(ep);
    ucs_status_t status;

    wr->wr_id       = (uintptr_t)op;
    wr->send_flags |= HCA_SEND_DEFER_SIGNAL;
    status          = uct_hca_ep_post(ep, wr);
    if (ucs_unlikely(status != UCS_OK)) {
        if ((op->type == UCT_HCA_OP_BUFFER) && (ep->status != UCS_OK) &&
            (status != UCS_ERR_NO_RESOURCE)) {
            /* a bcopy send through a bounce buffer: no completion of the
             * caller's, lost as a short one */
            status = uct_hca_ep_failed_post(ep, 0);
        }
        ucs_mpool_put_inline(op);
        return status;
    }
    if (!(wr->send_flags & HCA_SEND_DEFER_SIGNAL)) {
        /* completed inside the post (intra-host paths): no CQE comes */
        uct_hca_ep_finish_op(op, UCS_OK);
        ucs_mpool_put_inline(op);
        return UCS_OK;
    }
    iface->tx_credits--;
    ucs_list_add_tail(&ep->ops, &op->outstanding);
    return UCS_INPROGRESS;
}

void uct_hca_ep_complete_op(uct_hca_iface_t *iface, uct_hca_op_t *op,
                            ucs_status_t status)
{
    uct_hca_ep_finish_op(op, status);
    if (op->comp != NULL) {
        uct_invoke_completion(op->comp, status);
    }
    ucs_mpool_put_inline(op);
}

static UCS_F_ALWAYS_INLINE uint32_t uct_hca_lkey(uct_mem_h memh)
{
    return (memh == UCT_MEM_HANDLE_NULL) ? 0 :
           ((uct_hca_memh_t*)memh)->lkey;
}

/* iov -> SGEs after `first` prefilled ones; returns the SGE count. */
static UCS_F_ALWAYS_INLINE int
uct_hca_ep_iov_to_sge(const uct_iov_t *iov, size_t iovcnt, hca_sge_t *sge,
                      int first, size_t *length_p)
{
    int n = first;

    for (size_t i = 0; i < iovcnt; ++i) {
        size_t len = uct_iov_get_length(&iov[i]);
        if (len == 0) {
            continue;
        }
        sge[n].addr   = (uintptr_t)iov[i].buffer;
        sge[n].length = (uint32_t)len;
        sge[n].lkey   = uct_hca_lkey(iov[i].memh);
        *length_p    += len;
        ++n;
    }
    return n;
}

/* ---------------------------------------------------------------- AM */

/* An AM sent from pieces (header and payload, an iov) traced as the
 * receiver sees it, one buffer: what UCX's AM tracer (UCP's, or a test's)
 * decodes.  Only with the data level on; at most max_inline bytes. */
static UCS_F_NOINLINE void
uct_hca_ep_trace_am_pieces(uct_hca_iface_t *iface, uint8_t id,
                           const hca_sge_t *sge, int num_sge,
                           const char *what)
{
    /* not "buf": uct_iface_trace_am declares one of its own */
    char msg[UCT_HCA_MAX_INLINE];
    size_t length = 0;

    for (int i = 0; i < num_sge; ++i) {
        size_t n = ucs_min(sge[i].length, sizeof(msg) - length);
        if (n != 0) {
            memcpy(msg + length, (const void*)(uintptr_t)sge[i].addr, n);
        }
        length += n;
    }
    uct_iface_trace_am(&iface->super, UCT_AM_TRACE_TYPE_SEND, id, msg, length,
                       "%s", what);
}


/* am_short through a WR: the send queue is busy or the ring is full. */
static UCS_F_NOINLINE ucs_status_t
uct_hca_ep_am_short_wr(uct_hca_ep_t *ep, uint8_t id, uint64_t header,
                       const void *payload, unsigned length)
{
    hca_sge_t sge[2]       = {
        {.addr = (uintptr_t)&header, .length = sizeof(header)},
        {.addr = (uintptr_t)payload, .length = length},
    };
    hca_send_wr_t wr       = {
        .sg_list    = sge,
        .num_sge    = 2,
        .opcode     = HCA_WR_SEND_WITH_IMM,
        .send_flags = HCA_SEND_INLINE,
        .imm_data   = id,
    };

    return uct_hca_ep_post(ep, &wr);
}

static UCS_F_ALWAYS_INLINE ucs_status_t
uct_hca_ep_am_short_send(uct_ep_h tl_ep, uint8_t id, uint64_t header,
                         const void *payload, unsigned length)
{
    uct_hca_ep_t *ep       = ucs_derived_of(tl_ep, uct_hca_ep_t);
    uct_hca_iface_t *iface = uct_hca_ep_iface(ep);
    int rc;

    UCT_CHECK_AM_ID(id);
    UCT_CHECK_LENGTH(length + sizeof(header), 0, iface->config.max_inline,
                     "am_short");
    if (uct_hca_ep_direct_ok(ep)) {
        /* header and payload straight into the target's ring: one call */
        rc = ep->fast->send_short(ep->qp, &header, sizeof(header), payload,
                                  length, HCA_WR_SEND_WITH_IMM, id);
        if (ucs_likely(rc == 0)) {
            ep->send_flags = 0;
            return UCS_OK;
        }
        if (rc == -EAGAIN) {
            rc = hca_qp_send_blocked(ep->qp);
        }
        if (rc != -EBUSY) {
            return uct_hca_ep_post_error(ep, rc, 0); /* ring full, peer gone */
        }
    }
    return uct_hca_ep_am_short_wr(ep, id, header, payload, length);
}

static UCS_F_ALWAYS_INLINE ucs_status_t
uct_hca_ep_am_short_iov_send(uct_ep_h tl_ep, uint8_t id, const uct_iov_t *iov,
                             size_t iovcnt)
{
    uct_hca_ep_t *ep       = ucs_derived_of(tl_ep, uct_hca_ep_t);
    uct_hca_iface_t *iface = uct_hca_ep_iface(ep);
    hca_sge_t sge[UCT_HCA_MAX_IOV];
    size_t length          = 0;
    hca_send_wr_t wr       = {
        .sg_list    = sge,
        .opcode     = HCA_WR_SEND_WITH_IMM,
        .send_flags = HCA_SEND_INLINE,
        .imm_data   = id,
    };

    int rc;

    UCT_CHECK_AM_ID(id);
    UCT_CHECK_IOV_SIZE(iovcnt, UCT_HCA_MAX_IOV, "am_short_iov");
    wr.num_sge = uct_hca_ep_iov_to_sge(iov, iovcnt, sge, 0, &length);
    UCT_CHECK_LENGTH(length, 0, iface->config.max_inline, "am_short_iov");
    rc = uct_hca_ep_am_direct_sge(ep, id, sge, wr.num_sge, length);
    if (ucs_likely(rc == 0)) {
        return UCS_OK;
    }
    if (rc != -EBUSY) {
        return uct_hca_ep_post_error(ep, rc, 0); /* ring full, peer gone */
    }
    return uct_hca_ep_post(ep, &wr);
}

void uct_hca_ep_peer_check(uct_hca_ep_t *ep)
{
    if (!hca_qp_check_peer(ep->qp)) {
        uct_hca_iface_schedule_err(uct_hca_ep_iface(ep), ep,
                                   UCS_ERR_ENDPOINT_TIMEOUT);
    }
}

ssize_t uct_hca_ep_am_bcopy(uct_ep_h tl_ep, uint8_t id,
                            uct_pack_callback_t pack_cb, void *arg,
                            unsigned flags)
{
    uct_hca_ep_t *ep       = ucs_derived_of(tl_ep, uct_hca_ep_t);
    uct_hca_iface_t *iface = uct_hca_ep_iface(ep);
    hca_send_wr_t wr       = {.opcode = HCA_WR_SEND_WITH_IMM, .imm_data = id};
    ucs_status_t status;
    hca_send_slot_t slot;
    uct_hca_op_t *op;
    hca_sge_t sge;
    size_t length;
    int rc;

    UCT_CHECK_AM_ID(id);
    if (ucs_unlikely(flags & UCT_SEND_FLAG_PEER_CHECK)) {
        /* a store into a dead peer's ring would still "succeed" */
        uct_hca_ep_peer_check(ep);
    }
    if (iface->config.bcopy_in_slot && uct_hca_ep_direct_ok(ep)) {
        /* packed straight into the target's ring (seg_size fits a slot) */
        rc = uct_hca_ep_reserve(ep, (uint32_t)iface->config.seg_size,
                              &slot);
        if (ucs_likely(rc == 0)) {
            length = pack_cb(slot.data, arg);
            if (ucs_unlikely(length > slot.max_length)) {
                ucs_fatal("am_bcopy: packed %zu bytes, above seg_size %zu",
                          length, iface->config.seg_size);
            }
            uct_iface_trace_am(&iface->super, UCT_AM_TRACE_TYPE_SEND, id,
                               slot.data, length, "TX: AM_BCOPY");
            if (ucs_unlikely(length > iface->config.seg_size)) {
                ep->fast->send_cancel(ep->qp, &slot);
                ucs_error("am_bcopy: packed %zu bytes, above seg_size %zu",
                          length, iface->config.seg_size);
                return UCS_ERR_INVALID_PARAM;
            }
            uct_hca_ep_am_commit(ep, &slot, id, length);
            return (ssize_t)length;
        }
        if (rc != -EBUSY) {
            status = uct_hca_ep_post_error(ep, rc, 0);
            if (status != UCS_OK) {
                return (ssize_t)status;
            }
            /* failed, not yet reported: packed and lost below */
        }
    }
    op = uct_hca_ep_op_get(ep, UCT_HCA_OP_BUFFER, NULL);
    if (ucs_unlikely(op == NULL)) {
        return uct_hca_ep_no_op(ep, 0);
    }
    length = pack_cb(uct_hca_op_buffer(op), arg);
    if (ucs_unlikely(length > iface->config.seg_size)) {
        return uct_hca_ep_bcopy_overrun(op, "am_bcopy", length,
                                        iface->config.seg_size);
    }
    sge.addr    = (uintptr_t)uct_hca_op_buffer(op);
    sge.length  = (uint32_t)length;
    sge.lkey    = op->lkey;
    wr.sg_list  = &sge;
    wr.num_sge  = 1;
    if (length <= iface->config.max_inline) {
        /* copied into the target's ring by the post: buffer free now */
        wr.send_flags = HCA_SEND_INLINE;
        status        = uct_hca_ep_post(ep, &wr);
        if (status == UCS_OK) { /* traced once, when sent */
            uct_iface_trace_am(&iface->super, UCT_AM_TRACE_TYPE_SEND, id,
                               uct_hca_op_buffer(op), length, "TX: AM_BCOPY");
        }
        ucs_mpool_put_inline(op);
    } else {
        status = uct_hca_ep_post_op(ep, &wr, op);
        if (!UCS_STATUS_IS_ERR(status)) { /* in flight: its buffer lives */
            uct_iface_trace_am(&iface->super, UCT_AM_TRACE_TYPE_SEND, id,
                               (const void*)(uintptr_t)sge.addr, length,
                               "TX: AM_BCOPY");
        }
    }
    return UCS_STATUS_IS_ERR(status) ? (ssize_t)status : (ssize_t)length;
}

static UCS_F_ALWAYS_INLINE ucs_status_t
uct_hca_ep_am_zcopy_send(uct_ep_h tl_ep, uint8_t id, const void *header,
                         unsigned header_length, const uct_iov_t *iov,
                         size_t iovcnt, unsigned flags, uct_completion_t *comp)
{
    uct_hca_ep_t *ep       = ucs_derived_of(tl_ep, uct_hca_ep_t);
    uct_hca_iface_t *iface = uct_hca_ep_iface(ep);
    hca_sge_t sge[UCT_HCA_MAX_IOV + 1];
    size_t length          = header_length;
    hca_send_wr_t wr       = {
        .sg_list  = sge,
        .opcode   = HCA_WR_SEND_WITH_IMM,
        .imm_data = id,
    };
    uct_hca_op_t *op;
    int rc;

    UCT_CHECK_AM_ID(id);
    UCT_CHECK_IOV_SIZE(iovcnt, UCT_HCA_MAX_IOV, "am_zcopy");
    UCT_CHECK_LENGTH(header_length, 0, 128, "am_zcopy header");
    if (ucs_unlikely(flags & UCT_SEND_FLAG_PEER_CHECK)) {
        uct_hca_ep_peer_check(ep);
    }

    sge[0].addr   = (uintptr_t)header;
    sge[0].length = header_length;
    sge[0].lkey   = 0;
    wr.num_sge    = uct_hca_ep_iov_to_sge(iov, iovcnt, sge, 1, &length);
    UCT_CHECK_LENGTH(length, 0, iface->config.seg_size, "am_zcopy");

    /* one copy into the target's ring either way: done at once, as an
     * am_bcopy (no descriptor, no completion to wait for) */
    rc = uct_hca_ep_am_direct_sge(ep, id, sge, wr.num_sge, length);
    if (ucs_likely(rc == 0)) {
        return UCS_OK;
    }
    if (rc != -EBUSY) {
        return uct_hca_ep_post_error(ep, rc, 1);
    }
    if (length <= iface->config.max_inline) {
        /* small enough to be copied into the ring at post: done (a
         * zero-copy send: a failed ep answers its failure) */
        wr.send_flags = HCA_SEND_INLINE;
        return uct_hca_ep_post_ex(ep, &wr, 1);
    }
    op = uct_hca_ep_op_get(ep, UCT_HCA_OP_COMP, comp);
    if (ucs_unlikely(op == NULL)) {
        return uct_hca_ep_no_op(ep, 1);
    }
    /* the header must live in registered memory until completion */
    if (header_length != 0) { /* header may be NULL then */
        memcpy(uct_hca_op_buffer(op), header, header_length);
    }
    sge[0].addr = (uintptr_t)uct_hca_op_buffer(op);
    sge[0].lkey = op->lkey;
    return uct_hca_ep_post_op(ep, &wr, op);
}

/* The AMs are traced once each, when sent: one refused (NO_RESOURCE, and
 * sent again later) is not (UCX's AM tracer count, as rc's and mm's, is
 * one per message). */
ucs_status_t uct_hca_ep_am_short(uct_ep_h tl_ep, uint8_t id, uint64_t header,
                                 const void *payload, unsigned length)
{
    ucs_status_t status = uct_hca_ep_am_short_send(tl_ep, id, header, payload,
                                                   length);

    if (ucs_log_is_enabled(UCS_LOG_LEVEL_TRACE_DATA) && (status == UCS_OK)) {
        const hca_sge_t msg[2] = {
            {.addr = (uintptr_t)&header, .length = sizeof(header)},
            {.addr = (uintptr_t)payload, .length = length},
        };
        uct_hca_ep_trace_am_pieces(uct_hca_ep_iface(ucs_derived_of(
                                           tl_ep, uct_hca_ep_t)),
                                   id, msg, 2, "TX: AM_SHORT");
    }
    return status;
}

ucs_status_t uct_hca_ep_am_short_iov(uct_ep_h tl_ep, uint8_t id,
                                     const uct_iov_t *iov, size_t iovcnt)
{
    ucs_status_t status = uct_hca_ep_am_short_iov_send(tl_ep, id, iov, iovcnt);

    if (ucs_log_is_enabled(UCS_LOG_LEVEL_TRACE_DATA) && (status == UCS_OK)) {
        hca_sge_t sge[UCT_HCA_MAX_IOV];
        size_t length = 0;
        int n = uct_hca_ep_iov_to_sge(iov, iovcnt, sge, 0, &length);

        uct_hca_ep_trace_am_pieces(uct_hca_ep_iface(ucs_derived_of(
                                           tl_ep, uct_hca_ep_t)),
                                   id, sge, n, "TX: AM_SHORT_IOV");
    }
    return status;
}

ucs_status_t uct_hca_ep_am_zcopy(uct_ep_h tl_ep, uint8_t id,
                                 const void *header, unsigned header_length,
                                 const uct_iov_t *iov, size_t iovcnt,
                                 unsigned flags, uct_completion_t *comp)
{
    ucs_status_t status = uct_hca_ep_am_zcopy_send(tl_ep, id, header,
                                                   header_length, iov, iovcnt,
                                                   flags, comp);

    if (!UCS_STATUS_IS_ERR(status)) {
        uct_iface_trace_am(&uct_hca_ep_iface(ucs_derived_of(
                                   tl_ep, uct_hca_ep_t))->super,
                           UCT_AM_TRACE_TYPE_SEND, id, header, header_length,
                           "TX: AM_ZCOPY total %zu",
                           header_length + uct_iov_total_length(iov, iovcnt));
    }
    return status;
}

/* ---------------------------------------------------------------- RMA */

/* put_short through a WR: busy send queue, or memory we do not map. */
static UCS_F_NOINLINE ucs_status_t
uct_hca_ep_put_short_wr(uct_hca_ep_t *ep, const void *buffer,
                        unsigned length, uint64_t remote_addr,
                        uct_rkey_t rkey)
{
    hca_sge_t sge          = {.addr = (uintptr_t)buffer, .length = length};
    hca_send_wr_t wr       = {
        .sg_list    = &sge,
        .num_sge    = 1,
        .opcode     = HCA_WR_RDMA_WRITE,
        .send_flags = HCA_SEND_INLINE,
        .rdma       = {.remote_addr = remote_addr, .rkey = (uint32_t)rkey},
    };

    return uct_hca_ep_post(ep, &wr);
}

/* put_short above the inline size, through a WR: the data is copied into
 * a bounce buffer first (the caller may reuse its buffer when we return),
 * as put_bcopy does; the write completes later and a flush waits for it.
 * The target's range and rights are checked where the WR executes, so a
 * bad one fails the operation (error CQE), never writes. */
static UCS_F_NOINLINE ucs_status_t
uct_hca_ep_put_short_bounce(uct_hca_ep_t *ep, const void *buffer,
                            unsigned length, uint64_t remote_addr,
                            uct_rkey_t rkey)
{
    hca_send_wr_t wr = {
        .opcode = HCA_WR_RDMA_WRITE,
        .rdma   = {.remote_addr = remote_addr, .rkey = (uint32_t)rkey},
    };
    ucs_status_t status;
    uct_hca_op_t *op;
    hca_sge_t sge;

    /* the bounce buffer's size, even where UCX checks no parameters */
    if (ucs_unlikely(length > uct_hca_ep_iface(ep)->config.seg_size)) {
        return UCS_ERR_INVALID_PARAM;
    }
    op = uct_hca_ep_op_get(ep, UCT_HCA_OP_BUFFER, NULL);
    if (ucs_unlikely(op == NULL)) {
        return uct_hca_ep_no_op(ep, 0);
    }
    memcpy(uct_hca_op_buffer(op), buffer, length);
    sge.addr   = (uintptr_t)uct_hca_op_buffer(op);
    sge.length = length;
    sge.lkey   = op->lkey;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    status     = uct_hca_ep_post_op(ep, &wr, op);
    /* in flight (INPROGRESS) is done for the caller: the data was copied */
    return UCS_STATUS_IS_ERR(status) ? status : UCS_OK;
}

/* put_short goes up to seg_size (cap.put.max_short), not only the inline
 * size: UCP 1.13 sends every put up to max_short as one put_short, and a
 * short put knows its length before it writes, so into the peer's mapped
 * device memory it is one copy (the write_direct below, range checked
 * first), where put_bcopy packs into a bounce buffer and copies again.
 * Above the inline size, a target we do not map takes the bounce buffer. */
ucs_status_t uct_hca_ep_put_short(uct_ep_h tl_ep, const void *buffer,
                                  unsigned length, uint64_t remote_addr,
                                  uct_rkey_t rkey)
{
    uct_hca_ep_t *ep       = ucs_derived_of(tl_ep, uct_hca_ep_t);
    uct_hca_iface_t *iface = uct_hca_ep_iface(ep);

    UCT_CHECK_LENGTH(length, 0, iface->config.seg_size, "put_short");
    uct_hca_trace_rma(ep, "PUT_SHORT", buffer, length, remote_addr, rkey);
    if (uct_hca_ep_direct_ok(ep) &&
        (ep->fast->write_direct(ep->qp, buffer, length, remote_addr,
                          (uint32_t)rkey) == 0)) {
        ep->send_flags = 0; /* idle queue: the fence is satisfied */
        return UCS_OK;
    }
    if (ucs_unlikely(length > iface->config.max_inline)) {
        return uct_hca_ep_put_short_bounce(ep, buffer, length, remote_addr,
                                           rkey);
    }
    return uct_hca_ep_put_short_wr(ep, buffer, length, remote_addr, rkey);
}

ssize_t uct_hca_ep_put_bcopy(uct_ep_h tl_ep, uct_pack_callback_t pack_cb,
                             void *arg, uint64_t remote_addr,
                             uct_rkey_t rkey)
{
    uct_hca_ep_t *ep       = ucs_derived_of(tl_ep, uct_hca_ep_t);
    uct_hca_iface_t *iface = uct_hca_ep_iface(ep);
    hca_send_wr_t wr       = {
        .opcode = HCA_WR_RDMA_WRITE,
        .rdma   = {.remote_addr = remote_addr, .rkey = (uint32_t)rkey},
    };
    ucs_status_t status;
    uct_hca_op_t *op;
    hca_sge_t sge;
    size_t length;

    op = uct_hca_ep_op_get(ep, UCT_HCA_OP_BUFFER, NULL);
    if (ucs_unlikely(op == NULL)) {
        return uct_hca_ep_no_op(ep, 0);
    }
    length     = pack_cb(uct_hca_op_buffer(op), arg);
    if (ucs_unlikely(length > iface->config.seg_size)) {
        return uct_hca_ep_bcopy_overrun(op, "put_bcopy", length,
                                        iface->config.seg_size);
    }
    uct_hca_trace_rma(ep, "PUT_BCOPY", uct_hca_op_buffer(op), length,
                      remote_addr, rkey);
    sge.addr   = (uintptr_t)uct_hca_op_buffer(op);
    sge.length = (uint32_t)length;
    sge.lkey   = op->lkey;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    if (uct_hca_ep_direct_ok(ep) &&
        (ep->fast->write_direct(ep->qp, uct_hca_op_buffer(op), length,
                                remote_addr, (uint32_t)rkey) == 0)) {
        /* the peer's device memory, mapped here: written in the call, no
         * WR to complete (as put_short) */
        ep->send_flags = 0;
        ucs_mpool_put_inline(op);
        return (ssize_t)length;
    }
    if (length <= iface->config.max_inline) {
        wr.send_flags = HCA_SEND_INLINE;
        status        = uct_hca_ep_post(ep, &wr);
        ucs_mpool_put_inline(op);
    } else {
        status = uct_hca_ep_post_op(ep, &wr, op);
    }
    return UCS_STATUS_IS_ERR(status) ? (ssize_t)status : (ssize_t)length;
}

/* put_zcopy/get_zcopy on a peer's device memory that we map: the data
 * moves in the call, as get_bcopy's does, and the operation is complete
 * (no WR, no CQE: a zero-copy transfer of a few KiB then costs what a
 * bcopy one does).  Every local SGE must carry a memh (an lkey), as the
 * WR path requires.  1 when done, 0: post a WR. */
static UCS_F_ALWAYS_INLINE int
uct_hca_ep_rdma_direct(uct_hca_ep_t *ep, hca_wr_opcode_t opcode,
                       const hca_sge_t *sge, int num_sge, size_t length,
                       uint64_t remote_addr, uint32_t rkey)
{
    int write = (opcode == HCA_WR_RDMA_WRITE);
    char *p;

    for (int i = 0; i < num_sge; ++i) {
        if (ucs_unlikely(sge[i].lkey == 0)) {
            return 0;
        }
    }
    p = ep->fast->direct_ptr(ep->qp, remote_addr, rkey, length,
                             write ? HCA_ACCESS_REMOTE_WRITE :
                                     HCA_ACCESS_REMOTE_READ);
    if (p == NULL) {
        return 0;
    }
    for (int i = 0; i < num_sge; ++i) {
        if (write) {
            memcpy(p, (const void*)(uintptr_t)sge[i].addr, sge[i].length);
        } else {
            memcpy((void*)(uintptr_t)sge[i].addr, p, sge[i].length);
        }
        p += sge[i].length;
    }
    ep->fast->direct_done(ep->qp);
    ep->send_flags = 0; /* idle queue: the fence is satisfied */
    return 1;
}

/* put_zcopy and get_zcopy: one RDMA WRITE/READ over the iov. */
static UCS_F_ALWAYS_INLINE ucs_status_t
uct_hca_ep_rdma_zcopy(uct_ep_h tl_ep, hca_wr_opcode_t opcode,
                      const uct_iov_t *iov, size_t iovcnt,
                      uint64_t remote_addr, uct_rkey_t rkey,
                      uct_completion_t *comp)
{
    uct_hca_ep_t *ep = ucs_derived_of(tl_ep, uct_hca_ep_t);
    hca_sge_t sge[UCT_HCA_MAX_IOV];
    size_t length    = 0;
    hca_send_wr_t wr = {
        .sg_list = sge,
        .opcode  = opcode,
        .rdma    = {.remote_addr = remote_addr, .rkey = (uint32_t)rkey},
    };
    uct_hca_op_t *op;

    UCT_CHECK_IOV_SIZE(iovcnt, UCT_HCA_MAX_IOV, "rdma_zcopy");
    wr.num_sge = uct_hca_ep_iov_to_sge(iov, iovcnt, sge, 0, &length);
    /* the total, before a 32-bit SGE length could truncate an entry */
    UCT_CHECK_LENGTH(length, 0, uct_hca_ep_iface(ep)->config.max_zcopy,
                     "rdma_zcopy");
    uct_hca_trace_rma(ep, (opcode == HCA_WR_RDMA_WRITE) ? "PUT_ZCOPY" :
                                                          "GET_ZCOPY",
                      (iovcnt > 0) ? iov[0].buffer : NULL, length,
                      remote_addr, rkey);
    if (uct_hca_ep_direct_ok(ep) && (length != 0) &&
        uct_hca_ep_rdma_direct(ep, opcode, sge, wr.num_sge, length,
                               remote_addr, (uint32_t)rkey)) {
        return UCS_OK;
    }
    op         = uct_hca_ep_op_get(ep, UCT_HCA_OP_COMP, comp);
    if (ucs_unlikely(op == NULL)) {
        return uct_hca_ep_no_op(ep, 1);
    }
    return uct_hca_ep_post_op(ep, &wr, op);
}

ucs_status_t uct_hca_ep_put_zcopy(uct_ep_h tl_ep, const uct_iov_t *iov,
                                  size_t iovcnt, uint64_t remote_addr,
                                  uct_rkey_t rkey, uct_completion_t *comp)
{
    return uct_hca_ep_rdma_zcopy(tl_ep, HCA_WR_RDMA_WRITE, iov, iovcnt,
                                 remote_addr, rkey, comp);
}

ucs_status_t uct_hca_ep_get_bcopy(uct_ep_h tl_ep,
                                  uct_unpack_callback_t unpack_cb, void *arg,
                                  size_t length, uint64_t remote_addr,
                                  uct_rkey_t rkey, uct_completion_t *comp)
{
    uct_hca_ep_t *ep       = ucs_derived_of(tl_ep, uct_hca_ep_t);
    uct_hca_iface_t *iface = uct_hca_ep_iface(ep);
    hca_send_wr_t wr       = {
        .opcode = HCA_WR_RDMA_READ,
        .rdma   = {.remote_addr = remote_addr, .rkey = (uint32_t)rkey},
    };
    uct_hca_op_t *op;
    hca_sge_t sge;
    void *src;

    UCT_CHECK_LENGTH(length, 0, iface->config.seg_size, "get_bcopy");
    uct_hca_trace_rma(ep, "GET_BCOPY", NULL, length, remote_addr, rkey);
    if (uct_hca_ep_direct_ok(ep)) {
        /* the peer's device memory is mapped here: unpack straight from
         * it, no bounce buffer */
        src = ep->fast->direct_ptr(ep->qp, remote_addr, (uint32_t)rkey, length,
                             HCA_ACCESS_REMOTE_READ);
        if (src != NULL) {
            unpack_cb(arg, src, length);
            ep->fast->direct_done(ep->qp);
            ep->send_flags = 0;
            return UCS_OK;
        }
    }
    op = uct_hca_ep_op_get(ep, UCT_HCA_OP_GET_BCOPY, comp);
    if (ucs_unlikely(op == NULL)) {
        return uct_hca_ep_no_op(ep, 1);
    }
    op->unpack_cb  = unpack_cb;
    op->unpack_arg = arg;
    op->length     = (uint32_t)length;
    sge.addr       = (uintptr_t)uct_hca_op_buffer(op);
    sge.length     = (uint32_t)length;
    sge.lkey       = op->lkey;
    wr.sg_list     = &sge;
    wr.num_sge     = 1;
    return uct_hca_ep_post_op(ep, &wr, op);
}

ucs_status_t uct_hca_ep_get_zcopy(uct_ep_h tl_ep, const uct_iov_t *iov,
                                  size_t iovcnt, uint64_t remote_addr,
                                  uct_rkey_t rkey, uct_completion_t *comp)
{
    return uct_hca_ep_rdma_zcopy(tl_ep, HCA_WR_RDMA_READ, iov, iovcnt,
                                 remote_addr, rkey, comp);
}

/* ---------------------------------------------------------------- atomics */

static UCS_F_ALWAYS_INLINE int uct_hca_atomic_opcode(unsigned op, int fetch)
{
    switch (op) {
    case UCT_ATOMIC_OP_ADD:
        return fetch ? HCA_WR_ATOMIC_FETCH_ADD : HCA_WR_ATOMIC_ADD;
    case UCT_ATOMIC_OP_AND:
        return fetch ? HCA_WR_ATOMIC_FETCH_AND : HCA_WR_ATOMIC_AND;
    case UCT_ATOMIC_OP_OR:
        return fetch ? HCA_WR_ATOMIC_FETCH_OR : HCA_WR_ATOMIC_OR;
    case UCT_ATOMIC_OP_XOR:
        return fetch ? HCA_WR_ATOMIC_FETCH_XOR : HCA_WR_ATOMIC_XOR;
    case UCT_ATOMIC_OP_SWAP:
        return fetch ? HCA_WR_ATOMIC_SWAP : -1;
    default:
        return -1;
    }
}

/* Atomics through a WR: busy send queue, or memory we do not map.  A
 * fetching one completes from the CQE unless it completed in the post. */
static UCS_F_NOINLINE ucs_status_t
uct_hca_ep_atomic_wr(uct_hca_ep_t *ep, int op, uint64_t value, uint64_t swap,
                     void *result, uint64_t remote_addr, uct_rkey_t rkey,
                     unsigned size, uct_completion_t *comp)
{
    hca_send_wr_t wr = {
        .opcode      = (hca_wr_opcode_t)op,
        .send_flags  = (size == 4) ? HCA_SEND_ATOMIC32 : 0,
        .rdma        = {.remote_addr = remote_addr, .rkey = (uint32_t)rkey},
        .compare_add = value,
        .swap        = swap,
    };
    uct_hca_op_t *hop;
    hca_sge_t sge;

    if (result == NULL) {
        return uct_hca_ep_post(ep, &wr); /* a post: nothing comes back */
    }
    hop = uct_hca_ep_op_get(ep, UCT_HCA_OP_FETCH, comp);
    if (ucs_unlikely(hop == NULL)) {
        return uct_hca_ep_no_op(ep, 1);
    }
    hop->result = result;
    hop->size   = size;
    hop->value  = 0;
    sge.addr    = (uintptr_t)&hop->value;
    sge.length  = size;
    sge.lkey    = hop->lkey;
    wr.sg_list  = &sge;
    wr.num_sge  = 1;
    return uct_hca_ep_post_op(ep, &wr, hop);
}

/* result NULL: a post (no fetch).  The direct path first: one CPU atomic
 * on the peer's mapped device memory. */
static UCS_F_ALWAYS_INLINE ucs_status_t
uct_hca_ep_atomic(uct_hca_ep_t *ep, int op, uint64_t value, uint64_t swap,
                  void *result, uint64_t remote_addr, uct_rkey_t rkey,
                  unsigned size, uct_completion_t *comp)
{
    if (ucs_unlikely(op < 0)) {
        return UCS_ERR_UNSUPPORTED;
    }
    uct_hca_trace_amo(ep, op, size, value, result, remote_addr, rkey);
    if (uct_hca_ep_direct_ok(ep) &&
        (ep->fast->atomic_direct(ep->qp, (hca_wr_opcode_t)op, size, remote_addr,
                           (uint32_t)rkey, value, swap, result) == 0)) {
        ep->send_flags = 0; /* idle queue: the fence is satisfied */
        return UCS_OK;
    }
    return uct_hca_ep_atomic_wr(ep, op, value, swap, result, remote_addr,
                                rkey, size, comp);
}

ucs_status_t uct_hca_ep_atomic32_post(uct_ep_h tl_ep, unsigned opcode,
                                      uint32_t value, uint64_t remote_addr,
                                      uct_rkey_t rkey)
{
    return uct_hca_ep_atomic(ucs_derived_of(tl_ep, uct_hca_ep_t),
                             uct_hca_atomic_opcode(opcode, 0), value, 0, NULL,
                             remote_addr, rkey, 4, NULL);
}

ucs_status_t uct_hca_ep_atomic64_post(uct_ep_h tl_ep, unsigned opcode,
                                      uint64_t value, uint64_t remote_addr,
                                      uct_rkey_t rkey)
{
    return uct_hca_ep_atomic(ucs_derived_of(tl_ep, uct_hca_ep_t),
                             uct_hca_atomic_opcode(opcode, 0), value, 0, NULL,
                             remote_addr, rkey, 8, NULL);
}

ucs_status_t uct_hca_ep_atomic32_fetch(uct_ep_h tl_ep, uct_atomic_op_t opcode,
                                       uint32_t value, uint32_t *result,
                                       uint64_t remote_addr, uct_rkey_t rkey,
                                       uct_completion_t *comp)
{
    return uct_hca_ep_atomic(ucs_derived_of(tl_ep, uct_hca_ep_t),
                             uct_hca_atomic_opcode(opcode, 1), value, 0,
                             result, remote_addr, rkey, 4, comp);
}

ucs_status_t uct_hca_ep_atomic64_fetch(uct_ep_h tl_ep, uct_atomic_op_t opcode,
                                       uint64_t value, uint64_t *result,
                                       uint64_t remote_addr, uct_rkey_t rkey,
                                       uct_completion_t *comp)
{
    return uct_hca_ep_atomic(ucs_derived_of(tl_ep, uct_hca_ep_t),
                             uct_hca_atomic_opcode(opcode, 1), value, 0,
                             result, remote_addr, rkey, 8, comp);
}

ucs_status_t uct_hca_ep_atomic_cswap32(uct_ep_h tl_ep, uint32_t compare,
                                       uint32_t swap, uint64_t remote_addr,
                                       uct_rkey_t rkey, uint32_t *result,
                                       uct_completion_t *comp)
{
    return uct_hca_ep_atomic(ucs_derived_of(tl_ep, uct_hca_ep_t),
                             HCA_WR_ATOMIC_CMP_SWP, compare, swap, result,
                             remote_addr, rkey, 4, comp);
}

ucs_status_t uct_hca_ep_atomic_cswap64(uct_ep_h tl_ep, uint64_t compare,
                                       uint64_t swap, uint64_t remote_addr,
                                       uct_rkey_t rkey, uint64_t *result,
                                       uct_completion_t *comp)
{
    return uct_hca_ep_atomic(ucs_derived_of(tl_ep, uct_hca_ep_t),
                             HCA_WR_ATOMIC_CMP_SWP, compare, swap, result,
                             remote_addr, rkey, 8, comp);
}

/* ---------------------------------------------------------------- flush */

void uct_hca_ep_flush_progress(uct_hca_ep_t *ep, ucs_queue_head_t *due)
{
    ucs_status_t status = (ep->status == UCS_ERR_CANCELED) ? UCS_OK :
                                                             ep->status;
    uint64_t retired    = hca_qp_sq_retired(ep->qp);
    uct_hca_flush_req_t *req;

    /* in order: a flush completes once the WRs posted before it retired,
     * whatever was posted after it */
    while (!ucs_queue_is_empty(&ep->flush_q)) {
        req = ucs_queue_head_elem_non_empty(&ep->flush_q, uct_hca_flush_req_t,
                                            queue);
        if ((int64_t)(retired - req->sq_pos) < 0) {
            break;
        }
        ucs_queue_pull_non_empty(&ep->flush_q);
        req->status = status;
        ucs_queue_push(due, &req->queue);
        if (ucs_queue_is_empty(&ep->flush_q)) {
            ucs_list_del(&ep->flush_list);
        }
    }
}

void uct_hca_ep_flush_complete(ucs_queue_head_t *due)
{
    uct_hca_flush_req_t *req;

    while (!ucs_queue_is_empty(due)) {
        req = ucs_queue_pull_elem_non_empty(due, uct_hca_flush_req_t, queue);
        uct_invoke_completion(req->comp, req->status);
        ucs_free(req);
    }
}

ucs_status_t uct_hca_ep_flush(uct_ep_h tl_ep, unsigned flags,
                              uct_completion_t *comp)
{
    uct_hca_ep_t *ep       = ucs_derived_of(tl_ep, uct_hca_ep_t);
    uct_hca_iface_t *iface = uct_hca_ep_iface(ep);
    uct_hca_flush_req_t *req;

    if (flags & UCT_FLUSH_FLAG_CANCEL) {
        /* uct.h: the ep is in error afterwards and only to be destroyed.
         * Every outstanding WR completes with UCS_ERR_CANCELED; pending
         * requests stay for the caller's purge. */
        if (hca_qp_outstanding(ep->qp) != 0) {
            hca_qp_modify(ep->qp, &(hca_qp_attr_t){.qp_state = HCA_QPS_ERR},
                          HCA_QP_ATTR_STATE);
        }
        if (ep->status == UCS_OK) {
            ep->status = UCS_ERR_CANCELED;
        }
    } else if (ucs_unlikely(UCS_STATUS_IS_ERR(ep->status))) {
        return ep->status; /* failed (or cancelled): as every operation */
    } else if (ucs_unlikely(hca_qp_state(ep->qp) == HCA_QPS_ERR)) {
        return uct_hca_ep_qp_failed(ep, 1);
    } else if (!ucs_arbiter_group_is_empty(&ep->arb_group) &&
               !ep->in_pending) {
        /* requests queued before this flush go first; from the dispatch
         * of this ep's own queue (a flush request of the caller's) every
         * request before it has been dispatched */
        return UCS_ERR_NO_RESOURCE;
    }
    if (hca_qp_outstanding(ep->qp) == 0) {
        return UCS_OK;
    }
    if (comp == NULL) {
        return UCS_INPROGRESS;
    }
    req = ucs_malloc(sizeof(*req), "hca_flush_req");
    if (req == NULL) {
        return UCS_ERR_NO_MEMORY;
    }
    req->comp   = comp;
    req->sq_pos = hca_qp_sq_posted(ep->qp);
    if (ucs_queue_is_empty(&ep->flush_q)) {
        ucs_list_add_tail(&iface->flush_eps, &ep->flush_list);
    }
    ucs_queue_push(&ep->flush_q, &req->queue);
    return UCS_INPROGRESS;
}

ucs_status_t uct_hca_ep_fence(uct_ep_h tl_ep, unsigned flags)
{
    uct_hca_ep_t *ep = ucs_derived_of(tl_ep, uct_hca_ep_t);

    if (ucs_unlikely(UCS_STATUS_IS_ERR(ep->status))) {
        return ep->status; /* failed: as every later operation */
    }
    /* the next WR waits until every earlier one completed remotely */
    ep->send_flags |= HCA_SEND_FENCE;
    return UCS_OK;
}

ucs_status_t uct_hca_ep_check(uct_ep_h tl_ep, unsigned flags,
                              uct_completion_t *comp)
{
    /* the check is done in the call: a failed peer is reported through
     * the iface's error handler, never through comp */
    UCT_HCA_EP_CHECK_PARAMS(flags, comp);
    uct_hca_ep_peer_check(ucs_derived_of(tl_ep, uct_hca_ep_t));
    return UCS_OK;
}

/* ---------------------------------------------------------------- pending */

static int uct_hca_ep_has_resources(uct_hca_ep_t *ep)
{
    uct_hca_iface_t *iface = uct_hca_ep_iface(ep);

    return !ep->no_resource && (iface->tx_credits > 0) &&
           (hca_qp_outstanding(ep->qp) < iface->config.tx_queue_len);
}

ucs_status_t uct_hca_ep_pending_add(uct_ep_h tl_ep, uct_pending_req_t *n,
                                    unsigned flags)
{
    uct_hca_ep_t *ep       = ucs_derived_of(tl_ep, uct_hca_ep_t);
    uct_hca_iface_t *iface = uct_hca_ep_iface(ep);

    if (ucs_unlikely(ep->status != UCS_OK)) {
        if (ep->err_pending && !ep->err_reported) {
            /* failed, not yet reported: a post answered NO_RESOURCE
             * (uct_hca_ep_failed_post), so the request is queued; it is
             * never dispatched, and the purge after the report hands it
             * back (BUSY would have the caller post again at once, and a
             * caller that retries without progress would spin) */
            uct_pending_req_arb_group_push(&ep->arb_group, n);
            return UCS_OK;
        }
        /* failed and reported: the caller retries the operation and gets
         * the ep's status */
        return UCS_ERR_BUSY;
    }
    if (uct_hca_ep_has_resources(ep) &&
        ucs_arbiter_group_is_empty(&ep->arb_group)) {
        return UCS_ERR_BUSY;
    }
    uct_pending_req_arb_group_push(&ep->arb_group, n);
    ucs_arbiter_group_schedule(&iface->arbiter, &ep->arb_group);
    return UCS_OK;
}

ucs_arbiter_cb_result_t uct_hca_ep_process_pending(ucs_arbiter_t *arbiter,
                                                   ucs_arbiter_group_t *group,
                                                   ucs_arbiter_elem_t *elem,
                                                   void *arg)
{
    uct_hca_ep_t *ep       = ucs_container_of(group, uct_hca_ep_t, arb_group);
    uct_pending_req_t *req = ucs_container_of(elem, uct_pending_req_t, priv);
    unsigned *count        = arg;
    ucs_status_t status;

    if (ucs_unlikely(ep->status != UCS_OK)) {
        /* failed or cancelled: its requests wait for the caller's purge,
         * which hands each back once */
        return UCS_ARBITER_CB_RESULT_DESCHED_GROUP;
    }
    ep->no_resource = 0; /* retry: the target may have drained its ring */
    ep->in_pending  = 1;
    status          = req->func(req);
    ep->in_pending  = 0;
    if (status == UCS_OK) {
        (*count)++;
        return UCS_ARBITER_CB_RESULT_REMOVE_ELEM;
    } else if (status == UCS_INPROGRESS) {
        (*count)++;
        return UCS_ARBITER_CB_RESULT_NEXT_GROUP;
    } else if (ucs_unlikely(ep->status != UCS_OK)) {
        return UCS_ARBITER_CB_RESULT_DESCHED_GROUP; /* failed meanwhile */
    }
    /* no resources (a full target ring sends no event): try again on the
     * next progress */
    return UCS_ARBITER_CB_RESULT_RESCHED_GROUP;
}

typedef struct {
    uct_pending_purge_callback_t cb;
    void                         *arg;
} uct_hca_purge_args_t;

static ucs_arbiter_cb_result_t uct_hca_ep_purge_cb(ucs_arbiter_t *arbiter,
                                                   ucs_arbiter_group_t *group,
                                                   ucs_arbiter_elem_t *elem,
                                                   void *arg)
{
    uct_hca_purge_args_t *args = arg;
    uct_pending_req_t *req     = ucs_container_of(elem, uct_pending_req_t,
                                                  priv);

    if (args->cb != NULL) {
        args->cb(req, args->arg);
    } else {
        /* destroyed with requests still queued: they are dropped */
        ucs_warn("ep %p: canceling user pending request %p",
                 ucs_container_of(group, uct_hca_ep_t, arb_group), req);
    }
    return UCS_ARBITER_CB_RESULT_REMOVE_ELEM;
}

void uct_hca_ep_pending_purge(uct_ep_h tl_ep, uct_pending_purge_callback_t cb,
                              void *arg)
{
    uct_hca_ep_t *ep          = ucs_derived_of(tl_ep, uct_hca_ep_t);
    uct_hca_iface_t *iface    = uct_hca_ep_iface(ep);
    uct_hca_purge_args_t args = {cb, arg};

    ucs_arbiter_group_purge(&iface->arbiter, &ep->arb_group,
                            uct_hca_ep_purge_cb, &args);
}

/* ---------------------------------------------------------------- class */

int uct_hca_ep_is_connected_to(const uct_ep_h tl_ep,
                               const uct_device_addr_t *dev_addr,
                               const uct_iface_addr_t *iface_addr)
{
    const uct_hca_ep_t *ep             = ucs_derived_of(tl_ep, uct_hca_ep_t);
    const uct_hca_iface_addr_t *ifaddr = (const uct_hca_iface_addr_t*)
                                         iface_addr;
    hca_port_addr_t addr;

    if ((dev_addr == NULL) || (iface_addr == NULL)) {
        return 0;
    }
    /* both made by uct_hca_port_addr, padding zeroed */
    memset(&addr, 0, sizeof(addr));
    uct_hca_port_addr(&addr, (const uct_hca_device_addr_t*)dev_addr, ifaddr);
    return (ifaddr->qpn == ep->peer_qpn) &&
           !memcmp(&addr, &ep->peer, sizeof(addr));
}

UCS_CLASS_INIT_FUNC(uct_hca_ep_t, const uct_ep_params_t *params)
{
    uct_hca_iface_t *iface = ucs_derived_of(params->iface, uct_hca_iface_t);
    const uct_hca_iface_addr_t *ifaddr;
    const uct_hca_device_addr_t *devaddr;
    hca_qp_init_attr_t init = {0};
    hca_qp_attr_t attr      = {0};
    int rc;

    UCS_CLASS_CALL_SUPER_INIT(uct_base_ep_t, &iface->super);
    UCT_EP_PARAMS_CHECK_DEV_IFACE_ADDRS(params);
    ifaddr  = (const uct_hca_iface_addr_t*)params->iface_addr;
    devaddr = (const uct_hca_device_addr_t*)params->dev_addr;

    init.send_cq         = iface->cq;
    init.recv_cq         = iface->ep_rx_cq;
    init.srq             = iface->ep_srq;
    init.max_send_wr     = iface->config.tx_queue_len;
    init.max_send_sge    = UCT_HCA_MAX_IOV + 1;
    init.max_inline_data = iface->config.max_inline;
    init.quiet_flush     = 1;
    rc = hca_qp_create(iface->md->pd, &init, &self->qp);
    if (rc != 0) {
        ucs_error("hca: cannot create a QP: %s", strerror(-rc));
        return UCS_ERR_NO_RESOURCE;
    }

    attr.qp_state        = HCA_QPS_INIT;
    rc = hca_qp_modify(self->qp, &attr, HCA_QP_ATTR_STATE);
    attr.qp_state        = HCA_QPS_RTR;
    uct_hca_port_addr(&attr.dest, devaddr, ifaddr);
    attr.dest_qp_num     = ifaddr->qpn;
    rc = rc ? rc : hca_qp_modify(self->qp, &attr,
                                 HCA_QP_ATTR_STATE | HCA_QP_ATTR_DEST);
    attr.qp_state        = HCA_QPS_RTS;
    rc = rc ? rc : hca_qp_modify(self->qp, &attr, HCA_QP_ATTR_STATE);
    if (rc != 0) {
        ucs_error("hca: cannot connect to pid %u qpn 0x%x: %s", ifaddr->pid,
                  ifaddr->qpn, strerror(-rc));
        hca_qp_destroy(self->qp);
        return UCS_ERR_UNREACHABLE;
    }

    self->fast         = hca_qp_fast_ops(self->qp);
    self->status       = UCS_OK;
    self->send_flags   = 0;
    self->err_reported = 0;
    self->err_pending  = 0;
    self->no_resource  = 0;
    self->lost_posts   = 0;
    self->in_pending   = 0;
    self->peer         = attr.dest;
    self->peer_qpn     = ifaddr->qpn;
    ucs_arbiter_group_init(&self->arb_group);
    ucs_queue_head_init(&self->flush_q);
    ucs_list_head_init(&self->ops);
    ucs_list_add_tail(&iface->ep_list, &self->list);
    iface->ep_by_qp[HCA_QPN_INDEX(hca_qp_num(self->qp))] = self;
    return UCS_OK;
}

UCS_CLASS_CLEANUP_FUNC(uct_hca_ep_t)
{
    uct_hca_iface_t *iface = ucs_derived_of(self->super.super.iface,
                                            uct_hca_iface_t);
    uct_hca_flush_req_t *req;
    uct_hca_op_t *op, *tmp;

    uct_hca_ep_pending_purge(&self->super.super, NULL, NULL);
    ucs_arbiter_group_cleanup(&self->arb_group);
    /* the device lets go of the operations' buffers: the ERR transition
     * ends every outstanding WR (its CQE goes to the CQ), and nothing is
     * read from or written to their buffers after it (on tcp a frame
     * already started goes on from a copy, no answer lands) */
    hca_qp_modify(self->qp, &(hca_qp_attr_t){.qp_state = HCA_QPS_ERR},
                  HCA_QP_ATTR_STATE);
    /* every outstanding operation completes here, with UCS_ERR_CANCELED,
     * as rc and tcp purge theirs: once we return, its completion and
     * buffers may be gone.  Its CQE, read later among other eps', only
     * gives back the descriptor and the credit. */
    ucs_list_for_each_safe(op, tmp, &self->ops, outstanding) {
        ucs_list_del(&op->outstanding);
        op->ep = NULL;
        if (op->comp != NULL) {
            uct_invoke_completion(op->comp, UCS_ERR_CANCELED);
            op->comp = NULL;
        }
    }
    /* then the flushes, which complete after the operations before them */
    if (!ucs_queue_is_empty(&self->flush_q)) {
        ucs_list_del(&self->flush_list);
        while (!ucs_queue_is_empty(&self->flush_q)) {
            req = ucs_queue_pull_elem_non_empty(&self->flush_q,
                                                uct_hca_flush_req_t, queue);
            uct_invoke_completion(req->comp, UCS_ERR_CANCELED);
            ucs_free(req);
        }
    }
    if (self->err_pending) {
        iface->failed_eps--;
    }
    ucs_list_del(&self->list);
    iface->ep_by_qp[HCA_QPN_INDEX(hca_qp_num(self->qp))] = NULL;
    hca_qp_destroy(self->qp);
}

UCS_CLASS_DEFINE(uct_hca_ep_t, uct_base_ep_t);
UCS_CLASS_DEFINE_NEW_FUNC(uct_hca_ep_t, uct_ep_t, const uct_ep_params_t*);
UCS_CLASS_DEFINE_DELETE_FUNC(uct_hca_ep_t, uct_ep_t);
