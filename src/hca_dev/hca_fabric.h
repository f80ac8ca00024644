/*
 * hca_fabric.h - the fabric interface: all that the device's engines and
 * objects need from the medium that carries their requests and responses.
 *
 * A fabric moves data; it never completes a WQE, pushes a CQE or changes
 * a QP's state itself: each op returns what happened and the caller (an
 * engine, an object) acts on it.  The fabric of a QP is chosen at connect
 * time from the peer's address (hca_fabric_for_addr) and kept in
 * qp->fabric; its per-QP state lives in qp->fabric_priv and its
 * per-device state in dev->fabric_dev[type], both private to it.
 *
 * Mandatory ops are set by every fabric.  The optional ones (the fast
 * paths, and ops a fabric has no use for) may be NULL in a fabric's table:
 * hca_fabric_open() fills them with "unsupported" defaults, the way
 * libibverbs fills a provider's ops, so callers never test for NULL.
 */
#ifndef HCA_FABRIC_H
#define HCA_FABRIC_H

#include "hca_dev.h"
#include "hca_wire.h"

struct hca_wqe;
struct hca_rwqe;

/* Bytes of per-QP state a fabric may keep in qp->fabric_priv. */
#define HCA_FABRIC_QP_PRIV 192

/* What exec() and poll_response() did with a WQE. */
typedef enum {
    HCA_EXEC_DONE = 0, /* finished with *status_p: the engine completes it */
    HCA_EXEC_ISSUED,   /* waiting for the peer's response */
    HCA_EXEC_PARTIAL,  /* some data moved, call again later */
    HCA_EXEC_BUSY,     /* no room at the peer, nothing done: a post hands
                          the WQE back (-EAGAIN) */
    HCA_EXEC_WAIT      /* nothing done: an order rule of the fabric holds
                          it behind an issued WQE; it stays queued (a post
                          takes it) and goes at a later progress */
} hca_exec_t;

typedef struct hca_fabric_ops {
    const char        *name;
    hca_fabric_type_t  type;

    /* ---- device: the context's fabric state and threads */
    int   (*dev_open)(hca_device_t *dev);
    void  (*dev_close)(hca_device_t *dev);

    /* ---- addressing: can this fabric reach the context at addr?  Its
     * part of our own address, and of the port's attributes. */
    int   (*reachable)(hca_device_t *dev, const hca_port_addr_t *addr);
    void  (*address)(hca_device_t *dev, hca_port_addr_t *addr);
    void  (*port_query)(hca_device_t *dev, hca_port_attr_t *attr);

    /* ---- connection: INIT->RTR of a QP with a peer (qp->dest), and the
     * end of it (RESET, destroy) */
    int   (*connect)(hca_qp_t *qp);
    void  (*disconnect)(hca_qp_t *qp);
    /* The QP went to ERR and its WQEs are about to be flushed: after
     * this returns the fabric no longer writes into their buffers. */
    void  (*quiesce)(hca_qp_t *qp);

    /* ---- requester: executes (part of) the WQE at the head of
     * execution; polls the response of an ISSUED one (DONE when it came) */
    hca_exec_t (*exec)(hca_qp_t *qp, struct hca_wqe *wqe,
                       hca_wc_status_t *status_p);
    hca_exec_t (*poll_response)(hca_qp_t *qp, struct hca_wqe *wqe,
                                hca_wc_status_t *status_p);
    /* 1 if the response of an ISSUED WQE is there (no side effect: for
     * arming a CQ) */
    int   (*response_ready)(const hca_qp_t *qp, const struct hca_wqe *wqe);

    /* ---- responder: what the receive side needs from the fabric of the
     * message it handles.  pull copies a message's data from its source
     * (the iovs it described) into the receive WQE; answer tells the
     * source's waiting WQE how it ended; source_alive says if the source
     * context still runs. */
    hca_wc_status_t (*pull)(hca_device_t *dev, const hca_msg_hdr_t *hdr,
                            const hca_wire_iov_t *iov, const struct hca_rwqe *rwqe);
    void  (*answer)(hca_device_t *dev, const hca_msg_hdr_t *hdr,
                    const hca_pull_hdr_t *pull, hca_wc_status_t status);
    int   (*source_alive)(hca_device_t *dev, uint32_t pid, uint32_t ctx_id);
    /* what a message this fabric placed in our receive rings says of its
     * source: 1 if the fabric's receiver checked the source against the
     * QP's accepted peer (whose host is then the source's: tcp checks its
     * connection's peer), 0 if the source is a process of this host (shm:
     * it wrote the ring itself) */
    int   msg_from_qp_peer;
    /* how long an unfinished message of this fabric may go without a
     * fragment (NULL: HCA_PARTIAL_TIMEOUT_NS) */
    uint64_t (*partial_timeout_ns)(hca_device_t *dev);

    /* ---- memory: after an MPT entry of ours was invalidated, waits for
     * the accesses this fabric's peers may still make to it (the
     * deregistration promise) */
    void  (*mr_fence)(hca_device_t *dev, const hca_mpt_entry_t *entry,
                      uint32_t accessors, int unfenced);

    /* ---- a user thread's poll (while dev->fabric_polls has the fabric's
     * bit): what the fabric can do in the caller's thread now, so that a
     * polling process needs no thread switch; the number of things done */
    int   (*poll)(hca_device_t *dev);
    /* a CQ of the device was armed, its owner is about to sleep
     * and polls no more; what the fabric left to its polls is taken back
     * now, not when it notices the polls stopped */
    void  (*armed)(hca_device_t *dev);
    /* ---- the owner's service ring (dev->svc), whatever dev->fabric_polls
     * says: a poll found requests in it (serve them in the caller's
     * thread; the number served), and a CQ was armed (the owner polls no
     * more: whoever serves the ring meanwhile takes over now) */
    int   (*serve)(hca_device_t *dev);
    void  (*owner_armed)(hca_device_t *dev);

    /* ---- liveness */
    hca_wc_status_t (*peer_status)(hca_qp_t *qp);
    uint64_t (*check_peers)(hca_device_t *dev);

    /* ---- optional fast paths (hca_dev.h "direct send" and "direct
     * RDMA"): on an idle send queue, executed inside the call */
    int   (*post_direct)(hca_qp_t *qp, hca_send_wr_t *wr, uint64_t length);
    hca_fast_ops_t fast;
    int   (*rkey_ptr)(hca_qp_t *qp, uint64_t remote_addr, uint32_t rkey,
                      size_t length, void **ptr_p);

    /* ---- optional: views of a peer's device memory without a device
     * context (hca_dev.h hca_dm_view_*, UCT's rkey_ptr), dispatched by
     * the registry (hca_fabric.c).  view_open says -EHOSTUNREACH for a
     * peer this fabric cannot map; the view it makes starts with
     * struct hca_dm_view, which names the fabric for ptr and close. */
    int   (*dm_view_open)(const hca_port_addr_t *addr, uint32_t dm_id,
                          hca_dm_view_t **view_p);
    int   (*dm_view_ptr)(hca_dm_view_t *view, uint32_t rkey,
                         uint64_t remote_addr, void **ptr_p);
    void  (*dm_view_close)(hca_dm_view_t *view);

    /* ---- optional: the names of the fabric's own counters
     * (hca_counters_t.fabric_own[type][i]), NULL past the last one; the
     * fabric counts them itself, in the context's dev->svc_cnt */
    const char *(*counter_name)(unsigned i);
} hca_fabric_ops_t;

/* The head of every fabric's device memory view. */
struct hca_dm_view {
    const hca_fabric_ops_t *fabric;
};

#endif
