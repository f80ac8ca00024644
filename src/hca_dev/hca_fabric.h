/*
 * hca_fabric.h - what the engines need from a fabric.
 *
 * The requester (hca_req.c) owns the send queue: order, fences, the
 * un-posting of a WR that finds no room, completions in post order.  For
 * each WQE it calls the fabric's exec(), which moves the data (or starts
 * to) and says how far it got.  The completer (hca_comp.c) asks the fabric
 * for responses to issued WQEs.  The responder side of the shm fabric is
 * hca_resp.c (receive rings) and hca_service.c (requests the requester
 * cannot execute itself).  A TCP fabric plugs in under the same calls.
 */
#ifndef HCA_FABRIC_H
#define HCA_FABRIC_H

typedef enum {
    HCA_EXEC_DONE = 0, /* complete: hca_wqe_done() was called */
    HCA_EXEC_ISSUED,   /* waiting for the peer's response */
    HCA_EXEC_PARTIAL,  /* some data moved, call again later */
    HCA_EXEC_BUSY      /* no room at the peer, nothing done */
} hca_exec_t;

typedef struct hca_fabric_ops {
    const char *name;
    /* INIT->RTR: check the address, attach to the peer. */
    int        (*connect)(struct hca_qp *qp);
    /* Executes (part of) the WQE at the head of execution. */
    hca_exec_t (*exec)(struct hca_qp *qp, hca_wqe_t *wqe);
    /* Checks the response of an issued WQE: DONE when it arrived (and
     * hca_wqe_done() was called) or ISSUED/PARTIAL while waiting. */
    hca_exec_t (*poll_response)(struct hca_qp *qp, hca_wqe_t *wqe);
    /* HCA_WC_SUCCESS while the peer is alive and answering; else why
     * the QP fails (gone: RETRY_EXC_ERR, cannot answer: REM_OP_ERR). */
    hca_wc_status_t (*peer_status)(struct hca_qp *qp);
} hca_fabric_ops_t;

extern const hca_fabric_ops_t hca_fabric_shm;

/* shm fabric: peers and their objects */
hca_peer_t *hca_peer_get(hca_device_t *dev, const hca_port_addr_t *addr);
void        hca_peers_destroy(hca_device_t *dev);
hca_map_t  *hca_peer_ring(hca_device_t *dev, hca_peer_t *peer,
                          uint32_t ring_id);
/* Maps a requester QP's q object (not cached: see hca_answer.c). */
hca_map_t  *hca_peer_qobj_map(hca_device_t *dev, hca_peer_t *peer,
                              uint32_t qpn);
hca_map_t  *hca_peer_dm(hca_device_t *dev, hca_peer_t *peer,
                        uint32_t dm_id);
int         hca_peer_alive(hca_peer_t *peer);
/* The doorbell's fast path (see hca_fabric_shm.c): 1 if wr was executed
 * completely inside the call and needs no WQE and no CQE. */
int         hca_shm_post_direct(struct hca_qp *qp, hca_send_wr_t *wr,
                                uint64_t length);
/* Empties the direct path's MPT cache (new connection). */
void        hca_direct_forget(struct hca_qp *qp);

#endif
