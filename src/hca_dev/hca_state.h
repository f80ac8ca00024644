/*
 * hca_state.h - the object-state layer's functions (layer 3: hca_cq.c,
 * hca_dm.c, hca_rq.c, hca_qp.c) that the engines and the verbs call.
 * Private to libhcadev (not installed).
 */
#ifndef HCA_STATE_H
#define HCA_STATE_H

#include "hca_obj.h"

/* The device memory holding [addr, addr+length), or NULL (dev->lock). */
struct hca_dm *hca_dm_find(hca_device_t *dev, uintptr_t addr, size_t length);
/* Its last MR is going (dev->lock held): 1 if its user freed it meanwhile,
 * and it is out of the list: the caller destroys it (hca_dm_destroy) once
 * the lock is released. */
int  hca_dm_last_mr_locked(struct hca_dm *dm);
void hca_dm_destroy(struct hca_dm *dm);

/* The export of the shared object holding [addr, addr+length), found or
 * made (hca_export.c), with one more reference, and the range's offset in
 * it; NULL if the range is not shared memory a peer can map (then peers
 * take another route: never an error).  Not under dev->lock. */
struct hca_export *hca_export_get(hca_device_t *dev, uintptr_t addr,
                                  size_t length, uint64_t *offset_p);
/* Drops a reference; the last one withdraws the export (dev->lock). */
void hca_export_put(hca_device_t *dev, struct hca_export *ex);
/* Withdraws every export (device close). */
void hca_exports_destroy(hca_device_t *dev);

/* ---------------------------------------------------------------- CQ */

/* Producer (engine code of the owner): never overwrites. */
int hca_cq_push(hca_cq_t *cq, const hca_wc_t *wc);
/* Consumer: up to num CQEs, or -EOVERFLOW (then its QPs are in ERR). */
int hca_cq_ring_poll(hca_cq_t *cq, int num, hca_wc_t *wc);
/* Arms (1) or disarms (0) the CQ and its receive rings; -EAGAIN if a
 * ring already holds something. */
int hca_cq_set_armed(hca_cq_t *cq, uint32_t armed);
void hca_cq_overflow_error(hca_cq_t *cq);
int hca_cq_attach_qp(hca_cq_t *cq, struct hca_qp *qp);
void hca_cq_detach_qp(hca_cq_t *cq, struct hca_qp *qp);
int hca_cq_attach_rq(hca_cq_t *cq, struct hca_rq *rq);
void hca_cq_detach_rq(hca_cq_t *cq, struct hca_rq *rq);

/* ---------------------------------------------------------------- RQ */

int  hca_rq_init(hca_rq_t *rq, hca_pd_t *pd, uint32_t depth,
                 uint32_t max_sge, int is_srq);
void hca_rq_cleanup(hca_rq_t *rq);
int  hca_rq_post(hca_rq_t *rq, hca_recv_wr_t *wr, hca_recv_wr_t **bad_wr);

/* ---------------------------------------------------------------- QP */

int  hca_qp_to_err(hca_qp_t *qp, hca_wc_status_t first);
/* A WQE ends with status (a failure moves the QP to ERR). */
void hca_wqe_done(hca_qp_t *qp, hca_wqe_t *wqe, hca_wc_status_t status);
/* Done WQEs at the tail become CQEs, in post order. */
void hca_qp_report_sq(hca_qp_t *qp);
/* Completes every posted receive of the QP's own RQ as flushed. */
void hca_qp_flush_recv(hca_qp_t *qp);
/* The target ring was full: -EAGAIN, or -ECONNRESET once it stayed full
 * and its owner is gone (the QP is then in ERR). */
int  hca_qp_ring_full(hca_qp_t *qp);
/* The QP's one liveness timer, for whoever finds it blocked with nothing
 * moving (issued WQEs with no answer, a full target ring): 1 while the
 * peer lives, 0 once it was found gone (the QP is then in ERR). */
int  hca_qp_stalled(hca_qp_t *qp);
hca_qp_t *hca_qp_lookup(hca_device_t *dev, uint32_t qpn);

#endif
