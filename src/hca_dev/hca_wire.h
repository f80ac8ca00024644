/*
 * hca_wire.h - every structure that crosses a process boundary on the shm
 * fabric.  Peers map these objects and read them; every field that comes
 * from a peer is validated before it is used (see hca_shm_peer.c).
 *
 * Objects (POSIX shm, mode 0600, named by hca_ctx_name() and, with the
 * context's name_nonce, hca_obj_name()):
 *   ctx   one per opened device context: header, MPT, published QP table,
 *         CQ notify table, service ring (requests for the responder thread)
 *   r<N>  a receive ring (a QP's own receive queue, or an SRQ's)
 *   q<N>  per QP: response slots (one per send WQE) + bounce area
 *   dm<N> device memory
 * The ctx object also holds the export table: the objects outside hca
 * (a sysv segment, a shared file or memfd) that back registered memory,
 * which peers map themselves (hca_export_entry_t).
 */
#ifndef HCA_WIRE_H
#define HCA_WIRE_H

#include <stdatomic.h>
#include <stdint.h>

#define HCA_WIRE_MAGIC       0x31414348u  /* "HCA1" */
#define HCA_WIRE_VERSION     11 /* 7: counters by fabric and opcode; 8: a
                                    QP's accepted source has its host
                                    (hca_qp_pub_t.dest_host); 9: an MPT
                                    entry has its registration's serial, a
                                    QP table entry its generation; 10: a
                                    ring has an owner word per slot after
                                    its slots (hca_ring.h); 11: the export
                                    table (hca_export_entry_t) */
#define HCA_CACHE_LINE       64

#define HCA_RING_SLOTS       64           /* slots per receive ring */
#define HCA_RING_SLOT_SIZE   (8192 + 64)  /* bytes, header included: an 8 KiB
                                              message in one slot */
#define HCA_SVC_SLOTS        256          /* service ring slots */
#define HCA_BOUNCE_SIZE      (64u * 1024) /* per-QP staging (no CMA) */
#define HCA_MAX_SGE          8

/* -------------------------------------------------------------- MPT */

typedef enum {
    HCA_MPT_FREE    = 0,
    HCA_MPT_VALID   = 1,
    HCA_MPT_INVALID = 2   /* being deregistered: no new access passes */
} hca_mpt_state_t;

/* Contract: the owner writes every plain field, then stores state VALID
 * (release).  A requester of another process announces its access in its
 * QP's busy word (hca_busy_t, in its own context), marks the entry with
 * its slot in the owner's mapper table (`accessors`), then loads state
 * and key; only if VALID and equal to its rkey may it read the plain
 * fields and touch memory, and it clears its busy word when done.
 * Deregistration stores INVALID (seq_cst) and waits for the busy words of
 * the mappers the entry names, each only while its process lives (see
 * hca_shm_fence.c).  `inflight` pins of the owner's own threads (its
 * responder, a QP to itself) are counted and waited for as they are. */
/* A key (lkey = rkey) names its MPT entry and a tag that changes when the
 * entry is reused, so a stale key fails the check. */
#define HCA_KEY_TAG_BITS   8
#define HCA_KEY_TAG_MASK   ((1u << HCA_KEY_TAG_BITS) - 1)
#define hca_key_index(_key)        ((uint32_t)(_key) >> HCA_KEY_TAG_BITS)
#define hca_key_make(_index, _tag) (((uint32_t)(_index) << HCA_KEY_TAG_BITS) | \
                                    ((uint32_t)(_tag) & HCA_KEY_TAG_MASK))

/* A QPN is gen << HCA_QPN_INDEX_BITS | index (hca_dev.h): the generation
 * changes when the index is reused. */
#define HCA_QPN_GEN_MASK   0xfffffu

typedef struct hca_mpt_entry {
    _Atomic uint32_t state;     /* hca_mpt_state_t */
    _Atomic uint32_t key;       /* index << 8 | tag, tag changes on reuse */
    _Atomic uint32_t inflight;  /* the owner's own threads past the check */
    uint32_t         pd_handle; /* owning PD */
    uint32_t         access;    /* HCA_ACCESS_* */
    uint32_t         dm_id;     /* device memory id, 0 if plain memory */
    uint64_t         addr;      /* start, in the owner's address space */
    uint64_t         length;
    uint64_t         dm_offset; /* addr - device memory base */
    _Atomic uint32_t accessors; /* who may be inside an access: 0 nobody,
                                   slot + 1 of one mapper, or
                                   HCA_MPT_ACCESSORS_MANY */
    _Atomic uint32_t unfenced;  /* an accessor relies on the owner's
                                   membarrier (its busy store has no fence
                                   of its own): dereg must run it */
    _Atomic uint64_t serial;    /* the registration's number, unique in the
                                   context (never reused, unlike the key's
                                   tag); 0 from its revocation on.  One
                                   load tells a requester that the entry
                                   is still the registration it checked
                                   and marked (hca_shm_direct.c) */
} hca_mpt_entry_t;              /* one cache line: no entry straddles two */

#define HCA_MPT_ACCESSORS_MANY 0xffffffffu

/* ------------------------------------------------------------ exports */

/* Memory that hca did not allocate but that a peer on the host can map
 * itself: the object backing a registration, as the owner found it in its
 * own /proc/self/maps (hca_backing.c).  An MPT entry whose dm_id has
 * HCA_DM_EXPORT set lies in the export of that id, at dm_offset bytes into
 * the object; a peer maps the object once and then accesses it directly,
 * under the same MPT checks as device memory.  Export ids are never
 * reused; slot = id % HCA_MAX_EXPORT.
 *
 * Contract: the owner stores id 0, writes the fields, then stores the new
 * id (release); a reader loads id (acquire), copies the fields, and loads
 * id again after an acquire fence: the copy is the export's only if both
 * loads gave the id it looks for. */
#define HCA_DM_EXPORT  0x80000000u
#define HCA_MAX_EXPORT 1024

typedef enum {
    HCA_EXPORT_SYSV = 1,  /* handle: shmid; stamp: its creator's pid */
    HCA_EXPORT_FILE = 2   /* handle: an fd of the owner, open on the file
                             (/proc/<pid>/fd/<handle>); dev, ino: the
                             file */
} hca_export_kind_t;

typedef struct hca_export_entry {
    _Atomic uint32_t id;       /* HCA_DM_EXPORT | n; 0: free */
    uint32_t         kind;     /* hca_export_kind_t */
    uint64_t         handle;
    uint64_t         dev;
    uint64_t         ino;
    uint64_t         size;     /* bytes of the object a peer maps */
    uint64_t         stamp;
    uint64_t         reserved[2];
} hca_export_entry_t;

/* -------------------------------------------------------------- QP table */

/* What peers need to know about a QP.  qpn is stored last (release) on
 * create and cleared first on destroy. */
typedef struct hca_qp_pub {
    _Atomic uint32_t qpn;         /* 0: free slot */
    _Atomic uint32_t state;       /* hca_qp_state_t */
    uint32_t         pd_handle;
    uint32_t         access;      /* remote access allowed by the QP */
    _Atomic uint32_t dest_pid;    /* accepted source (RTR), see dest_qpn */
    _Atomic uint32_t dest_ctx;
    _Atomic uint32_t dest_qpn;    /* HCA_QPN_ANY: any source */
    uint32_t         ring_id;     /* receive ring for SENDs to this QP */
    uint32_t         send_cq_idx; /* notify slots */
    uint32_t         recv_cq_idx;
    uint32_t         sq_depth;    /* response slots in its q object */
    _Atomic uint32_t nak_qpn;     /* written by a peer that could not
                                     answer a request of QP nak_qpn (it
                                     could not map its q object): that QP
                                     fails (REM_OP_ERR) at its next
                                     liveness check */
    _Atomic uint64_t dest_host;   /* host key of the accepted source: pids
                                     of other hosts collide with ours */
    _Atomic uint64_t gen;         /* +1 (release) after every change of
                                     what a requester checks (qpn, state,
                                     access, accepted source); never reset
                                     when the slot is reused.  A requester
                                     that checked the entry after reading
                                     gen G trusts that check while gen is
                                     still G (one load) */
} hca_qp_pub_t;

/* -------------------------------------------------------------- notify */

typedef struct hca_notify {
    _Atomic uint32_t armed;       /* consumer sleeps: signal its socket */
    uint32_t         reserved[15];
} hca_notify_t;

/* -------------------------------------------------------------- rings */

/* Multi-producer single-consumer ring.  Producers claim index h with a CAS
 * on head (only while h - tail < slots), write the slot, then store
 * stamp = h + 1 (release): the stamp is the per-wrap owner mark.  The
 * consumer at tail waits for stamp == tail + 1 (acquire), handles the
 * slot, then advances tail (release), which frees the slot. */
typedef struct hca_ring_hdr {
    uint32_t         magic;
    uint32_t         version;
    uint32_t         slots;       /* power of two */
    uint32_t         slot_size;
    _Atomic uint32_t notify_idx;  /* which consumer socket to signal:
                                     CQ index, or HCA_NOTIFY_SVC */
    uint32_t         reserved[11];
    _Atomic uint64_t head __attribute__((aligned(HCA_CACHE_LINE)));
                                  /* | HCA_RING_ARMED: consumer sleeps */
    _Atomic uint64_t tail __attribute__((aligned(HCA_CACHE_LINE)));
    uint8_t          pad[HCA_CACHE_LINE - 8];
} hca_ring_hdr_t;

#define HCA_NOTIFY_SVC 0xffffffffu

/* Messages in a receive ring */
typedef enum {
    HCA_MSG_SEND      = 1,  /* payload inline (one slot or fragments) */
    HCA_MSG_SEND_PULL = 2,  /* payload stays at the sender: the responder
                               reads it by single copy, then reports */
    HCA_MSG_WRITE_IMM = 3,  /* data already written: consume a receive */
    HCA_MSG_NOP       = 4,  /* a reserved slot given back: skip it */
    HCA_MSG_OP_LAST
} hca_msg_op_t;

enum {
    HCA_MSG_FIRST    = 1u << 0,
    HCA_MSG_LAST     = 1u << 1,
    HCA_MSG_WITH_IMM = 1u << 2,
    HCA_MSG_VIA_TCP  = 1u << 3  /* placed by our tcp fabric's receiver for
                                   a peer on another host (src_pid and
                                   src_ctx are that peer's) */
};

typedef struct hca_msg_hdr {
    _Atomic uint64_t stamp;    /* ring index + 1 once published */
    uint8_t          op;       /* hca_msg_op_t */
    uint8_t          flags;    /* HCA_MSG_* */
    uint8_t          num_iov;  /* SEND_PULL: iovs in the payload */
    uint8_t          data_off; /* payload offset in the slot: one of
                                  HCA_MSG_DATA_NEAR/ALIGNED */
    uint32_t         src_pid;
    uint32_t         src_ctx;
    uint32_t         src_qpn;
    uint32_t         dst_qpn;
    uint32_t         imm;
    uint32_t         length;   /* payload bytes in this slot */
    uint32_t         msg_len;  /* bytes of the whole message */
} hca_msg_hdr_t;               /* 40 bytes: a small payload shares the
                                  header's cache line */

/* SEND_PULL payload: where to answer, then num_iov iovs */
typedef struct hca_pull_hdr {
    uint32_t resp_idx;         /* sender's response slot */
    uint32_t resp_stamp;
} hca_pull_hdr_t;

typedef struct hca_wire_iov {
    uint64_t addr;
    uint64_t length;
} hca_wire_iov_t;

/* Where the payload starts: a small one right after the header, in the
 * header's cache line (one line moves per message: measured 0.19 against
 * 0.27 us am_lat); a large one on the next line (aligned copies: 8 KiB
 * am_bw +20%). */
#define HCA_MSG_DATA_NEAR    ((uint32_t)sizeof(hca_msg_hdr_t))
#define HCA_MSG_DATA_ALIGNED ((uint32_t)HCA_CACHE_LINE)
#define HCA_MSG_NEAR_MAX     512u
#define HCA_SLOT_PAYLOAD     (HCA_RING_SLOT_SIZE - HCA_MSG_DATA_ALIGNED)

static inline uint32_t hca_msg_data_off(uint64_t length)
{
    return (length <= HCA_MSG_NEAR_MAX) ? HCA_MSG_DATA_NEAR :
                                          HCA_MSG_DATA_ALIGNED;
}

/* Payload bytes a slot can hold at data_off, 0 for an invalid offset. */
static inline uint32_t hca_msg_room(uint32_t data_off)
{
    return ((data_off == HCA_MSG_DATA_NEAR) ||
            (data_off == HCA_MSG_DATA_ALIGNED)) ?
           (uint32_t)HCA_RING_SLOT_SIZE - data_off : 0;
}

/* Requests for the target's responder thread (atomics on plain memory,
 * RDMA WRITE/READ when single copy is not permitted). */
typedef struct hca_svc_req {
    _Atomic uint64_t stamp;    /* ring index + 1 once published */
    uint8_t          opcode;   /* hca_wr_opcode_t */
    uint8_t          size;     /* atomic operand size, 4 or 8 */
    uint16_t         reserved0;
    uint32_t         src_pid;
    uint32_t         src_ctx;
    uint32_t         src_qpn;  /* requester QP: names its q object */
    uint32_t         dst_qpn;  /* target QP: PD and access check */
    uint32_t         rkey;
    uint32_t         resp_idx; /* response slot in the requester's q */
    uint32_t         resp_stamp;
    uint64_t         remote_addr;
    uint64_t         length;   /* WRITE/READ chunk in the bounce area */
    uint64_t         operand;  /* add/cmp/bitwise/swap value */
    uint64_t         swap;     /* cmp_swp new value */
    uint64_t         reserved1[3];
} hca_svc_req_t;

/* -------------------------------------------------------------- q object */

typedef struct hca_resp_slot {
    _Atomic uint32_t stamp;    /* equals the request's resp_stamp when
                                  the response is complete */
    uint32_t         status;   /* hca_wc_status_t */
    uint64_t         value;    /* fetched value */
} hca_resp_slot_t;

typedef struct hca_qobj_hdr {
    uint32_t magic;
    uint32_t sq_depth;         /* number of response slots */
    uint64_t bounce_offset;    /* from the start of the object */
    uint64_t resp_offset;      /* response slots */
    uint64_t counters_offset;  /* the QP's hca_counters_t */
    uint64_t reserved[4];
} hca_qobj_hdr_t;

/* -------------------------------------------------------------- ctx */

typedef struct hca_ctx_hdr {
    uint32_t magic;
    uint32_t version;
    uint32_t pid;
    uint32_t ctx_id;
    uint64_t start_time;       /* owner's /proc start time (pid reuse) */
    uint32_t max_mr;
    uint32_t max_qp;
    uint32_t max_cq;
    uint32_t max_dm;
    uint64_t mpt_offset;       /* offsets from the start of the object */
    uint64_t qp_offset;
    uint64_t notify_offset;
    uint64_t svc_offset;       /* hca_ring_hdr_t + HCA_SVC_SLOTS reqs */
    uint32_t single_copy;      /* owner allows CMA on its side */
    uint32_t direct_fence;     /* owner's dereg runs membarrier: its
                                  peers' busy stores need no fence */
    uint64_t probe_addr;       /* address of probe_value in the owner */
    uint64_t probe_value;      /* peers read it by CMA to test access */
    uint64_t counters_offset;  /* responder-side hca_counters_t */
    uint64_t mappers_offset;   /* HCA_MAX_MAPPERS hca_mapper_t */
    uint64_t busy_offset;      /* max_qp + 1 hca_busy_t, by QP index */
    _Atomic uint32_t qp_hwm;   /* highest QP index ever used: how far a
                                  deregistration scans the busy words */
    uint32_t name_nonce;       /* random: in the names of every other
                                  object and socket of the context, so
                                  that no other user can take them first */
    uint64_t export_offset;    /* HCA_MAX_EXPORT hca_export_entry_t */
    uint64_t reserved[7];
} hca_ctx_hdr_t;

/* Who accesses this context's memory from another process: a requester
 * claims a slot before its first access (id = CLAIMING, then start_time,
 * then its id), so that a deregistration knows whose busy words to wait
 * for, and can tell a live registrant from a dead one (its pid's start
 * time) or from a newer process that reused the pid. */
#define HCA_MAX_MAPPERS 256
#define HCA_MAPPER_CLAIMING (~0ull)
typedef struct hca_mapper {
    _Atomic uint64_t id;       /* pid << 32 | ctx_id; 0: free */
    _Atomic uint64_t start_time;
} hca_mapper_t;

/* Set by a requester QP around every access to another process's memory
 * (a plain store when the owner's membarrier orders it, else followed by
 * a full fence); one cache line each, written only by the QP's thread. */
typedef struct hca_busy {
    _Atomic uint32_t busy;
    uint32_t         pad[15];
} hca_busy_t;

_Static_assert(sizeof(hca_mpt_entry_t) == HCA_CACHE_LINE, "MPT entry layout");
_Static_assert(sizeof(hca_qp_pub_t) == HCA_CACHE_LINE, "QP table entry layout");
_Static_assert(sizeof(hca_notify_t) == 64, "notify layout");
_Static_assert(sizeof(hca_ring_hdr_t) == 3 * HCA_CACHE_LINE, "ring hdr");
_Static_assert(sizeof(hca_msg_hdr_t) == 40, "message header layout");
_Static_assert(sizeof(hca_svc_req_t) == 96, "service request layout");
_Static_assert(sizeof(hca_resp_slot_t) == 16, "response slot layout");
_Static_assert(sizeof(hca_ctx_hdr_t) == 192, "ctx header layout");
_Static_assert(sizeof(hca_export_entry_t) == HCA_CACHE_LINE, "export entry");
_Static_assert(sizeof(hca_busy_t) == HCA_CACHE_LINE, "busy word layout");

#endif
