/*
 * test_tcp_reliable.cc - RC QPs of the tcp fabric survive the loss of
 * frames and of sockets (docs/TCP-WIRE.md, "Resuming a connection" and
 * "Sequence, duplicates, replay"): PSNs, the exactly-once responder with
 * its atomic replay table, go-back-N retransmission, connections that
 * outlive their sockets, reconnect, one retry timeout.
 *
 * Every test runs the same verified workload between two processes forced
 * onto the tcp fabric on loopback (the parent is the main requester, a
 * forked child the main responder), with HCA_FAULT and the retry timeout
 * in the environment of both before either opens its device:
 *
 *  - 8 RC QP pairs; on each, interleaved: RDMA WRITEs of 8 B, 4 KiB,
 *    100 KiB and 1 MiB (several frames) each read back with an RDMA READ
 *    and compared; SENDs of 8 B to 20 KiB (several fragments) with a
 *    sequence number, checked by the receiver exactly once, in order,
 *    byte for byte; 500 FETCH_ADDs (add 1) on one 8-byte counter shared by
 *    all QPs: the old values fetched over all QPs are exactly {0..N-1}
 *    and the counter ends at N (exactly-once);
 *  - up to 16 WRs outstanding per QP, so that faults hit work in flight;
 *  - the child sends traffic back (WRITEs read back, SENDs), so that both
 *    directions are exercised.
 *
 * At the end every completion is SUCCESS, no QP is in ERR and all data is
 * verified.  Each run prints its wall time, the longest gap between two
 * consecutive completions of the requester (the recovery time) and the
 * tcp counters of both processes (the child sends its own over the pipe).
 *
 * How a run is set up (TcpReliable::run):
 *  - the environment, set before the fork so that both processes open
 *    their device with it, and unset in TearDown: HCA_FAULT (the fault
 *    string, or unset), HCA_TCP_RETRY_TIMEOUT_MS and its alias
 *    HCA_TCP_TIMEOUT_MS (the retry timeout; 2 s unless a test says);
 *  - over the pipes: the child sends its rel_info (address, QP numbers,
 *    its write area and counter), the parent its own; the child connects,
 *    posts its receives and sends READY_TOKEN; both run; the parent sends
 *    CTL_STOP with the SENDs it completed per QP; the child finishes its
 *    round, waits for those SENDs and sends a child_report (its errors,
 *    counts, the counter's final value and its tcp counters, CNT_MISSING
 *    for a name its fabric does not have); the parent sends CTL_QUIT.
 *  - the parent's side stays open until TearDown, so that a test reads
 *    the parent's counters with tcp_counter (a missing name fails) and
 *    adds the child's: both().
 *
 * Every wait is bounded; the child has a watchdog.
 */
#include "test_common.h"
#include "tcp_forge.h"
#include "tcp_raw_socket.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <inttypes.h>
#include <atomic>
#include <random>
#include <memory>
#include <thread>
#include <unordered_map>

namespace hcat {
namespace {

const int      NQP          = 8;
const int      WINDOW       = 16;     /* WRs outstanding per QP */
const uint32_t QP_DEPTH     = 64;
const int      RECV_DEPTH   = 32;     /* receives posted per QP */
const size_t   SEND_MAX     = 20 * 1024;
const int      W_CLASSES    = 4;
const size_t   W_SIZES[W_CLASSES] = {8, 4096, 100 * 1024, 1024 * 1024};
const int      W_SLOTS      = 2;      /* regions per size class and QP */
const int      N_SEND_SIZES = 8;
const size_t   SEND_SIZES[N_SEND_SIZES] = {8,    100,  1500,  4096,
                                           8192, 8193, 12345, SEND_MAX};
const int      DEFAULT_RETRY_MS = 2000;
const uint32_t READY_TOKEN      = 0x4e4d4459;
const unsigned CHILD_WATCHDOG_S = 60;

/* The counters printed for both processes.  "connections_lost" is what
 * the fabric calls conns_lost. */
const int         NCNT = 11;
const char *const CNT_NAMES[NCNT] = {
        "retransmits", "dup_requests", "replays",         "seq_naks",
        "rtos",        "reconnects",   "faults_injected", "connections_lost",
        "failovers",   "path0_frames_tx", "path1_frames_tx"};

/* Two paths on one host: the kernel takes all of 127.0.0.0/8 as local. */
const char *const TWO_PATHS = "127.0.0.1,127.0.0.2";
/* the child's own HCA_NET_DEVICES (set before the fork), if not the
 * parent's: a peer with fewer paths */
const char *child_net_devices = nullptr;
const uint64_t    CNT_MISSING     = ~0ull;

/* A counter for printing only: 0 when the fabric has no counter of that
 * name (the assertions use tcp_counter, which fails on a missing name). */
uint64_t counter_or_zero(hca_device_t *dev, const char *name,
                         bool *missing = nullptr)
{
    int i = hca_fabric_counter_find(HCA_FABRIC_TCP, name);
    hca_counters_t cnt;

    if (missing != nullptr) {
        *missing = (i < 0);
    }
    memset(&cnt, 0, sizeof(cnt));
    if ((i < 0) || (hca_device_counters(dev, &cnt) != 0)) {
        return 0;
    }
    return cnt.fabric_own[HCA_FABRIC_TCP][i];
}

enum role_t {
    PARENT = 1,
    CHILD  = 2
};

/* What one requester posts per QP in one round, interleaved. */
struct mix_t {
    int atomics;
    int sends;
    int writes;   /* each followed by its READ back */
};

const mix_t PARENT_MIX = {500, 64, 32};
/* The child's traffic back: a few WRITEs and SENDs per round, a round
 * every CHILD_ROUND_MS at most. */
const mix_t CHILD_MIX      = {0, 8, 4};
const int   CHILD_ROUND_MS = 100;

inline size_t align64(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

/* A QP's write area: W_SLOTS regions of each size class. */
size_t region_off(int cls, int slot)
{
    size_t off = 0;
    for (int k = 0; k < cls; ++k) {
        off += W_SLOTS * align64(W_SIZES[k]);
    }
    return off + (size_t)slot * align64(W_SIZES[cls]);
}

size_t area_len()
{
    size_t len = 0;
    for (int k = 0; k < W_CLASSES; ++k) {
        len += W_SLOTS * align64(W_SIZES[k]);
    }
    return len;
}

inline size_t send_len(uint64_t seq)
{
    return SEND_SIZES[seq % N_SEND_SIZES];
}

inline uint64_t send_seed(role_t sender, int q, uint64_t seq)
{
    return ((uint64_t)sender << 56) | ((uint64_t)q << 48) | (1ull << 40) |
           seq;
}

inline uint64_t write_seed(role_t writer, int q, uint64_t n)
{
    return ((uint64_t)writer << 56) | ((uint64_t)q << 48) | n;
}

/* What each process tells the other: where to connect and what memory
 * its peer's requester addresses. */
struct rel_info {
    hca_port_addr_t addr;
    uint32_t        qpn[NQP];
    uint64_t        area;          /* NQP write areas of area_len() */
    uint32_t        area_rkey;
    uint32_t        counter_rkey;
    uint64_t        counter;       /* the shared FETCH_ADD counter */
};

enum {
    CTL_STOP = 1,
    CTL_QUIT = 2
};

/* Parent to child: stop starting rounds; how many SENDs to wait for. */
struct ctl_msg {
    uint32_t op;
    uint32_t pad;
    uint64_t sends[NQP];
};

/* Child to parent, at the end. */
struct child_report {
    int32_t  req_errors;        /* failed completions / posts */
    int32_t  rx_errors;         /* bad or failed receives */
    int32_t  qps_in_err;
    int32_t  pad;
    uint64_t completions;
    uint64_t writes_verified;   /* its WRITEs read back and compared */
    uint64_t rx_got[NQP];       /* the parent's SENDs received in order */
    uint64_t sent[NQP];         /* its own SENDs completed */
    uint64_t counter;           /* the FETCH_ADD counter at the end */
    uint64_t cnt[NCNT];         /* CNT_MISSING: no such counter */
    char     req_err[200];
    char     rx_err[200];
};

/* ------------------------------------------------------------ requester */

/* Posts a mix per QP and round, keeping up to WINDOW WRs outstanding per
 * QP, and checks what completes.  Never blocks: a post that finds no room
 * is tried again at the next pump(), so that the caller's loop goes on
 * (SIGCONT, kills, bounds).  Records failures instead of asserting: the
 * child reports them, and a dead peer's failures are expected. */
class requester {
public:
    requester(role_t role, mix_t mix) : role_(role), mix_(mix)
    {
    }

    ::testing::AssertionResult setup(ctx &c, hca_pd_t *pd,
                                     const std::vector<hca_qp_t*> &qps,
                                     const rel_info &peer)
    {
        qps_  = qps;
        peer_ = peer;
        src_  = c.alloc(MEM_MALLOC, NQP * area_len());
        rb_   = c.alloc(MEM_MALLOC, NQP * area_len());
        sbuf_ = c.alloc(MEM_MALLOC, (size_t)NQP * WINDOW * SEND_MAX);
        res_  = (uint64_t*)c.alloc(MEM_MALLOC, NQP * WINDOW * 8);
        if (!src_ || !rb_ || !sbuf_ || !res_) {
            return ::testing::AssertionFailure() << "no memory";
        }
        hca_mr_t *m1 = c.reg(pd, src_, NQP * area_len(), ACCESS_ALL);
        hca_mr_t *m2 = c.reg(pd, rb_, NQP * area_len(), ACCESS_ALL);
        hca_mr_t *m3 = c.reg(pd, sbuf_, (size_t)NQP * WINDOW * SEND_MAX,
                             ACCESS_ALL);
        hca_mr_t *m4 = c.reg(pd, res_, NQP * WINDOW * 8, ACCESS_ALL);
        if (!m1 || !m2 || !m3 || !m4) {
            return ::testing::AssertionFailure() << "cannot register";
        }
        src_lkey_  = hca_mr_lkey(m1);
        rb_lkey_   = hca_mr_lkey(m2);
        sbuf_lkey_ = hca_mr_lkey(m3);
        res_lkey_  = hca_mr_lkey(m4);
        qs_.assign(NQP, qstate());
        return ::testing::AssertionSuccess();
    }

    /* The next round: each QP's mix in an order of its own. */
    void start_round()
    {
        ++rounds_;
        for (int q = 0; q < NQP; ++q) {
            qstate &s = qs_[q];
            s.items.clear();
            s.items.insert(s.items.end(), mix_.atomics, 'A');
            s.items.insert(s.items.end(), mix_.sends, 'S');
            s.items.insert(s.items.end(), mix_.writes, 'W');
            std::mt19937 rng((unsigned)(role_ * 1000003 + rounds_ * NQP + q));
            std::shuffle(s.items.begin(), s.items.end(), rng);
            s.next = 0;
        }
    }

    bool round_done() const
    {
        for (const qstate &s : qs_) {
            if (stopped_ ? (s.outstanding != 0)
                         : ((s.next < s.items.size()) ||
                            (s.outstanding != 0) || !s.deferred.empty())) {
                return false;
            }
        }
        return true;
    }

    size_t outstanding() const
    {
        size_t n = 0;
        for (const qstate &s : qs_) {
            n += (size_t)s.outstanding;
        }
        return n;
    }

    /* Posts nothing more (the peer is being killed). */
    void stop_posting()
    {
        stopped_ = true;
    }

    /* Posts what the windows allow; returns the number posted. */
    int pump()
    {
        int n = 0;
        if (stopped_) {
            return 0;
        }
        for (int q = 0; q < NQP; ++q) {
            qstate &s = qs_[q];
            while (!s.deferred.empty()) { /* READs back, first */
                uint64_t id = s.deferred.front();
                int rc      = post_op(id);
                if ((rc == -EAGAIN) || (rc == -ENOMEM)) {
                    break;
                }
                s.deferred.pop_front();
                if (rc != 0) {
                    fail_post(ops_[id], rc);
                    release(ops_[id]);
                    ops_.erase(id);
                    continue;
                }
                ++s.outstanding;
                ++n;
            }
            if (!s.deferred.empty()) {
                continue;
            }
            while ((s.outstanding < WINDOW) && (s.next < s.items.size())) {
                int rc = post_item(q, s.items[s.next]);
                if (rc > 0) {
                    break; /* no room, or its region is busy: later */
                }
                ++s.next;
                if (rc == 0) {
                    ++s.outstanding;
                    ++n;
                }
            }
        }
        return n;
    }

    void on_wc(const hca_wc_t &wc)
    {
        double t = now_ms();
        if (last_wc_ms_ > 0) {
            max_gap_ms_ = std::max(max_gap_ms_, t - last_wc_ms_);
        }
        last_wc_ms_ = t;
        ++completions_;
        auto it = ops_.find(wc.wr_id);
        if (it == ops_.end()) {
            fail("completion of an unknown wr_id: " + wc_str(wc));
            return;
        }
        op o = it->second;
        ops_.erase(it);
        qstate &s = qs_[o.q];
        --s.outstanding;
        if (wc.status != HCA_WC_SUCCESS) {
            statuses_.push_back(wc.status);
            std::ostringstream os;
            os << "QP " << o.q << " " << kind_name(o.kind) << ": "
               << wc_str(wc);
            fail(os.str());
            release(o);
            return;
        }
        if (wc.opcode != expected_opcode(o.kind)) {
            std::ostringstream os;
            os << "QP " << o.q << " " << kind_name(o.kind)
               << " completed as " << wc.opcode;
            fail(os.str());
        }
        size_t size = (o.kind == 'W' || o.kind == 'R') ? W_SIZES[o.cls] : 0;
        switch (o.kind) {
        case 'W': { /* now read it back into a cleared buffer */
            o.kind = 'R';
            memset(rb_ + area_off(o), LSENTINEL, size);
            uint64_t id = next_id_++;
            ops_[id]    = o;
            s.deferred.push_back(id);
            break;
        }
        case 'R': {
            int64_t d = check_pattern(rb_ + area_off(o), size, o.seed);
            if (d != -1) {
                std::ostringstream os;
                os << "QP " << o.q << ": READ back of a " << size
                   << "-byte WRITE differs at byte " << d;
                fail(os.str());
            } else {
                ++writes_verified_;
            }
            release(o);
            break;
        }
        case 'S':
            ++s.sends_done;
            break;
        case 'A':
            olds_.push_back(res_[o.q * WINDOW + o.rs]);
            break;
        }
    }

    /* every SEND of QP q completed */
    uint64_t sends_done(int q) const
    {
        return qs_[q].sends_done;
    }

    uint64_t sends_posted(int q) const
    {
        return qs_[q].send_seq;
    }

    int                                 errors_          = 0;
    std::string                         first_err_;
    std::vector<hca_wc_status_t>        statuses_;   /* failed completions */
    std::vector<uint64_t>               olds_;       /* FETCH_ADD results */
    uint64_t                            completions_     = 0;
    uint64_t                            writes_verified_ = 0;
    double                              max_gap_ms_      = 0;
    double                              last_wc_ms_      = 0;
    int                                 rounds_          = 0;

private:
    struct op {
        int      q;
        char     kind;   /* W R S A */
        int      cls, slot;
        uint64_t seed;
        uint32_t rs;     /* send slot / atomic result slot */
        uint32_t len;
    };

    struct qstate {
        std::vector<char>    items;
        size_t               next       = 0;
        int                  outstanding = 0;
        std::deque<uint64_t> deferred;        /* READs to post */
        uint64_t             send_seq   = 0;  /* SENDs posted */
        uint64_t             sends_done = 0;
        uint64_t             atomics    = 0;
        uint64_t             writes     = 0;
        int                  wslot[W_CLASSES] = {0, 0, 0, 0};
        bool                 busy[W_CLASSES][W_SLOTS] = {};
    };

    static const char *kind_name(char k)
    {
        switch (k) {
        case 'W': return "RDMA_WRITE";
        case 'R': return "RDMA_READ";
        case 'S': return "SEND";
        default:  return "FETCH_ADD";
        }
    }

    static hca_wc_opcode_t expected_opcode(char k)
    {
        switch (k) {
        case 'W': return HCA_WC_RDMA_WRITE;
        case 'R': return HCA_WC_RDMA_READ;
        case 'S': return HCA_WC_SEND;
        default:  return HCA_WC_ATOMIC;
        }
    }

    size_t area_off(const op &o) const
    {
        return (size_t)o.q * area_len() + region_off(o.cls, o.slot);
    }

    void fail(const std::string &what)
    {
        if (errors_++ == 0) {
            first_err_ = what;
        }
    }

    void fail_post(const op &o, int rc)
    {
        std::ostringstream os;
        os << "QP " << o.q << ": posting " << kind_name(o.kind) << " = "
           << rc;
        fail(os.str());
    }

    /* The region of a WRITE/READ pair is free again. */
    void release(const op &o)
    {
        if ((o.kind == 'W') || (o.kind == 'R')) {
            qs_[o.q].busy[o.cls][o.slot] = false;
        }
    }

    int post_op(uint64_t id)
    {
        const op &o = ops_[id];
        hca_sge_t sg;
        hca_send_wr_t wr;
        size_t off = area_off(o);
        uint64_t raddr = peer_.area + off;
        switch (o.kind) {
        case 'W':
            sg = mk_sge(src_ + off, W_SIZES[o.cls], src_lkey_);
            wr = mk_wr(HCA_WR_RDMA_WRITE, &sg, 1, HCA_SEND_SIGNALED, id,
                       raddr, peer_.area_rkey);
            break;
        case 'R':
            sg = mk_sge(rb_ + off, W_SIZES[o.cls], rb_lkey_);
            wr = mk_wr(HCA_WR_RDMA_READ, &sg, 1, HCA_SEND_SIGNALED, id,
                       raddr, peer_.area_rkey);
            break;
        case 'S':
            sg = mk_sge(sbuf_ + ((size_t)o.q * WINDOW + o.rs) * SEND_MAX,
                        o.len, sbuf_lkey_);
            wr = mk_wr(HCA_WR_SEND, &sg, 1, HCA_SEND_SIGNALED, id);
            break;
        default:
            sg = mk_sge(&res_[o.q * WINDOW + o.rs], 8, res_lkey_);
            wr = mk_wr(HCA_WR_ATOMIC_FETCH_ADD, &sg, 1, HCA_SEND_SIGNALED,
                       id, peer_.counter, peer_.counter_rkey);
            wr.compare_add = 1;
            break;
        }
        hca_send_wr_t *bad = nullptr;
        return hca_post_send(qps_[o.q], &wr, &bad);
    }

    /* 0 posted, > 0 not now (no room, region busy), < 0 failed. */
    int post_item(int q, char kind)
    {
        qstate &s = qs_[q];
        op o;
        memset(&o, 0, sizeof(o));
        o.q    = q;
        o.kind = kind;
        switch (kind) {
        case 'W':
            o.cls  = (int)(s.writes % W_CLASSES);
            o.slot = s.wslot[o.cls];
            if (s.busy[o.cls][o.slot]) {
                return 1;
            }
            o.seed = write_seed(role_, q, s.writes);
            fill_pattern(src_ + area_off(o), W_SIZES[o.cls], o.seed);
            break;
        case 'S': {
            /* slot reuse is safe: SEND seq-WINDOW completed, or the
             * window would be full */
            o.rs    = (uint32_t)(s.send_seq % WINDOW);
            o.len   = (uint32_t)send_len(s.send_seq);
            uint8_t *p = sbuf_ + ((size_t)q * WINDOW + o.rs) * SEND_MAX;
            uint64_t seq = s.send_seq;
            memcpy(p, &seq, 8);
            fill_pattern(p + 8, o.len - 8, send_seed(role_, q, seq));
            break;
        }
        default:
            o.rs = (uint32_t)(s.atomics % WINDOW);
            res_[q * WINDOW + o.rs] = ~0ull;
            break;
        }
        uint64_t id = next_id_++;
        ops_[id]    = o;
        int rc      = post_op(id);
        if ((rc == -EAGAIN) || (rc == -ENOMEM)) {
            ops_.erase(id);
            return 1;
        }
        if (rc != 0) {
            fail_post(o, rc);
            ops_.erase(id);
            return rc;
        }
        switch (kind) {
        case 'W':
            s.busy[o.cls][o.slot] = true;
            s.wslot[o.cls]        = (o.slot + 1) % W_SLOTS;
            ++s.writes;
            break;
        case 'S':
            ++s.send_seq;
            break;
        default:
            ++s.atomics;
            break;
        }
        return 0;
    }

    role_t                           role_;
    mix_t                            mix_;
    std::vector<hca_qp_t*>           qps_;
    rel_info                         peer_;
    uint8_t                         *src_  = nullptr, *rb_ = nullptr;
    uint8_t                         *sbuf_ = nullptr;
    uint64_t                        *res_  = nullptr;
    uint32_t                         src_lkey_ = 0, rb_lkey_ = 0;
    uint32_t                         sbuf_lkey_ = 0, res_lkey_ = 0;
    std::vector<qstate>              qs_;
    std::unordered_map<uint64_t, op> ops_;
    uint64_t                         next_id_ = 1;
    bool                             stopped_ = false;
};

/* ------------------------------------------------------------ receiver */

/* Keeps RECV_DEPTH receives posted per QP and checks every SEND of the
 * peer: its sequence number is the next one of its QP (none lost, none
 * twice, in order), its length and bytes are the sender's. */
class receiver {
public:
    explicit receiver(role_t sender) : sender_(sender)
    {
    }

    ::testing::AssertionResult setup(ctx &c, hca_pd_t *pd,
                                     const std::vector<hca_qp_t*> &qps)
    {
        qps_ = qps;
        size_t len = (size_t)NQP * RECV_DEPTH * SEND_MAX;
        buf_ = c.alloc(MEM_MALLOC, len);
        if (buf_ == nullptr) {
            return ::testing::AssertionFailure() << "no memory";
        }
        hca_mr_t *mr = c.reg(pd, buf_, len, ACCESS_ALL);
        if (mr == nullptr) {
            return ::testing::AssertionFailure() << "cannot register";
        }
        lkey_ = hca_mr_lkey(mr);
        got_.assign(NQP, 0);
        for (uint64_t i = 0; i < (uint64_t)NQP * RECV_DEPTH; ++i) {
            int rc = post(i);
            if (rc != 0) {
                return ::testing::AssertionFailure()
                       << "hca_post_recv = " << rc;
            }
        }
        return ::testing::AssertionSuccess();
    }

    void on_wc(const hca_wc_t &wc)
    {
        int q = (int)(wc.wr_id / RECV_DEPTH);
        std::ostringstream os;
        if ((wc.wr_id >= (uint64_t)NQP * RECV_DEPTH) ||
            (wc.status != HCA_WC_SUCCESS)) {
            os << "receive: " << wc_str(wc);
            fail(os.str());
            return; /* a failed QP: nothing to repost */
        }
        const uint8_t *p = slot(wc.wr_id);
        uint64_t seq;
        memcpy(&seq, p, 8);
        if (hca_qp_num(qps_[q]) != wc.qp_num) {
            os << "QP " << q << ": receive completed on QP " << wc.qp_num;
        } else if (seq != got_[q]) {
            os << "QP " << q << ": SEND " << seq << " arrived, expected "
               << got_[q] << " (lost, duplicated or out of order)";
        } else if (wc.byte_len != send_len(seq)) {
            os << "QP " << q << ": SEND " << seq << " of " << wc.byte_len
               << " bytes, sent " << send_len(seq);
        } else {
            int64_t d = check_pattern(p + 8, send_len(seq) - 8,
                                      send_seed(sender_, q, seq));
            if (d != -1) {
                os << "QP " << q << ": SEND " << seq << " (" << send_len(seq)
                   << " bytes) differs at byte " << d + 8;
            }
        }
        if (!os.str().empty()) {
            fail(os.str());
        }
        got_[q] = seq + 1; /* resynchronised after a failure */
        int rc  = post(wc.wr_id);
        if (rc != 0) {
            std::ostringstream pe;
            pe << "QP " << q << ": hca_post_recv = " << rc;
            fail(pe.str());
        }
    }

    uint64_t got(int q) const
    {
        return got_[q];
    }

    int         errors_ = 0;
    std::string first_err_;

private:
    uint8_t *slot(uint64_t i) const
    {
        return buf_ + i * SEND_MAX;
    }

    int post(uint64_t i)
    {
        return post_recv1(qps_[i / RECV_DEPTH], slot(i), SEND_MAX, lkey_, i);
    }

    void fail(const std::string &what)
    {
        if (errors_++ == 0) {
            first_err_ = what;
        }
    }

    role_t                 sender_;
    std::vector<hca_qp_t*> qps_;
    uint8_t               *buf_  = nullptr;
    uint32_t               lkey_ = 0;
    std::vector<uint64_t>  got_;
};

/* ------------------------------------------------------------ one side */

/* One process's end: its context, 8 QPs with one send and one receive
 * CQ, the write area and counter its peer addresses, its requester and
 * its receiver. */
struct side {
    ctx                    c;
    hca_pd_t              *pd      = nullptr;
    cqw                   *scq     = nullptr;
    cqw                   *rcq     = nullptr;
    std::vector<hca_qp_t*> qps;
    uint8_t               *area    = nullptr;
    hca_mr_t              *area_mr = nullptr;
    uint64_t              *counter = nullptr;
    hca_mr_t              *cnt_mr  = nullptr;
    requester              req;
    receiver               rx;

    explicit side(role_t me) :
        req(me, (me == PARENT) ? PARENT_MIX : CHILD_MIX),
        rx((me == PARENT) ? CHILD : PARENT)
    {
    }

    ::testing::AssertionResult open()
    {
        auto r = c.open(0, HCA_FABRIC_TCP);
        if (!r) {
            return r;
        }
        pd  = c.new_pd();
        scq = c.new_cq(4096);
        rcq = c.new_cq(4096);
        if (!pd || !scq || !rcq) {
            return ::testing::AssertionFailure() << "no PD or CQ";
        }
        for (int q = 0; q < NQP; ++q) {
            hca_qp_t *qp = c.new_qp(pd, scq, rcq, c.caps(QP_DEPTH));
            if (qp == nullptr) {
                return ::testing::AssertionFailure() << "no QP";
            }
            qps.push_back(qp);
        }
        area    = c.alloc(MEM_MALLOC, NQP * area_len());
        counter = (uint64_t*)c.alloc(MEM_MALLOC, 64);
        if (!area || !counter) {
            return ::testing::AssertionFailure() << "no memory";
        }
        memset(area, SENTINEL, NQP * area_len());
        *counter = 0;
        area_mr  = c.reg(pd, area, NQP * area_len(), ACCESS_ALL);
        cnt_mr   = c.reg(pd, counter, 64, ACCESS_ALL);
        if (!area_mr || !cnt_mr) {
            return ::testing::AssertionFailure() << "cannot register";
        }
        return ::testing::AssertionSuccess();
    }

    rel_info info() const
    {
        rel_info in;
        memset(&in, 0, sizeof(in));
        in.addr = c.addr;
        for (int q = 0; q < NQP; ++q) {
            in.qpn[q] = hca_qp_num(qps[q]);
        }
        in.area         = (uint64_t)(uintptr_t)area;
        in.area_rkey    = hca_mr_rkey(area_mr);
        in.counter      = (uint64_t)(uintptr_t)counter;
        in.counter_rkey = hca_mr_rkey(cnt_mr);
        return in;
    }

    /* QP q to the peer's QP q; receives posted; the requester set up. */
    ::testing::AssertionResult connect(const rel_info &peer)
    {
        for (int q = 0; q < NQP; ++q) {
            int rc = connect_qp(qps[q], peer.addr, peer.qpn[q]);
            if (rc != 0) {
                return ::testing::AssertionFailure()
                       << "connect_qp(" << q << ") = " << rc;
            }
        }
        auto r = rx.setup(c, pd, qps);
        if (!r) {
            return r;
        }
        return req.setup(c, pd, qps, peer);
    }

    /* One turn: progress, completions handled, new work posted.  Returns
     * the number of completions. */
    int step()
    {
        (void)progress_all();
        int n = 0;
        hca_wc_t wc;
        while (scq->pop(&wc)) {
            req.on_wc(wc);
            ++n;
        }
        while (rcq->pop(&wc)) {
            rx.on_wc(wc);
            ++n;
        }
        req.pump();
        return n;
    }

    int qps_in_err() const
    {
        int n = 0;
        for (hca_qp_t *qp : qps) {
            n += (hca_qp_state(qp) == HCA_QPS_ERR);
        }
        return n;
    }
};

/* The child: the responder of the parent's work, with traffic of its own
 * back, until the parent says stop; then it waits for the parent's SENDs
 * (bounded), reports, and waits for the parent's QUIT. */
void child_body(int rfd, int wfd)
{
    if (child_net_devices != nullptr) {
        setenv("HCA_NET_DEVICES", child_net_devices, 1);
    }
    side s(CHILD);
    ASSERT_TRUE(s.open());
    ASSERT_TRUE(send_msg(wfd, s.info()));
    rel_info peer;
    ASSERT_TRUE(recv_msg(rfd, &peer));
    ASSERT_TRUE(s.connect(peer));
    ASSERT_TRUE(send_token(wfd, READY_TOKEN));

    ctl_msg stop;
    memset(&stop, 0, sizeof(stop));
    bool stopping    = false;
    double stop_at   = 0, next_pipe = 0;
    double round_at  = now_ms();
    s.req.start_round();
    for (;;) {
        int n    = s.step();
        double t = now_ms();
        if (!stopping && s.req.round_done() &&
            (t >= round_at + CHILD_ROUND_MS)) {
            s.req.start_round();
            round_at = t;
        }
        if (!stopping && (t >= next_pipe)) {
            next_pipe = t + 1;
            if (fd_readable(rfd)) {
                if (!recv_msg(rfd, &stop) || (stop.op != CTL_STOP)) {
                    return; /* the parent is gone */
                }
                stopping = true;
                stop_at  = t;
            }
        }
        if (stopping) {
            bool all = s.req.round_done();
            for (int q = 0; q < NQP; ++q) {
                all = all && (s.rx.got(q) >= stop.sends[q]);
            }
            if (all || (t > stop_at + TIMEOUT_MS)) {
                break;
            }
        }
        if (n == 0) {
            sched_yield();
        }
    }

    child_report rep;
    memset(&rep, 0, sizeof(rep));
    rep.req_errors      = s.req.errors_;
    rep.rx_errors       = s.rx.errors_;
    rep.qps_in_err      = s.qps_in_err();
    rep.completions     = s.req.completions_;
    rep.writes_verified = s.req.writes_verified_;
    for (int q = 0; q < NQP; ++q) {
        rep.rx_got[q] = s.rx.got(q);
        rep.sent[q]   = s.req.sends_done(q);
    }
    rep.counter = *(volatile uint64_t*)s.counter;
    for (int i = 0; i < NCNT; ++i) {
        bool missing = false;
        rep.cnt[i] = counter_or_zero(s.c.dev, CNT_NAMES[i], &missing);
        if (missing) {
            rep.cnt[i] = CNT_MISSING;
        }
    }
    snprintf(rep.req_err, sizeof(rep.req_err), "%s",
             s.req.first_err_.c_str());
    snprintf(rep.rx_err, sizeof(rep.rx_err), "%s", s.rx.first_err_.c_str());
    ASSERT_TRUE(send_msg(wfd, rep));
    /* served until the parent has read its own counters */
    ctl_msg quit;
    EXPECT_TRUE(recv_msg(rfd, &quit, 2 * TIMEOUT_MS));
}

/* ------------------------------------------------------------ ss -K */

/* Whether `ss -K` kills TCP sockets here: it needs CAP_NET_ADMIN and a
 * kernel with SOCK_DESTROY (CONFIG_INET_DIAG_DESTROY).  A loopback
 * connection made for the purpose is killed and its socket must see the
 * error within a second. */
bool ss_kill_works(std::string *why)
{
    if (geteuid() != 0) {
        *why = "needs root (CAP_NET_ADMIN) for ss -K";
        return false;
    }
    int rc = system("ss -V >/dev/null 2>&1");
    if (rc != 0) {
        *why = "no ss";
        return false;
    }
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int cfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa;
    socklen_t sl = sizeof(sa);
    memset(&sa, 0, sizeof(sa));
    sa.sin_family      = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bool ok = (lfd >= 0) && (cfd >= 0) &&
              (bind(lfd, (struct sockaddr*)&sa, sizeof(sa)) == 0) &&
              (listen(lfd, 1) == 0) &&
              (getsockname(lfd, (struct sockaddr*)&sa, &sl) == 0) &&
              (connect(cfd, (struct sockaddr*)&sa, sizeof(sa)) == 0);
    int afd = ok ? accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC) : -1;
    struct sockaddr_in ca;
    socklen_t cl = sizeof(ca);
    ok = ok && (afd >= 0) &&
         (getsockname(cfd, (struct sockaddr*)&ca, &cl) == 0);
    bool killed = false;
    if (ok) {
        char cmd[160];
        snprintf(cmd, sizeof(cmd),
                 "ss -K -tnH 'sport = :%u and dport = :%u' >/dev/null 2>&1",
                 ntohs(ca.sin_port), ntohs(sa.sin_port));
        rc = system(cmd);
        (void)rc; /* judged by what the socket sees */
        struct pollfd pfd = {cfd, POLLIN, 0};
        killed = (poll(&pfd, 1, 1000) > 0) &&
                 (pfd.revents & (POLLERR | POLLHUP));
    }
    for (int fd : {lfd, cfd, afd}) {
        if (fd >= 0) {
            close(fd);
        }
    }
    if (!killed) {
        *why = "ss -K does not kill sockets here (kernel without "
               "CONFIG_INET_DIAG_DESTROY?)";
    }
    return killed;
}

/* Kills the TCP connections between the two contexts: every socket whose
 * source or destination port is one of the two listeners' (listening
 * sockets are not listed without -l, so the listeners stay).  Returns the
 * number of sockets ss listed as killed, or -1. */
int ss_kill_ports(uint16_t a, uint16_t b)
{
    char cmd[256];
    snprintf(cmd, sizeof(cmd),
             "ss -K -tnH '( sport = :%u or dport = :%u or sport = :%u or "
             "dport = :%u )' 2>&1",
             a, a, b, b);
    FILE *f = popen(cmd, "r");
    if (f == nullptr) {
        return -1;
    }
    char line[512];
    int n = 0;
    while (fgets(line, sizeof(line), f) != nullptr) {
        printf("# ss -K: %s", line);
        n += (strstr(line, "ESTAB") != nullptr) ||
             (strstr(line, "127.0.0.1") != nullptr);
    }
    int rc = pclose(f);
    return (rc == 0) ? n : -1;
}

/* ------------------------------------------------------------ fixture */

struct run_cfg {
    const char *fault        = nullptr;  /* HCA_FAULT */
    int         retry_ms     = DEFAULT_RETRY_MS;
    int         min_ms       = 0;        /* rounds until this much time */
    int         stop_at_ms   = -1;       /* SIGSTOP the child then */
    int         stop_for_ms  = 0;        /* ... and SIGCONT after this */
    int         kill_at_ms   = -1;       /* SIGKILL the child then */
    int         ss_kill_at_ms = -1;      /* ss -K the connections then
                                            (with two paths: the first
                                            path's only) */
    const char *net_devices  = nullptr;  /* HCA_NET_DEVICES: paths */
};

struct run_out {
    double       wall_ms    = 0;
    double       max_gap_ms = 0;
    int          rounds     = 0;
    int          ss_killed  = -2;       /* -2: not run */
    /* peer killed */
    double       kill_ms    = -1;       /* when, from the start */
    double       drain_ms   = -1;       /* kill to the last completion */
    size_t       left       = 0;        /* outstanding at the end */
    child_report rep;
    bool         have_rep   = false;
};

/* The fixture: one run of the workload per test; the parent's side stays
 * open until TearDown so that the test reads its counters. */
class TcpReliable : public hca_test {
protected:
    std::unique_ptr<side> par;
    run_out               out;

    void set_env(const run_cfg &cfg)
    {
        if (cfg.fault != nullptr) {
            setenv("HCA_FAULT", cfg.fault, 1);
        } else {
            unsetenv("HCA_FAULT");
        }
        if (cfg.net_devices != nullptr) {
            setenv("HCA_NET_DEVICES", cfg.net_devices, 1);
        } else {
            unsetenv("HCA_NET_DEVICES");
        }
        std::string t = std::to_string(cfg.retry_ms);
        setenv("HCA_TCP_RETRY_TIMEOUT_MS", t.c_str(), 1);
        setenv("HCA_TCP_TIMEOUT_MS", t.c_str(), 1);
    }

    void TearDown() override
    {
        par.reset();
        unsetenv("HCA_FAULT");
        unsetenv("HCA_NET_DEVICES");
        child_net_devices = nullptr;
        unsetenv("HCA_TCP_RETRY_TIMEOUT_MS");
        unsetenv("HCA_TCP_TIMEOUT_MS");
        hca_test::TearDown();
    }

    /* Both processes' value of a tcp counter; the parent's read with
     * tcp_counter, which fails the test if the fabric has no such
     * counter. */
    uint64_t both(const char *name)
    {
        uint64_t v = tcp_counter(par->c.dev, name);
        for (int i = 0; i < NCNT; ++i) {
            if (out.have_rep && !strcmp(CNT_NAMES[i], name) &&
                (out.rep.cnt[i] != CNT_MISSING)) {
                v += out.rep.cnt[i];
            }
        }
        return v;
    }

    void print(const run_cfg &cfg)
    {
        printf("# fault \"%s\", retry timeout %d ms: %d round(s) in %.0f ms, "
               "longest gap between completions %.1f ms\n",
               cfg.fault ? cfg.fault : "", cfg.retry_ms, out.rounds,
               out.wall_ms, out.max_gap_ms);
        uint64_t ps = 0, cs = 0;
        for (int q = 0; q < NQP; ++q) {
            ps += par->req.sends_done(q);
            cs += out.have_rep ? out.rep.sent[q] : 0;
        }
        printf("#   parent: %zu FETCH_ADDs, %" PRIu64 " WRITEs read back, "
               "%" PRIu64 " SENDs; child: %" PRIu64 " WRITEs read back, "
               "%" PRIu64 " SENDs\n",
               par->req.olds_.size(), par->req.writes_verified_, ps,
               out.have_rep ? out.rep.writes_verified : 0, cs);
        RecordProperty("wall_ms", (int)out.wall_ms);
        RecordProperty("max_gap_ms", (int)out.max_gap_ms);
        printf("#   %-17s %12s %12s\n", "counter", "parent", "child");
        for (int i = 0; i < NCNT; ++i) {
            bool missing = false;
            uint64_t p = counter_or_zero(par->c.dev, CNT_NAMES[i], &missing);
            std::string cs = "-";
            if (out.have_rep) {
                cs = (out.rep.cnt[i] == CNT_MISSING)
                             ? "n/a"
                             : std::to_string(out.rep.cnt[i]);
            }
            printf("#   %-17s %12s %12s\n", CNT_NAMES[i],
                   missing ? "n/a" : std::to_string(p).c_str(), cs.c_str());
        }
        fflush(stdout);
    }

    /* Runs the workload with cfg (call with ASSERT_NO_FATAL_FAILURE). */
    void run(const run_cfg &cfg)
    {
        set_env(cfg); /* before the fork and either open */
        child_t *ch = fork_child(child_body, CHILD_WATCHDOG_S);
        ASSERT_NE(nullptr, ch);
        par.reset(new side(PARENT));
        side &s = *par;
        ASSERT_TRUE(s.open());
        rel_info peer;
        ASSERT_TRUE(recv_msg(ch->rfd, &peer)) << "no info from the child";
        ASSERT_TRUE(s.connect(peer));
        ASSERT_TRUE(send_msg(ch->wfd, s.info()));
        ASSERT_TRUE(expect_token(ch->rfd, READY_TOKEN));

        double t0 = now_ms(), last = t0, stop_t = 0, kill_t = 0;
        bool stopped = false, conted = false, killed = false;
        bool ss_done = false, frozen = false;
        double frozen_t = 0;
        double end   = t0 + cfg.min_ms + 30000; /* < the child's watchdog */
        s.req.start_round();
        for (;;) {
            int n    = s.step();
            double t = now_ms(), el = t - t0;
            if (n > 0) {
                last = t;
            }
            if ((cfg.stop_at_ms >= 0) && !stopped && (el >= cfg.stop_at_ms)) {
                ASSERT_EQ(0, kill(ch->pid, SIGSTOP));
                stopped = true;
                stop_t  = t;
            }
            if (stopped && !conted && (t >= stop_t + cfg.stop_for_ms)) {
                ASSERT_EQ(0, kill(ch->pid, SIGCONT));
                conted = true;
            }
            /* the kills land on work in flight */
            bool busy = (s.req.outstanding() > 0);
            if ((cfg.ss_kill_at_ms >= 0) && !ss_done && busy &&
                (el >= cfg.ss_kill_at_ms)) {
                out.ss_killed = ss_kill_ports(peer.addr.net.port,
                                              s.c.addr.net.port);
                ss_done = true;
            }
            if ((cfg.kill_at_ms >= 0) && !killed && !frozen && busy &&
                (el >= cfg.kill_at_ms)) {
                /* frozen first, and killed 50 ms later: what we post
                 * meanwhile is never answered, so work is in flight at
                 * the kill (killed at once, everything outstanding might
                 * have been answered already) */
                ASSERT_EQ(0, kill(ch->pid, SIGSTOP));
                frozen   = true;
                frozen_t = t;
            }
            if (frozen && !killed && (t >= frozen_t + 50)) {
                kill_child(ch);
                killed      = true;
                kill_t      = now_ms();
                out.kill_ms = kill_t - t0;
                s.req.stop_posting();
                last = kill_t;
            }
            if (killed) {
                /* every outstanding WR must complete, with its error */
                if ((s.req.outstanding() == 0) ||
                    (t > kill_t + cfg.retry_ms + 5000)) {
                    break;
                }
            } else if (s.req.round_done() && (s.req.errors_ > 0) &&
                       (!stopped || conted)) {
                break; /* failed: more rounds would only fail more */
            } else if (s.req.round_done() && (el >= cfg.min_ms) &&
                       (!stopped || conted) &&
                       ((cfg.kill_at_ms < 0) || killed)) {
                break;
            } else if (s.req.round_done()) {
                s.req.start_round();
            }
            if (t - last > TIMEOUT_MS) {
                ADD_FAILURE() << "no completion for " << TIMEOUT_MS
                              << " ms; " << s.req.outstanding()
                              << " WRs outstanding";
                break;
            }
            if (t > end) {
                ADD_FAILURE() << "the run did not end within "
                              << cfg.min_ms + 30000 << " ms";
                break;
            }
            if (n == 0) {
                sched_yield();
            }
        }
        out.wall_ms    = now_ms() - t0;
        out.max_gap_ms = s.req.max_gap_ms_;
        out.rounds     = s.req.rounds_;
        out.left       = s.req.outstanding();
        if (killed) {
            if (s.req.last_wc_ms_ > kill_t) {
                out.drain_ms = s.req.last_wc_ms_ - kill_t;
            }
            print(cfg);
            return;
        }

        /* the child stops its own traffic and reports when it has all our
         * SENDs */
        ctl_msg cm;
        memset(&cm, 0, sizeof(cm));
        cm.op = CTL_STOP;
        for (int q = 0; q < NQP; ++q) {
            /* the completed ones: those the child must have (a failed
             * run does not keep it waiting for the others) */
            cm.sends[q] = s.req.sends_done(q);
        }
        ASSERT_TRUE(send_msg(ch->wfd, cm));
        double lim = now_ms() + 2 * TIMEOUT_MS;
        while (!fd_readable(ch->rfd) && (now_ms() < lim)) {
            if (s.step() == 0) {
                sched_yield();
            }
        }
        ASSERT_TRUE(recv_msg(ch->rfd, &out.rep)) << "no report from the child";
        out.have_rep = true;
        /* and we wait for all of its SENDs */
        lim = now_ms() + TIMEOUT_MS;
        for (;;) {
            bool all = true;
            for (int q = 0; q < NQP; ++q) {
                all = all && (s.rx.got(q) >= out.rep.sent[q]);
            }
            if (all || (now_ms() > lim)) {
                break;
            }
            if (s.step() == 0) {
                sched_yield();
            }
        }
        print(cfg);
        cm.op = CTL_QUIT;
        EXPECT_TRUE(send_msg(ch->wfd, cm));
        EXPECT_TRUE(wait_child(ch, TIMEOUT_MS)) << "the child";
    }

    /* Every completion SUCCESS, no QP in ERR, every byte and every
     * atomic verified, on both sides. */
    void expect_verified()
    {
        ASSERT_TRUE(out.have_rep);
        side &s = *par;
        EXPECT_EQ(0, s.req.errors_) << "parent's requester: "
                                    << s.req.first_err_;
        EXPECT_EQ(0, s.rx.errors_) << "parent's receiver: "
                                   << s.rx.first_err_;
        EXPECT_EQ(0, out.rep.req_errors) << "child's requester: "
                                         << out.rep.req_err;
        EXPECT_EQ(0, out.rep.rx_errors) << "child's receiver: "
                                        << out.rep.rx_err;
        EXPECT_EQ(0, s.qps_in_err()) << "parent's QPs in ERR";
        EXPECT_EQ(0, out.rep.qps_in_err) << "child's QPs in ERR";
        /* per QP; the first mismatch of each kind only */
        std::string sends_err, got_err, back_err;
        for (int q = 0; q < NQP; ++q) {
            std::ostringstream os;
            os << "QP " << q << ": ";
            if (sends_err.empty() &&
                (s.req.sends_posted(q) != s.req.sends_done(q))) {
                sends_err = os.str() + std::to_string(s.req.sends_posted(q)) +
                            " SENDs posted, " +
                            std::to_string(s.req.sends_done(q)) + " completed";
            }
            if (got_err.empty() &&
                (s.req.sends_posted(q) != out.rep.rx_got[q])) {
                got_err = os.str() + "the child received " +
                          std::to_string(out.rep.rx_got[q]) + " of " +
                          std::to_string(s.req.sends_posted(q)) +
                          " SENDs";
            }
            if (back_err.empty() && ((out.rep.sent[q] == 0) ||
                                     (out.rep.sent[q] != s.rx.got(q)))) {
                back_err = os.str() + "the parent received " +
                           std::to_string(s.rx.got(q)) + " of the child's " +
                           std::to_string(out.rep.sent[q]) + " SENDs";
            }
        }
        EXPECT_EQ("", sends_err);
        EXPECT_EQ("", got_err);
        EXPECT_EQ("", back_err) << "(the child must send some back)";
        uint64_t n_writes = (uint64_t)out.rounds * NQP * PARENT_MIX.writes;
        EXPECT_EQ(n_writes, s.req.writes_verified_)
                << "WRITEs read back and compared";
        EXPECT_GT(out.rep.writes_verified, 0u) << "the child's WRITEs";

        /* exactly once: the old values are {0..N-1}, the counter N */
        uint64_t n = (uint64_t)out.rounds * NQP * PARENT_MIX.atomics;
        std::vector<uint64_t> olds = s.req.olds_;
        std::sort(olds.begin(), olds.end());
        EXPECT_EQ(n, olds.size()) << "FETCH_ADDs completed";
        size_t bad = 0;
        for (size_t i = 0; i < olds.size(); ++i) {
            if (olds[i] != i) {
                if (bad++ == 0) {
                    ADD_FAILURE() << "FETCH_ADD old values are not {0.."
                                  << olds.size() - 1 << "}: sorted[" << i
                                  << "] = " << olds[i]
                                  << " (a lost or doubled add)";
                }
            }
        }
        EXPECT_EQ(0u, bad) << "old values out of place";
        EXPECT_EQ(n, out.rep.counter) << "the counter at the end";
    }
};

/* ------------------------------------------------------------ tests */

/* The baseline: the workload verifies with no fault, and a clean run
 * resends nothing and never reconnects. */
TEST_F(TcpReliable, NoFault)
{
    run_cfg cfg;
    ASSERT_NO_FATAL_FAILURE(run(cfg));
    ASSERT_NO_FATAL_FAILURE(expect_verified());
    EXPECT_EQ(0u, both("retransmits"));
    EXPECT_EQ(0u, both("reconnects"));
}

/* 1% of the frames dropped at the receiver (both sides, answers too): the
 * requester retransmits (go-back-N, RTO) and the responder executes each
 * request once: the data and the atomic old values are exact. */
TEST_F(TcpReliable, Loss1Percent)
{
    run_cfg cfg;
    cfg.fault = "tcp_loss=0.01";
    ASSERT_NO_FATAL_FAILURE(run(cfg));
    ASSERT_NO_FATAL_FAILURE(expect_verified());
    EXPECT_GT(both("faults_injected"), 0u);
    EXPECT_GT(both("retransmits"), 0u);
}

/* 1% of the frames sent twice: the responder recognises the duplicates
 * (dup_requests) and answers them without executing them again (no
 * atomic applied twice, no SEND received twice). */
TEST_F(TcpReliable, Dup1Percent)
{
    run_cfg cfg;
    cfg.fault = "tcp_dup=0.01";
    ASSERT_NO_FATAL_FAILURE(run(cfg));
    ASSERT_NO_FATAL_FAILURE(expect_verified());
    EXPECT_GT(both("faults_injected"), 0u);
    EXPECT_GT(both("dup_requests"), 0u);
}

/* Loss and duplication together: retransmitted frames are duplicated
 * too, and duplicates of lost ones arrive; still exactly once. */
TEST_F(TcpReliable, LossAndDup)
{
    run_cfg cfg;
    cfg.fault = "tcp_loss=0.01,tcp_dup=0.01";
    ASSERT_NO_FATAL_FAILURE(run(cfg));
    ASSERT_NO_FATAL_FAILURE(expect_verified());
    EXPECT_GT(both("faults_injected"), 0u);
    EXPECT_GT(both("retransmits"), 0u);
    EXPECT_GT(both("dup_requests"), 0u);
}

/* Injected delay: 1 % of frames wait 5 ms before they go (and the frames
 * behind them on their connection wait too: a stall, as on a congested
 * link, not a reordering).  Nothing is lost: no retransmission is needed,
 * and none happens. */
TEST_F(TcpReliable, DelayKeepsData)
{
    run_cfg cfg;
    cfg.fault = "tcp_delay=0.01,tcp_delay_us=5000";
    ASSERT_NO_FATAL_FAILURE(run(cfg));
    ASSERT_NO_FATAL_FAILURE(expect_verified());
    EXPECT_GT(both("faults_injected"), 0u);
    EXPECT_EQ(0u, both("retransmits"));
    EXPECT_EQ(0u, both("reconnects"));
}

/* A connection reset mid-frame (half of a frame sent, then the link
 * killed) at 0.2% of the frames sent: the sessions reconnect and resend
 * what was not answered; no QP fails, everything verifies. */
TEST_F(TcpReliable, InjectedResets)
{
    run_cfg cfg;
    cfg.fault = "tcp_reset=0.002";
    ASSERT_NO_FATAL_FAILURE(run(cfg));
    ASSERT_NO_FATAL_FAILURE(expect_verified());
    EXPECT_GT(both("faults_injected"), 0u);
    EXPECT_GT(both("reconnects"), 0u);
    EXPECT_GT(both("retransmits"), 0u);
}

/* Every connection killed every 100 ms for 2 s while the workload runs
 * (2.5 s of it): reconnects again and again (>= 5 over both processes),
 * and the QPs come out of it intact. */
TEST_F(TcpReliable, ResetEvery100msFor2s)
{
    run_cfg cfg;
    cfg.fault  = "tcp_reset_ms=100,tcp_reset_for_ms=2000";
    cfg.min_ms = 2500;
    ASSERT_NO_FATAL_FAILURE(run(cfg));
    ASSERT_NO_FATAL_FAILURE(expect_verified());
    EXPECT_GE(both("reconnects"), 5u);
}

/* The peer's listener restarts: 300 ms after each context opened, its
 * listener and every connection are closed, and the listener is bound
 * again on the same port 100 ms later (HCA_FAULT tcp_relisten_ms, both
 * processes).  The dialler's attempts meet a refused connect until then;
 * the connections resume, and everything completes once. */
TEST_F(TcpReliable, ListenerRestarted)
{
    run_cfg cfg;
    cfg.fault  = "tcp_relisten_ms=300";
    cfg.min_ms = 1200;
    ASSERT_NO_FATAL_FAILURE(run(cfg));
    ASSERT_NO_FATAL_FAILURE(expect_verified());
    EXPECT_GT(both("reconnects"), 0u);
    EXPECT_GT(both("faults_injected"), 0u);
}

/* ------------------------------------------------------------ paths */

/* Two paths (127.0.0.1 and 127.0.0.2): the QPs are spread over both, the
 * workload verifies, and nothing fails over. */
TEST_F(TcpReliable, TwoPathsNoFault)
{
    run_cfg cfg;
    cfg.net_devices = TWO_PATHS;
    cfg.min_ms      = 500;
    ASSERT_NO_FATAL_FAILURE(run(cfg));
    ASSERT_NO_FATAL_FAILURE(expect_verified());
    EXPECT_EQ(2u, par->c.addr.n_net_more + 1) << "the parent's paths";
    EXPECT_EQ(0u, both("failovers"));
    EXPECT_EQ(0u, both("retransmits"));
    EXPECT_GT(tcp_counter(par->c.dev, "path0_frames_tx"), 0u);
    EXPECT_GT(tcp_counter(par->c.dev, "path1_frames_tx"), 0u)
            << "the second path carried none of the parent's QPs";
}

/* A peer with one path, we with two: the pair uses one (the address with
 * more paths than the peer has still works, both ways). */
TEST_F(TcpReliable, PeerWithFewerPaths)
{
    run_cfg cfg;
    cfg.net_devices   = TWO_PATHS;
    child_net_devices = "127.0.0.1";
    ASSERT_NO_FATAL_FAILURE(run(cfg));
    ASSERT_NO_FATAL_FAILURE(expect_verified());
    EXPECT_EQ(0u, tcp_counter(par->c.dev, "path1_frames_tx"));
}

/* The first path's connections killed mid-stream (ss -K on its listeners'
 * ports only), the second path up: the QPs on the first move to the
 * second at once and send again there what was unanswered; nothing fails,
 * everything verifies exactly once, the failovers are counted, and the
 * killed path is dialled again in the background. */
TEST_F(TcpReliable, PathKilledFailsOver)
{
    std::string why;
    if (!ss_kill_works(&why)) {
        GTEST_SKIP() << why;
    }
    run_cfg cfg;
    cfg.net_devices   = TWO_PATHS;
    cfg.min_ms        = 1500;
    cfg.ss_kill_at_ms = 300;
    /* longer than the run: a failover that waited for the timeout, or a
     * QP that waited for its own path to come back, would show as a gap
     * of seconds */
    cfg.retry_ms      = 10000;
    ASSERT_NO_FATAL_FAILURE(run(cfg));
    printf("# ss -K killed %d socket(s) of path 0\n", out.ss_killed);
    EXPECT_GT(out.ss_killed, 0) << "ss -K found no connection to kill";
    ASSERT_NO_FATAL_FAILURE(expect_verified());
    EXPECT_GT(both("failovers"), 0u);
    EXPECT_GT(both("reconnects"), 0u) << "the lost path was not dialled again";
    EXPECT_GT(tcp_counter(par->c.dev, "path1_frames_tx"), 0u);
    /* a third of the retry timeout: a failover that waited for it (or
     * for the lost path to come back) shows; a loaded machine's
     * scheduling (one run here: 1.2 s with four busy MPI ranks on the
     * two cores) does not fail it */
    EXPECT_LT(out.max_gap_ms, cfg.retry_ms / 3.0)
            << "the QPs waited for something after the path was lost";
}

/* The kernel kills the connections between the two processes under the
 * workload (ss -K, as an admin or a middlebox would): not a fault of the
 * library's making, so it proves the real reconnect path.  The sessions
 * reconnect and everything verifies. */
TEST_F(TcpReliable, SsKillMidStream)
{
    std::string why;
    if (!ss_kill_works(&why)) {
        GTEST_SKIP() << why;
    }
    run_cfg cfg;
    cfg.min_ms        = 1000;
    cfg.ss_kill_at_ms = 300;
    ASSERT_NO_FATAL_FAILURE(run(cfg));
    printf("# ss -K killed %d socket(s)\n", out.ss_killed);
    EXPECT_GT(out.ss_killed, 0) << "ss -K found no connection to kill";
    ASSERT_NO_FATAL_FAILURE(expect_verified());
    EXPECT_GT(both("reconnects"), 0u);
}

/* The responder process frozen (SIGSTOP) for 1.5 s mid-stream, shorter
 * than the 4 s retry timeout: nothing fails; the work resumes at SIGCONT
 * and verifies (the longest gap printed is about the stop). */
TEST_F(TcpReliable, SigstopShorterThanTimeout)
{
    run_cfg cfg;
    cfg.retry_ms    = 4000;
    cfg.min_ms      = 2500;
    cfg.stop_at_ms  = 300;
    cfg.stop_for_ms = 1500;
    ASSERT_NO_FATAL_FAILURE(run(cfg));
    ASSERT_NO_FATAL_FAILURE(expect_verified());
    EXPECT_GE(out.max_gap_ms, 1000.0) << "the stop did not stall the work";
}

/* The responder process killed mid-stream, retry timeout 2 s: every WR
 * outstanding at the kill completes, the failed ones with a dead-peer
 * status (RETRY_EXC_ERR, then FLUSH_ERR for the rest of a failed QP),
 * within the retry timeout plus a second (+ 500 ms slack) of the kill;
 * nothing hangs. */
TEST_F(TcpReliable, PeerGoneFailsWithinTimeout)
{
    run_cfg cfg;
    cfg.retry_ms   = 2000;
    cfg.min_ms     = 60000; /* until the kill */
    cfg.kill_at_ms = 300;
    ASSERT_NO_FATAL_FAILURE(run(cfg));
    side &s = *par;
    printf("# killed at %.0f ms; %zu failed completions, the last %.0f ms "
           "after the kill; %zu WRs still outstanding\n",
           out.kill_ms, s.req.statuses_.size(), out.drain_ms, out.left);
    RecordProperty("drain_ms", (int)out.drain_ms);
    EXPECT_EQ(0u, out.left) << "WRs never completed after the peer died";
    ASSERT_FALSE(s.req.statuses_.empty())
            << "nothing failed: was the work still in flight at the kill?";
    size_t retry_exc = 0;
    for (hca_wc_status_t st : s.req.statuses_) {
        EXPECT_TRUE(dead_peer_status(st)) << st;
        retry_exc += (st == HCA_WC_RETRY_EXC_ERR);
    }
    EXPECT_GT(retry_exc, 0u) << "no RETRY_EXC_ERR";
    EXPECT_GE(out.drain_ms, 0.0);
    EXPECT_LE(out.drain_ms, cfg.retry_ms + 1000.0 + 500.0)
            << "ms from the kill to the last completion";
}

/* ------------------------------------------------------------ restarted peer */

/* A raw acceptor playing a peer context at a fake address: it completes
 * the acceptor's side of handshakes with the incarnation it is told, and
 * answers WRITEs. */
class raw_peer {
public:
    hca_port_addr_t addr;      /* what our QP is connected to */
    int             lfd = -1;
    tcpf_session_t  pending{}; /* the handshake under way ... */
    tcpf_session_t  last{};    /* ... and the last one completed */

    explicit raw_peer(const hca_port_addr_t &like)
    {
        struct sockaddr_in sin;
        socklen_t len = sizeof(sin);
        int one       = 1;

        addr        = like;
        addr.host   = 0x7e57ab1e0000ull + (uint64_t)getpid(); /* not ours */
        addr.pid    = 0x7e57;
        addr.ctx_id = 0x3c;
        addr.secret = 0x5ec0de5ec0de5ec0ull;
        lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        (void)setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        memset(&sin, 0, sizeof(sin));
        sin.sin_family      = AF_INET;
        sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        EXPECT_EQ(0, bind(lfd, (struct sockaddr*)&sin, sizeof(sin)));
        EXPECT_EQ(0, listen(lfd, 4));
        EXPECT_EQ(0, getsockname(lfd, (struct sockaddr*)&sin, &len));
        addr.net.family = HCA_NET_IPV4;
        memset(addr.net.addr, 0, sizeof(addr.net.addr));
        memcpy(addr.net.addr, &sin.sin_addr, 4);
        addr.net.port = ntohs(sin.sin_port);
    }

    ~raw_peer()
    {
        if (lfd >= 0) {
            close(lfd);
        }
    }

    /* Accepts a connection (bounded) into s. */
    bool accept_one(tcp_raw_socket &s, int ms)
    {
        struct pollfd pfd = {lfd, POLLIN, 0};
        if (poll(&pfd, 1, ms) != 1) {
            return false;
        }
        s.fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        return s.fd >= 0;
    }

    /* The HELLO, then a CHALLENGE that proves the peer's secret with
     * incarnation incarn.  *hello: the connector's HELLO. */
    ::testing::AssertionResult challenge(tcp_raw_socket &s, uint64_t incarn,
                                         tcpf_hello_t *hello)
    {
        uint8_t raw[TCPF_HELLO_LEN];
        tcpf_hello_t ch;

        if (s.recv_exact(raw, sizeof(raw), TIMEOUT_MS) != 1) {
            return ::testing::AssertionFailure() << "no HELLO";
        }
        tcpf_hello_decode(raw, hello);
        if (hello->step != TCPF_STEP_HELLO) {
            return ::testing::AssertionFailure() << "not a HELLO";
        }
        if (tcpf_challenge(hello, addr.host, addr.pid, addr.ctx_id,
                           addr.secret, 0xa11ce00000000000ull ^ incarn, incarn,
                           &ch, &pending) != 0) {
            return ::testing::AssertionFailure() << "a low-order key";
        }
        tcpf_hello_encode(&ch, raw);
        if (!s.send_all(raw, sizeof(raw))) {
            return ::testing::AssertionFailure() << "CHALLENGE not sent";
        }
        return ::testing::AssertionSuccess();
    }

    /* The PROOF (its identity not checked: we play a peer that takes
     * anyone; a RESUME must prove the last session's key, as our own
     * acceptor requires), then an OK VERDICT (to a RESUME: proving that
     * key too). */
    ::testing::AssertionResult verdict(tcp_raw_socket &s)
    {
        uint8_t raw[TCPF_HELLO_LEN], mac[TCPF_MAC_LEN];
        tcpf_hello_t h, p;

        if (s.recv_exact(raw, sizeof(raw), TIMEOUT_MS) != 1) {
            return ::testing::AssertionFailure() << "no PROOF";
        }
        tcpf_hello_decode(raw, &p);
        memset(&h, 0, sizeof(h));
        h.step     = TCPF_STEP_VERDICT;
        h.src_host = addr.host;
        h.src_pid  = addr.pid;
        h.src_ctx  = addr.ctx_id;
        if (p.cont == TCPF_CONT_RESUME) {
            tcpf_key_mac(mac, last.key, TCPF_MAC_RESUME, &pending.t);
            if (memcmp(mac, p.cont_mac, sizeof(mac)) != 0) {
                return ::testing::AssertionFailure()
                       << "a RESUME that does not prove the session's key";
            }
            tcpf_key_mac(h.mac, last.key, TCPF_MAC_RESUMED, &pending.t);
        }
        last = pending;
        tcpf_hello_encode(&h, raw);
        return s.send_all(raw, sizeof(raw)) ?
               ::testing::AssertionSuccess() :
               ::testing::AssertionFailure() << "VERDICT not sent";
    }

    /* The next frame (keepalives skipped) and its payload. */
    ::testing::AssertionResult frame(tcp_raw_socket &s, tcpf_hdr_t *h,
                                     std::vector<uint8_t> *payload)
    {
        uint8_t raw[TCPF_HDR_LEN];

        do {
            if (s.recv_exact(raw, sizeof(raw), TIMEOUT_MS) != 1) {
                return ::testing::AssertionFailure() << "no frame";
            }
            tcpf_hdr_decode(raw, h);
        } while (h->opcode == TCPF_OP_KEEPALIVE);
        payload->resize(h->length);
        if ((h->length > 0) &&
            (s.recv_exact(payload->data(), h->length, TIMEOUT_MS) != 1)) {
            return ::testing::AssertionFailure() << "no payload";
        }
        return ::testing::AssertionSuccess();
    }

    bool ack(tcp_raw_socket &s, const tcpf_hdr_t &req)
    {
        uint8_t raw[TCPF_HDR_LEN];
        tcpf_hdr_t a;

        memset(&a, 0, sizeof(a));
        a.version    = (uint8_t)tcpf_version;
        a.opcode     = TCPF_OP_ACK;
        a.src_qpn    = req.dst_qpn;
        a.dst_qpn    = req.src_qpn;
        a.psn        = req.psn;
        a.resp_idx   = req.resp_idx;
        a.resp_stamp = req.resp_stamp;
        tcpf_hdr_encode(&a, raw);
        return s.send_all(raw, sizeof(raw));
    }
};

/* The raw-peer tests' bed: a context with one QP to be connected to a raw
 * peer at a fake address, and a registered 256-byte source of pattern
 * seed. */
struct raw_peer_bed {
    ctx                       a;
    std::unique_ptr<raw_peer> peer;
    hca_qp_t                 *qp  = nullptr;
    cqw                      *cq  = nullptr;
    uint8_t                  *src = nullptr;
    hca_mr_t                 *smr = nullptr;

    void open(uint64_t seed)
    {
        ASSERT_TRUE(a.open(0, HCA_FABRIC_TCP));
        peer.reset(new raw_peer(a.addr));
        hca_pd_t *pd = a.new_pd();
        cq           = a.new_cq();
        qp           = a.new_qp(pd, cq, cq);
        src          = a.alloc(MEM_MALLOC, 256);
        smr          = a.reg(pd, src, 256, ACCESS_ALL);
        ASSERT_NE(nullptr, qp);
        ASSERT_NE(nullptr, smr);
        fill_pattern(src, 256, seed);
    }
};

/* A peer that restarted (its listener answers again, but as another
 * incarnation) is never fed a replay: the connection whose socket was
 * lost dials again, sees the new incarnation in the CHALLENGE and fails;
 * the unanswered WRITE completes with RETRY_EXC_ERR long before the retry
 * timeout, and the new incarnation gets no PROOF and no frame. */
TEST_F(TcpReliable, RestartedPeerNotReplayed)
{
    setenv("HCA_TCP_RETRY_TIMEOUT_MS", "10000", 1);
    raw_peer_bed bed;
    ASSERT_NO_FATAL_FAILURE(bed.open(9));
    raw_peer &peer = *bed.peer;
    hca_qp_t *qp   = bed.qp;
    cqw *cq        = bed.cq;
    uint8_t *src   = bed.src;
    hca_mr_t *smr  = bed.smr;

    std::atomic<int> stage(0);
    std::string peer_err;
    bool proof_after_restart = false, frame_after_restart = false;
    std::thread t([&]() {
        tcp_raw_socket s1, s2;
        tcpf_hello_t h;
        tcpf_hdr_t f;
        std::vector<uint8_t> pl;
        if (!peer.accept_one(s1, TIMEOUT_MS) ||
            !peer.challenge(s1, 0x1111, &h) || !peer.verdict(s1)) {
            peer_err = "first handshake";
            stage    = -1;
            return;
        }
        /* WRITE 1: answered */
        if (!peer.frame(s1, &f, &pl) || (f.opcode != TCPF_OP_WRITE) ||
            !(f.flags & TCPF_F_START) || !peer.ack(s1, f)) {
            peer_err = "first WRITE";
            stage    = -1;
            return;
        }
        stage = 1;
        /* WRITE 2: read, not answered; then the socket is reset and the
         * peer "restarts" */
        if (!peer.frame(s1, &f, &pl) || (f.opcode != TCPF_OP_WRITE)) {
            peer_err = "second WRITE";
            stage    = -1;
            return;
        }
        struct linger lg = {1, 0};
        (void)setsockopt(s1.fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
        s1.close_fd();
        stage = 2;
        if (!peer.accept_one(s2, TIMEOUT_MS) ||
            !peer.challenge(s2, 0x2222, &h)) {
            peer_err = "the dial again";
            stage    = -1;
            return;
        }
        /* it must close: no PROOF (which would ask to resume), no frame */
        uint8_t raw[TCPF_HELLO_LEN];
        int rc = s2.recv_exact(raw, sizeof(raw), 3000);
        proof_after_restart = (rc == 1);
        if (rc == 1) {
            frame_after_restart = (s2.recv_exact(raw, 8, 500) == 1);
        }
        stage = 3;
    });

    ASSERT_EQ(0, connect_qp(qp, peer.addr, 0x77));
    hca_sge_t sg     = mk_sge(src, 256, hca_mr_lkey(smr));
    hca_send_wr_t wr = mk_wr(HCA_WR_RDMA_WRITE, &sg, 1, HCA_SEND_SIGNALED, 1,
                             0x100000, 0x1234);
    hca_wc_t wc;
    ASSERT_EQ(0, post_retry(qp, &wr));
    EXPECT_TRUE(wait_wc(cq, &wc));
    EXPECT_EQ(HCA_WC_SUCCESS, wc.status) << wc_str(wc);
    wr.wr_id = 2;
    ASSERT_EQ(0, post_retry(qp, &wr));
    double t0 = now_ms();
    EXPECT_TRUE(wait_wc(cq, &wc));
    double took = now_ms() - t0;
    t.join();
    unsetenv("HCA_TCP_RETRY_TIMEOUT_MS");
    ASSERT_NE(-1, stage.load()) << "the raw peer: " << peer_err;
    EXPECT_EQ(2u, wc.wr_id);
    EXPECT_EQ(HCA_WC_RETRY_EXC_ERR, wc.status) << wc_str(wc);
    EXPECT_LT(took, 5000.0) << "failed by the retry timeout (10 s), not by "
                               "the new incarnation";
    EXPECT_FALSE(proof_after_restart) << "the restarted peer was asked to "
                                         "resume the old connection";
    EXPECT_FALSE(frame_after_restart);
    printf("# the WRITE of the old incarnation failed %.0f ms after it was "
           "posted\n", took);
}

/* A WR posted while the connection is being made again (its socket lost,
 * the dialler waiting for the peer's answer) is accepted, as a verbs QP
 * in RTS accepts one while its link retries, and goes out once the
 * connection resumes: not handed back as "no resources" (UCT would report
 * NO_RESOURCE for an ep whose peer is merely reconnecting). */
TEST_F(TcpReliable, PostWhileReconnectingIsAccepted)
{
    setenv("HCA_TCP_RETRY_TIMEOUT_MS", "10000", 1);
    raw_peer_bed bed;
    ASSERT_NO_FATAL_FAILURE(bed.open(5));
    raw_peer &peer = *bed.peer;
    hca_qp_t *qp   = bed.qp;
    cqw *cq        = bed.cq;
    uint8_t *src   = bed.src;
    hca_mr_t *smr  = bed.smr;

    std::atomic<int> stage(0);
    std::string peer_err;
    std::vector<uint8_t> second;
    uint32_t first_psn = 0, second_psn = 0;
    std::thread t([&]() {
        tcp_raw_socket s1, s2;
        tcpf_hello_t h;
        tcpf_hdr_t f;
        std::vector<uint8_t> pl;
        if (!peer.accept_one(s1, TIMEOUT_MS) ||
            !peer.challenge(s1, 0x1111, &h) || !peer.verdict(s1)) {
            peer_err = "first handshake";
            stage    = -1;
            return;
        }
        if (!peer.frame(s1, &f, &pl) || (f.opcode != TCPF_OP_WRITE) ||
            !peer.ack(s1, f)) {
            peer_err = "first WRITE";
            stage    = -1;
            return;
        }
        first_psn = f.psn;
        struct linger lg = {1, 0};
        (void)setsockopt(s1.fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
        s1.close_fd();
        stage = 1;
        /* the dialler's HELLO waits in the backlog while the test posts */
        while (stage.load() == 1) {
            usleep(1000);
        }
        if (!peer.accept_one(s2, TIMEOUT_MS) ||
            !peer.challenge(s2, 0x1111, &h) || !peer.verdict(s2)) {
            peer_err = "the handshake that resumes";
            stage    = -1;
            return;
        }
        if (!peer.frame(s2, &f, &pl) || (f.opcode != TCPF_OP_WRITE) ||
            !peer.ack(s2, f)) {
            peer_err = "the WRITE posted while reconnecting";
            stage    = -1;
            return;
        }
        second_psn = f.psn;
        second     = pl;
        stage      = 3;
    });

    ASSERT_EQ(0, connect_qp(qp, peer.addr, 0x77));
    hca_sge_t sg     = mk_sge(src, 256, hca_mr_lkey(smr));
    hca_send_wr_t wr = mk_wr(HCA_WR_RDMA_WRITE, &sg, 1, HCA_SEND_SIGNALED, 1,
                             0x100000, 0x1234);
    hca_send_wr_t *bad = nullptr;
    hca_wc_t wc;
    ASSERT_EQ(0, post_retry(qp, &wr));
    EXPECT_TRUE(wait_wc(cq, &wc));
    EXPECT_EQ(HCA_WC_SUCCESS, wc.status) << wc_str(wc);
    double t0 = now_ms();
    while ((stage.load() == 0) && (now_ms() - t0 < TIMEOUT_MS)) {
        usleep(1000);
    }
    ASSERT_EQ(1, stage.load()) << "the raw peer: " << peer_err;
    usleep(100000); /* the socket is lost, the dialler has dialled again */
    fill_pattern(src, 256, 6);
    wr.wr_id = 2;
    int rc   = hca_post_send(qp, &wr, &bad);
    stage    = 2;
    EXPECT_EQ(0, rc) << "a WR posted while the connection resumes was "
                        "refused";
    if (rc == 0) {
        EXPECT_TRUE(wait_wc(cq, &wc));
        EXPECT_EQ(2u, wc.wr_id);
        EXPECT_EQ(HCA_WC_SUCCESS, wc.status) << wc_str(wc);
    }
    t.join();
    unsetenv("HCA_TCP_RETRY_TIMEOUT_MS");
    if (rc == 0) {
        ASSERT_EQ(3, stage.load()) << "the raw peer: " << peer_err;
        EXPECT_EQ(first_psn + 1, second_psn);
        ASSERT_EQ(256u, second.size());
        EXPECT_EQ(-1, check_pattern(second.data(), 256, 6))
                << "the WRITE sent after the resume carried other data";
    }
}

/* ------------------------------------------------------------ first post */

/* How long the first handshake of a pair is held back in the first-post
 * tests, and how long a post may take: no wait for the network. */
const int    LATE_HANDSHAKE_MS = 500;
const double POST_MAX_MS       = 50.0;

/* A raw acceptor that takes its time over the first handshake (a slow or
 * distant peer): once the connector's HELLO is in (stage 1: the handshake
 * is under way) it waits LATE_HANDSHAKE_MS.  Then, as `how` says: it
 * completes the handshake, takes one WRITE, whose frame and payload it
 * keeps (stage 3), and answers it; never answers (the socket open until
 * `stop`); or resets the socket. */
struct late_acceptor {
    enum how_t {
        ANSWERS,
        SILENT,
        RESETS
    };

    raw_peer            &peer;
    const how_t          how;
    std::atomic<int>     stage{0};
    std::atomic<bool>    stop{false};
    std::string          err;
    tcpf_hdr_t           frame;
    std::vector<uint8_t> payload;
    std::atomic<double>  acted_ms{0}; /* its CHALLENGE sent, or the reset */
    std::thread          t;

    late_acceptor(raw_peer &p, how_t h) : peer(p), how(h)
    {
        memset(&frame, 0, sizeof(frame));
        t = std::thread([this]() { serve(); });
    }

    ~late_acceptor()
    {
        stop = true;
        if (t.joinable()) {
            t.join();
        }
    }

    /* Waits (bounded) until the connector's HELLO is in. */
    bool handshaking()
    {
        double t0 = now_ms();
        while ((stage.load() == 0) && (now_ms() - t0 < TIMEOUT_MS)) {
            usleep(1000);
        }
        return stage.load() >= 1;
    }

    void serve()
    {
        tcp_raw_socket s;
        tcpf_hello_t h;
        struct pollfd pfd;

        if (!peer.accept_one(s, TIMEOUT_MS)) {
            return fail("no connection");
        }
        pfd = {s.fd, POLLIN, 0};
        if (poll(&pfd, 1, TIMEOUT_MS) != 1) {
            return fail("no HELLO");
        }
        stage = 1;
        sleep_ms(LATE_HANDSHAKE_MS);
        if (how == RESETS) {
            struct linger lg = {1, 0};
            (void)setsockopt(s.fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
            acted_ms = now_ms(); /* before: the WR may fail at once */
            s.close_fd();
            return;
        }
        if (how == SILENT) {
            while (!stop) {
                usleep(10000);
            }
            return;
        }
        acted_ms = now_ms();
        if (!peer.challenge(s, 0x1111, &h) || !peer.verdict(s)) {
            return fail("the handshake");
        }
        if (!peer.frame(s, &frame, &payload) ||
            (frame.opcode != TCPF_OP_WRITE)) {
            return fail("the WRITE");
        }
        stage = 3; /* before the answer: the test reads what came once the
                      WR completes */
        if (!peer.ack(s, frame)) {
            return fail("the WRITE's answer");
        }
        while (!stop) {
            usleep(10000);
        }
    }

private:
    void fail(const char *what)
    {
        err   = what;
        stage = -1;
    }
};

/* A WRITE posted on a brand-new pair, its handshake under way; the time
 * hca_post_send took (ms) in *post_ms.  The post must return before the
 * acceptor acts, or the handshake was not under way. */
void post_first_write(raw_peer_bed &bed, late_acceptor &acc, int seed,
                      double *post_ms)
{
    ASSERT_EQ(0, connect_qp(bed.qp, bed.peer->addr, 0x77));
    ASSERT_TRUE(acc.handshaking()) << "the raw acceptor: " << acc.err;
    fill_pattern(bed.src, 256, (uint64_t)seed);
    hca_sge_t sg       = mk_sge(bed.src, 256, hca_mr_lkey(bed.smr));
    hca_send_wr_t wr   = mk_wr(HCA_WR_RDMA_WRITE, &sg, 1, HCA_SEND_SIGNALED,
                               1, 0x100000, 0x1234);
    hca_send_wr_t *bad = nullptr;
    double t0          = now_ms();
    int rc             = hca_post_send(bed.qp, &wr, &bad);
    double end         = now_ms();
    *post_ms           = end - t0;
    ASSERT_EQ(0, rc) << "the first post on a pair still connecting";
    printf("# hca_post_send took %.2f ms while the handshake was under way "
           "(held back %d ms)\n", *post_ms, LATE_HANDSHAKE_MS);
    EXPECT_LT(*post_ms, POST_MAX_MS)
            << "the post waited for the handshake";
    double acted = acc.acted_ms.load();
    EXPECT_TRUE((acted == 0) || (acted > end))
            << "the post returned after the acceptor acted: the post "
               "waited for it, or the test came too late";
}

/* Waits for one completion on c asleep: hca_cq_wait, then a poll, until
 * one is in (bounded by timeout_ms).  Each sleep may last slice_ms: one
 * that lasts it whole was not woken; *timeouts counts them. */
::testing::AssertionResult sleep_for_wc(cqw *c, hca_wc_t *wc, int slice_ms,
                                        int timeout_ms, int *timeouts)
{
    double end = now_ms() + timeout_ms;

    *timeouts = 0;
    for (;;) {
        if (c->poll_once() < 0) {
            return ::testing::AssertionFailure()
                   << "hca_cq_poll returned " << c->err;
        }
        if (c->pop(wc)) {
            return ::testing::AssertionSuccess();
        }
        if (now_ms() > end) {
            return ::testing::AssertionFailure()
                   << "no completion in " << timeout_ms << " ms";
        }
        if (hca_cq_wait(c->cq, slice_ms) == 0) {
            ++*timeouts;
        }
    }
}

/* A post never waits for the network (no UCX transport blocks in a
 * post): the first WR of a brand-new pair, posted while the acceptor
 * holds its CHALLENGE back 500 ms, is accepted at once (in well under the
 * handshake's time) and goes out once the connection is up: the
 * acceptor gets it as the QP's first frame (F_START), with the data
 * posted, and its answer completes it.  Before, hca_post_send slept until
 * the handshake was done. */
TEST_F(TcpReliable, FirstPostReturnsDuringHandshake)
{
    raw_peer_bed bed;
    ASSERT_NO_FATAL_FAILURE(bed.open(5));
    late_acceptor acc(*bed.peer, late_acceptor::ANSWERS);
    double post_ms = 0;
    hca_wc_t wc;

    ASSERT_NO_FATAL_FAILURE(post_first_write(bed, acc, 6, &post_ms));
    ASSERT_TRUE(wait_wc(bed.cq, &wc));
    double done_ms = now_ms();
    EXPECT_EQ(1u, wc.wr_id);
    EXPECT_EQ(HCA_WC_SUCCESS, wc.status) << wc_str(wc);
    ASSERT_EQ(3, acc.stage.load()) << "the raw acceptor: " << acc.err;
    EXPECT_GE(done_ms, acc.acted_ms.load())
            << "completed before the acceptor answered";
    EXPECT_TRUE(acc.frame.flags & TCPF_F_START)
            << "the QP's first frame without F_START";
    ASSERT_EQ(256u, acc.payload.size());
    EXPECT_EQ(-1, check_pattern(acc.payload.data(), 256, 6))
            << "the WRITE carried other data than was posted";
    printf("# completed %.0f ms after the acceptor's CHALLENGE\n",
           done_ms - acc.acted_ms.load());
}

/* The same, with a requester that sleeps on its CQ's notification
 * (hca_cq_wait) instead of polling: the connection coming up wakes it to
 * send the WR (then the answer wakes it again); no sleep of it lasts
 * its whole 3 s. */
TEST_F(TcpReliable, FirstPostWakesSleeperAtHandshake)
{
    raw_peer_bed bed;
    ASSERT_NO_FATAL_FAILURE(bed.open(7));
    late_acceptor acc(*bed.peer, late_acceptor::ANSWERS);
    double post_ms = 0;
    int timeouts   = 0;
    hca_wc_t wc;

    ASSERT_NO_FATAL_FAILURE(post_first_write(bed, acc, 8, &post_ms));
    ASSERT_TRUE(sleep_for_wc(bed.cq, &wc, 3000, TIMEOUT_MS, &timeouts));
    double done_ms = now_ms();
    EXPECT_EQ(0, timeouts) << "a sleeper was not woken when the handshake "
                              "completed";
    EXPECT_EQ(1u, wc.wr_id);
    EXPECT_EQ(HCA_WC_SUCCESS, wc.status) << wc_str(wc);
    ASSERT_EQ(3, acc.stage.load()) << "the raw acceptor: " << acc.err;
    ASSERT_EQ(256u, acc.payload.size());
    EXPECT_EQ(-1, check_pattern(acc.payload.data(), 256, 8));
    EXPECT_LT(done_ms - acc.acted_ms.load(), 1000.0)
            << "ms from the CHALLENGE to the completion";
}

/* A first handshake that never completes (the acceptor reads the HELLO
 * and never answers): the post still returns at once, and the WR fails
 * (RETRY_EXC_ERR) when the connect limit (HCA_TCP_CONNECT_MS, 5 s) kills
 * the connection, waking the requester asleep on its CQ: nothing hangs. */
TEST_F(TcpReliable, FirstPostFailsIfHandshakeNeverEnds)
{
    const double CONNECT_LIMIT_MS = 5000;
    raw_peer_bed bed;
    ASSERT_NO_FATAL_FAILURE(bed.open(9));
    late_acceptor acc(*bed.peer, late_acceptor::SILENT);
    double post_ms = 0, t0 = now_ms();
    int timeouts   = 0;
    hca_wc_t wc;

    ASSERT_NO_FATAL_FAILURE(post_first_write(bed, acc, 10, &post_ms));
    ASSERT_TRUE(sleep_for_wc(bed.cq, &wc, 8000, TIMEOUT_MS, &timeouts));
    double took = now_ms() - t0;
    EXPECT_EQ(0, timeouts) << "a sleeper was not woken when its connection "
                              "died";
    EXPECT_EQ(1u, wc.wr_id);
    EXPECT_EQ(HCA_WC_RETRY_EXC_ERR, wc.status) << wc_str(wc);
    EXPECT_EQ(HCA_QPS_ERR, hca_qp_state(bed.qp));
    EXPECT_GE(took, CONNECT_LIMIT_MS - 100) << "failed before the limit";
    EXPECT_LT(took, CONNECT_LIMIT_MS + 2000)
            << "ms from the connect to the failed completion";
    printf("# the WR failed %.0f ms after the connect (limit %.0f ms)\n",
           took, CONNECT_LIMIT_MS);
}

/* A first handshake cut by the acceptor (a reset while the connector
 * waits for the CHALLENGE): the post returned at once, and the WR fails
 * as soon as the connection is found dead, not at any timeout. */
TEST_F(TcpReliable, FirstPostFailsIfHandshakeReset)
{
    raw_peer_bed bed;
    ASSERT_NO_FATAL_FAILURE(bed.open(11));
    late_acceptor acc(*bed.peer, late_acceptor::RESETS);
    double post_ms = 0;
    hca_wc_t wc;

    ASSERT_NO_FATAL_FAILURE(post_first_write(bed, acc, 12, &post_ms));
    ASSERT_TRUE(wait_wc(bed.cq, &wc));
    double after = now_ms() - acc.acted_ms.load();
    EXPECT_EQ(1u, wc.wr_id);
    EXPECT_NE(HCA_WC_SUCCESS, wc.status) << wc_str(wc);
    EXPECT_EQ(HCA_QPS_ERR, hca_qp_state(bed.qp));
    EXPECT_LT(after, 1000.0) << "ms from the reset to the failed completion";
    printf("# the WR failed (%s) %.0f ms after the reset\n",
           hca_wc_status_str(wc.status), after);
}

/* A listener on ip (a loopback address), its address in *net; -1 if
 * none. */
int listen_on(const char *ip, hca_net_addr_t *net)
{
    struct sockaddr_in sin;
    socklen_t len = sizeof(sin);
    int one       = 1;
    int fd        = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    if ((fd < 0) || (inet_pton(AF_INET, ip, &sin.sin_addr) != 1) ||
        (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0) ||
        (bind(fd, (struct sockaddr*)&sin, sizeof(sin)) != 0) ||
        (listen(fd, 4) != 0) ||
        (getsockname(fd, (struct sockaddr*)&sin, &len) != 0)) {
        if (fd >= 0) {
            close(fd);
        }
        return -1;
    }
    memset(net, 0, sizeof(*net));
    net->family = HCA_NET_IPV4;
    memcpy(net->addr, &sin.sin_addr, 4);
    net->port = ntohs(sin.sin_port);
    return fd;
}

/* Two paths, the first post's on the first (the QP's home: no path was UP
 * at its connect), whose handshake never completes; the second's does.
 * The post returns at once, and when the first path dies at the connect
 * limit the requester, asleep on its CQ, is woken and moves the WR to
 * the second path, where it goes as the QP's first frame (F_START) and
 * completes.  Before, the post slept until the first path died, then
 * failed with RETRY_EXC_ERR.  The retry timeout is 20 s: the raw peer
 * sends no keepalive, and the second path must not go silent (T/2)
 * meanwhile. */
TEST_F(TcpReliable, FirstPostFailsOverIfItsPathNeverComesUp)
{
    setenv("HCA_NET_DEVICES", TWO_PATHS, 1);
    setenv("HCA_TCP_RETRY_TIMEOUT_MS", "20000", 1);
    raw_peer_bed bed;
    ASSERT_NO_FATAL_FAILURE(bed.open(13));
    ASSERT_EQ(1u, bed.a.addr.n_net_more) << "not two paths of our own";
    raw_peer &peer = *bed.peer;
    int lfd2       = listen_on("127.0.0.2", &peer.addr.net_more[0]);
    ASSERT_GE(lfd2, 0) << "no listener on 127.0.0.2";
    peer.addr.n_net_more = 1;
    /* path 0 (peer.lfd) is the silent one: raw_peer's own listener */
    late_acceptor silent(peer, late_acceptor::SILENT);

    std::atomic<int> stage(0);
    std::string peer_err;
    std::atomic<bool> stop(false);
    tcpf_hdr_t f;
    std::vector<uint8_t> pl;
    std::thread second([&]() {
        tcp_raw_socket s;
        struct pollfd pfd = {lfd2, POLLIN, 0};
        tcpf_hello_t h;
        if (poll(&pfd, 1, TIMEOUT_MS) != 1) {
            peer_err = "no connection on the second path";
            stage    = -1;
            return;
        }
        s.fd = accept4(lfd2, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if ((s.fd < 0) || !peer.challenge(s, 0x1111, &h) ||
            !peer.verdict(s)) {
            peer_err = "the second path's handshake";
            stage    = -1;
            return;
        }
        stage = 1;
        if (!peer.frame(s, &f, &pl) || (f.opcode != TCPF_OP_WRITE)) {
            peer_err = "the WRITE on the second path";
            stage    = -1;
            return;
        }
        stage = 2; /* before the answer: read once the WR completes */
        if (!peer.ack(s, f)) {
            peer_err = "the WRITE's answer";
            stage    = -1;
            return;
        }
        while (!stop) {
            usleep(10000);
        }
    });
    /* joined on every way out (a failed ASSERT too) */
    struct joiner {
        std::thread       &t;
        std::atomic<bool> &stop;
        int                fd;
        ~joiner()
        {
            stop = true;
            if (t.joinable()) {
                t.join();
            }
            close(fd);
        }
    } join_second{second, stop, lfd2};

    double post_ms = 0, t0 = now_ms();
    int timeouts   = 0;
    hca_wc_t wc;
    ASSERT_NO_FATAL_FAILURE(post_first_write(bed, silent, 14, &post_ms));
    ASSERT_TRUE(sleep_for_wc(bed.cq, &wc, 8000, TIMEOUT_MS, &timeouts));
    double took = now_ms() - t0;
    stop = true;
    second.join();
    EXPECT_EQ(0, timeouts) << "a sleeper was not woken when its path died";
    EXPECT_EQ(1u, wc.wr_id);
    EXPECT_EQ(HCA_WC_SUCCESS, wc.status) << wc_str(wc);
    ASSERT_EQ(2, stage.load()) << "the second path: " << peer_err;
    EXPECT_TRUE(f.flags & TCPF_F_START)
            << "the QP's first frame, on the second path, without F_START";
    ASSERT_EQ(256u, pl.size());
    EXPECT_EQ(-1, check_pattern(pl.data(), 256, 14))
            << "the WRITE carried other data than was posted";
    /* the limit, found at a timer pass (every 1.25 s), and the resend */
    EXPECT_LT(took, 5000.0 + 1250.0 + 1000.0)
            << "ms from the connect to the completion on the second path";
    printf("# completed on the second path %.0f ms after the connect (the "
           "first path's connect limit: 5000 ms)\n", took);
}

} // namespace
} // namespace hcat
