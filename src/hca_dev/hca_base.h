/*
 * hca_base.h - what the base layer (layer 0) offers the rest: POSIX shared-
 * memory objects and their names (hca_memobj.c), host and process identity
 * (hca_host.c), a ring consumer's reaper of dead claims (hca_ring_reap.c),
 * fault injection (hca_fault.c), wakeup sockets (hca_notify.c) and the
 * opcode table (hca_opcode.c).
 * Private to libhcadev (not installed).
 */
#ifndef HCA_BASE_H
#define HCA_BASE_H

#include "hca_dev.h"
#include "hca_util.h"
#include "hca_ring.h"
#include "hca_wire.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* ---------------------------------------------------------------- shm */

#define HCA_OBJ_NAME_MAX 96 /* "/hca.<pidns>.<pid>.<ctx>.<nonce>.<kind><id>" */

typedef struct hca_memobj {
    void   *addr;
    size_t  length;
    char    name[HCA_OBJ_NAME_MAX];
    int     owner;          /* created by us: unlink on close */
    int     sysv;           /* a sysv segment we attached: shmdt */
} hca_memobj_t;

int  hca_memobj_create(hca_memobj_t *shm, const char *name, size_t length,
                    int numa_node);
int  hca_memobj_map(hca_memobj_t *shm, const char *name, size_t min_length);
void hca_memobj_destroy(hca_memobj_t *shm);
void hca_memobj_reclaim(uint32_t pidns, uint32_t self_pid, int first_open);
void hca_ctx_name(char *buf, size_t len, uint32_t pidns, uint32_t pid,
                  uint32_t ctx);
void hca_obj_name(char *buf, size_t len, uint32_t pidns, uint32_t pid,
                  uint32_t ctx, uint32_t nonce, const char *kind, uint64_t id);

/* ------------------------------------------------------------- backing */

/* What backs a range of our memory that a peer could map itself
 * (hca_backing.c). */
typedef struct hca_backing {
    uint32_t kind;          /* hca_export_kind_t */
    int      deleted;       /* the file has no name any more */
    uint64_t handle;        /* SYSV: shmid */
    uint32_t sysv_key;      /* SYSV: the key in its name */
    uint64_t dev, ino;      /* the object (SYSV: ino is the shmid) */
    uint64_t offset;        /* of the range's start in the object */
    char     path[256];     /* as /proc/self/maps shows it */
} hca_backing_t;

#define HCA_BACKING_MAX_SIZE (1ull << 40) /* what a peer maps at most */

/* 0 and *b if [addr, addr+length) lies in one shared, writable object
 * that a peer could open (a sysv segment, a file, a memfd); -ENOENT for
 * private or anonymous memory, or a range over several objects. */
int hca_backing_find(uintptr_t addr, size_t length, hca_backing_t *b);
/* The owner's side: fills an export entry (all but its id) for `length`
 * bytes from b->offset; for a file, *fd_p is an fd the owner keeps open
 * while the export lives.  0, or -errno: no export, another route. */
int hca_backing_export(const hca_backing_t *b, uint64_t length,
                       hca_export_entry_t *e, int *fd_p);
/* A peer's side: maps the object of an export of owner_pid (checked
 * against what it names and for our user).  0, or -errno. */
int hca_backing_map(const hca_export_entry_t *e, uint32_t owner_pid,
                    hca_memobj_t *obj);

/* ---------------------------------------------------------------- host */

int      hca_proc_start_time(uint32_t pid, uint64_t *start_p);
/* 1 if the producer of a claim mark (hca_ring.h) is gone. */
int      hca_claimer_gone(uint64_t mark);

/* A ring consumer (hca_ring_reap.c), while nothing is published at its
 * tail: frees the slot there if its producer can never publish it (gone,
 * or claimed and never stamped for long; watch remembers since when).
 * 1 if a slot was freed. */
int      hca_ring_reap_dead_claim(hca_ring_t *ring, hca_ring_watch_t *watch);
uint32_t hca_ns_inode(const char *kind);

/* Fault injection (hca_fault.c): HCA_FAULT="map=P,reg=P,answer_delay_us=N,
 * ring_stall_ms=N,tcp_loss=P,tcp_dup=P,tcp_reset=P,tcp_reset_ms=N,
 * tcp_reset_for_ms=N,tcp_relisten_ms=N,tcp_delay=P,tcp_delay_us=N" (P a
 * probability in [0,1]); off
 * by default.  The
 * tcp faults are per frame: these kernels have no netem. */
typedef enum {
    HCA_FAULT_MAP = 0,     /* a peer's object cannot be mapped */
    HCA_FAULT_REG,         /* a registration fails (-ENOMEM) */
    HCA_FAULT_TCP_LOSS,    /* a frame read is dropped as if never sent */
    HCA_FAULT_TCP_DUP,     /* a frame is sent twice */
    HCA_FAULT_TCP_RESET,   /* the connection is cut in the middle of a
                              frame being sent */
    HCA_FAULT_TCP_DELAY,   /* a frame waits tcp_delay_us before it goes
                              (a stall, not a reordering: TCP keeps order) */
    HCA_FAULT_LAST
} hca_fault_kind_t;

typedef struct hca_fault_cfg {
    int              enabled;
    uint32_t         prob[HCA_FAULT_LAST];  /* of 2^32 */
    uint32_t         answer_delay_us;       /* before each answer */
    uint32_t         ring_stall_ms;         /* the owner stops consuming
                                               its receive rings */
    uint32_t         tcp_reset_ms;          /* every N ms, every tcp
                                               connection is cut ... */
    uint32_t         tcp_reset_for_ms;      /* ... during the first N ms
                                               after the open (0: always) */
    uint32_t         tcp_delay_us;          /* tcp_delay's wait (default
                                               2000) */
    uint32_t         tcp_relisten_ms;       /* N ms after the open, the tcp
                                               listener and every connection
                                               are closed; the listener is
                                               bound again on its port 100 ms
                                               later (a restarted listener) */
    _Atomic uint64_t seq;
} hca_fault_cfg_t;

void hca_fault_init(hca_fault_cfg_t *cfg);
int  hca_fault_hit(hca_fault_cfg_t *cfg, hca_fault_kind_t kind);
/* ring_stall_ms: 1 in the first half of every 2 * ring_stall_ms. */
int  hca_fault_ring_stalled(const hca_fault_cfg_t *cfg);

/* ---------------------------------------------------------------- wakeups */

/* A context of this host that wakeups go to: its consumers' sockets are
 * named after these (hca_notify.c).  The device keeps its own
 * (dev->notify_self); the shm fabric one per peer. */
typedef struct hca_notify_ctx {
    uint32_t pidns;
    uint32_t pid;
    uint32_t ctx;
    uint32_t nonce;
} hca_notify_ctx_t;

int      hca_notify_bind(hca_device_t *dev, uint32_t idx, int *fd_p);
/* Wakes consumer idx (a CQ's notify index, or HCA_NOTIFY_SVC) of `to`. */
void     hca_notify_signal(hca_device_t *dev, const hca_notify_ctx_t *to,
                           uint32_t idx);

/* ---------------------------------------------------------------- opcodes */

enum {
    HCA_OPF_SEND   = 1u << 0,  /* consumes a receive at the target */
    HCA_OPF_WRITE  = 1u << 1,  /* moves local data to remote memory */
    HCA_OPF_READ   = 1u << 2,  /* moves remote data to local memory */
    HCA_OPF_ATOMIC = 1u << 3,
    HCA_OPF_FETCH  = 1u << 4,  /* atomic returns the old value */
    HCA_OPF_IMM    = 1u << 5   /* carries immediate data */
};

typedef struct hca_opcode_info {
    const char      *name;
    unsigned         flags;        /* HCA_OPF_* */
    unsigned         rem_access;   /* MR and QP right needed at target */
    hca_wc_opcode_t  wc_opcode;
} hca_opcode_info_t;

extern const hca_opcode_info_t hca_opcode[HCA_WR_OPCODE_LAST];

#endif
