/*
 * hca_dev.h - public API of the hca software RDMA host channel adapter.
 *
 * A verbs-like interface: devices and ports, protection domains (PD), memory
 * regions (MR) with lkey/rkey checked against a memory protection table (MPT),
 * completion queues (CQ), reliable-connected queue pairs (QP) and shared
 * receive queues (SRQ).
 *
 * Conventions: functions return 0 or a negative errno; completions carry an
 * hca_wc_status_t.  Device-wide objects (device context, PD, MR/MPT) are safe
 * under concurrent use; a QP, CQ or SRQ is used by one thread at a time
 * (UCX serialises each worker), except that posting to an SRQ and polling
 * the CQs of its QPs must also happen from one thread.
 */
#ifndef HCA_DEV_H
#define HCA_DEV_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* libhcadev is compiled with -fvisibility=hidden: what is declared here, and
 * only that, is exported from libhcadev.so (contrib/check-layers.py checks
 * it).  GCC and clang, C and C++, understand the pragma; other compilers
 * export everything. */
#if defined(__GNUC__) && (__GNUC__ >= 4)
#pragma GCC visibility push(default)
#define HCA_DEV_VISIBILITY_PUSHED 1
#endif

#define HCA_DEV_API_VERSION   1
#define HCA_DEVNAME_MAX       16

typedef struct hca_device hca_device_t;  /* an opened device context */
typedef struct hca_pd     hca_pd_t;
typedef struct hca_mr     hca_mr_t;
typedef struct hca_cq     hca_cq_t;
typedef struct hca_qp     hca_qp_t;
typedef struct hca_srq    hca_srq_t;
typedef struct hca_dm     hca_dm_t;      /* device memory (shared object) */


/* ---------------------------------------------------------------- device */

typedef enum {
    HCA_PORT_DOWN   = 1,
    HCA_PORT_INIT   = 2,
    HCA_PORT_ACTIVE = 4
} hca_port_state_t;

typedef enum {
    HCA_FABRIC_SHM = 0,  /* processes of one host: shared memory + CMA */
    HCA_FABRIC_TCP = 1,  /* other hosts: TCP sockets */
    HCA_FABRIC_LAST
} hca_fabric_type_t;

/* Atomic capabilities (hca_device_attr_t.atomic_caps) */
enum {
    HCA_ATOMIC_CAP_32     = 1u << 0,  /* 32-bit operands */
    HCA_ATOMIC_CAP_64     = 1u << 1,  /* 64-bit operands */
    HCA_ATOMIC_CAP_GLOB   = 1u << 2,  /* atomic w.r.t. the target CPU */
    HCA_ATOMIC_CAP_BITOPS = 1u << 3   /* and/or/xor/swap besides add/cswap */
};

typedef struct hca_device_attr {
    char     name[HCA_DEVNAME_MAX]; /* "hca0" */
    uint64_t node_guid;         /* stable per host and device */
    uint32_t vendor_id;
    uint32_t hw_ver;
    char     fw_ver[32];
    int      numa_node;         /* rings and buffers live on this node */
    uint32_t phys_port_cnt;
    uint32_t max_pd;
    uint32_t max_mr;            /* MPT entries per device context */
    uint64_t max_mr_size;
    uint32_t max_qp;
    uint32_t max_qp_wr;         /* send/recv queue depth */
    uint32_t max_sge;
    uint32_t max_cq;
    uint32_t max_cqe;
    uint32_t max_srq;
    uint32_t max_srq_wr;
    uint32_t max_inline_data;   /* bytes of inline data per send WQE */
    uint64_t max_msg_size;      /* largest SEND / RDMA WRITE / RDMA READ */
    uint32_t max_dm;            /* device memory objects per context */
    uint64_t max_dm_size;
    uint32_t atomic_caps;       /* HCA_ATOMIC_CAP_* */
    uint32_t max_qp_rd_atom;    /* atomics a QP has unanswered at once
                                   (more wait in its send queue): the
                                   responder's replay table of each
                                   requester QP holds that many results,
                                   for their duplicates after a reconnect
                                   (docs/TCP-WIRE.md) */
} hca_device_attr_t;

/* Which fabrics a context uses (hca_open_attr_t.fabric, or the
 * environment variable HCA_FABRIC=auto|shm|tcp when that is AUTO). */
typedef enum {
    HCA_FABRIC_MODE_AUTO = 0, /* shm on the same host, tcp to others */
    HCA_FABRIC_MODE_SHM,      /* shm only: other hosts are unreachable */
    HCA_FABRIC_MODE_TCP,      /* tcp to every peer, this host's too */
    HCA_FABRIC_MODE_LAST
} hca_fabric_mode_t;

/* A context's tcp listener (family HCA_NET_NONE: it has none). */
enum {
    HCA_NET_NONE = 0,
    HCA_NET_IPV4 = 4,
    HCA_NET_IPV6 = 6
};

typedef struct hca_net_addr {
    uint8_t  family;      /* HCA_NET_* */
    uint8_t  reserved;
    uint16_t port;        /* host byte order */
    uint8_t  addr[16];    /* network byte order; IPv4 in the first 4 */
} hca_net_addr_t;

/* The tcp fabric's paths: one listener per interface named in
 * net_devices, up to this many (docs/TCP-WIRE.md, "Paths"). */
#define HCA_NET_MAX_PATHS 4

/* One path of a context (hca_port_attr_t.paths). */
typedef struct hca_path_attr {
    hca_net_addr_t net;           /* its listener */
    char           dev[32];       /* its interface */
    uint32_t       up;            /* the interface is up and running */
} hca_path_attr_t;

typedef struct hca_port_attr {
    hca_port_state_t  state;
    hca_fabric_type_t fabric;      /* the fabric of peers on this host */
    uint32_t          mtu;         /* bytes moved per ring slot */
    uint32_t          max_msg_sz;
    uint32_t          single_copy; /* 1 if CMA may be used by this process */
    hca_fabric_mode_t fabric_mode;
    hca_net_addr_t    net;         /* tcp listener, if tcp is enabled */
    char              net_dev[32]; /* its interface ("lo", "eth0") */
    uint32_t          n_paths;     /* tcp: listeners (net is the first) */
    hca_path_attr_t   paths[HCA_NET_MAX_PATHS];
} hca_port_attr_t;

/* Host identity: what makes two processes "the same host" for the shm
 * fabric - same boot, and the same IPC (shared memory), PID (process ids)
 * and network (abstract AF_UNIX sockets) namespaces. */
typedef struct hca_host_id {
    uint8_t  boot_id[16];
    uint32_t ipc_ns;
    uint32_t pid_ns;
    uint32_t net_ns;
} hca_host_id_t;

/* Address of an opened device context (what a GID + LID are on IB). */
typedef struct hca_port_addr {
    uint64_t       host;     /* hca_host_key() of the context's host */
    uint32_t       pid;
    uint32_t       ctx_id;   /* which open of the device in that process */
    hca_net_addr_t net;      /* its tcp listener (its first path) */
    uint64_t       secret;   /* random per context: a tcp peer must
                                present it, so only a process that was
                                given the address can connect */
    uint32_t       n_net_more; /* its further paths' listeners */
    hca_net_addr_t net_more[HCA_NET_MAX_PATHS - 1];
} hca_port_addr_t;

/* Returns the number of devices and writes up to max names. */
int  hca_get_device_list(char (*names)[HCA_DEVNAME_MAX], int max);

/* Open flags */
enum {
    HCA_OPEN_NO_SINGLE_COPY = 1u << 0, /* never use CMA (process_vm_*):
                                          move data through the rings and
                                          the responder instead */
    HCA_OPEN_NO_MEMBARRIER  = 1u << 1  /* do not use membarrier(2): direct
                                          accesses pin MPT entries (what
                                          happens where it is missing) */
};

/* Everything a context can be opened with (hca_device_open_attr). */
typedef struct hca_open_attr {
    unsigned          flags;       /* HCA_OPEN_* */
    hca_fabric_mode_t fabric;      /* AUTO: $HCA_FABRIC, else auto */
    const char       *net_devices; /* tcp: interface names or addresses,
                                      comma separated, each usable one a
                                      path (up to HCA_NET_MAX_PATHS);
                                      NULL: $HCA_NET_DEVICES, else
                                      the first interface that is up,
                                      not loopback and has an address,
                                      else loopback */
    uint16_t          port_min;    /* listener port range; 0: ephemeral */
    uint16_t          port_max;
    uint32_t          peer_timeout_ms; /* a silent tcp peer fails its QPs
                                          after this; 0: $HCA_TCP_TIMEOUT_MS,
                                          else 10000 */
} hca_open_attr_t;

int  hca_device_open(const char *name, unsigned flags, hca_device_t **dev_p);
int  hca_device_open_attr(const char *name, const hca_open_attr_t *attr,
                          hca_device_t **dev_p);
int  hca_device_close(hca_device_t *dev);
int  hca_device_query(hca_device_t *dev, hca_device_attr_t *attr);
int  hca_port_query(hca_device_t *dev, uint8_t port_num, hca_port_attr_t *attr);
void hca_port_address(hca_device_t *dev, hca_port_addr_t *addr);
const char *hca_device_name(hca_device_t *dev);

int  hca_host_id_get(hca_host_id_t *id);
int  hca_host_id_equal(const hca_host_id_t *a, const hca_host_id_t *b);
/* A 64-bit digest of a host identity: what addresses carry. */
uint64_t hca_host_key(const hca_host_id_t *id);
/* "10.0.0.1:4711", "[fe80::1]:4711" or "-" (no listener). */
void hca_net_addr_str(const hca_net_addr_t *addr, char *buf, size_t len);

/* Is the context at addr reachable from dev (same host for shm)? */
int  hca_port_addr_reachable(hca_device_t *dev, const hca_port_addr_t *addr);

/* Is the process that owns addr still running?  1 alive, 0 gone. */
int  hca_port_addr_alive(const hca_port_addr_t *addr);

/* Looks for peers of dev whose process is gone (kill(pid, 0): one cheap
 * syscall per peer, so it can run every 100 ms; and, in turn, one peer's
 * start time, which also finds a zombie or a reused pid).  QPs connected to them
 * fail at their next operation or hca_qp_check_peer().  Returns how many
 * peers of dev were ever found dead: a caller that saw the number change
 * checks its QPs. */
uint64_t hca_device_check_peers(hca_device_t *dev);


/* ---------------------------------------------------------------- PD / MR */

enum {
    HCA_ACCESS_LOCAL_WRITE   = 1u << 0,
    HCA_ACCESS_REMOTE_WRITE  = 1u << 1,
    HCA_ACCESS_REMOTE_READ   = 1u << 2,
    HCA_ACCESS_REMOTE_ATOMIC = 1u << 3
};

int  hca_pd_alloc(hca_device_t *dev, hca_pd_t **pd_p);
int  hca_pd_dealloc(hca_pd_t *pd);     /* -EBUSY while MRs/QPs use it */

/* Registers [addr, addr+length).  Memory inside device memory (hca_dm_*)
 * is recognised and accessed by peers through their own mapping.
 * Invariants: length > 0 unless addr is any valid pointer (0-length MRs are
 * allowed for 0-byte operations); remote atomic access needs no alignment of
 * the region itself, only of each atomic's address. */
int  hca_mr_reg(hca_pd_t *pd, void *addr, size_t length, unsigned access,
                hca_mr_t **mr_p);
/* Invalidates the MPT entry, waits until no peer that passed the check is
 * still copying, then frees it: no byte lands after it returns. */
int  hca_mr_dereg(hca_mr_t *mr);
/* The first half of hca_mr_dereg: no access passes the key check any more
 * and none that passed it is still copying (no byte lands after it
 * returns), but the MR stays allocated until hca_mr_dereg.  Idempotent. */
void hca_mr_invalidate(hca_mr_t *mr);
/* The steps within this process: no access passes the key check from now
 * on, and this process's own threads that passed it (responder, fabric
 * thread) have finished copying; accesses of other processes that passed
 * it may still land (their fence is hca_mr_invalidate's).  Takes no lock
 * and allocates nothing (it spins), so a memory hook that runs inside
 * munmap or the allocator may call it. */
void hca_mr_revoke(hca_mr_t *mr);
uint32_t hca_mr_lkey(const hca_mr_t *mr);
uint32_t hca_mr_rkey(const hca_mr_t *mr);

/* If the MR lies in device memory: that memory's id, and its base address
 * in the owner's address space (*dm_base_p).  0 for plain memory. */
uint32_t hca_mr_dm_id(const hca_mr_t *mr, uint64_t *dm_base_p);

/* A peer's device memory mapped here for direct loads and stores (UCT
 * rkey_ptr), with its MPT: hca_dm_view_ptr() checks the key, the entry's
 * state, that the MR lies in this device memory, the remote read and
 * write rights and the range, like any access (-EACCES if one fails).  A
 * pointer stays mapped until the view closes; after the owner
 * deregistered the MR, accesses through it are the user's race (as with
 * UCX's posix and xpmem rkey_ptr). */
typedef struct hca_dm_view hca_dm_view_t;
int  hca_dm_view_open(const hca_port_addr_t *addr, uint32_t dm_id,
                      hca_dm_view_t **view_p);
int  hca_dm_view_ptr(hca_dm_view_t *view, uint32_t rkey,
                     uint64_t remote_addr, void **ptr_p);
void hca_dm_view_close(hca_dm_view_t *view);

/* Device memory: a shared-memory object peers on the same host map.  Its
 * MRs give peers direct loads/stores (hca_rkey_ptr) and CPU atomics.
 * hca_dm_free with MRs inside still registered keeps the memory (mapped,
 * their keys valid) until the last of them is deregistered. */
int   hca_dm_alloc(hca_device_t *dev, size_t length, hca_dm_t **dm_p);
int   hca_dm_free(hca_dm_t *dm);
void *hca_dm_addr(const hca_dm_t *dm);
size_t hca_dm_length(const hca_dm_t *dm);


/* ---------------------------------------------------------------- CQ */

typedef enum {
    HCA_WC_SUCCESS = 0,
    HCA_WC_LOC_LEN_ERR,      /* receive buffer too small, SGE too long */
    HCA_WC_LOC_QP_OP_ERR,    /* bad WQE (opcode, inline size, sge count) */
    HCA_WC_LOC_PROT_ERR,     /* local lkey check failed */
    HCA_WC_WR_FLUSH_ERR,     /* flushed: QP in ERR */
    HCA_WC_REM_INV_REQ_ERR,  /* target QP refuses (state, source, opcode) */
    HCA_WC_REM_ACCESS_ERR,   /* rkey check failed at the target */
    HCA_WC_REM_OP_ERR,       /* target failed to execute (e.g. copy fault) */
    HCA_WC_RETRY_EXC_ERR,    /* peer gone: its process or the target QP */
    HCA_WC_RNR_RETRY_EXC_ERR,/* no receive posted (not used: RNR waits) */
    HCA_WC_GENERAL_ERR,
    HCA_WC_STATUS_LAST
} hca_wc_status_t;

typedef enum {
    HCA_WC_SEND = 0,
    HCA_WC_RDMA_WRITE,
    HCA_WC_RDMA_READ,
    HCA_WC_ATOMIC,
    HCA_WC_RECV,              /* a SEND arrived */
    HCA_WC_RECV_RDMA_WITH_IMM /* an RDMA WRITE with immediate arrived */
} hca_wc_opcode_t;

enum {
    HCA_WC_WITH_IMM = 1u << 0
};

typedef struct hca_wc {
    uint64_t        wr_id;
    hca_wc_status_t status;
    hca_wc_opcode_t opcode;
    uint32_t        byte_len;   /* receive: bytes placed */
    uint32_t        imm_data;
    uint32_t        qp_num;     /* local QP */
    uint32_t        src_qp;     /* receive: sender's QP number */
    uint32_t        wc_flags;   /* HCA_WC_WITH_IMM */
    uint32_t        vendor_err; /* errno-like detail for errors */
} hca_wc_t;

int  hca_cq_create(hca_device_t *dev, int cqe, hca_cq_t **cq_p);
int  hca_cq_destroy(hca_cq_t *cq);       /* -EBUSY while QPs use it */
/* Progresses the engines that feed this CQ and returns up to num
 * completions (>= 0), or -EOVERFLOW once the CQ has overflowed (entries
 * were lost: the CQ and its QPs are in error). Never blocks, no syscall on
 * the intra-host fast path. */
int  hca_cq_poll(hca_cq_t *cq, int num, hca_wc_t *wc);
/* Arms the CQ: the next completion (or arrival that will produce one)
 * makes its fd readable.  Returns -EAGAIN if work is already pending
 * (poll again instead of sleeping): a completion, or one that a poll can
 * produce now.  A message that waits for a receive the caller has not
 * posted is not: the receive posted later makes the armed CQ's fd
 * readable. */
int  hca_cq_arm(hca_cq_t *cq);
/* A pollable fd (POLLIN when armed and signalled).  Peers in other
 * processes signal it.  hca_cq_ack_events drains it. */
int  hca_cq_fd(hca_cq_t *cq);
void hca_cq_ack_events(hca_cq_t *cq);
/* Blocks until armed and signalled or timeout_ms (-1 forever): arm + poll(2).
 * Returns 1 if signalled or work pending, 0 on timeout.  It also returns 1
 * when a ring slot claimed after the arm woke no one within a second (its
 * producer may have died): poll, then wait again. */
int  hca_cq_wait(hca_cq_t *cq, int timeout_ms);


/* ---------------------------------------------------------------- SRQ */

typedef struct hca_srq_init_attr {
    uint32_t max_wr;
    uint32_t max_sge;
} hca_srq_init_attr_t;

int  hca_srq_create(hca_pd_t *pd, const hca_srq_init_attr_t *attr,
                    hca_srq_t **srq_p);
int  hca_srq_destroy(hca_srq_t *srq);


/* ---------------------------------------------------------------- QP */

typedef enum {
    HCA_QPS_RESET = 0,
    HCA_QPS_INIT,
    HCA_QPS_RTR,
    HCA_QPS_RTS,
    HCA_QPS_ERR,
    HCA_QPS_LAST
} hca_qp_state_t;

typedef enum {
    HCA_WR_SEND = 0,
    HCA_WR_SEND_WITH_IMM,
    HCA_WR_RDMA_WRITE,
    HCA_WR_RDMA_WRITE_WITH_IMM,
    HCA_WR_RDMA_READ,
    HCA_WR_ATOMIC_FETCH_ADD,    /* fetching forms return the old value */
    HCA_WR_ATOMIC_CMP_SWP,
    HCA_WR_ATOMIC_SWAP,
    HCA_WR_ATOMIC_FETCH_AND,
    HCA_WR_ATOMIC_FETCH_OR,
    HCA_WR_ATOMIC_FETCH_XOR,
    HCA_WR_ATOMIC_ADD,          /* post forms: no result */
    HCA_WR_ATOMIC_AND,
    HCA_WR_ATOMIC_OR,
    HCA_WR_ATOMIC_XOR,
    HCA_WR_OPCODE_LAST
} hca_wr_opcode_t;

enum {
    HCA_SEND_SIGNALED = 1u << 0, /* produce a CQE (else only on error) */
    HCA_SEND_FENCE    = 1u << 1, /* wait for every earlier WR to complete */
    HCA_SEND_INLINE   = 1u << 2, /* copy SGE data into the WQE at post */
    HCA_SEND_ATOMIC32 = 1u << 3, /* 32-bit atomic (default 64-bit) */
    HCA_SEND_DEFER_SIGNAL = 1u << 4 /* signalled only if the WR has not
                                       completed when hca_post_send returns:
                                       if it completed successfully inside
                                       the call, the flag is cleared in the
                                       caller's WR and no CQE will come */
};

typedef struct hca_sge {
    uint64_t addr;
    uint32_t length;
    uint32_t lkey;
} hca_sge_t;

typedef struct hca_send_wr {
    uint64_t            wr_id;
    struct hca_send_wr *next;
    hca_sge_t          *sg_list;    /* atomic: one 4/8 byte SGE for the
                                       result (fetching forms) */
    int                 num_sge;
    hca_wr_opcode_t     opcode;
    unsigned            send_flags; /* HCA_SEND_* */
    uint32_t            imm_data;
    struct {
        uint64_t remote_addr;
        uint32_t rkey;
    } rdma;                         /* RDMA and atomic target */
    uint64_t            compare_add; /* add operand / compare value /
                                        and-or-xor operand / swap value */
    uint64_t            swap;        /* cmp_swp: new value */
} hca_send_wr_t;

typedef struct hca_recv_wr {
    uint64_t            wr_id;
    struct hca_recv_wr *next;
    hca_sge_t          *sg_list;
    int                 num_sge;
} hca_recv_wr_t;

typedef struct hca_qp_init_attr {
    hca_cq_t  *send_cq;
    hca_cq_t  *recv_cq;
    hca_srq_t *srq;            /* NULL: the QP has its own receive queue */
    uint32_t   max_send_wr;
    uint32_t   max_recv_wr;
    uint32_t   max_send_sge;
    uint32_t   max_recv_sge;
    uint32_t   max_inline_data;
    int        sq_sig_all;
    int        quiet_flush;    /* flushed unsignalled WRs make no CQE
                                  (errors other than flush always do) */
    unsigned   create_flags;   /* HCA_QP_CREATE_* */
} hca_qp_init_attr_t;

enum {
    HCA_QP_CREATE_RECV_INPLACE = 1u << 0 /* own RQ only: single-slot SENDs
                                            are read in place with
                                            hca_recv_peek() instead of
                                            consuming posted receives */
};

#define HCA_QPN_ANY 0xffffffffu    /* RTR: accept any source (DC target) */

/* The low HCA_QPN_INDEX_BITS of a QP number index its context's QP table
 * (never 0, unique among the context's live QPs), so a consumer can keep
 * its QPs in an array of 1 << HCA_QPN_INDEX_BITS by QPN. */
#define HCA_QPN_INDEX_BITS  12
#define HCA_QPN_INDEX(_qpn) ((uint32_t)(_qpn) & ((1u << HCA_QPN_INDEX_BITS) - 1))

typedef struct hca_qp_attr {
    hca_qp_state_t  qp_state;
    hca_port_addr_t dest;          /* RTR: the peer's port address */
    uint32_t        dest_qp_num;   /* RTR: peer QPN, or HCA_QPN_ANY */
    unsigned        access;        /* INIT: remote access allowed by the
                                      QP (HCA_ACCESS_REMOTE_*) */
} hca_qp_attr_t;

enum {
    HCA_QP_ATTR_STATE  = 1u << 0,
    HCA_QP_ATTR_DEST   = 1u << 1,  /* dest + dest_qp_num */
    HCA_QP_ATTR_ACCESS = 1u << 2
};

int  hca_qp_create(hca_pd_t *pd, const hca_qp_init_attr_t *attr,
                   hca_qp_t **qp_p);
int  hca_qp_destroy(hca_qp_t *qp);
uint32_t hca_qp_num(const hca_qp_t *qp);
hca_qp_state_t hca_qp_state(const hca_qp_t *qp);
/* Why the QP is in ERR: the status of the WR that failed first
 * (HCA_WC_RETRY_EXC_ERR: the peer is gone), HCA_WC_WR_FLUSH_ERR when it
 * was moved there by hca_qp_modify; HCA_WC_SUCCESS in any other state.
 * Lets a consumer fail later posts with the error it will see in the CQ. */
hca_wc_status_t hca_qp_error(const hca_qp_t *qp);
/* Legal transitions: RESET->INIT (ACCESS), INIT->RTR (DEST, dest_qp_num
 * != 0), RTR->RTS (not for a receive-only HCA_QPN_ANY target), any->ERR,
 * any->RESET.  Others give -EINVAL and change nothing.
 * Completion of a SEND means the message is in the target's receive ring
 * (up to one slot, mtu bytes) or, for a larger one, placed in the posted
 * receive buffer.  A message waits in the ring until a receive is posted
 * (infinite RNR retry); a peer that dies meanwhile loses it, as a host
 * that crashes loses what its HCA acknowledged. */
int  hca_qp_modify(hca_qp_t *qp, const hca_qp_attr_t *attr, unsigned mask);
/* Posts a chain; on error *bad_wr is the first WR not posted:
 * -ENOMEM send queue full (a slot is taken until the WR completed and, if
 *  it produced a CQE, until that CQE was polled), -EINVAL malformed WR
 *  (HCA_SEND_INLINE longer than the QP's max_inline_data, ...) or state
 *  not RTS.  In ERR, WRs are accepted and complete as flushed (verbs).
 * -EAGAIN the target's receive ring is full (retry later; nothing of
 *  that WR was delivered), -ECONNRESET the ring stayed full and its owner
 *  is gone (the QP moved to ERR). */
int  hca_post_send(hca_qp_t *qp, hca_send_wr_t *wr, hca_send_wr_t **bad_wr);
int  hca_post_recv(hca_qp_t *qp, hca_recv_wr_t *wr, hca_recv_wr_t **bad_wr);
int  hca_post_srq_recv(hca_srq_t *srq, hca_recv_wr_t *wr,
                       hca_recv_wr_t **bad_wr);
/* Checks that the peer of a connected QP is alive; if not, moves the QP
 * to ERR (outstanding WRs complete with RETRY_EXC / flush).  1 alive,
 * 0 dead. */
int  hca_qp_check_peer(hca_qp_t *qp);
/* Send queue slots in use: WRs not yet completed, plus completed ones
 * whose CQE has not been polled yet. */
uint32_t hca_qp_outstanding(const hca_qp_t *qp);
/* Running counts of the send queue since the QP was created (or reset):
 * WRs posted, and WRs retired - completed with their CQE polled, or
 * completed with none due.  A consumer that waits for "every WR posted so
 * far" records hca_qp_sq_posted() and waits until hca_qp_sq_retired()
 * reaches it, without waiting for WRs posted later. */
uint64_t hca_qp_sq_posted(const hca_qp_t *qp);
uint64_t hca_qp_sq_retired(const hca_qp_t *qp);


/* ------------------------------------------- direct send, in-place receive */

/* A transport's fast paths, one way each: the QP's fast ops
 * (hca_qp_fast_ops()), which a transport caches per endpoint - a call
 * through a pointer is the whole path, no dispatch in between.  Each
 * answers "does not apply" (-EBUSY, -EAGAIN, NULL) where the QP's fabric
 * has no such path; caps says which may apply, so a caller can skip the
 * call.  Valid from RTR until the QP is reset or destroyed; before RTR
 * every path is "does not apply".  Every path runs only on an idle send
 * queue (nothing queued or waiting for a response) of a QP in RTS without
 * sq_sig_all, so it never overtakes a WR: every earlier WR has completed,
 * and a fence is satisfied too.  What completes in the call has no CQE (as
 * an unsignalled hca_post_send would have none).
 *
 * Direct send, one copy end to end: the sender writes the payload straight
 * into a slot of the target's receive ring, and the receiver reads it
 * there (like a NIC's inline WQE and a receive ring in host memory).
 * send_reserve claims a slot of the target QP's ring; the caller writes
 * up to max_length bytes at data, then send_commit publishes it as a SEND
 * / SEND_WITH_IMM, which is then complete.  Returns 0, or
 *   -EAGAIN      the target's ring is full: nothing was sent; apply
 *                hca_qp_send_blocked() (below), then retry later as for
 *                hca_post_send;
 *   -EBUSY       the direct path does not apply (queue not idle, QP not
 *                in RTS, target refuses): post a WR instead, which
 *                queues, waits or reports the error.
 * Between reserve and commit the ring is held: commit (or cancel) at
 * once, and post nothing on the QP in between.
 *
 * Direct RDMA WRITE and atomics, and the direct pointer: executed in the
 * call when the target MR is device memory of a peer on this host (which
 * this process maps); -EAGAIN or NULL: post a WR instead (which also
 * reports a bad key or range). */
typedef struct hca_send_slot {
    void     *data;        /* write the payload here */
    uint32_t  max_length;  /* bytes available at data */
    uint8_t   data_off;    /* opaque */
    uint8_t   wake;        /* opaque */
    uint16_t  reserved;
    uint64_t  index;       /* opaque: the ring index */
    void     *ring;        /* opaque */
} hca_send_slot_t;

enum {
    HCA_FAST_SEND   = 1u << 0, /* send_reserve/commit/cancel, send_short */
    HCA_FAST_WRITE  = 1u << 1, /* write_direct */
    HCA_FAST_PTR    = 1u << 2, /* direct_ptr/done */
    HCA_FAST_ATOMIC = 1u << 3  /* atomic_direct */
};

typedef struct hca_fast_ops {
    unsigned caps;             /* HCA_FAST_* */
    /* length_hint: the payload size if known (a small one shares the
     * header's cache line), else the largest expected (data is then
     * cache-line aligned for fast copies); max_length says what really
     * fits. */
    int   (*send_reserve)(hca_qp_t *qp, uint32_t length_hint,
                          hca_send_slot_t *slot);
    /* opcode HCA_WR_SEND or HCA_WR_SEND_WITH_IMM; -EINVAL (and the slot
     * is cancelled) if length > max_length or the opcode is not a SEND. */
    int   (*send_commit)(hca_qp_t *qp, hca_send_slot_t *slot,
                         uint32_t length, hca_wr_opcode_t opcode,
                         uint32_t imm_data);
    /* Gives the slot back: the target skips it. */
    void  (*send_cancel)(hca_qp_t *qp, hca_send_slot_t *slot);
    /* reserve, copy hdr then data, commit - in one call (a header and a
     * payload that fit one slot together).  Returns as send_reserve, and
     * -EBUSY also when they do not fit (post a WR instead). */
    int   (*send_short)(hca_qp_t *qp, const void *hdr, uint32_t hdr_length,
                        const void *data, uint32_t length,
                        hca_wr_opcode_t opcode, uint32_t imm_data);
    /* RDMA WRITE of [buf, buf + length) to remote_addr: 0 when done. */
    int   (*write_direct)(hca_qp_t *qp, const void *buf, size_t length,
                          uint64_t remote_addr, uint32_t rkey);
    /* The same check without the copy, for a caller that moves the data
     * itself (scatter/gather, an unpack callback): our mapping of
     * [remote_addr, remote_addr + length) for access
     * HCA_ACCESS_REMOTE_READ or _WRITE, counted as that RDMA op.  Move the
     * data at once, then call direct_done (a deregistration of the MR
     * waits until then; deregistering it from the same thread before
     * would wait forever, destroying the QP ends the access); post nothing
     * on the QP in between.  NULL: post a WR instead. */
    void *(*direct_ptr)(hca_qp_t *qp, uint64_t remote_addr, uint32_t rkey,
                        size_t length, unsigned access);
    void  (*direct_done)(hca_qp_t *qp);
    /* opcode: any HCA_WR_ATOMIC_*; size 4 or 8 (remote_addr aligned to
     * it).  0 when done: the old value is stored at result, size bytes,
     * unless result is NULL (pass NULL for the post forms). */
    int   (*atomic_direct)(hca_qp_t *qp, hca_wr_opcode_t opcode,
                           unsigned size, uint64_t remote_addr,
                           uint32_t rkey, uint64_t compare_add,
                           uint64_t swap, void *result);
} hca_fast_ops_t;

const hca_fast_ops_t *hca_qp_fast_ops(const hca_qp_t *qp);
/* After send_reserve or send_short answered -EAGAIN (the target's ring is
 * full): -EAGAIN, or -ECONNRESET once the ring stayed full and its owner
 * is gone (the QP is then in ERR). */
int hca_qp_send_blocked(hca_qp_t *qp);

/* In-place receive, for a QP created with HCA_QP_CREATE_RECV_INPLACE:
 * hca_recv_peek() returns 1 and describes the next message if it is a
 * SEND that fits one ring slot; data stays valid until
 * hca_recv_release(), which must come before the next peek.  It returns
 * 0 when the ring is empty, when the next message needs a posted receive
 * (a larger SEND, an RDMA WRITE with immediate; hca_cq_poll() places
 * those and reports them as CQEs, and stops at the next in-place one), or
 * while the receive CQ holds receive completions of this QP, so that
 * messages are seen in the order they arrived when the caller drains the
 * CQ between peeks.  The data is in shared memory the sender can still
 * write: read what you need once (as from any network buffer). */
typedef struct hca_recv_msg {
    const void *data;
    uint32_t    byte_len;
    uint32_t    imm_data;
    uint32_t    wc_flags;   /* HCA_WC_WITH_IMM */
    uint32_t    src_qp;
    uint64_t    index;      /* opaque: the ring index */
} hca_recv_msg_t;

int  hca_recv_peek(hca_qp_t *qp, hca_recv_msg_t *msg);
void hca_recv_release(hca_qp_t *qp, const hca_recv_msg_t *msg);


/* ---------------------------------------------------------------- rkey_ptr */

/* For a peer's MR inside its device memory: a local pointer to
 * remote_addr, valid while the connection's mapping lives.  -ENOENT if the
 * MR is not device memory, -EACCES on a failed key, range or rights check
 * (a pointer reads and writes: the MR and the target QP must grant
 * HCA_RKEY_PTR_ACCESS). */
#define HCA_RKEY_PTR_ACCESS (HCA_ACCESS_REMOTE_READ | HCA_ACCESS_REMOTE_WRITE)
int  hca_qp_rkey_ptr(hca_qp_t *qp, uint64_t remote_addr, uint32_t rkey,
                     size_t length, void **ptr_p);


/* ---------------------------------------------------------------- counters */

/* Room for one fabric's own counters in hca_counters_t. */
#define HCA_FABRIC_COUNTERS_MAX 48

typedef struct hca_counters {
    uint64_t tx_ops[HCA_WR_OPCODE_LAST];    /* WRs executed, by opcode */
    uint64_t tx_bytes[HCA_WR_OPCODE_LAST];
    uint64_t rx_ops[HCA_WR_OPCODE_LAST];    /* served as responder */
    uint64_t rx_bytes[HCA_WR_OPCODE_LAST];
    uint64_t errors[HCA_WC_STATUS_LAST];    /* error completions by status */
    uint64_t ring_full;                     /* -EAGAIN: target ring full */
    uint64_t single_copy_ops;               /* CMA transfers */
    uint64_t mapped_ops;                    /* via mapped device memory */
    uint64_t responder_ops;                 /* executed by a responder */
    uint64_t cq_overflows;
    uint64_t wakeups_sent;
    /* tx_ops and tx_bytes again, by the fabric that carried them
     * (hca_fabric_type_t): which peers were on other hosts */
    uint64_t fabric_tx_ops[HCA_FABRIC_LAST][HCA_WR_OPCODE_LAST];
    uint64_t fabric_tx_bytes[HCA_FABRIC_LAST][HCA_WR_OPCODE_LAST];
    /* each fabric's own counters (tcp: its wire's frames, bytes, NAKs,
     * connections), by the fabric's index: hca_fabric_counter_name names
     * them, hca_fabric_counter_find finds one */
    uint64_t fabric_own[HCA_FABRIC_LAST][HCA_FABRIC_COUNTERS_MAX];
} hca_counters_t;

/* The name of fabric's own counter i (fabric_own[fabric][i]), or NULL
 * past its last one; a name is a word of [a-z0-9_]. */
const char *hca_fabric_counter_name(hca_fabric_type_t fabric, unsigned i);
/* The index of fabric's own counter called name, or -ENOENT. */
int  hca_fabric_counter_find(hca_fabric_type_t fabric, const char *name);

/* A QP's requester counts (tx_*, fabric_tx_*, mapped_ops) are kept in the
 * process and published to the object other processes read every this
 * many operations of an opcode, and when the QP resets or closes: seen
 * from another process (hca_host_counters), a live QP's figures are less
 * than this many operations per opcode behind; the process's own calls
 * (hca_qp_counters, hca_device_counters) see every operation. */
#define HCA_COUNTERS_PUBLISH_OPS 256

/* Sums over every QP ever created on the context (closed ones included). */
int  hca_device_counters(hca_device_t *dev, hca_counters_t *cnt);
/* Host-wide: every process's live QPs and contexts plus the totals of
 * closed ones, for device devname (what hca_devinfo shows). */
int  hca_host_counters(const char *devname, hca_counters_t *cnt);
int  hca_qp_counters(hca_qp_t *qp, hca_counters_t *cnt);

const char *hca_wc_status_str(hca_wc_status_t status);
const char *hca_wr_opcode_str(hca_wr_opcode_t opcode);
const char *hca_qp_state_str(hca_qp_state_t state);
const char *hca_port_state_str(hca_port_state_t state);
const char *hca_fabric_type_str(hca_fabric_type_t fabric); /* "shm", "tcp" */

#ifdef HCA_DEV_VISIBILITY_PUSHED
#pragma GCC visibility pop
#undef HCA_DEV_VISIBILITY_PUSHED
#endif

#ifdef __cplusplus
}
#endif

#endif
