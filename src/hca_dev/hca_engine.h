/*
 * hca_engine.h - the engines (layer 4: requester hca_req.c, completer
 * hca_comp.c, responder hca_resp.c, ingress hca_ingress.c) and the progress
 * layer's busy list (hca_progress.c, layer 5), as the layers above call them.
 * Private to libhcadev (not installed).
 */
#ifndef HCA_ENGINE_H
#define HCA_ENGINE_H

#include "hca_obj.h"

/* Responder (hca_resp.c): the states of a received message, and a
 * handler per message op - the step from ARRIVED to the next state. */
typedef enum {
    HCA_RX_ARRIVED = 0, /* taken from its ring, routed */
    HCA_RX_RNR,         /* no receive posted: it stays in its ring */
    HCA_RX_PARTIAL,     /* a fragment placed, the message goes on */
    HCA_RX_COMPLETE,    /* placed, its receive completed */
    HCA_RX_DROPPED,     /* refused, forged or orphaned: counted */
    HCA_RX_LAST
} hca_rx_state_t;

extern const char *const hca_rx_state_name[HCA_RX_LAST];
typedef hca_rx_state_t (*hca_resp_handler_t)(hca_rq_t *rq, struct hca_qp *qp,
                                             const hca_ingress_msg_t *m);
extern const hca_resp_handler_t hca_resp_handlers[HCA_MSG_OP_LAST];
void hca_resp_refuse(hca_device_t *dev, const hca_ingress_msg_t *m,
                     int qp_gone);
/* Ends partials whose source died or, the ring drained, went quiet (every
 * 100 ms at most). */
void hca_resp_sweep(hca_rq_t *rq, int drained);

/* Ingress router (hca_ingress.c): consumes up to budget messages of the
 * ring, each handed to its responder handler. */
int  hca_ingress_poll(hca_rq_t *rq, int budget);

/* Engines: requester (hca_req.c) and completer (hca_comp.c) */
extern const char *const hca_wqe_state_name[];
int  hca_req_progress(hca_qp_t *qp);
void hca_comp_poll_responses(hca_qp_t *qp);

/* Progress (hca_progress.c): after the requester ran, put qp on its CQ's
 * busy list if it has issued or queued WQEs (owner thread). */
void hca_progress_mark_busy(hca_qp_t *qp);

#endif
