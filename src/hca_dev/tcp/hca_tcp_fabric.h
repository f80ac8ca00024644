/*
 * hca_tcp_fabric.h - private to the tcp fabric: peers on other hosts (or
 * any peer, when tcp is forced), over one TCP connection per path of a
 * pair of device contexts.
 *
 * Files:
 *   hca_fabric_tcp.c  ops table, device open/close, connect, liveness
 *   hca_tcp_netif.c   the paths: which interfaces and addresses the
 *                     listeners use
 *   hca_tcp_path.c    a connection per path to a peer context, sharing
 *                     its responder records; QPs failing over
 *   hca_tcp_link.c    interfaces going down and up (netlink)
 *   hca_tcp_state.c   the connection's and the receiver's state machines
 *   hca_tcp_rel.c     reliability: PSNs, the requester's record of what
 *                     is unanswered and its retransmission, the
 *                     responder's in-order exactly-once check, duplicates
 *                     and the atomic replay table
 *   hca_tcp_conn.c    connections: establish, epoll events, handshake,
 *                     death
 *   hca_tcp_tx.c      sending: frames under tx_lock, queued answers
 *   hca_tcp_rx.c      receiving: the byte stream, cut into handshake
 *                     messages and frames, payloads into their memory
 *   hca_tcp_resp.c    a received frame: the responder (WRITE, READ,
 *                     ATOMIC, SEND into a receive ring) and the answers
 *                     to our own requests
 *   hca_tcp_thread.c  the fabric's thread: accepts, has connections
 *                     read, keeps alive, times out; a user's poll
 *   hca_tcp_exec.c    the requester: a WQE as frames
 *   hca_tcp_frame.c   the header checks (hca_tcp_wire.h)
 *
 * Threads: a requester (the QP's owner) sends its frames itself, under
 * the connection's tx_lock.  The fabric's thread reads every connection,
 * answers requests (the target process need not call the device) and
 * sends the answers under the same lock.  tcp->lock orders the thread's
 * use of QPs (their rings and buffers) against QP destroy, reset and
 * flush (hca_tcp_quiesce).
 */
#ifndef HCA_TCP_FABRIC_H
#define HCA_TCP_FABRIC_H

#include "hca_util.h"
#include "hca_obj.h"
#include "hca_tcp_wire.h"
#include "hca_tcp_auth.h"

#include <sys/socket.h>
#include <sys/uio.h>

#define HCA_TCP_JOBS          256     /* answers queued per connection */
#define HCA_TCP_READS         16      /* READ answers a connection's socket
                                         remembers it carried: a READ asked
                                         again there gets only what it did
                                         not carry (hca_tcp_resp.c) */
#define HCA_TCP_TIMEOUT_MS    10000   /* default retry timeout: nothing
                                         received from a peer for this
                                         long fails its QPs */
#define HCA_TCP_RD_ATOM       HCA_MAX_QP_RD_ATOM /* atomics a requester QP may have
                                         unanswered, and the replay table of
                                         a responder (max_qp_rd_atom) */
#define HCA_TCP_STRIPE_PARTS  256     /* parts of a striped WRITE, at
                                         most (16 MiB): the responder's
                                         bitmap of those landed ahead */
#define HCA_TCP_STRIPE_MIN    (512u * 1024) /* a WRITE this large goes over
                                         two paths, when two are UP */
#define HCA_TCP_RQP_BUCKETS   64      /* responder records' hash, per
                                         connection */
#define HCA_TCP_RQP_ANY       128     /* responder records a peer context
                                         may hold per QP of ours that
                                         accepts any source (and one per QP
                                         of ours connected to it): one per
                                         requester QP of its that addresses
                                         us; a source past them is refused */
#define HCA_TCP_RQP_SWEEP_NS  1000000ull /* records at the limit: those whose
                                         target no longer accepts their
                                         source are looked for at most this
                                         often */
#define HCA_TCP_RTO_NS        20000000ull /* injected loss only: a QP with
                                         frames unanswered this long sends
                                         them again (a live TCP stream
                                         loses nothing: no timer then) */
#define HCA_TCP_REDIAL_MAX_MS 100     /* reconnect attempts' backoff cap */
#define HCA_TCP_CONNECT_MS    5000    /* connect + handshake limit */
#define HCA_TCP_HALF_OPEN_MAX 256     /* inbound connections whose handshake
                                         is not done, per listener (and at
                                         most a quarter of RLIMIT_NOFILE:
                                         the rest is headroom for the
                                         connections that completed it) */
#define HCA_TCP_HALF_OPEN_SRC 64      /* ... of them from one address */
#define HCA_TCP_CONN_SRC      1024    /* established inbound connections
                                         (UP or LINKING) from one source
                                         address: a host's contexts, one
                                         per path each (the environment's
                                         HCA_TCP_CONN_SRC) */
#define HCA_TCP_CONN_MAX      16384   /* ... in all (HCA_TCP_CONN_MAX), and
                                         at most half of RLIMIT_NOFILE;
                                         over a cap the oldest unproven one
                                         closes (hca_tcp_conn_admit) */
#define HCA_TCP_LOG_NS        1000000000ull /* refusals: a log line at most
                                         this often */
#define HCA_TCP_POLL_MAX      64      /* connections a user poll reads; with
                                         more the thread keeps reading */
#define HCA_TCP_READ_BUDGET   (1u << 20) /* bytes one read of a connection
                                         takes before it lets the thread
                                         (its timers: keepalives, other
                                         connections) or the polling
                                         process go on */
#define HCA_TCP_RXBUF         (16u * 1024) /* per-connection read buffer: one
                                         recv takes many small frames */
#define HCA_TCP_RX_TRAIL      sizeof(hca_tcp_hdr_t) /* read behind a
                                         payload that goes straight to
                                         memory: the next header, in the
                                         same readv, and none of the
                                         payload after it (a copy) */

/* The connection's state machine (hca_tcp_state.c). */
typedef enum {
    HCA_TCP_CONN_NEW = 0,        /* made, not connecting yet */
    HCA_TCP_CONN_CONNECTING,     /* connect() in progress */
    HCA_TCP_CONN_HELLO,          /* hello sent (connector) or awaited
                                    (acceptor) */
    HCA_TCP_CONN_UP,
    HCA_TCP_CONN_LINKING,        /* its socket was lost: the connection
                                    lives on (QPs, sequence state) while
                                    the side that dialled dials again,
                                    within the retry timeout */
    HCA_TCP_CONN_DEAD            /* closed; conn->fail says why */
} hca_tcp_conn_state_t;

#define HCA_TCP_TX_ANSWERS    16      /* queued answers sent ahead of a
                                         frame, in the same sendmsg */

/* The frame being written to the socket: a header and the iovecs of its
 * payload, sent in as many sendmsg calls as the socket takes, behind the
 * answers (ACKs, keepalives) that were queued when it started: one
 * sendmsg carries them all, so an answer costs no syscall of its own when
 * a frame goes the same way. */
typedef struct hca_tcp_tx {
    hca_tcp_hdr_t    hdr;
    hca_tcp_hdr_t    answers[HCA_TCP_TX_ANSWERS];
    struct iovec     iov[HCA_TCP_TX_ANSWERS + 2 * (1 + HCA_MAX_SGE)]; /* a
                                   frame twice: injected duplication */
    int              frames;    /* in it: answers, and hdr if any */
    int              iovcnt;
    int              first;     /* first iov not sent */
    size_t           left;      /* bytes not sent */
    uint32_t         owner_qpn; /* requester QP whose buffers the payload
                                   is in (0: none) */
    hca_mpt_entry_t *pinned;    /* READ_RESP: the region it is read from,
                                   released when sent */
    uint8_t         *bounce;    /* HCA_TCP_SEG_MAX bytes, made at the first
                                   orphan: the copy an orphaned frame's
                                   payload goes out from */
    int              cut;       /* injected reset: half of it goes out,
                                   then the socket is dropped */
    uint64_t         hold_ns;   /* injected delay: nothing goes out before
                                   (0: none) */
} hca_tcp_tx_t;

/* An answer the fabric's thread owes a peer: an ACK, or the rest of a
 * READ (sent in HCA_TCP_SEG_MAX frames straight from the region). */
typedef struct hca_tcp_job {
    hca_tcp_hdr_t    hdr;       /* ACK, or READ_RESP of the next part */
    hca_mpt_entry_t *entry;     /* READ: pinned until its last part */
    uint32_t         end;       /* READ: where its parts end (total, or
                                   a striped answer's share) */
    int              striped;   /* READ: its parts say HCA_TCP_F_STRIPED */
    uint64_t         addr;      /* READ: start in our memory */
    int              stale;     /* READ: its answer started over (asked
                                   again under injected loss), its later
                                   parts go to waste: it ends at the next
                                   part boundary */
} hca_tcp_job_t;

/* What of a READ's answer the connection's socket carried, or has queued
 * (tx_lock; forgotten with the socket): a live TCP stream loses nothing,
 * so the same READ asked again on it is answered only with the rest. */
typedef struct hca_tcp_answered {
    uint32_t qpn;       /* the requester QP */
    uint32_t psn;       /* the READ's */
    uint64_t addr;      /* ... its start in our memory */
    uint32_t total;     /* ... its length */
    uint32_t lo, hi;    /* [lo, hi): the bytes of its answer carried */
    uint64_t ns;        /* injected loss: its answer last started over */
} hca_tcp_answered_t;

/* The receiver's state machine (hca_tcp_state.c): the frame being read
 * (under rx_lock). */
typedef enum {
    HCA_TCP_RX_HELLO = 0,
    HCA_TCP_RX_HDR,
    HCA_TCP_RX_PAYLOAD,         /* into rx.iov (memory, or the stage) */
    HCA_TCP_RX_DISCARD,         /* refused: read and dropped */
    HCA_TCP_RX_PARKED           /* a SEND in the stage waits for room in
                                   its receive ring */
} hca_tcp_rx_state_t;

/* Where a payload being read goes (hca_tcp_rx_t.kind). */
typedef enum {
    HCA_TCP_RXK_NONE = 0,
    HCA_TCP_RXK_STAGE,   /* a SEND fragment into conn->rx.stage */
    HCA_TCP_RXK_REGION,  /* a WRITE into a pinned region */
    HCA_TCP_RXK_READ     /* a READ_RESP into a waiting WQE's buffers */
} hca_tcp_rx_kind_t;

typedef struct hca_tcp_rx {
    hca_tcp_rx_state_t state;
    union {
        hca_tcp_hdr_t   hdr;
        hca_tcp_hello_t hello;
        uint8_t         bytes[sizeof(hca_tcp_hello_t) > sizeof(hca_tcp_hdr_t) ?
                              sizeof(hca_tcp_hello_t) : sizeof(hca_tcp_hdr_t)];
    } in;
    size_t           got;       /* bytes of `in` read */
    size_t           want;      /* bytes of `in` expected */
    int              kind;      /* PAYLOAD: into what (hca_tcp_rx_kind_t) */
    struct iovec     iov[HCA_MAX_SGE];
    int              iovcnt;
    size_t           left;      /* payload bytes not read */
    hca_mpt_entry_t *pinned;    /* WRITE: the region, until the frame's end */
    uint8_t         *stage;     /* SEND fragment, HCA_TCP_SEND_MAX bytes */
    uint64_t         parked_ns; /* when it parked */
    /* bytes read from the socket and not yet used: headers and small
     * payloads are read in bulk and taken from here (a payload is read
     * straight to its memory once the buffer has no more of it) */
    uint8_t         *buf;       /* HCA_TCP_RXBUF bytes */
    uint32_t         buf_head;  /* first unused byte */
    uint32_t         buf_tail;  /* end of the bytes read */
    int              bulk;      /* the last header had a large payload:
                                   the next header is read with a little
                                   behind it, not a whole buffer of what
                                   is likely more payload (a copy) */
    struct hca_tcp_rqp *rqp;    /* the request's responder record */
    int              dup;       /* the request is a duplicate */
} hca_tcp_rx_t;

/* An atomic the responder executed, kept to answer its duplicate. */
typedef struct hca_tcp_atom {
    uint32_t psn;
    uint8_t  valid;
    uint8_t  status;
    uint64_t value;
} hca_tcp_atom_t;

/* The responder's record of one requester QP (InfiniBand's responder
 * state of an RC QP): what it expects next, and the atomics it answered.
 * Kept per connection, which outlives its sockets; made only for a
 * requester QP whose first frame its target QP accepted, as many for a
 * peer context as it may have QPs that address ours (hca_tcp_rel.c). */
typedef struct hca_tcp_rqp {
    struct hca_tcp_rqp *next;       /* hash chain */
    uint32_t        src_qpn;
    uint32_t        start_psn;      /* its connect's first frame */
    uint32_t        epsn;           /* the next frame to execute */
    uint8_t         nak_sent;       /* a PSN_SEQ NAK for epsn is out */
    uint8_t         err;            /* refused at err_psn: later frames
                                       are dropped, as after a NAK on IB */
    uint8_t         err_status;
    uint8_t         atom_next;
    uint32_t        err_psn;
    uint32_t        dst_qpn;        /* our QP its connect's first frame
                                       went to: the record lives while that
                                       QP accepts it (hca_tcp_rqps_sweep) */
    hca_tcp_atom_t  atom[HCA_TCP_RD_ATOM]; /* the replay table: a ring */
    /* a striped WRITE (HCA_TCP_F_STRIPED): its parts may land ahead of
     * epsn, from the other path.  Bit k of `ahead`: the part at
     * stripe_psn + k landed; epsn passes landed parts when it reaches
     * them.  Its LAST, landed ahead, is held here and answered then. */
    uint32_t        stripe_psn;     /* the WRITE's first PSN */
    uint8_t         stripe_on;
    uint8_t         last_held;
    uint64_t        ahead[HCA_TCP_STRIPE_PARTS / 64];
    hca_tcp_hdr_t   last_hdr;
    struct hca_tcp_conn *busy;      /* the path whose reader executes the
                                       frame expected (epsn), from its
                                       header to its end: a copy of it on
                                       another path after a failover waits
                                       or takes it over (hca_tcp_psn_check) */
    uint64_t        busy_frame;     /* ... its rx_frames then */
} hca_tcp_rqp_t;

typedef struct hca_tcp_conn {
    struct hca_tcp_conn *next;
    struct hca_tcp_dev  *tcp;
    int                  fd;
    int                  path;      /* which of our paths (tcp->paths): the
                                       listener it came in on, or the one
                                       we dialled its peer's path of the
                                       same index from */
    struct hca_tcp_conn *rq_lead;   /* whose responder records it uses:
                                       every connection with one peer
                                       context (its incarnation) shares
                                       them, so a QP that moves to another
                                       path keeps its PSN order and its
                                       duplicates' answers (tcp->lock) */
    uint32_t             lead_refs; /* connections whose rq_lead it is:
                                       not freed while they use it */
    _Atomic int          state;     /* hca_tcp_conn_state_t: changed only
                                       by hca_tcp_conn_to */
    struct hca_tcp_conn *_Atomic superseded; /* our dialled connection
                                       crossed by the peer's on the same
                                       path (both dialled at once): the
                                       one to use, theirs if it is the
                                       smaller context's; its QPs move
                                       there when idle (hca_tcp_path.c) */
    _Atomic int          ask_failover; /* lost its socket: its QPs are to
                                       be asked to fail over (the thread,
                                       hca_tcp_failover_ask) */
    int                  trace;     /* HCA_TRACE=1: transitions logged */
    int                  outbound;  /* we connected */
    _Atomic int          fail;      /* DEAD: what its QPs report
                                       (hca_wc_status_t; the first
                                       killer's, set before the state) */
    hca_port_addr_t      peer;      /* host, pid, ctx, listener; inbound:
                                       the identity its hello claimed */
    /* the handshake (the thread; read-only once UP) */
    int                  hs_step;   /* the last message sent (0: none) */
    hca_tcp_transcript_t hs;        /* its nonces, identities, keys */
    uint8_t              kx_sk[HCA_TCP_KX_LEN]; /* our ephemeral secret
                                       (wiped once the key is derived) */
    uint8_t              hs_key[HCA_TCP_KEY_LEN]; /* the session key of hs
                                       (the handshake under way) ... */
    int                  hs_keyed;  /* ... derived (its CHALLENGE went out,
                                       or came in), not yet UP */
    uint8_t              proof[HCA_TCP_MAC_LEN]; /* inbound: MAC(the
                                       claimed peer's secret; IDENTITY, hs) */
    uint8_t              cont;      /* inbound: what its PROOF continues
                                       (hca_tcp_cont_t) ... */
    uint8_t              cont_mac[HCA_TCP_MAC_LEN]; /* ... and proved */
    _Atomic int          proven;    /* the peer is who conn->peer says: we
                                       dialled its listener with its secret
                                       and it proved it knows it; or
                                       (inbound) its proof verified with the
                                       secret of that peer's address */
    uint64_t             proven_by; /* inbound, proven: that secret (a
                                       resume proves it again) */
    uint8_t              src_ip[16]; /* inbound: where from (IPv4 mapped) */
    uint32_t             qp_refs;   /* our QPs connected through it
                                       (tcp->lock) */
    uint64_t             peer_incarn; /* the peer context's incarnation
                                         (its hello): 0 if it cannot resume */
    int                  was_up;    /* it was UP once: a lost socket sends
                                       it to LINKING, not DEAD */
    int                  dead_woken; /* DEAD, and its QPs' owners woken
                                       for it (the thread, hca_tcp_reap) */
    int                  has_key;   /* key is set: it was UP once */
    uint8_t              key[HCA_TCP_KEY_LEN]; /* the session key of the
                                       last completed handshake: what a
                                       RESUME or a JOIN proves it knows */
    uint8_t              key_prev[HCA_TCP_KEY_LEN]; /* acceptor: the one
                                       before (a VERDICT lost with its
                                       socket leaves the connector one
                                       handshake behind) */
    uint64_t             redial_ns; /* LINKING, dialler: the next attempt */
    uint32_t             redial_ms; /* its backoff */
    uint64_t             start_ns;  /* connect began */
    _Atomic uint64_t     last_rx_ns;
    _Atomic uint64_t     last_tx_ns;
    /* sending (tx_lock) */
    pthread_mutex_t      tx_lock;
    hca_tcp_tx_t         tx;
    uint64_t             tx_stuck_ns; /* the frame in tx met a full socket
                                         then (0: it did not): with
                                         answers queued, it must be out
                                         within the peer timeout */
    hca_tcp_job_t        jobs[HCA_TCP_JOBS];
    uint32_t             jobs_head, jobs_tail;
    hca_tcp_answered_t   answered[HCA_TCP_READS]; /* the last READs
                                       answered on its socket: a ring */
    uint32_t             answered_next;
    int                  want_out;  /* EPOLLOUT armed */
    /* receiving: the thread, or a user thread polling the device
     * (hca_tcp_poll), under rx_lock.  Lock order: rx_lock, then tcp->lock;
     * holding tcp->lock, rx_lock is only tried. */
    pthread_mutex_t      rx_lock;
    hca_tcp_rx_t         rx;
    hca_tcp_rqp_t       *rqps[HCA_TCP_RQP_BUCKETS]; /* responder records
                                       (tcp->lock): the rq_lead's are used */
    uint32_t             n_rqps;
    uint32_t             rqp_limit; /* of n_rqps, computed last (our QPs
                                       change: computed again when it is
                                       reached, hca_tcp_rqp_limit) */
    uint64_t             rqp_swept_ns; /* the last look for records whose
                                       target is gone (hca_tcp_rqps_sweep) */
    uint64_t             rx_frames; /* headers read (rx_lock) */
    uint64_t             rx_judged_frames; /* the timer pass's last look */
    uint64_t             rx_judged_ns;     /* at a payload (rx_lock) */
    int                  reading;   /* EPOLLIN armed */
    int                  answer_now;  /* an answer queued that its peer
                                         may be waiting for: sent when
                                         the read ends (rx_lock) */
    int                  answer_polls; /* user polls the queued answers
                                          still wait for a frame of ours
                                          to go with (rx_lock) */
} hca_tcp_conn_t;

/* The fabric's own counters (hca_counters_t.fabric_own[HCA_FABRIC_TCP]),
 * named by hca_tcp_counter_name. */
typedef enum {
    HCA_TCP_CNT_FRAMES_TX,
    HCA_TCP_CNT_FRAMES_RX,
    HCA_TCP_CNT_BYTES_TX,
    HCA_TCP_CNT_BYTES_RX,
    HCA_TCP_CNT_RETRIES,      /* sends that found no room (socket, ring) */
    HCA_TCP_CNT_CONNS,        /* connections established */
    HCA_TCP_CNT_CONNS_LOST,   /* closed: reset, timeout, bad frame, refusal */
    HCA_TCP_CNT_BAD_FRAMES,   /* connections closed for a malformed frame */
    HCA_TCP_CNT_REFUSED,      /* hellos refused (secret, context, version);
                                 connections closed at a cap (half-open,
                                 established: HCA_TCP_CONN_SRC, _MAX) */
    HCA_TCP_CNT_RETRANSMITS,  /* request frames sent again */
    HCA_TCP_CNT_DUP_REQUESTS, /* request frames received again (not
                                 executed again) */
    HCA_TCP_CNT_REPLAYS,      /* duplicate atomics answered from the replay
                                 table, duplicate READs answered again */
    HCA_TCP_CNT_SEQ_NAKS,     /* PSN_SEQ NAKs sent (a frame came ahead) */
    HCA_TCP_CNT_RTOS,         /* retransmissions by timer (injected loss) */
    HCA_TCP_CNT_RECONNECTS,   /* connections resumed on a new socket */
    HCA_TCP_CNT_FAULTS,       /* injected faults (HCA_FAULT) */
    HCA_TCP_CNT_FAILOVERS,    /* QPs moved to another path, theirs lost */
    HCA_TCP_CNT_STRIPED,      /* WRITEs sent over two paths (begun: a
                                 path lost sends one again on one) */
    HCA_TCP_CNT_STRIPED_READS, /* READs answered over two paths */
    HCA_TCP_CNT_RECORDS,      /* responder records held now (a gauge:
                                 made less freed; a requester QP refused
                                 for want of room is a nak_rem_op_err) */
    HCA_TCP_CNT_JOINS,        /* connections that joined a session by
                                 proving its key (a JOIN: another path) */
    HCA_TCP_CNT_NAKS,         /* requests refused, + the syndrome */
    HCA_TCP_CNT_PATHS = HCA_TCP_CNT_NAKS + HCA_WC_STATUS_LAST, /* per path
                                 (HCA_TCP_CNT_PATH) */
    HCA_TCP_CNT_LAST = HCA_TCP_CNT_PATHS +
                       HCA_NET_MAX_PATHS * 4
} hca_tcp_counter_t;
/* A path's own counters: frames and bytes sent on it, frames sent again
 * on it, QPs moved off it (the path index counts: the sums of every
 * process of the host, whose paths are numbered as they list them). */
enum {
    HCA_TCP_PATH_FRAMES_TX = 0,
    HCA_TCP_PATH_BYTES_TX,
    HCA_TCP_PATH_RETRANSMITS,
    HCA_TCP_PATH_FAILOVERS
};
#define HCA_TCP_CNT_PATH(_path, _which) \
    (HCA_TCP_CNT_PATHS + (_path) * 4 + (_which))
_Static_assert(HCA_TCP_CNT_LAST <= HCA_FABRIC_COUNTERS_MAX,
               "the tcp fabric's counters do not fit hca_counters_t");

/* They live in the context's responder-side counters (dev->svc_cnt,
 * shared memory: hca_devinfo sums them); any thread adds. */
#define HCA_TCP_COUNT(_tcp, _counter, _n) \
    __atomic_fetch_add(&(_tcp)->dev->svc_cnt->fabric_own[HCA_FABRIC_TCP] \
                                                        [_counter], \
                       (uint64_t)(_n), __ATOMIC_RELAXED)

/* One of the context's paths: an interface with an address of ours, and
 * its listener (hca_tcp_netif.c). */
typedef struct hca_tcp_path {
    int                  listen_fd;
    int                  listen_paused; /* out of fds: the listener waits
                                           for the next timer pass */
    hca_net_addr_t       addr;       /* the listener's */
    char                 ifname[32];
    unsigned             ifindex;
    _Atomic int          down;       /* its interface is down (netlink):
                                        its connections were dropped */
} hca_tcp_path_t;

typedef struct hca_tcp_dev {
    hca_device_t        *dev;
    hca_tcp_path_t       paths[HCA_NET_MAX_PATHS];
    int                  n_paths;    /* >= 1 */
    int                  nl_fd;      /* netlink: our interfaces' links
                                        going down and up (-1: none) */
    int                  epfd;
    int                  ready_epfd; /* every connection's socket, for
                                        input: a user poll asks it (no
                                        socket lock taken) whether any has
                                        something before it reads them */
    _Atomic int          rx_buffered; /* a read left frames in a read
                                         buffer: the next poll reads even
                                         with no socket readable */
    int                  wake_fd;    /* eventfd: stop, new connection */
    pthread_t            thread;
    _Atomic int          running;
    _Atomic int          parked;     /* a connection waits for ring room:
                                        the thread looks every 1 ms */
    pthread_mutex_t      lock;       /* conns, and the thread's use of QPs */
    hca_tcp_conn_t      *conns;
    uint64_t             secret;
    uint32_t             timeout_ms; /* the retry timeout */
    uint64_t             stripe_min; /* a WRITE or READ this large may
                                        stripe (HCA_TCP_STRIPE_MIN, or the
                                        environment's; UINT64_MAX never) */
    uint64_t             incarn;     /* this context's incarnation */
    uint64_t             open_ns;
    uint64_t             reset_ns;   /* injected periodic resets: the last */
    int                  relisten;   /* injected listener restart: 1 closed,
                                        2 bound again */
    uint64_t             relisten_ns; /* ... when it is bound again */
    _Atomic int          linking;    /* a connection is LINKING: the
                                        thread looks every 1 ms */
    uint8_t             *scratch;    /* discarded payload lands here */
    _Atomic uint64_t     conns_dead; /* found dead (check_peers counts) */
    _Atomic uint32_t     conns_up;   /* live connections: polls read them */
    _Atomic uint64_t     user_poll_seq; /* counts user polls (relaxed,
                                           not exact): no clock read in a
                                           poll, the thread times them */
    uint64_t             poll_seq_seen; /* the thread's: seq at its last
                                           look, and when it changed */
    uint64_t             poll_seen_ns;
    _Atomic int          poller_armed; /* a CQ was armed since the thread
                                          last looked: no poll comes */
    _Atomic int          user_polls; /* the thread leaves reading to the
                                        polling process (hca_tcp_thread.c) */
    _Atomic int          answers_held; /* a poll left answers queued: the
                                          thread sends them at its next
                                          watch (HCA_TCP_WATCH_MS) */
    uint32_t             half_open_max; /* HCA_TCP_HALF_OPEN_MAX, or less
                                           under a low RLIMIT_NOFILE */
    uint32_t             conn_src_max; /* HCA_TCP_CONN_SRC, or the
                                          environment's */
    uint32_t             conn_max;   /* HCA_TCP_CONN_MAX, or the
                                        environment's; at most half of
                                        RLIMIT_NOFILE */
    uint64_t             log_ns;     /* the last refusal logged (thread) */
    uint32_t             log_held;   /* refusals not logged since */
} hca_tcp_dev_t;

/* A WQE whose frames were sent and whose answer has not come: the
 * requester's record for retransmission (a ring per QP, send-queue deep).
 * Its frames are rebuilt from the WQE, which keeps its buffers until the
 * completion. */
enum { HCA_TCP_SENT_PLAIN = 0, HCA_TCP_SENT_READ, HCA_TCP_SENT_ATOMIC };
typedef struct hca_tcp_sent {
    uint32_t psn;       /* its first frame's */
    uint32_t npsn;      /* its frames: one PSN each */
    uint32_t sq_idx;    /* the WQE ... */
    uint32_t stamp;     /* ... and its resp_stamp */
    uint32_t read_off;  /* READ: answer bytes landed in order (thread) */
    uint32_t read_gap;  /* READ: 1 + the read_off it was sent again from
                           (0: none): one request per gap */
    uint8_t  kind;      /* HCA_TCP_SENT_* */
    uint8_t  striped;   /* a WRITE whose parts go over two paths, or a
                           READ whose answer may: each frame says so
                           (HCA_TCP_F_STRIPED) */
    uint8_t  read_done; /* READ (thread): its answer is in whole, maybe
                           before that of a striped READ ahead of it */
    uint64_t read_got[HCA_TCP_STRIPE_PARTS / 64]; /* READ (thread): parts
                           of a striped answer that landed ahead of
                           read_off (bit k: at k * HCA_TCP_SEG_MAX) */
} hca_tcp_sent_t;

/* Per-QP state, in qp->fabric_priv.  The owner (who posts and polls)
 * writes next_psn, rtx_psn and sent_head; the thread, which takes the
 * answers, writes sent_tail and asks for a retransmission in rewind. */
typedef struct hca_tcp_qp {
    hca_tcp_conn_t  *conn;        /* the path its frames take now: the
                                     owner moves it (tcp->lock) */
    hca_tcp_conn_t  *home;        /* the path it was given at connect: it
                                     goes back there when it is up again
                                     and nothing is unanswered */
    hca_tcp_sent_t  *sent;        /* sent_mask + 1 entries */
    uint32_t         sent_mask;
    uint32_t         start_psn;   /* random at each connect (RTR) */
    uint32_t         next_psn;    /* of its next new frame */
    uint32_t         rtx_psn;     /* the next frame to send again
                                     (== next_psn: none) */
    uint32_t         wire_psn;    /* after the last frame that went out:
                                     hca_tcp_rtx sends those from it on
                                     for their first time (posted before
                                     the connection was UP), not again */
    _Atomic uint64_t sent_head;   /* owner */
    _Atomic uint64_t sent_tail;   /* thread (tcp->lock) */
    _Atomic uint64_t rewind;      /* thread: 1 << 32 | psn to send again
                                     from (0: none) */
    _Atomic uint64_t answered_ns; /* thread: an answer was taken */
    _Atomic uint32_t atomics_out; /* unanswered atomics (HCA_TCP_RD_ATOM) */
    _Atomic uint32_t move;        /* thread: its path was lost, another
                                     may be UP: the owner fails over */
    uint64_t         rto_ns;      /* owner: injected loss, when it looked */
    /* a WRITE striped over its path and a sibling (hca_tcp_stripe.c),
     * the owner's: the sibling (a qp_refs of it held), the parts it
     * takes ([0, stripe_split); the QP's path takes the rest), the next
     * part of each to send, and the PSN after the WRITE: no later WQE
     * goes before it is answered */
    hca_tcp_conn_t  *stripe_conn;
    uint32_t         stripe_split;
    uint32_t         stripe_next[2]; /* [0]: the sibling's, [1]: ours */
    uint32_t         stripe_end;
    uint8_t          striping;    /* parts not sent yet */
    uint8_t          stripe_reads; /* the open stripe is of READs: READs
                                     may follow it, nothing else */
    _Atomic uint32_t stripe_open; /* not answered yet: the thread reads
                                     it when a path is lost */
} hca_tcp_qp_t;

_Static_assert(sizeof(hca_tcp_qp_t) <= HCA_FABRIC_QP_PRIV, "tcp QP state");

HCA_INLINE hca_tcp_qp_t *hca_tcp_qp(hca_qp_t *qp)
{
    return (hca_tcp_qp_t*)(void*)qp->fabric_priv;
}

HCA_INLINE hca_tcp_dev_t *hca_tcp_dev(hca_device_t *dev)
{
    return (hca_tcp_dev_t*)dev->fabric_dev[HCA_FABRIC_TCP];
}

/* The WQE's buffers at [offset, offset + len) as iovecs (at most
 * HCA_MAX_SGE); -1 if that is not inside them. */
HCA_INLINE int hca_tcp_sge_iov(const hca_wqe_t *wqe, uint64_t offset,
                               uint64_t len, struct iovec *iov)
{
    int n = 0;

    if ((offset > wqe->length) || (len > wqe->length - offset)) {
        return -1;
    }
    for (uint32_t i = 0; (i < wqe->num_sge) && (len > 0); ++i) {
        uint64_t take;
        if (offset >= wqe->sge[i].length) {
            offset -= wqe->sge[i].length;
            continue;
        }
        take = wqe->sge[i].length - offset;
        take = (take < len) ? take : len;
        iov[n].iov_base = (uint8_t*)(uintptr_t)wqe->sge[i].addr + offset;
        iov[n].iov_len  = take;
        ++n;
        len   -= take;
        offset = 0;
    }
    return n;
}

/* The two are paths to one peer context (its incarnation): they share
 * responder records, and either carries the answers of a QP's frames. */
HCA_INLINE int hca_tcp_conn_siblings(const hca_tcp_conn_t *a,
                                     const hca_tcp_conn_t *b)
{
    return (a == b) || ((a->rq_lead != NULL) && (a->rq_lead == b->rq_lead));
}

/* The peer's listener of its path `path` (its address: net, net_more). */
HCA_INLINE const hca_net_addr_t *hca_tcp_peer_net(const hca_port_addr_t *peer,
                                                  int path)
{
    return (path == 0) ? &peer->net : &peer->net_more[path - 1];
}

/* hca_tcp_netif.c: the paths, from the setting (names or addresses,
 * comma separated) or the default choice: how many (>= 1), or -errno. */
int  hca_tcp_netif_pick(const char *setting, hca_tcp_path_t *paths, int max);
int  hca_tcp_sockaddr(const hca_net_addr_t *addr, void *sa, uint32_t *len);
/* the path's listener at path->addr, on a port of [port_min, port_max]
 * (0: any): 0 and path->listen_fd, path->addr.port set, or -errno */
int  hca_tcp_listen(hca_tcp_path_t *path, uint16_t port_min,
                    uint16_t port_max);
/* the interface's link is up and running (IFF_UP, IFF_RUNNING) */
int  hca_tcp_netif_up(const hca_tcp_path_t *path);

/* PSNs wrap at 2^32: a - b in serial arithmetic */
HCA_INLINE int32_t hca_tcp_psn_diff(uint32_t a, uint32_t b)
{
    return (int32_t)(a - b);
}

/* hca_tcp_rel.c: reliability.  The requester side (the QP's owner):
 * records a WQE about to go out, builds frame k of a recorded WQE, and
 * sends again what the thread asked for. */
int  hca_tcp_sent_push(hca_qp_t *qp, hca_wqe_t *wqe);
void hca_tcp_frame_build(hca_qp_t *qp, const hca_wqe_t *wqe,
                         const hca_tcp_sent_t *e, uint32_t k,
                         hca_tcp_hdr_t *hdr, struct iovec *iov, int *iovcnt);
/* the entry of the WQE being sent (the newest) */
hca_tcp_sent_t *hca_tcp_sent_last(hca_qp_t *qp);
/* the owner takes the thread's request: rtx_psn moves back to it */
void hca_tcp_rewind_take(hca_qp_t *qp);
/* a retransmission was asked for, or (injected loss) is due */
int  hca_tcp_rtx_wanted(hca_tcp_dev_t *tcp, hca_qp_t *qp);
/* the thread: answers taken (tcp->lock held) */
void hca_tcp_acked(hca_tcp_dev_t *tcp, hca_qp_t *qp,
                   const hca_tcp_hdr_t *hdr);
hca_tcp_sent_t *hca_tcp_sent_find(hca_qp_t *qp, uint32_t psn);
void hca_tcp_rewind(hca_tcp_dev_t *tcp, hca_qp_t *qp, uint32_t psn);
/* every QP of ours on conn sends (again) what is unanswered, its owner
 * woken for it: the connection came up, or resumed on a new socket; or,
 * dead, its owner's next poll fails it (tcp->lock held) */
void hca_tcp_rewind_conn(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn);
/* the thread, at a connection's first UP: its QPs' unsent frames out */
void hca_tcp_send_unsent(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn);
void hca_tcp_sent_clear(hca_qp_t *qp);

/* The responder side (rx_lock and tcp->lock held); the rqp checked last
 * is conn->rx.rqp. */
typedef enum {
    HCA_TCP_PSN_NEW = 0,  /* the frame expected: execute it */
    HCA_TCP_PSN_DUP,      /* executed before: answer, do not execute */
    HCA_TCP_PSN_GAP,      /* ahead of the PSN expected, the first since
                             it: drop it, NAK PSN_SEQ with the expected */
    HCA_TCP_PSN_DROP,     /* ahead of a gap NAKed, or after a refusal */
    HCA_TCP_PSN_BUSY,     /* the frame expected, whose copy on another
                             path is being read right now: drop it, NAK
                             PSN_SEQ with the expected (it comes again) */
    HCA_TCP_PSN_UNKNOWN,  /* a striped WRITE's first part, of a QP this
                             path has no record of: drop it, NAK PSN_SEQ
                             with its PSN (it comes again, on the QP's
                             path) */
    HCA_TCP_PSN_NO_RECORD, /* a requester QP with no record: its target is
                             checked (a refusal NAKed, no record made),
                             then hca_tcp_psn_first */
    HCA_TCP_PSN_FULL      /* ... whose peer context has as many records as
                             it may (one per QP of ours connected to it,
                             HCA_TCP_RQP_ANY per any-source QP of ours):
                             NAK it (REM_OP_ERR), no record */
} hca_tcp_psn_verdict_t;
hca_tcp_psn_verdict_t hca_tcp_psn_check(hca_tcp_dev_t *tcp,
                                        hca_tcp_conn_t *conn,
                                        const hca_tcp_hdr_t *hdr);
/* the frame of a requester QP with no record, whose target QP accepts it:
 * its record is made if it is the QP's first frame (F_START) and the peer
 * context has room, then it is checked as any */
hca_tcp_psn_verdict_t hca_tcp_psn_first(hca_tcp_dev_t *tcp,
                                        hca_tcp_conn_t *conn,
                                        const hca_tcp_hdr_t *hdr);
/* the request in conn->rx was executed / refused */
void hca_tcp_psn_done(hca_tcp_conn_t *conn, const hca_tcp_hdr_t *hdr);
/* a part of a striped WRITE landed (at epsn, or ahead of it): 1 if a
 * request is to be answered now, *ack (its LAST, or a LAST held that
 * epsn passed) */
int  hca_tcp_psn_landed(hca_tcp_conn_t *conn, const hca_tcp_hdr_t *hdr,
                        hca_tcp_hdr_t *ack);
void hca_tcp_psn_refused(hca_tcp_conn_t *conn, const hca_tcp_hdr_t *hdr,
                         hca_wc_status_t status);
/* the request in conn->rx is the one refused: 1 and its status */
int  hca_tcp_psn_refusal(hca_tcp_conn_t *conn, const hca_tcp_hdr_t *hdr,
                         hca_wc_status_t *status_p);
void hca_tcp_atom_save(hca_tcp_conn_t *conn, const hca_tcp_hdr_t *hdr,
                       hca_wc_status_t status, uint64_t value);
const hca_tcp_atom_t *hca_tcp_atom_find(hca_tcp_conn_t *conn,
                                        const hca_tcp_hdr_t *hdr);
void hca_tcp_rqps_free(hca_tcp_conn_t *conn);
/* conn goes: no record says it executes a frame (tcp->lock held, or the
 * thread stopped) */
void hca_tcp_rqps_forget(hca_tcp_conn_t *conn);

/* hca_tcp_conn.c: connections, their epoll events, the handshake.  The
 * connection to peer on path (tcp->lock held), dialled if there is none
 * (NULL: out of resources, or the peer has no such path). */
hca_tcp_conn_t *hca_tcp_conn_get(hca_tcp_dev_t *tcp,
                                 const hca_port_addr_t *peer, int path);
/* the paths a pair of contexts uses: as many as both have */
int  hca_tcp_pair_paths(const hca_tcp_dev_t *tcp, const hca_port_addr_t *peer);

/* hca_tcp_path.c: paths, and QPs failing over between them.  A new
 * connection UP takes the responder records of its siblings (tcp->lock
 * held). */
void hca_tcp_conn_lead(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn);
/* the key a new outbound connection's JOIN proves: of a connection to
 * the same peer, UP or with its CHALLENGE read (tcp->lock), NULL if none */
const uint8_t *hca_tcp_join_key(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn);
void hca_tcp_paths_close(hca_tcp_dev_t *tcp);
/* a socket for the peer's path, bound to our path's address: its fd and
 * the address to dial, or -1 */
int  hca_tcp_path_socket(hca_tcp_dev_t *tcp, const hca_port_addr_t *peer,
                         int path, struct sockaddr_storage *ss,
                         uint32_t *len);
/* a new QP's home (*home: the pair's connection with the fewest QPs) and
 * the connection it sends on first (home, or one UP while home connects);
 * each path dialled if it is not yet (tcp->lock held) */
hca_tcp_conn_t *hca_tcp_home_pick(hca_tcp_dev_t *tcp,
                                  const hca_port_addr_t *peer,
                                  hca_tcp_conn_t **home);
/* a QP on a connection in this state may move to a sibling */
int  hca_tcp_failover_ok(const hca_tcp_conn_t *conn, int state);
/* the owner: the QP moves to a sibling that is UP and sends again what is
 * unanswered there; the new connection, or NULL (none is UP) */
hca_tcp_conn_t *hca_tcp_failover(hca_tcp_dev_t *tcp, hca_qp_t *qp);
/* the owner: the QP goes back to its home path if it is UP again and
 * nothing is unanswered; the connection it sends on */
hca_tcp_conn_t *hca_tcp_path_return(hca_tcp_dev_t *tcp, hca_qp_t *qp);
/* conn lost its socket: its QPs with frames unanswered are asked to fail
 * over (the thread, tcp->lock held) */
void hca_tcp_failover_ask(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn);
/* conn is UP: QPs waiting on its lost siblings move to it; a connection
 * of ours it crosses is superseded (tcp->lock) */
void hca_tcp_path_up(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn);
/* the connection the peer dialled is the pair's one on its path (we are
 * the larger context: both use the smaller's) */
int  hca_tcp_theirs_wins(const hca_tcp_dev_t *tcp,
                         const hca_port_addr_t *peer);
/* the owner: the QP, idle, moves off a superseded connection */
hca_tcp_conn_t *hca_tcp_path_uncross(hca_tcp_dev_t *tcp, hca_qp_t *qp);
/* a lost connection with a sibling UP is not timed out (tcp->lock) */
int  hca_tcp_path_keeps(hca_tcp_dev_t *tcp, const hca_tcp_conn_t *conn);
/* the netlink socket of link changes, and its events (the thread) */
int  hca_tcp_links_watch(void);
void hca_tcp_links_changed(hca_tcp_dev_t *tcp);
/* Does the connection prove it is the context whose secret is secret
 * (conn->peer's identity)?  Outbound: we dialled it and it proved it
 * knows its secret; inbound: the proof in its hello verifies.  The answer
 * yes is remembered (tcp->lock held). */
int  hca_tcp_conn_proves(hca_tcp_conn_t *conn, uint64_t secret);
/* conn is the peer whose address has secret: we dialled it with that
 * secret (outbound), or it proves it (inbound, hca_tcp_conn_proves) */
int  hca_tcp_conn_is_peer(hca_tcp_conn_t *conn, uint64_t secret);
hca_tcp_conn_t *hca_tcp_conn_new(hca_tcp_dev_t *tcp, int fd, int outbound);
void hca_tcp_conn_kill_at(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn,
                          hca_wc_status_t why, const char *where);
/* its socket broke (reset, closed, silent): LINKING if it can resume,
 * else DEAD with RETRY_EXC_ERR */
void hca_tcp_conn_drop_at(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn,
                          const char *where);
#define hca_tcp_conn_drop(_tcp, _conn) \
    hca_tcp_conn_drop_at(_tcp, _conn, __FILE__ ":" HCA_TCP_STR(__LINE__))
/* the peer is a process of this host that is gone (exited, or a zombie):
 * known at once, rather than at the retry timeout */
int  hca_tcp_peer_gone(const hca_tcp_dev_t *tcp, const hca_tcp_conn_t *conn);
/* a LINKING connection we dialled dials again (the thread, tcp->lock
 * held, its old socket closed): 0, or -1 to try later */
int  hca_tcp_redial(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn);
/* releases what the frames being read and sent hold (a socket's end,
 * both locks held) */
void hca_tcp_rx_abort(hca_tcp_conn_t *conn);
/* its receiver and sender start again on a new socket */
void hca_tcp_conn_io_reset(hca_tcp_conn_t *conn, hca_tcp_rx_state_t rx_state);
#define HCA_TCP_STR2(x) #x
#define HCA_TCP_STR(x)  HCA_TCP_STR2(x)
/* (where: for HCA_TRACE, the line that found it dead) */
#define hca_tcp_conn_kill(_tcp, _conn, _why) \
    hca_tcp_conn_kill_at(_tcp, _conn, _why, __FILE__ ":" HCA_TCP_STR(__LINE__))
void hca_tcp_conn_free(hca_tcp_conn_t *conn);
/* the events the thread waits for on conn (tx_lock held), and a new
 * connection's first (tcp->lock held) */
void hca_tcp_events(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn, int op);
void hca_tcp_watch(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn);
/* our connect finished (the thread): sends our HELLO */
void hca_tcp_connected(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn);
/* a handshake message is in conn->rx.in.hello (rx_lock held) */
void hca_tcp_hello_in(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn);
/* a refusal's log line, at most one every HCA_TCP_LOG_NS */
void hca_tcp_refusal(hca_tcp_dev_t *tcp, const char *fmt, ...)
        __attribute__((format(printf, 2, 3)));

/* hca_tcp_tx.c: sending.  tx (conn->tx_lock held): 1 the frame is out,
 * 0 the socket is full, -1 the connection died */
int  hca_tcp_tx_flush(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn);
/* starts the frame hdr (NULL: none) with its payload, behind the
 * answers queued at the head of the jobs (tx_lock held, the last tx out) */
void hca_tcp_tx_start(hca_tcp_conn_t *conn, const hca_tcp_hdr_t *hdr,
                      const struct iovec *iov, int iovcnt,
                      uint32_t owner_qpn);
void hca_tcp_want_out(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn);
/* queues an answer (tx_lock held): 0, or -EAGAIN if full; it goes out
 * with the next frame or at the next pump */
int  hca_tcp_job_push(hca_tcp_conn_t *conn, const hca_tcp_job_t *job);
/* sends queued answers while the socket takes them (tx_lock held) */
void hca_tcp_jobs_pump(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn);
/* sends the queued answers, not the rest of a READ (tx_lock not held) */
void hca_tcp_answers_out(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn);
/* QP qpn's buffers are no longer to be read: the rest of a frame of its
 * in the tx goes out from a copy (tx_lock held) */
void hca_tcp_tx_orphan(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn,
                       uint32_t qpn);

/* hca_tcp_rx.c: receiving (conn->rx_lock held).  Reads what the
 * connection has, then sends the answers it made: 0, or -1 when it
 * died. */
int  hca_tcp_read(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn);
/* a user poll's read of conn: its answers may wait for a frame of ours */
void hca_tcp_poll_read(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn);

/* hca_tcp_resp.c: the frame in conn->rx.in.hdr was read and checked; its
 * payload, if any, is read by the receiver after this set conn->rx up */
void hca_tcp_rx_frame(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn);
/* the payload is in: finishes the frame */
void hca_tcp_rx_done(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn);
/* a parked SEND: 1 if it went into its ring now */
int  hca_tcp_rx_unpark(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn);
/* before reading more payload into a QP's buffers: 1 if still wanted
 * (tcp->lock held) */
int  hca_tcp_rx_target_ok(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn);

/* hca_tcp_thread.c: the fabric's thread; a user thread's poll reads the
 * live connections it can lock now, so that a polling process gets its
 * messages without a thread switch. */
int  hca_tcp_poll(hca_device_t *dev);
/* A CQ was armed: the thread takes the reading back at once. */
void hca_tcp_armed(hca_device_t *dev);
/* an inbound connection completed its first handshake (tcp->lock held):
 * 1 it may go UP (the oldest unproven one closed if a cap was reached),
 * 0 it is refused (at a cap, every other one proven) */
int  hca_tcp_conn_admit(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn);
int  hca_tcp_thread_start(hca_tcp_dev_t *tcp);
void hca_tcp_thread_stop(hca_tcp_dev_t *tcp);

/* hca_tcp_stripe.c: a large WRITE or READ answer over two paths (the
 * owner).  The WQE may stripe (a WRITE or READ of HCA_TCP_STRIPE_MIN
 * bytes or more, two paths) */
int  hca_tcp_stripe_fits(const hca_tcp_dev_t *tcp, const hca_wqe_t *wqe);
/* the WQE just recorded (e) goes over its QP's path and the sibling */
void hca_tcp_stripe_begin(hca_qp_t *qp, hca_wqe_t *wqe, hca_tcp_sent_t *e,
                          hca_tcp_conn_t *sibling);
/* the READ just recorded (e) lets its responder stripe the answer */
void hca_tcp_stripe_read(hca_qp_t *qp, hca_tcp_sent_t *e);
/* sends its parts while the sockets take them: ISSUED all sent, PARTIAL
 * the rest later (or, a path lost, the whole WRITE again: cancelled) */
hca_exec_t hca_tcp_stripe_send(hca_tcp_dev_t *tcp, hca_qp_t *qp,
                               hca_wqe_t *wqe);
/* its parts not sent yet go with a retransmission from the first
 * unanswered PSN, on the QP's path */
void hca_tcp_stripe_cancel(hca_qp_t *qp, hca_wqe_t *wqe);
/* a striped WRITE or READ is not answered yet: later WQEs wait */
int  hca_tcp_stripe_waits(hca_qp_t *qp);
/* ... this WQE waits (a READ after striped READs does not) */
int  hca_tcp_stripe_blocks(hca_qp_t *qp, const hca_wqe_t *wqe);
/* hca_tcp_path.c: an UP sibling of the QP's path on another path, that
 * may carry its requests (tq->stripe_conn, a qp_refs held); NULL if none
 * (tcp->lock not held) */
hca_tcp_conn_t *hca_tcp_stripe_sibling(hca_tcp_dev_t *tcp, hca_qp_t *qp);
/* the responder: an UP sibling of conn on another path that may carry
 * READ answers to its peer (both proven to be that peer), NULL if none
 * (tcp->lock held) */
hca_tcp_conn_t *hca_tcp_answer_sibling(hca_tcp_dev_t *tcp,
                                       hca_tcp_conn_t *conn);
/* what the path's socket delivered lately, bytes per second (0: not
 * known) */
uint64_t hca_tcp_path_rate(hca_tcp_conn_t *conn);
/* of n parts, how many the first of two paths takes, by their rates
 * (half while either is unknown): 1 .. n - 1 */
uint32_t hca_tcp_stripe_split(uint32_t n, uint64_t first, uint64_t second);

/* The QP has a striped WRITE unanswered with parts on conn: conn's loss
 * sends it again (the thread). */
HCA_INLINE int hca_tcp_stripe_uses(hca_tcp_qp_t *tq, const hca_tcp_conn_t *conn)
{
    return (tq->stripe_conn == conn) &&
           atomic_load_explicit(&tq->stripe_open, memory_order_acquire);
}

/* hca_tcp_exec.c */
hca_exec_t hca_tcp_exec(hca_qp_t *qp, struct hca_wqe *wqe,
                        hca_wc_status_t *status_p);
hca_exec_t hca_tcp_poll_response(hca_qp_t *qp, struct hca_wqe *wqe,
                                 hca_wc_status_t *status_p);
int  hca_tcp_response_ready(const hca_qp_t *qp, const struct hca_wqe *wqe);

/* ---------------------------------------------------------------- states */

/* hca_tcp_state.c: the only writers of conn->state and conn->rx.state.
 * hca_tcp_conn_to returns the state it left, or -1 if the connection was
 * DEAD already (killed by another thread: the caller's move is moot);
 * an illegal transition is a bug and aborts. */
int  hca_tcp_conn_to_at(hca_tcp_conn_t *conn, hca_tcp_conn_state_t to,
                        const char *where);
void hca_tcp_rx_to_at(hca_tcp_conn_t *conn, hca_tcp_rx_state_t to,
                      const char *where);
const char *hca_tcp_conn_state_str(int state);
const char *hca_tcp_rx_state_str(int state);
#define hca_tcp_conn_to(_conn, _to) hca_tcp_conn_to_at(_conn, _to, __func__)
#define hca_tcp_rx_to(_conn, _to)   hca_tcp_rx_to_at(_conn, _to, __func__)

#endif
