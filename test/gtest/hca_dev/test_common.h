/*
 * test_common.h - shared helpers and fixtures of the libhcadev googletest
 * suite.
 *
 *  - ctx: one opened device context that tracks (and destroys, in the right
 *    order) the PDs, CQs, QPs, SRQs, MRs and buffers a test creates.
 *  - cqw: a CQ with a queue of reaped completions.  progress_all() polls
 *    every CQ of the process, so that waiting for one completion also
 *    progresses the peer QPs of the same process (two-sided traffic needs
 *    the target's receive CQ to be polled).
 *  - child processes: fork_child() runs a lambda in a forked child that
 *    _exit()s with 0, or 1 when a googletest assertion failed in it; the
 *    child has a watchdog (alarm) and dies with its parent; the parent waits
 *    with wait_child() (bounded), and hca_test::TearDown() kills leftovers.
 *  - target: the passive side of a connection, either in this process
 *    (local_target) or in a forked child driven over pipes (remote_target),
 *    so that the same test bodies (run_data_op, run_atomic, run_mpt_check,
 *    run_fence, run_placement, run_ordering) run in one process and across
 *    two processes.
 *
 * Every wait is bounded (TIMEOUT_MS): a broken library makes tests fail,
 * never hang.
 *
 * The definitions are in test_common.cc, compiled once: only templates and
 * helpers of a few lines stay inline here, since every test file includes
 * this header.
 */
#ifndef HCA_GTEST_HCA_DEV_TEST_COMMON_H
#define HCA_GTEST_HCA_DEV_TEST_COMMON_H

#include <gtest/gtest.h>

#include "hca_dev.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <memory>
#include <ostream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>


/* ------------------------------------------------------------ printing */
/* In the global namespace, where the enums live, so googletest finds them. */

inline const char *hcat_safe_str(const char *s)
{
    return s ? s : "(null)";
}

inline std::ostream &operator<<(std::ostream &os, hca_wc_status_t s)
{
    return os << hcat_safe_str(hca_wc_status_str(s)) << "(" << (int)s << ")";
}

inline std::ostream &operator<<(std::ostream &os, hca_qp_state_t s)
{
    return os << hcat_safe_str(hca_qp_state_str(s)) << "(" << (int)s << ")";
}

inline std::ostream &operator<<(std::ostream &os, hca_wr_opcode_t o)
{
    return os << hcat_safe_str(hca_wr_opcode_str(o)) << "(" << (int)o << ")";
}

std::ostream &operator<<(std::ostream &os, hca_wc_opcode_t o);

/* The device's fast paths as a transport calls them: through the QP's fast
 * ops (hca_dev.h: one way each), with the ring-full rule applied after a
 * send that found the target's ring full, as the UCT applies it. */
inline int fast_send_reserve(hca_qp_t *qp, uint32_t length_hint,
                             hca_send_slot_t *slot)
{
    int rc = hca_qp_fast_ops(qp)->send_reserve(qp, length_hint, slot);
    return (rc == -EAGAIN) ? hca_qp_send_blocked(qp) : rc;
}
inline int fast_send_commit(hca_qp_t *qp, hca_send_slot_t *slot,
                            uint32_t length, hca_wr_opcode_t opcode,
                            uint32_t imm_data)
{
    return hca_qp_fast_ops(qp)->send_commit(qp, slot, length, opcode,
                                            imm_data);
}
inline void fast_send_cancel(hca_qp_t *qp, hca_send_slot_t *slot)
{
    hca_qp_fast_ops(qp)->send_cancel(qp, slot);
}
inline int fast_send_short(hca_qp_t *qp, const void *hdr, uint32_t hdr_length,
                           const void *data, uint32_t length,
                           hca_wr_opcode_t opcode, uint32_t imm_data)
{
    int rc = hca_qp_fast_ops(qp)->send_short(qp, hdr, hdr_length, data,
                                             length, opcode, imm_data);
    return (rc == -EAGAIN) ? hca_qp_send_blocked(qp) : rc;
}
inline int fast_write_direct(hca_qp_t *qp, const void *buf, size_t length,
                             uint64_t remote_addr, uint32_t rkey)
{
    return hca_qp_fast_ops(qp)->write_direct(qp, buf, length, remote_addr,
                                             rkey);
}
inline void *fast_direct_ptr(hca_qp_t *qp, uint64_t remote_addr,
                             uint32_t rkey, size_t length, unsigned access)
{
    return hca_qp_fast_ops(qp)->direct_ptr(qp, remote_addr, rkey, length,
                                           access);
}
inline void fast_direct_done(hca_qp_t *qp)
{
    hca_qp_fast_ops(qp)->direct_done(qp);
}
inline int fast_atomic_direct(hca_qp_t *qp, hca_wr_opcode_t opcode,
                              unsigned size, uint64_t remote_addr,
                              uint32_t rkey, uint64_t compare_add,
                              uint64_t swap, void *result)
{
    return hca_qp_fast_ops(qp)->atomic_direct(qp, opcode, size, remote_addr,
                                              rkey, compare_add, swap,
                                              result);
}


namespace hcat {

/* ------------------------------------------------------------ constants */

static const int      TIMEOUT_MS = 10000;   /* any single wait */
static const uint8_t  SENTINEL   = 0xA5;    /* untouched remote memory */
static const uint8_t  LSENTINEL  = 0x5A;    /* untouched local memory */
static const size_t   GUARD      = 64;      /* guard bytes around buffers */
/* Buffers sized after attr.max_msg_size are capped at 1 GiB: a message of
 * the largest size the device allows may be bigger than what a test can
 * reasonably allocate (and copy, and check) in a few seconds. */
static const size_t   MAX_ALLOC  = 1ul << 30;
/* Marker for "attr.max_msg_size" in size parameters. */
static const size_t   SIZE_MAX_MSG = (size_t)-1;
static const uint32_t IMM_VALUE  = 0x600dcafeu;

static const unsigned REMOTE_ALL = HCA_ACCESS_REMOTE_WRITE |
                                   HCA_ACCESS_REMOTE_READ |
                                   HCA_ACCESS_REMOTE_ATOMIC;
static const unsigned ACCESS_ALL = HCA_ACCESS_LOCAL_WRITE | REMOTE_ALL;

enum mem_kind_t {
    MEM_MALLOC = 0,   /* plain malloc'd memory */
    MEM_DM     = 1    /* device memory (hca_dm_alloc) */
};

inline const char *mem_kind_name(mem_kind_t k)
{
    return (k == MEM_DM) ? "dm" : "malloc";
}

inline double now_ms()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

inline void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* CPU time (user + system) used by the calling thread, in ms. */
inline double thread_cpu_ms()
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Time allowed for one transfer of size bytes: 10 s + 10 s per GiB. */
inline int xfer_timeout_ms(size_t size)
{
    return TIMEOUT_MS + (int)(size / (100ul * 1024));
}

std::string wc_str(const hca_wc_t &wc);


/* ------------------------------------------------------------ patterns */

/* A data pattern that depends on the seed and on the position (not
 * periodic), and never contains the sentinel bytes, so that a byte that was
 * not written is always detected. */
uint64_t pattern_word(uint64_t seed, uint64_t k);

void fill_pattern(void *p, size_t len, uint64_t seed);

/* Index of the first differing byte of b[k, k+n) against word w, or -1. */
int64_t first_diff(const uint8_t *b, size_t k, size_t n, uint64_t w);

/* Index of the first byte that differs from the pattern, or -1. */
int64_t check_pattern(const void *p, size_t len, uint64_t seed);

/* Index of the first byte != v, or -1. */
int64_t check_byte(const void *p, size_t len, uint8_t v);

/* What a buffer is filled with / checked against. */
struct fillspec {
    int      byte;   /* >= 0: every byte is this value; < 0: pattern */
    uint64_t seed;
};

inline fillspec PAT(uint64_t seed)
{
    fillspec f = {-1, seed};
    return f;
}

inline fillspec BYTE(uint8_t b)
{
    fillspec f = {b, 0};
    return f;
}

void do_fill(void *p, size_t len, fillspec f);

inline int64_t do_check(const void *p, size_t len, fillspec f)
{
    return (f.byte >= 0) ? check_byte(p, len, (uint8_t)f.byte)
                         : check_pattern(p, len, f.seed);
}


/* ------------------------------------------------------------ device */

/* The device under test: $HCA_TEST_DEVICE, else the first one listed. */
std::string dev_name();

const char *fabric_name(hca_fabric_type_t f);

/* Opens the device under test for a fabric: the one place where a fabric
 * becomes the arguments of hca_device_open.  shm: the device in shm mode
 * (this host only); tcp: tcp forced for every peer, on loopback (one
 * host's processes stand for two hosts). */
int open_device_for(hca_fabric_type_t fabric, unsigned flags,
                    hca_device_t **dev);

/* The fabrics the fabric-parameterised suites run on (seam_test: the
 * SameProcess / OtherProcess suites of test_ops.cc and test_procs.cc). */
inline std::vector<hca_fabric_type_t> test_fabrics()
{
    return {HCA_FABRIC_SHM, HCA_FABRIC_TCP};
}


/* ------------------------------------------------------------ CQ wrapper */

struct cqw {
    hca_cq_t             *cq  = nullptr;
    std::deque<hca_wc_t>  q;
    int                   err = 0;   /* last negative hca_cq_poll result */

    int poll_once();

    bool pop(hca_wc_t *wc);
};

/* Every CQ of this process that progress_all() polls. */
inline std::vector<cqw*> &cq_registry()
{
    static std::vector<cqw*> reg;
    return reg;
}

inline void cq_unregister(cqw *c)
{
    auto &r = cq_registry();
    r.erase(std::remove(r.begin(), r.end(), c), r.end());
}

/* Polls every registered CQ once; returns the number of new completions. */
int progress_all();

::testing::AssertionResult wait_wc(cqw *c, hca_wc_t *wc,
                                   int timeout_ms = TIMEOUT_MS);

::testing::AssertionResult wait_wcs(cqw *c, size_t n,
                                    std::vector<hca_wc_t> *out,
                                    int timeout_ms = TIMEOUT_MS);

/* Waits for one successful completion with this wr_id and opcode. */
::testing::AssertionResult wait_ok(cqw *c, uint64_t wr_id,
                                   hca_wc_opcode_t opcode,
                                   hca_wc_t *out  = nullptr,
                                   int timeout_ms = TIMEOUT_MS);

/* Waits for one completion with this wr_id and this (error) status. */
::testing::AssertionResult wait_status(cqw *c, uint64_t wr_id,
                                       hca_wc_status_t st,
                                       hca_wc_t *out  = nullptr,
                                       int timeout_ms = TIMEOUT_MS);

/* Polls for ms and fails if a completion arrives on c. */
::testing::AssertionResult expect_no_wc(cqw *c, int ms);


/* A fabric's own counter by the name the fabric gives it; a name it does
 * not have fails the test. */
inline uint64_t fabric_counter(const hca_counters_t &cnt,
                               hca_fabric_type_t fabric, const char *name)
{
    int i = hca_fabric_counter_find(fabric, name);

    EXPECT_GE(i, 0) << hca_fabric_type_str(fabric) << " has no counter "
                    << name;
    return (i < 0) ? 0 : cnt.fabric_own[fabric][i];
}

/* The context's own counter of the tcp fabric called name. */
inline uint64_t tcp_counter(hca_device_t *dev, const char *name)
{
    hca_counters_t cnt;

    memset(&cnt, 0, sizeof(cnt));
    EXPECT_EQ(0, hca_device_counters(dev, &cnt));
    return fabric_counter(cnt, HCA_FABRIC_TCP, name);
}

/* ------------------------------------------------------------ QP helpers */

struct qp_caps {
    uint32_t send_wr     = 128;
    uint32_t recv_wr     = 128;
    uint32_t send_sge    = 1;
    uint32_t recv_sge    = 1;
    uint32_t inline_data = 0;
    int      sig_all     = 0;
    int      quiet_flush = 0;
};

int qp_to_init(hca_qp_t *qp, unsigned access = REMOTE_ALL);

int qp_to_rtr(hca_qp_t *qp, const hca_port_addr_t &dest,
              uint32_t dest_qpn);

inline int qp_to_state(hca_qp_t *qp, hca_qp_state_t st)
{
    hca_qp_attr_t a;
    memset(&a, 0, sizeof(a));
    a.qp_state = st;
    return hca_qp_modify(qp, &a, HCA_QP_ATTR_STATE);
}

inline int qp_to_rts(hca_qp_t *qp)
{
    return qp_to_state(qp, HCA_QPS_RTS);
}

/* RESET -> INIT -> RTR -> RTS; returns the first error. */
int connect_qp(hca_qp_t *qp, const hca_port_addr_t &dest,
               uint32_t dest_qpn, unsigned access = REMOTE_ALL);

hca_sge_t mk_sge(const void *addr, size_t len, uint32_t lkey);

hca_send_wr_t mk_wr(hca_wr_opcode_t op, hca_sge_t *sg, int nsge,
                    unsigned flags = HCA_SEND_SIGNALED,
                    uint64_t wr_id = 0, uint64_t raddr = 0,
                    uint32_t rkey = 0);

/* Posts, retrying on -EAGAIN (target ring full) and -ENOMEM (send queue
 * full) while progressing every CQ of the process. */
int post_retry(hca_qp_t *qp, hca_send_wr_t *wr,
               int timeout_ms = TIMEOUT_MS);

int post_recv1(hca_qp_t *qp, const void *addr, size_t len,
               uint32_t lkey, uint64_t wr_id, int nsge = 1);

int post_srq_recv1(hca_srq_t *srq, const void *addr, size_t len,
                   uint32_t lkey, uint64_t wr_id);


/* ------------------------------------------------------------ context */

struct buf_t {
    uint8_t  *p;
    size_t    len;
    hca_dm_t *dm;
};

/* One opened device context and the objects created on it, destroyed in
 * order (QPs, SRQs, CQs, MRs, PDs, buffers, device) by close(). */
class ctx {
public:
    hca_device_t      *dev       = nullptr;
    hca_device_attr_t  attr;
    hca_port_addr_t    addr;
    unsigned           flags     = 0;
    hca_fabric_type_t  fabric    = HCA_FABRIC_SHM;
    int                alloc_err = 0;   /* errno of the last failed alloc */

    std::vector<hca_qp_t*>            qps;
    std::vector<hca_srq_t*>           srqs;
    std::vector<std::unique_ptr<cqw>> cqs;
    std::vector<hca_mr_t*>            mrs;
    std::vector<hca_pd_t*>            pds;
    std::vector<buf_t>                bufs;

    ctx()
    {
        memset(&attr, 0, sizeof(attr));
        memset(&addr, 0, sizeof(addr));
    }

    ctx(const ctx&) = delete;
    ctx &operator=(const ctx&) = delete;

    ~ctx()
    {
        close();
    }

    /* Opens the device for fabric fab (open_device_for); its port must be
     * on that fabric. */
    ::testing::AssertionResult open(unsigned fl = 0,
                                    hca_fabric_type_t fab = HCA_FABRIC_SHM);

    void close();

    /* Depth-limited default capabilities for a QP. */
    qp_caps caps(uint32_t depth = 128) const;

    hca_pd_t *new_pd();

    /* A CQ; registered for progress_all() unless reg is false. */
    cqw *new_cq(int cqe = 1024, bool reg = true);

    int destroy_cq(cqw *c);

    hca_qp_t *new_qp(hca_pd_t *pd, cqw *scq, cqw *rcq, const qp_caps &cp,
                     hca_srq_t *srq = nullptr);

    hca_qp_t *new_qp(hca_pd_t *pd, cqw *scq, cqw *rcq)
    {
        return new_qp(pd, scq, rcq, caps());
    }

    int destroy_qp(hca_qp_t *qp);

    hca_srq_t *new_srq(hca_pd_t *pd, uint32_t max_wr, uint32_t max_sge = 1);

    hca_mr_t *reg(hca_pd_t *pd, void *p, size_t len, unsigned access);

    int dereg(hca_mr_t *mr);

    void forget(hca_mr_t *mr)
    {
        mrs.erase(std::remove(mrs.begin(), mrs.end(), mr), mrs.end());
    }

    void forget(hca_qp_t *qp)
    {
        qps.erase(std::remove(qps.begin(), qps.end(), qp), qps.end());
    }

    void forget(hca_pd_t *pd)
    {
        pds.erase(std::remove(pds.begin(), pds.end(), pd), pds.end());
    }

    /* A buffer of len bytes (malloc or device memory), freed by close().
     * nullptr on failure (alloc_err holds the error); no test failure. */
    uint8_t *alloc(mem_kind_t kind, size_t len);
};


/* ------------------------------------------------------------ pipes */

bool write_all(int fd, const void *p, size_t len);

/* Reads exactly len bytes; false on EOF, error or timeout. */
bool read_all(int fd, void *p, size_t len, int timeout_ms = TIMEOUT_MS);

template <class T> inline bool send_msg(int fd, const T &v)
{
    return write_all(fd, &v, sizeof(v));
}

template <class T>
inline bool recv_msg(int fd, T *v, int timeout_ms = TIMEOUT_MS)
{
    return read_all(fd, v, sizeof(*v), timeout_ms);
}

inline bool send_token(int fd, uint32_t tok)
{
    return send_msg(fd, tok);
}

::testing::AssertionResult expect_token(int fd, uint32_t tok,
                                        int timeout_ms = TIMEOUT_MS);

/* Is fd readable right now? */
inline bool fd_readable(int fd, int timeout_ms = 0)
{
    struct pollfd pfd = {fd, POLLIN, 0};
    return poll(&pfd, 1, timeout_ms) > 0;
}

/* What two processes exchange to connect and address memory. */
struct peer_info {
    hca_port_addr_t addr;
    uint32_t        qpn[4];
    uint64_t        raddr[4];
    uint32_t        rkey[4];
    uint64_t        len[4];
};


/* ------------------------------------------------------------ children */

struct child_t {
    pid_t pid    = -1;
    int   rfd    = -1;   /* parent reads what the child writes */
    int   wfd    = -1;   /* parent writes, the child reads */
    bool  reaped = false;
    int   status = 0;
};

inline std::vector<std::unique_ptr<child_t>> &child_registry()
{
    static std::vector<std::unique_ptr<child_t>> reg;
    return reg;
}

inline bool &in_child()
{
    static bool v = false;
    return v;
}

inline const ::testing::TestResult *current_result()
{
    const ::testing::TestInfo *ti =
            ::testing::UnitTest::GetInstance()->current_test_info();
    return ti ? ti->result() : nullptr;
}

/* Forks a child that runs body(rfd, wfd) and _exit()s: 0 if no googletest
 * assertion failed in the child, 1 otherwise.  The child dies with its
 * parent and after watchdog_s seconds (SIGALRM). */
child_t *fork_child(const std::function<void(int rfd, int wfd)> &body,
                    unsigned watchdog_s = 60);

/* Waits (bounded) for the child to exit and checks it exited with 0. */
::testing::AssertionResult wait_child(child_t *c,
                                      int timeout_ms = TIMEOUT_MS);

void kill_child(child_t *c);

void close_child_fds(child_t *c);

/* Kills and reaps every child; returns true if one of them died by a
 * signal (its shared-memory objects are left until reclaimed). */
bool reap_all_children();


/* ------------------------------------------------------------ /dev/shm */

/* /dev/shm entries of the objects of process pid: names are
 * hca.<pidns>.<pid>.<starttime>.<ctx>.<kind><id>. */
std::vector<std::string> shm_entries_of(pid_t pid);

std::string join(const std::vector<std::string> &v);


/* ------------------------------------------------------------ target */

struct recv_seq_result {
    uint64_t received;      /* messages received in order */
    uint32_t bad_kind;      /* 0 ok, see RSEQ_* */
    uint32_t extra;         /* receives beyond count (must be 0) */
    uint64_t expected_seq;  /* at the first bad message */
    uint64_t got_seq;
    uint64_t detail;        /* status / byte_len / mismatch index */
};

enum {
    RSEQ_OK = 0,
    RSEQ_STATUS,     /* error completion (detail: status) */
    RSEQ_SEQ,        /* out of order / duplicate */
    RSEQ_LEN,        /* byte_len differs (detail: byte_len) */
    RSEQ_DATA,       /* payload differs (detail: first bad byte) */
    RSEQ_TIMEOUT,    /* not all messages arrived */
    RSEQ_POST        /* reposting a receive failed (detail: -rc) */
};

std::string rseq_str(const recv_seq_result &r);

/* Length of message seq of a sequence, at most slot bytes (>= 8). */
inline size_t seq_msg_len(uint64_t seq, size_t slot)
{
    size_t l = ((seq % 500) == 499) ? slot
                                    : 8 + (size_t)((seq * 2654435761ull) %
                                                   2000);
    return std::max<size_t>(8, std::min(l, slot));
}

/* Message seq: its 8-byte sequence number, then pattern(seq). */
inline void seq_msg_fill(uint8_t *p, uint64_t seq, size_t len)
{
    memcpy(p, &seq, 8);
    fill_pattern(p + 8, len - 8, seq);
}

/* The passive side of a connection.  Objects are named by small integer
 * ids.  Methods return >= 0 on success or a negative errno. */
class target {
public:
    virtual ~target() {}
    virtual bool remote() const = 0;
    virtual hca_port_addr_t port_addr() = 0;
    virtual hca_device_attr_t dev_attr() = 0;
    virtual int pd() = 0;
    /* a QP with its own send and recv CQ */
    virtual int qp(int pd, uint32_t *qpn, uint32_t depth = 128) = 0;
    virtual int connect(int qp, const hca_port_addr_t &dest, uint32_t dqpn,
                        unsigned access = REMOTE_ALL) = 0;
    virtual int destroy_qp(int qp) = 0;
    virtual int qp_state(int qp) = 0;
    /* a buffer; *addr is its address in the target process */
    virtual int buf(mem_kind_t kind, size_t len, uint64_t *addr) = 0;
    /* MR over [buf+off, buf+off+len) */
    virtual int mr(int pd, int buf, size_t off, size_t len, unsigned access,
                   uint32_t *rkey) = 0;
    virtual int dereg(int mr) = 0;
    virtual int fill(int buf, size_t off, size_t len, fillspec f) = 0;
    /* -1: matches; >= 0: first differing byte; < -1: error */
    virtual int64_t check(int buf, size_t off, size_t len, fillspec f) = 0;
    virtual int read(int buf, size_t off, void *p, size_t len) = 0;  /* <=64 */
    virtual int write(int buf, size_t off, const void *p, size_t len) = 0;
    /* count receives of len bytes at buf+off+i*stride, wr_id+i; mr < 0:
     * receives without SGE */
    virtual int post_recv(int qp, int mr, int buf, size_t off, size_t len,
                          uint64_t wr_id, int count = 1,
                          size_t stride = 0) = 0;
    /* collects up to n receive completions of qp (waits up to timeout) */
    virtual int poll_recv(int qp, int n, std::vector<hca_wc_t> *wcs,
                          int timeout_ms) = 0;
    /* Receives count sequence messages (seq_msg_fill) on window receives of
     * slot bytes at buf, reposting them, and checks order and contents. */
    virtual int recv_seq_start(int qp, int buf, int mr, size_t slot,
                               uint64_t count, uint32_t window) = 0;
    virtual void pump() = 0;
    virtual int recv_seq_finish(recv_seq_result *res, int timeout_ms) = 0;
};

/* A target in this process, on its own device context. */
class local_target : public target {
public:
    struct tqp {
        hca_qp_t *qp;
        cqw      *scq;
        cqw      *rcq;
    };

    ctx                    c;
    std::vector<hca_pd_t*> pds;
    std::vector<tqp>       qps;
    std::vector<buf_t>     bufs;
    std::vector<hca_mr_t*> mrs;

    struct {
        bool     active = false;
        int      qp, buf, mr;
        size_t   slot;
        uint64_t count;
        uint32_t window;
        recv_seq_result res;
    } rs;

    ::testing::AssertionResult open(unsigned flags = 0,
                                    hca_fabric_type_t fab = HCA_FABRIC_SHM)
    {
        return c.open(flags, fab);
    }

    bool remote() const override
    {
        return false;
    }

    hca_port_addr_t port_addr() override
    {
        return c.addr;
    }

    hca_device_attr_t dev_attr() override
    {
        return c.attr;
    }

    int pd() override;

    int qp(int pd, uint32_t *qpn, uint32_t depth) override;

    bool valid_qp(int q) const
    {
        return (q >= 0) && (q < (int)qps.size()) && (qps[q].qp != nullptr);
    }

    int connect(int q, const hca_port_addr_t &dest, uint32_t dqpn,
                unsigned access) override
    {
        if (!valid_qp(q)) {
            return -EINVAL;
        }
        return connect_qp(qps[q].qp, dest, dqpn, access);
    }

    int destroy_qp(int q) override;

    int qp_state(int q) override
    {
        if (!valid_qp(q)) {
            return -EINVAL;
        }
        return (int)hca_qp_state(qps[q].qp);
    }

    int buf(mem_kind_t kind, size_t len, uint64_t *addr) override;

    bool valid_range(int b, size_t off, size_t len) const
    {
        return (b >= 0) && (b < (int)bufs.size()) && (off <= bufs[b].len) &&
               (len <= bufs[b].len - off);
    }

    int mr(int p, int b, size_t off, size_t len, unsigned access,
           uint32_t *rkey) override;

    int dereg(int m) override;

    int fill(int b, size_t off, size_t len, fillspec f) override;

    int64_t check(int b, size_t off, size_t len, fillspec f) override
    {
        if (!valid_range(b, off, len)) {
            return -EINVAL;
        }
        return do_check(bufs[b].p + off, len, f);
    }

    int read(int b, size_t off, void *p, size_t len) override;

    int write(int b, size_t off, const void *p, size_t len) override;

    int post_recv(int q, int m, int b, size_t off, size_t len, uint64_t wr_id,
                  int count, size_t stride) override;

    int poll_recv(int q, int n, std::vector<hca_wc_t> *wcs,
                  int timeout_ms) override;

    int recv_seq_start(int q, int b, int m, size_t slot, uint64_t count,
                       uint32_t window) override;

    void pump() override;

    int recv_seq_finish(recv_seq_result *res, int timeout_ms) override;
};


/* ------------------------------------------------------------ remote */

enum rpc_op_t {
    RPC_PD = 1,
    RPC_QP,
    RPC_CONNECT,
    RPC_DESTROY_QP,
    RPC_QP_STATE,
    RPC_BUF,
    RPC_MR,
    RPC_DEREG,
    RPC_FILL,
    RPC_CHECK,
    RPC_READ,
    RPC_WRITE,
    RPC_POST_RECV,
    RPC_POLL_RECV,
    RPC_RECV_SEQ,
    RPC_QUIT
};

struct rpc_cmd {
    int32_t         op;
    int32_t         pad;
    int64_t         a[8];
    hca_port_addr_t addr;
    uint8_t         data[64];
};

struct rpc_reply {
    int64_t           rc;
    int64_t           v[4];
    uint8_t           data[64];
    recv_seq_result   rseq;
    int32_t           nwc;
    int32_t           pad;
};

struct rpc_hello {
    int32_t           rc;
    int32_t           pad;
    hca_port_addr_t   addr;
    hca_device_attr_t attr;
};

/* The child side: opens the device with flags and serves commands until
 * RPC_QUIT, EOF or a long idle time.  Idle, it sleeps in poll(2). */
void target_server(int rfd, int wfd, unsigned flags,
                   hca_fabric_type_t fab = HCA_FABRIC_SHM);

/* A target in a forked child (which opens the device after the fork). */
class remote_target : public target {
public:
    child_t          *child  = nullptr;
    bool              dead   = false;
    bool              busy   = false;   /* an async RPC is outstanding */
    hca_port_addr_t   addr_;
    hca_device_attr_t attr_;

    remote_target()
    {
        memset(&addr_, 0, sizeof(addr_));
        memset(&attr_, 0, sizeof(attr_));
    }

    ::testing::AssertionResult start(unsigned flags, unsigned watchdog_s = 120)
    {
        return start(flags, HCA_FABRIC_SHM, watchdog_s);
    }

    /* The child opens the device for fabric fab. */
    ::testing::AssertionResult start(unsigned flags, hca_fabric_type_t fab,
                                     unsigned watchdog_s = 120);

    ~remote_target() override
    {
        stop();
    }

    /* Asks the child to close everything and exit; checks its status. */
    void stop();

    bool send_cmd(const rpc_cmd &cmd);

    /* Waits for the reply while progressing the local CQs. */
    bool recv_reply(rpc_reply *r, std::vector<hca_wc_t> *wcs, int timeout_ms);

    int64_t call(rpc_cmd &cmd, rpc_reply *out = nullptr,
                 std::vector<hca_wc_t> *wcs = nullptr,
                 int timeout_ms = 2 * TIMEOUT_MS);

    static rpc_cmd mk(int op, std::initializer_list<int64_t> args);

    bool remote() const override
    {
        return true;
    }

    hca_port_addr_t port_addr() override
    {
        return addr_;
    }

    hca_device_attr_t dev_attr() override
    {
        return attr_;
    }

    int pd() override
    {
        rpc_cmd c = mk(RPC_PD, {});
        return (int)call(c);
    }

    int qp(int pd, uint32_t *qpn, uint32_t depth) override;

    int connect(int q, const hca_port_addr_t &dest, uint32_t dqpn,
                unsigned access) override
    {
        rpc_cmd c = mk(RPC_CONNECT, {q, dqpn, access});
        c.addr    = dest;
        return (int)call(c);
    }

    int destroy_qp(int q) override
    {
        rpc_cmd c = mk(RPC_DESTROY_QP, {q});
        return (int)call(c);
    }

    int qp_state(int q) override
    {
        rpc_cmd c = mk(RPC_QP_STATE, {q});
        return (int)call(c);
    }

    int buf(mem_kind_t kind, size_t len, uint64_t *addr) override;

    int mr(int p, int b, size_t off, size_t len, unsigned access,
           uint32_t *rkey) override;

    int dereg(int m) override
    {
        rpc_cmd c = mk(RPC_DEREG, {m});
        return (int)call(c);
    }

    int fill(int b, size_t off, size_t len, fillspec f) override
    {
        rpc_cmd c = mk(RPC_FILL, {b, (int64_t)off, (int64_t)len, f.byte,
                                  (int64_t)f.seed});
        return (int)call(c, nullptr, nullptr, xfer_timeout_ms(len));
    }

    int64_t check(int b, size_t off, size_t len, fillspec f) override
    {
        rpc_cmd c = mk(RPC_CHECK, {b, (int64_t)off, (int64_t)len, f.byte,
                                   (int64_t)f.seed});
        return call(c, nullptr, nullptr, xfer_timeout_ms(len));
    }

    int read(int b, size_t off, void *p, size_t len) override;

    int write(int b, size_t off, const void *p, size_t len) override;

    int post_recv(int q, int m, int b, size_t off, size_t len, uint64_t wr_id,
                  int count, size_t stride) override
    {
        rpc_cmd c = mk(RPC_POST_RECV, {q, m, b, (int64_t)off, (int64_t)len,
                                       (int64_t)wr_id, count,
                                       (int64_t)stride});
        return (int)call(c);
    }

    int poll_recv(int q, int n, std::vector<hca_wc_t> *wcs,
                  int timeout_ms) override
    {
        rpc_cmd c = mk(RPC_POLL_RECV, {q, n, timeout_ms});
        return (int)call(c, nullptr, wcs, timeout_ms + TIMEOUT_MS);
    }

    int recv_seq_start(int q, int b, int m, size_t slot, uint64_t count,
                       uint32_t window) override;

    void pump() override
    {
    }

    int recv_seq_finish(recv_seq_result *res, int timeout_ms) override;
};


/* ------------------------------------------------------------ fixture */

class hca_test : public ::testing::Test {
protected:
    void SetUp() override
    {
        signal(SIGPIPE, SIG_IGN);
    }

    void TearDown() override;
};


/* ------------------------------------------------------------ connection */

/* A local requester QP connected to a QP of target t. */
struct conn {
    hca_pd_t *pd    = nullptr;
    cqw      *scq   = nullptr;
    cqw      *rcq   = nullptr;
    hca_qp_t *qp    = nullptr;
    uint32_t  qpn   = 0;
    int       tpd   = -1;
    int       tqp   = -1;
    uint32_t  tqpn  = 0;
};

/* Creates (and connects, both ways) a local QP on pd (a new PD if null)
 * and a target QP on target PD tpd (a new one if < 0) whose INIT access is
 * t_access. */
::testing::AssertionResult make_conn(ctx &c, target &t, conn *cn,
                                     int tpd = -1,
                                     unsigned t_access = REMOTE_ALL,
                                     hca_pd_t *pd = nullptr,
                                     uint32_t depth = 128);


/* Posts wr (post_retry) and waits for its successful completion of opcode
 * opc on scq. */
::testing::AssertionResult post_and_wait(hca_qp_t *qp, cqw *scq,
                                         hca_send_wr_t *wr,
                                         hca_wc_opcode_t opc,
                                         hca_wc_t *wc = nullptr,
                                         int timeout_ms = TIMEOUT_MS);

/* Two QPs, each with its own send and receive CQ, connected to each other:
 * q1 on context a, q2 on context b (the same context: a loopback pair on
 * one PD). */
struct qp_pair {
    hca_pd_t *pd1 = nullptr, *pd2 = nullptr;
    cqw      *s1 = nullptr, *r1 = nullptr, *s2 = nullptr, *r2 = nullptr;
    hca_qp_t *q1 = nullptr, *q2 = nullptr;
};

::testing::AssertionResult make_qp_pair(ctx &a, ctx &b, qp_pair *p);

/* How a WR to a dead peer completes. */
inline bool dead_peer_status(hca_wc_status_t s)
{
    return (s == HCA_WC_RETRY_EXC_ERR) || (s == HCA_WC_WR_FLUSH_ERR);
}


/* ------------------------------------------------------------ fabric seam */

/* Where the target of a test lives: a device context of this process, or
 * a forked process (its own device context). */
enum target_kind_t {
    SAME_PROCESS,
    OTHER_PROCESS
};

inline const char *target_kind_name(target_kind_t k)
{
    return (k == SAME_PROCESS) ? "SameProcess" : "OtherProcess";
}

/* One point of the fabric seam: a fabric and where the target is. */
struct seam_t {
    hca_fabric_type_t fabric;
    target_kind_t     where;
};

/* "Shm_SameProcess": the head of every seam test's parameter name. */
inline std::string seam_name(const seam_t &s)
{
    return std::string(fabric_name(s.fabric)) + "_" +
           target_kind_name(s.where);
}

inline void PrintTo(const seam_t &s, std::ostream *os)
{
    *os << fabric_name(s.fabric) << "/" << target_kind_name(s.where);
}

/* Every fabric of test_fabrics() x the target kinds given. */
std::vector<seam_t> seams(std::vector<target_kind_t> kinds = {
                                  SAME_PROCESS, OTHER_PROCESS});

/* No parameter besides the seam. */
struct no_param {
};

inline void PrintTo(const no_param &, std::ostream *os)
{
    *os << "-";
}

/* The fixture of the tests that run against a target in this process or
 * in another one, on every fabric: the parameter is (seam, P).  c is the
 * requester's context; open_pair() opens the target of the seam's kind
 * (a child is forked before this process opens the device) and then c,
 * both for the seam's fabric.  Tests that only make sense for one target
 * kind are instantiated with seams({that kind}). */
template <class P>
class seam_test
    : public hca_test,
      public ::testing::WithParamInterface<std::tuple<seam_t, P>> {
public:
    typedef std::tuple<seam_t, P> param_type;

protected:
    ctx                     c;
    std::unique_ptr<target> tgt;

    const seam_t &seam() const
    {
        return std::get<0>(this->GetParam());
    }

    hca_fabric_type_t fabric() const
    {
        return seam().fabric;
    }

    target_kind_t where() const
    {
        return seam().where;
    }

    const P &param() const
    {
        return std::get<1>(this->GetParam());
    }

    target &t()
    {
        return *tgt;
    }

    ::testing::AssertionResult open_pair(unsigned flags)
    {
        ::testing::AssertionResult r = ::testing::AssertionSuccess();
        if (where() == OTHER_PROCESS) {
            remote_target *rt = new remote_target;
            tgt.reset(rt);
            r = rt->start(flags, fabric());
        } else {
            local_target *lt = new local_target;
            tgt.reset(lt);
            r = lt->open(flags, fabric());
        }
        if (!r) {
            return r;
        }
        return c.open(flags, fabric());
    }

    void TearDown() override
    {
        /* the order the tests had with locals: the requester closes before
         * the child target stops, a local target closes before the
         * requester */
        if (where() == OTHER_PROCESS) {
            c.close();
            tgt.reset();
        } else {
            tgt.reset();
            c.close();
        }
        hca_test::TearDown();
    }
};

/* The name of a seam test's parameter: the seam, then what rest(P)
 * gives (nothing for no_param). */
template <class P>
inline std::string seam_param_name(const std::tuple<seam_t, P> &p,
                                   const std::string &rest)
{
    return seam_name(std::get<0>(p)) + (rest.empty() ? "" : "_" + rest);
}


/* ------------------------------------------------------------ opcodes */

inline bool is_atomic_op(hca_wr_opcode_t op)
{
    return (op >= HCA_WR_ATOMIC_FETCH_ADD) && (op <= HCA_WR_ATOMIC_XOR);
}

inline bool is_fetching_op(hca_wr_opcode_t op)
{
    return (op >= HCA_WR_ATOMIC_FETCH_ADD) && (op <= HCA_WR_ATOMIC_FETCH_XOR);
}

/* needs HCA_ATOMIC_CAP_BITOPS */
inline bool is_bitop(hca_wr_opcode_t op)
{
    return (op == HCA_WR_ATOMIC_SWAP) || (op == HCA_WR_ATOMIC_FETCH_AND) ||
           (op == HCA_WR_ATOMIC_FETCH_OR) || (op == HCA_WR_ATOMIC_FETCH_XOR) ||
           (op == HCA_WR_ATOMIC_AND) || (op == HCA_WR_ATOMIC_OR) ||
           (op == HCA_WR_ATOMIC_XOR);
}

const char *op_short_name(hca_wr_opcode_t op);

/* Value at the target after the atomic op on old with the operands. */
uint64_t atomic_result(hca_wr_opcode_t op, uint64_t old, uint64_t a,
                       uint64_t swap, uint64_t mask);

hca_wc_opcode_t wc_opcode_of(hca_wr_opcode_t op);

/* The size a size parameter stands for (SIZE_MAX_MSG: max_msg_size capped
 * at MAX_ALLOC). */
inline size_t resolve_size(size_t size, const hca_device_attr_t &attr)
{
    if (size == SIZE_MAX_MSG) {
        return (size_t)std::min<uint64_t>(attr.max_msg_size, MAX_ALLOC);
    }
    return size;
}


/* ------------------------------------------------------------ test bodies */

/* One data operation (SEND, SEND_WITH_IMM, RDMA_WRITE, RDMA_WRITE_WITH_IMM,
 * RDMA_READ) of size bytes from local offset loff to remote offset roff,
 * on memory of kind, verified byte for byte, with guard bytes around both
 * buffers.  The MRs cover exactly the transferred range. */
void run_data_op(ctx &c, target &t, hca_wr_opcode_t op, size_t size,
                 size_t loff, size_t roff, mem_kind_t kind,
                 uint64_t seed = 1);

/* Operands of the atomic tests. */
struct atomic_vals {
    uint64_t init;   /* target value before */
    uint64_t a;      /* compare_add */
    uint64_t swap;
};

atomic_vals atomic_operands(hca_wr_opcode_t op, bool is32);

/* Checks the capabilities an atomic op needs; returns false (and skips)
 * if the device does not have them. */
bool atomic_supported(const hca_device_attr_t &a, hca_wr_opcode_t op,
                      bool is32, std::string *why);

/* One atomic op; checks the fetched value, the new target value and that
 * no neighbouring byte changed (local or remote).  CMP_SWP is done twice:
 * with a compare value that does not match (no change), then one that
 * does. */
void run_atomic(ctx &c, target &t, hca_wr_opcode_t op, bool is32,
                mem_kind_t kind);


/* MPT checks: each must give the right error completion and leave the
 * target memory untouched. */
enum mpt_case_t {
    MPT_UNKNOWN_RKEY = 0,
    MPT_STALE_RKEY,      /* MR deregistered */
    MPT_REUSED_ENTRY,    /* deregistered, then the entry reused */
    MPT_RANGE_BEFORE,    /* starts 1 byte before the MR */
    MPT_RANGE_AFTER,     /* ends 1 byte after the MR */
    MPT_NO_RIGHT,        /* MR without the remote right the op needs */
    MPT_QP_NO_RIGHT,     /* target QP (INIT access) without the right */
    MPT_OTHER_PD,        /* MR and target QP on different PDs */
    MPT_MISALIGNED,      /* atomic address not naturally aligned */
    MPT_BAD_LKEY,        /* local SGE with an unknown lkey */
    MPT_LOCAL_RANGE,     /* local SGE 1 byte past its MR */
    MPT_LOCAL_NO_WRITE,  /* READ / fetch into an MR without LOCAL_WRITE */
    MPT_CASE_LAST
};

enum mpt_op_t {
    MOP_WRITE = 0,
    MOP_WRITE_IMM,
    MOP_READ,
    MOP_FADD64,
    MOP_FADD32,
    MOP_CSWAP64,
    MOP_ADD64,
    MOP_SEND,
    MOP_LAST
};

struct mpt_param {
    mpt_case_t cs;
    mpt_op_t   op;
    mem_kind_t kind;
};

const char *mpt_case_name(mpt_case_t c);

inline const char *mpt_op_name(mpt_op_t o)
{
    static const char *n[] = {"Write", "WriteImm", "Read",  "FetchAdd64",
                              "FetchAdd32", "CmpSwp64", "Add64", "Send"};
    return ((unsigned)o < MOP_LAST) ? n[o] : "?";
}

inline bool mop_is_atomic(mpt_op_t o)
{
    return (o == MOP_FADD64) || (o == MOP_FADD32) || (o == MOP_CSWAP64) ||
           (o == MOP_ADD64);
}

bool mpt_valid(mpt_case_t cs, mpt_op_t op);

std::vector<mpt_param> mpt_params();

inline void PrintTo(const mpt_param &p, std::ostream *os)
{
    *os << mpt_case_name(p.cs) << "/" << mpt_op_name(p.op) << "/"
        << mem_kind_name(p.kind);
}

inline std::string mpt_param_name(const ::testing::TestParamInfo<mpt_param> &i)
{
    return std::string(mpt_case_name(i.param.cs)) + "_" +
           mpt_op_name(i.param.op) + "_" + mem_kind_name(i.param.kind);
}

/* The remote right an op needs. */
unsigned mop_right(mpt_op_t o);

hca_wr_opcode_t mop_opcode(mpt_op_t o);

void run_mpt_check(ctx &c, target &t, mpt_case_t cs, mpt_op_t op,
                   mem_kind_t kind);


/* FENCE: an RDMA_READ / fetching atomic posted with HCA_SEND_FENCE right
 * after an RDMA_WRITE to the same address sees the write. */
void run_fence(ctx &c, target &t, mem_kind_t kind);

/* Completion means placement: right after the completion of a WRITE the
 * target memory holds the data. */
void run_placement(ctx &c, target &t, mem_kind_t kind);

/* Ordering: count SENDs with sequence numbers and varying sizes arrive in
 * post order, exactly once, while the target reposts receives. */
void run_ordering(ctx &c, target &t, uint64_t count,
                  int timeout_ms = 6 * TIMEOUT_MS);


/* ------------------------------------------------------------ params */

std::string size_name(size_t s);

} /* namespace hcat */

#endif
