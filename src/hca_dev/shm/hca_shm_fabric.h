/*
 * hca_shm_fabric.h - the shm fabric's private state and functions: peers
 * on this host and our mappings of their objects, the per-QP and
 * per-device state, and what its files share.  Nothing outside the shm
 * fabric includes this header (the layering check enforces it through
 * the symbols): the rest of the device reaches shm only through
 * hca_fabric_shm_ops.
 *
 * Files: hca_fabric_shm.c (ops table, device open/close, connect,
 * liveness), hca_shm_peer.c (peers and mappings), hca_shm_copy.c (copies
 * between SGEs, single copy), hca_shm_exec.c (executing WQEs), hca_shm_direct.c
 * (the fast paths), hca_shm_fence.c (the access fence), hca_shm_answer.c
 * and hca_shm_service.c (the target's answers and its responder thread),
 * hca_shm_dm_view.c (peers' device memory for rkey_ptr).
 */
#ifndef HCA_SHM_FABRIC_H
#define HCA_SHM_FABRIC_H

#include "hca_util.h"
#include "hca_base.h"
#include "hca_obj.h"

#include <stddef.h>

/* ---------------------------------------------------------------- peers */

/* A mapping of a peer object, immutable once published on a list. */
typedef struct hca_map {
    struct hca_map *next;
    uint64_t        id;
    uint64_t        used;     /* q objects: last use (hca_shm_answer.c) */
    hca_memobj_t    obj;
    hca_ring_t      ring;     /* for rings */
    hca_resp_slot_t *resp;    /* q objects: validated at map time, never */
    uint8_t         *bounce;  /* re-read from the peer's header */
    uint32_t        sq_depth;
} hca_map_t;

/* Another device context (usually another process) we talk to.  Lives
 * until our device closes.  Lists are prepended under dev->lock and read
 * without it. */
typedef struct hca_peer {
    struct hca_peer   *next;
    hca_port_addr_t    addr;
    uint32_t           pidns;
    hca_memobj_t       ctx;
    hca_ctx_hdr_t      hdr;        /* validated copy */
    hca_notify_ctx_t   notify_to;  /* its consumers' wakeup names */
    hca_mpt_entry_t   *mpt;
    hca_qp_pub_t      *qp_pub;
    hca_notify_t      *notify;
    hca_ring_t         svc;
    _Atomic(hca_map_t*) rings;
    hca_map_t         *qobjs;      /* under dev->qobj_lock */
    _Atomic(hca_map_t*) dms;      /* device memory and exports by id */
    hca_export_entry_t *exports;   /* its export table */
    uint32_t           n_export_maps; /* exports in dms (dev->lock) */
    int                cma_ok;     /* single copy permitted to this peer */
    hca_mapper_t      *mappers;    /* its mapper table, busy words */
    hca_busy_t        *busy;
    _Atomic int        access_mode;/* HCA_ACCESS_* (hca_shm_fence.h) */
    int                mapper_slot;/* ours in its mapper table, or -1 */
    _Atomic int        dead;
    int                counted_dead; /* in dev->dead_peers (dev->lock) */
    int                self;       /* our own context */
} hca_peer_t;

typedef struct hca_mapper_view hca_mapper_view_t;

/* ---------------------------------------------------------------- answers */

/* An answer being written to a requester (hca_shm_answer.c). */
typedef struct hca_answer {
    hca_peer_t *peer;
    hca_map_t  *map;       /* its q object: map->bounce for chunks */
    uint32_t    src_qpn;
    uint32_t    resp_idx;
} hca_answer_t;

/* 0: the requester's response slot resp_idx is ready (finish with
 * hca_answer_end, soon: a lock is held); -1: no answer is possible (the
 * requester is gone or forged, or its QP was told to fail). */
int  hca_answer_begin(hca_device_t *dev, uint32_t src_pid, uint32_t src_ctx,
                      uint32_t src_qpn, uint32_t resp_idx, hca_answer_t *a);
void hca_answer_end(hca_device_t *dev, hca_answer_t *a, uint32_t stamp,
                    hca_wc_status_t status, uint64_t value);


/* ---------------------------------------------------------------- state */

/* Per device context (dev->fabric_dev[HCA_FABRIC_SHM]). */
typedef struct hca_shm_dev {
    hca_peer_t        *peers;      /* under dev->lock */
    uint32_t           sweep_turn; /* hca_shm_check_peers: whose start
                                      time is read this time */
    hca_mapper_view_t *mapper_views; /* our mappings of their contexts */
    pthread_mutex_t    fence_lock; /* mapper_views */
    pthread_mutex_t    qobj_lock;  /* peers' q objects (hca_shm_answer.c) */
    uint32_t           n_qobjs;
    uint64_t           qobj_tick;
    int                mb_ok;      /* registered for membarrier: our
                                      deregistrations run it */
    pthread_t          svc_thread;
    int                svc_sock;
    int                svc_started;
    _Atomic int        svc_stop;
    /* the owner serves its own service ring while it polls (hca_svc_poll):
     * then the responder thread sleeps unarmed, and requesters wake
     * nobody (hca_shm_service.c) */
    pthread_mutex_t    svc_lock;     /* the ring's consumer */
    _Atomic int        svc_napping;  /* the thread sleeps unarmed */
    _Atomic uint64_t   svc_owner_served; /* requests the owner's polls
                                            served */
} hca_shm_dev_t;

/* Per QP (qp->fabric_priv). */
typedef struct hca_shm_qp {
    hca_peer_t       *peer;
    hca_map_t        *tgt_ring;   /* cached target ring mapping */
    uint32_t          tgt_ring_id;
    /* the target QP's table entry as last checked in full, at its
     * generation tgt_gen (hca_shm_target_cached); NULL: not yet */
    hca_qp_pub_t     *tgt_pub;
    uint64_t          tgt_gen;
    struct {                      /* direct path: the last peer MR used,
                                     checked in full and marked under
                                     registration serial (hca_shm_direct.c) */
        uint32_t          rkey;   /* 0: empty */
        uint32_t          access;
        uint64_t          serial;
        hca_mpt_entry_t  *entry;
        uint8_t          *base;   /* our mapping of its addr */
        uint64_t          addr;
        uint64_t          length;
        int               mode;   /* HCA_ACCESS_BUSY or _BUSY_FENCED */
        int               open;   /* a direct_ptr access not ended */
        uint32_t          dm_id;
        /* the last key found to be plain memory (no direct path: the
         * caller posts a WR), while its registration lives */
        uint32_t          plain_rkey;
        uint64_t          plain_serial;
        hca_mpt_entry_t  *plain_entry;
    } dcache;
} hca_shm_qp_t;

_Static_assert(sizeof(hca_shm_qp_t) <= HCA_FABRIC_QP_PRIV,
               "hca_shm_qp_t must fit in qp->fabric_priv");

HCA_INLINE hca_shm_qp_t *hca_shm_qp(hca_qp_t *qp)
{
    return (hca_shm_qp_t*)(void*)qp->fabric_priv;
}

HCA_INLINE hca_shm_dev_t *hca_shm_dev(hca_device_t *dev)
{
    return (hca_shm_dev_t*)dev->fabric_dev[HCA_FABRIC_SHM];
}

/* ---------------------------------------------------------------- peers */

/* hca_shm_peer.c */
hca_peer_t *hca_peer_get(hca_device_t *dev, const hca_port_addr_t *addr);
void        hca_peers_destroy(hca_device_t *dev);
hca_map_t  *hca_peer_ring(hca_device_t *dev, hca_peer_t *peer,
                          uint32_t ring_id);
/* Maps a requester QP's q object (not cached: see hca_shm_answer.c). */
hca_map_t  *hca_peer_qobj_map(hca_device_t *dev, hca_peer_t *peer,
                              uint32_t qpn);
/* A peer's device memory or export (dm_id & HCA_DM_EXPORT) mapped, or
 * NULL: device memory that is gone, or an export we cannot map (the
 * caller then takes another route to that memory). */
hca_map_t  *hca_peer_dm(hca_device_t *dev, hca_peer_t *peer,
                        uint32_t dm_id);
#define HCA_PEER_EXPORT_MAPS 256
int         hca_peer_alive(hca_peer_t *peer);
uint64_t    hca_shm_check_peers(hca_device_t *dev);

/* ---------------------------------------------------------------- copies */

/* hca_shm_copy.c: between an SGE list (from byte offset) and a buffer */
void hca_sge_gather(const hca_sge_t *sge, uint32_t num_sge, uint64_t offset,
                    void *dst, uint64_t len);
void hca_sge_scatter(const hca_sge_t *sge, uint32_t num_sge, uint64_t offset,
                     const void *src, uint64_t len);
/* Single copy between our SGEs and [raddr, raddr+len) of pid. */
hca_wc_status_t hca_cma_xfer(uint32_t pid, int write, const hca_sge_t *sge,
                             uint32_t num_sge, uint64_t raddr);
/* A SEND_PULL's data, from its source into the receive WQE. */
hca_wc_status_t hca_shm_pull(hca_device_t *dev, const hca_msg_hdr_t *hdr,
                             const hca_wire_iov_t *wiov,
                             const hca_rwqe_t *rwqe);

/* ---------------------------------------------------------------- exec */

/* hca_shm_exec.c */
hca_exec_t hca_shm_exec(hca_qp_t *qp, hca_wqe_t *wqe,
                        hca_wc_status_t *status_p);
hca_exec_t hca_shm_poll_response(hca_qp_t *qp, hca_wqe_t *wqe,
                                 hca_wc_status_t *status_p);
int        hca_shm_response_ready(const hca_qp_t *qp, const hca_wqe_t *wqe);
/* ---------------------------------------------------------------- direct */

/* hca_shm_direct.c: the fast paths (hca_fast_ops_t) and the doorbell's */
int   hca_shm_post_direct(hca_qp_t *qp, hca_send_wr_t *wr, uint64_t length);
int   hca_shm_send_reserve(hca_qp_t *qp, uint32_t length_hint,
                           hca_send_slot_t *slot);
int   hca_shm_send_commit(hca_qp_t *qp, hca_send_slot_t *slot,
                          uint32_t length, hca_wr_opcode_t opcode,
                          uint32_t imm_data);
void  hca_shm_send_cancel(hca_qp_t *qp, hca_send_slot_t *slot);
int   hca_shm_send_short(hca_qp_t *qp, const void *hdr, uint32_t hdr_length,
                         const void *data, uint32_t length,
                         hca_wr_opcode_t opcode, uint32_t imm_data);
int   hca_shm_write_direct(hca_qp_t *qp, const void *buf, size_t length,
                           uint64_t remote_addr, uint32_t rkey);
void *hca_shm_direct_ptr(hca_qp_t *qp, uint64_t remote_addr, uint32_t rkey,
                         size_t length, unsigned access);
void  hca_shm_direct_done(hca_qp_t *qp);
int   hca_shm_atomic_direct(hca_qp_t *qp, hca_wr_opcode_t opcode,
                            unsigned size, uint64_t remote_addr,
                            uint32_t rkey, uint64_t compare_add,
                            uint64_t swap, void *result);
int   hca_shm_rkey_ptr(hca_qp_t *qp, uint64_t remote_addr, uint32_t rkey,
                       size_t length, void **ptr_p);

/* ---------------------------------------------------------------- dm view */

/* hca_shm_dm_view.c: a peer's device memory mapped for rkey_ptr */
int   hca_shm_dm_view_open(const hca_port_addr_t *addr, uint32_t dm_id,
                           hca_dm_view_t **view_p);
int   hca_shm_dm_view_ptr(hca_dm_view_t *view, uint32_t rkey,
                          uint64_t remote_addr, void **ptr_p);
void  hca_shm_dm_view_close(hca_dm_view_t *view);
/* Ends an access hca_shm_direct_ptr left open (disconnect). */
void  hca_direct_close(hca_qp_t *qp);

/* ---------------------------------------------------------------- fence */

/* hca_shm_fence.c, the owner's side (the requester's: hca_shm_fence.h) */
int    hca_access_fence_init(hca_device_t *dev);
void   hca_access_fence_wait(hca_device_t *dev, uint32_t accessors,
                             int unfenced);
void   hca_access_fence_close(hca_device_t *dev);
size_t hca_mapper_view_size(void);
/* At close: leave the peer's mapper table. */
void   hca_access_unregister(hca_device_t *dev, hca_peer_t *peer);

/* ---------------------------------------------------------------- service */

/* hca_shm_answer.c: the fabric's answer op */
void hca_shm_answer(hca_device_t *dev, const hca_msg_hdr_t *hdr,
                    const hca_pull_hdr_t *pull, hca_wc_status_t status);

/* hca_shm_service.c: the responder thread */
int  hca_svc_start(hca_device_t *dev);
void hca_svc_stop(hca_device_t *dev);
/* The owner's poll found requests, and its arm (the fabric's serve and
 * owner_armed ops). */
int  hca_svc_serve(hca_device_t *dev);
void hca_svc_owner_armed(hca_device_t *dev);

#endif
