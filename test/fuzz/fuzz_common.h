/*
 * fuzz_common.h - the world the libFuzzer harnesses of test/fuzz/ attack.
 *
 * A "victim" device context owns three QPs with their own receive rings:
 * an ordinary one and an in-place one (HCA_QP_CREATE_RECV_INPLACE), each
 * connected to a QP of a second "sender" context of the same process, and
 * one that accepts any source (RTR with HCA_QPN_ANY, a DC target: the only
 * kind a source in another process may reach without being its peer), and
 * a few MRs.  The harnesses play a hostile peer: through the sender
 * context's mappings of the victim's objects (exactly what another process
 * maps) they write forged messages into the victim's receive rings
 * (fuzz_ring.c) and forged requests into its service ring (fuzz_svc.c),
 * following the producer protocol of hca_ring.h, and let the victim consume
 * them: hca_cq_poll() for the rings, the service thread for the requests.
 *
 * Peer-supplied identities are picked through selectors, not taken raw,
 * so that inputs mean the same thing in every run (pids and QPNs change)
 * and so that a forged source never names an unrelated process on the
 * host: the victim would map and write into that process's objects.
 */
#ifndef HCA_FUZZ_COMMON_H
#define HCA_FUZZ_COMMON_H

#include "hca_shm_fabric.h" /* white box: the shm fabric's peers and rings */

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>

/* Victim QPs, by role */
enum {
    FZ_QP_RQ      = 0, /* own receive queue */
    FZ_QP_INPLACE = 1, /* own receive queue, in-place receive */
    FZ_QP_ANY     = 2, /* own receive queue, any source (RTR only) */
    FZ_NUM_QP     = 3
};

#define FZ_RECV_DEPTH  8    /* receives kept posted per victim QP */
#define FZ_RECV_SGE    3
#define FZ_PULL_SRC    16384 /* bytes of the buffer SEND_PULL reads from */
#define FZ_MR_LEN      4096  /* remote-access MRs of the service harness */
#define FZ_WRID_MAGIC  0xf022u /* wr_id >> 48 of every receive we post */

typedef struct fz_world {
    hca_device_t    *victim;
    hca_device_t    *sender;       /* plays the peer */
    hca_port_addr_t  vaddr, saddr;
    hca_pd_t        *vpd, *vpd2, *spd;
    hca_cq_t        *vcq, *scq;
    hca_qp_t        *vqp[FZ_NUM_QP];
    hca_qp_t        *sqp[FZ_NUM_QP]; /* sqp[i] sends to vqp[i] (and is
                                        its peer, but for FZ_QP_ANY) */
    /* receive buffers: separate allocations, so ASan guards each one */
    uint8_t         *rbuf[FZ_RECV_SGE];
    uint32_t         rlen[FZ_RECV_SGE];
    hca_mr_t        *rmr[FZ_RECV_SGE];
    /* service harness targets */
    uint8_t         *mem_rw, *mem_ro, *mem_pd2;
    hca_dm_t        *dm;
    hca_mr_t        *mr_rw, *mr_ro, *mr_dm, *mr_pd2;
    uint32_t         stale_key;    /* of an MR registered and deregistered */
    /* the victim as the sender sees it */
    hca_peer_t      *vpeer;
    hca_map_t       *ring[FZ_NUM_QP];
    /* other processes a forged source may name */
    pid_t            child;        /* a fork of ours, no device open: single
                                      copy from it works, it has no ctx */
    uint32_t         dead_pid;     /* above PID_MAX_LIMIT: never exists */
    /* the victim's service socket, to wake its thread */
    int              wake_sock;
    struct sockaddr_un svc_addr;
    socklen_t        svc_addr_len;
    /* receive accounting, per victim QP since its last restart */
    uint64_t         posted[FZ_NUM_QP];
    uint64_t         completed[FZ_NUM_QP];
    uint64_t         wr_seq;
} fz_world_t;

/* The buffer SEND_PULL iovs point into (global: ASan guards it, and the
 * forked child has it at the same address). */
extern uint8_t fz_pull_src[FZ_PULL_SRC];

/* Sets the world up once (LLVMFuzzerInitialize); aborts on failure. */
fz_world_t *fz_world_init(void);
fz_world_t *fz_world_get(void);

/* An invariant of the victim was broken: print and abort (a finding). */
void fz_fail(const char *fmt, ...)
    __attribute__((noreturn, format(printf, 1, 2)));

/* HCA_FUZZ_VERBOSE=1: the harnesses print each forged message (to read
 * a reproducer: ./fuzz_ring crash-...). */
int fz_verbose(void);

/* HCA_FUZZ_MASK=name,...: known findings to step around, so that a run
 * can look for others (the names are listed where each is masked). */
int fz_masked(const char *name);

/* Input reader: little-endian, zero once the input is exhausted. */
typedef struct fz_in {
    const uint8_t *p;
    size_t         n;
} fz_in_t;

uint8_t  fz_u8(fz_in_t *in);
uint16_t fz_u16(fz_in_t *in);
uint32_t fz_u32(fz_in_t *in);
uint64_t fz_u64(fz_in_t *in);

/* Selectors (see the input formats in fuzz_ring.c / fuzz_svc.c) */
uint32_t fz_pick_pid(const fz_world_t *w, uint8_t sel);
uint32_t fz_pick_ctx(const fz_world_t *w, uint8_t sel, uint32_t raw);
uint32_t fz_pick_src_qpn(const fz_world_t *w, int qp, uint8_t sel,
                         uint32_t raw);
uint32_t fz_pick_dst_qpn(const fz_world_t *w, int qp, uint8_t sel,
                         uint32_t raw);

/* Remote access a victim QP allows (HCA_ACCESS_REMOTE_*). */
unsigned fz_victim_access(int qp);
/* Wakes the victim's service thread (a claim found it armed). */
void fz_wake_svc(fz_world_t *w);
/* Victim QP qp: RESET -> INIT -> RTR (-> RTS), so that every input starts
 * from the same state (no half-received messages, no receives). */
void fz_qp_restart(fz_world_t *w, int qp);
/* Posts receives until FZ_RECV_DEPTH are outstanding. */
void fz_recv_fill(fz_world_t *w, int qp);
/* One round of the victim's consumer: hca_cq_poll until empty (every CQE
 * checked), then hca_recv_peek/release of the in-place QP. */
void fz_victim_poll(fz_world_t *w);
/* Keeps receives posted and polls until both rings are empty; a ring that
 * does not drain is a finding (the consumer stalls on a peer's message). */
void fz_drain(fz_world_t *w);

#endif
