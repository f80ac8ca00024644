/*
 * test_tcp_session.cc - who may continue a session of the tcp fabric
 * (docs/TCP-WIRE.md, "Who continues a session"; issue 37): an attacker
 * that holds the target's address (its secret) and a capture of a real
 * peer's handshake, taken by a relay between the two, can neither JOIN
 * the peer's responder records nor RESUME its connection.
 */
#include "test_common.h"
#include "tcp_forge.h"
#include "tcp_raw_socket.h"

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

namespace hcat {
namespace {

/* A TCP relay on 127.0.0.1 in front of a context's listener: what a
 * stranger on the path between two peers sees and does.  It forwards
 * every connection it accepts, records the bytes of each (both ways),
 * cuts them all with a reset when told, and refuses (closes at once) new
 * ones while told to. */
class tcp_relay {
public:
    hca_port_addr_t addr; /* the target's address, at the relay's port */
    std::atomic<int> refuse{0};

    explicit tcp_relay(const hca_port_addr_t &target) : target_(target)
    {
        struct sockaddr_in sin;
        socklen_t len = sizeof(sin);
        int one       = 1;

        lfd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        (void)setsockopt(lfd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        memset(&sin, 0, sizeof(sin));
        sin.sin_family      = AF_INET;
        sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        EXPECT_EQ(0, bind(lfd_, (struct sockaddr*)&sin, sizeof(sin)));
        EXPECT_EQ(0, listen(lfd_, 16));
        EXPECT_EQ(0, getsockname(lfd_, (struct sockaddr*)&sin, &len));
        addr            = target;
        addr.net.family = HCA_NET_IPV4;
        memset(addr.net.addr, 0, sizeof(addr.net.addr));
        memcpy(addr.net.addr, &sin.sin_addr, 4);
        addr.net.port = ntohs(sin.sin_port);
        thread_ = std::thread([this]() { loop(); });
    }

    ~tcp_relay()
    {
        stop_ = 1;
        thread_.join();
        for (auto &p : pairs_) {
            close_pair(p);
        }
        close(lfd_);
    }

    /* Every forwarded connection ends with a reset, both ways. */
    void cut()
    {
        cut_ = 1;
        while (cut_.load()) {
            usleep(1000);
        }
    }

    /* The bytes of connection i (in accept order) so far: from the
     * connector (up) or from the target (down); false if not that many. */
    bool captured(size_t i, bool up, std::vector<uint8_t> *out)
    {
        std::lock_guard<std::mutex> g(mu_);
        if (i >= log_.size()) {
            return false;
        }
        *out = up ? log_[i].up : log_[i].down;
        return true;
    }

private:
    struct pair {
        int a = -1, b = -1; /* the connector's socket, the target's */
        size_t log = 0;     /* its log_ entry */
    };
    struct bytes {
        std::vector<uint8_t> up, down;
    };

    hca_port_addr_t   target_;
    int               lfd_ = -1;
    std::atomic<int>  stop_{0}, cut_{0};
    std::thread       thread_;
    std::vector<pair> pairs_;
    std::mutex        mu_;
    std::vector<bytes> log_;

    static void reset_close(int fd)
    {
        struct linger lg = {1, 0};
        if (fd >= 0) {
            (void)setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
            close(fd);
        }
    }

    static void close_pair(pair &p)
    {
        reset_close(p.a);
        reset_close(p.b);
        p.a = p.b = -1;
    }

    void accept_one()
    {
        int a = accept4(lfd_, NULL, NULL, SOCK_CLOEXEC);
        if (a < 0) {
            return;
        }
        if (refuse.load()) {
            reset_close(a);
            return;
        }
        tcp_raw_socket t;
        if (!t.connect_to(target_)) {
            reset_close(a);
            return;
        }
        pair p;
        p.a  = a;
        p.b  = t.fd;
        t.fd = -1;
        {
            std::lock_guard<std::mutex> g(mu_);
            p.log = log_.size();
            log_.emplace_back();
        }
        pairs_.push_back(p);
    }

    /* from -> to, logged; false: the pair is done */
    bool forward(int from, int to, size_t log, bool up)
    {
        uint8_t buf[65536];
        ssize_t n = recv(from, buf, sizeof(buf), MSG_DONTWAIT);
        if (n == 0) {
            return false;
        }
        if (n < 0) {
            return (errno == EAGAIN) || (errno == EINTR);
        }
        {
            std::lock_guard<std::mutex> g(mu_);
            auto &v = up ? log_[log].up : log_[log].down;
            v.insert(v.end(), buf, buf + n);
        }
        for (ssize_t off = 0; off < n;) {
            ssize_t w = send(to, buf + off, (size_t)(n - off), MSG_NOSIGNAL);
            if (w <= 0) {
                return false;
            }
            off += w;
        }
        return true;
    }

    void loop()
    {
        while (!stop_.load()) {
            if (cut_.load()) {
                for (auto &p : pairs_) {
                    close_pair(p);
                }
                pairs_.clear();
                cut_ = 0;
            }
            std::vector<struct pollfd> fds;
            fds.push_back({lfd_, POLLIN, 0});
            for (auto &p : pairs_) {
                fds.push_back({p.a, POLLIN, 0});
                fds.push_back({p.b, POLLIN, 0});
            }
            if (poll(fds.data(), fds.size(), 10) <= 0) {
                continue;
            }
            if (fds[0].revents & POLLIN) {
                accept_one();
            }
            for (size_t i = 0; i < pairs_.size(); ++i) {
                pair &p = pairs_[i];
                bool ok = true;
                if ((1 + 2 * i + 1 < fds.size()) && (p.a >= 0)) {
                    if (fds[1 + 2 * i].revents & (POLLIN | POLLHUP | POLLERR)) {
                        ok = forward(p.a, p.b, p.log, true);
                    }
                    if (ok &&
                        (fds[2 + 2 * i].revents & (POLLIN | POLLHUP | POLLERR))) {
                        ok = forward(p.b, p.a, p.log, false);
                    }
                }
                if (!ok) {
                    close_pair(p);
                }
            }
            for (size_t i = 0; i < pairs_.size();) {
                if (pairs_[i].a < 0) {
                    pairs_.erase(pairs_.begin() + (long)i);
                } else {
                    ++i;
                }
            }
        }
    }
};

/* The bed: a target t with an any-source QP over a registered region,
 * and a real peer p whose QP reaches it through a relay. */
struct session_bed {
    static const size_t LEN = 4096;
    ctx t, p;
    std::unique_ptr<tcp_relay> relay;
    hca_qp_t *tany = nullptr, *pqp = nullptr;
    cqw *tcq = nullptr, *pcq = nullptr;
    uint8_t *tmem = nullptr, *psrc = nullptr;
    hca_mr_t *tmr = nullptr, *pmr = nullptr;

    void open()
    {
        ASSERT_TRUE(t.open(0, HCA_FABRIC_TCP));
        ASSERT_TRUE(p.open(0, HCA_FABRIC_TCP));
        hca_pd_t *tpd = t.new_pd();
        tcq           = t.new_cq(256);
        ASSERT_NE(nullptr, tcq);
        tany = t.new_qp(tpd, tcq, tcq);
        ASSERT_NE(nullptr, tany);
        ASSERT_EQ(0, qp_to_init(tany, REMOTE_ALL));
        ASSERT_EQ(0, qp_to_rtr(tany, t.addr, HCA_QPN_ANY));
        tmem = t.alloc(MEM_MALLOC, 2 * LEN);
        ASSERT_NE(nullptr, tmem);
        memset(tmem, SENTINEL, 2 * LEN);
        tmr = t.reg(tpd, tmem, 2 * LEN, ACCESS_ALL);
        ASSERT_NE(nullptr, tmr);

        relay.reset(new tcp_relay(t.addr));
        hca_pd_t *ppd = p.new_pd();
        pcq           = p.new_cq(256);
        ASSERT_NE(nullptr, pcq);
        pqp = p.new_qp(ppd, pcq, pcq);
        ASSERT_NE(nullptr, pqp);
        psrc = p.alloc(MEM_MALLOC, LEN);
        ASSERT_NE(nullptr, psrc);
        pmr = p.reg(ppd, psrc, LEN, ACCESS_ALL);
        ASSERT_NE(nullptr, pmr);
        ASSERT_EQ(0, connect_qp(pqp, relay->addr, hca_qp_num(tany)));
    }

    /* p WRITEs n messages of 256 bytes of pattern seed to the target's
     * first n * 256 bytes, each completing with success. */
    void p_writes(int n, uint64_t seed)
    {
        fill_pattern(psrc, (size_t)n * 256, seed);
        for (int i = 0; i < n; ++i) {
            hca_sge_t sg = mk_sge(psrc + 256 * i, 256, hca_mr_lkey(pmr));
            hca_send_wr_t wr = mk_wr(HCA_WR_RDMA_WRITE, &sg, 1,
                                     HCA_SEND_SIGNALED, (uint64_t)(100 + i),
                                     (uint64_t)(uintptr_t)(tmem + 256 * i),
                                     hca_mr_rkey(tmr));
            ASSERT_EQ(0, post_retry(pqp, &wr));
            ASSERT_TRUE(wait_ok(pcq, (uint64_t)(100 + i), HCA_WC_RDMA_WRITE));
        }
    }

    /* p's HELLO of relayed connection i: who it is and its incarnation */
    void p_hello(size_t i, tcpf_hello_t *h)
    {
        std::vector<uint8_t> up;
        ASSERT_TRUE(relay->captured(i, true, &up));
        ASSERT_GE(up.size(), (size_t)TCPF_HELLO_LEN);
        tcpf_hello_decode(up.data(), h);
        ASSERT_EQ(TCPF_STEP_HELLO, h->step);
        ASSERT_NE(0u, h->incarn);
    }
};

/* The attacker: a raw client of the target that claims the identity and
 * incarnation of hello `as`. */
struct claimant : public tcp_raw_socket {
    tcpf_hello_t   h;
    tcpf_session_t s;

    /* HELLO, CHALLENGE, PROOF (MAC with the target's secret, which it
     * holds; an identity proof it cannot make; continuing `cont` with a
     * MAC keyed by `key`); *verdict: the answer. */
    ::testing::AssertionResult shake(const hca_port_addr_t &target,
                                     const tcpf_hello_t &as, int cont,
                                     const uint8_t *key, tcpf_hello_t *verdict)
    {
        uint8_t raw[TCPF_HELLO_LEN];
        tcpf_hello_t ch, pr;

        auto r = connect_to(target);
        if (!r) {
            return r;
        }
        memset(&h, 0, sizeof(h));
        h.step     = TCPF_STEP_HELLO;
        h.src_host = as.src_host;
        h.src_pid  = as.src_pid;
        h.src_ctx  = as.src_ctx;
        h.incarn   = as.incarn;
        h.dst_host = target.host;
        h.dst_pid  = target.pid;
        h.dst_ctx  = target.ctx_id;
        h.nonce    = 0xbadc0ffee0000000ull ^ (uint64_t)now_ms();
        tcpf_kx_new(&h);
        tcpf_hello_encode(&h, raw);
        if (!send_all(raw, sizeof(raw)) ||
            (recv_exact(raw, sizeof(raw), TIMEOUT_MS) != 1)) {
            return ::testing::AssertionFailure() << "no CHALLENGE";
        }
        tcpf_hello_decode(raw, &ch);
        if (!tcpf_prove(&h, &ch, target.host, target.pid, target.ctx_id,
                        target.secret, target.secret, 0xbad5ec0e7ull, &pr,
                        &s)) {
            return ::testing::AssertionFailure() << "CHALLENGE refused";
        }
        if (cont != TCPF_CONT_NONE) {
            tcpf_continue(&pr, &s, cont, key);
        }
        tcpf_hello_encode(&pr, raw);
        if (!send_all(raw, sizeof(raw)) ||
            (recv_exact(raw, sizeof(raw), TIMEOUT_MS) != 1)) {
            return ::testing::AssertionFailure() << "no VERDICT";
        }
        tcpf_hello_decode(raw, verdict);
        return ::testing::AssertionSuccess();
    }

    /* The next frame that is not a KEEPALIVE: 1, 0 closed, -1 timeout. */
    int next_frame(tcpf_hdr_t *f, int timeout_ms)
    {
        uint8_t raw[TCPF_HDR_LEN];
        std::vector<uint8_t> pl;
        double end = now_ms() + timeout_ms;
        for (;;) {
            int rc = recv_exact(raw, sizeof(raw),
                                std::max(0, (int)(end - now_ms())));
            if (rc <= 0) {
                return rc;
            }
            tcpf_hdr_decode(raw, f);
            pl.resize(f->length);
            if ((f->length > 0) &&
                ((rc = recv_exact(pl.data(), f->length,
                                  std::max(0, (int)(end - now_ms())))) <= 0)) {
                return rc;
            }
            if (f->opcode != TCPF_OP_KEEPALIVE) {
                return 1;
            }
        }
    }
};

/* A WRITE of 64 bytes as QP src to the target's any-source QP. */
static tcpf_hdr_t forged_write(uint32_t src, uint32_t dst, uint32_t psn,
                               uint64_t addr, uint32_t rkey, uint32_t idx)
{
    tcpf_hdr_t f;
    memset(&f, 0, sizeof(f));
    f.version     = (uint8_t)tcpf_version;
    f.opcode      = TCPF_OP_WRITE;
    f.flags       = TCPF_F_LAST;
    f.src_qpn     = src;
    f.dst_qpn     = dst;
    f.psn         = psn;
    f.rkey        = rkey;
    f.remote_addr = addr;
    f.length      = 64;
    f.total       = 64;
    f.resp_idx    = idx;
    f.resp_stamp  = 1;
    return f;
}

/* Issue 37, defect 1: a claim alone (the target's secret, and the
 * identity and incarnation read from the peer's HELLO in clear) never
 * reaches the records of the peer's session.  The attacker learns what
 * PSN it can, and WRITEs 64 frames as the peer's QP from there; the
 * peer's own WRITEs that follow must still land byte for byte (before
 * the fix they were acknowledged as duplicates and never written). */
class TcpSession : public ::testing::TestWithParam<int> {};

TEST_P(TcpSession, ClaimReachesNoProvenRecords)
{
    const int cont = GetParam(); /* none, or a JOIN it cannot prove */
    session_bed bed;
    ASSERT_NO_FATAL_FAILURE(bed.open());
    ASSERT_NO_FATAL_FAILURE(bed.p_writes(1, 1)); /* the session is UP */
    tcpf_hello_t as, verdict;
    ASSERT_NO_FATAL_FAILURE(bed.p_hello(0, &as));

    claimant x;
    uint8_t guess[TCPF_KEY_LEN];
    memset(guess, 0x5a, sizeof(guess));
    ASSERT_TRUE(x.shake(bed.t.addr, as, cont, guess, &verdict));
    /* it holds the target's address: it may talk to it, as itself */
    ASSERT_EQ(TCPF_STEP_VERDICT, verdict.step);
    ASSERT_EQ(TCPF_HELLO_OK, verdict.status);

    const uint32_t src = hca_qp_num(bed.pqp), dst = hca_qp_num(bed.tany);
    const uint64_t aside = (uint64_t)(uintptr_t)(bed.tmem + session_bed::LEN);
    const uint32_t rkey  = hca_mr_rkey(bed.tmr);
    std::vector<uint8_t> junk(64, 0xee);
    /* a far PSN: what the answer tells of the peer's expected PSN */
    tcpf_hdr_t f = forged_write(src, dst, 0x00abcdefu, aside, rkey, 1), a;
    uint8_t raw[TCPF_HDR_LEN];
    tcpf_hdr_encode(&f, raw);
    ASSERT_TRUE(x.send_all(raw, sizeof(raw)) &&
                x.send_all(junk.data(), junk.size()));
    uint32_t psn    = 0x00123456u;
    uint8_t  flags0 = TCPF_F_START; /* no PSN learnt: start a sequence */
    if ((x.next_frame(&a, 2000) == 1) && (a.opcode == TCPF_OP_ACK) &&
        (a.syndrome == 0x80 /* PSN_SEQ */)) {
        psn    = a.psn;
        flags0 = 0;
    }
    for (uint32_t i = 0; i < 64; ++i) {
        f = forged_write(src, dst, psn + i, aside, rkey, 2 + i);
        if (i == 0) {
            f.flags |= flags0;
        }
        tcpf_hdr_encode(&f, raw);
        if (!x.send_all(raw, sizeof(raw)) ||
            !x.send_all(junk.data(), junk.size())) {
            break; /* it was closed: nothing more it can do */
        }
    }
    for (int i = 0; i < 64; ++i) {
        if (x.next_frame(&a, 500) != 1) {
            break;
        }
    }

    /* the peer goes on: its next WRITEs land */
    ASSERT_NO_FATAL_FAILURE(bed.p_writes(8, 2));
    EXPECT_EQ(-1, check_pattern(bed.tmem, 8 * 256, 2))
        << "the peer's WRITEs were acknowledged but not written";
}

INSTANTIATE_TEST_SUITE_P(Claim, TcpSession,
                         ::testing::Values((int)TCPF_CONT_NONE,
                                           (int)TCPF_CONT_JOIN),
                         [](const ::testing::TestParamInfo<int> &i) {
                             return std::string(i.param == TCPF_CONT_NONE ?
                                                "NoProof" : "UnprovenJoin");
                         });

/* Issue 37, defect 2: after a relay cut the peer's socket, the attacker
 * (the target's secret, the whole captured handshake) asks to RESUME the
 * peer's connection with the best MAC it can compute: the session key an
 * eavesdropper derives from the capture with a key pair of its own.  It
 * is refused and closed, no reconnect is counted, and the peer itself
 * resumes once the relay lets it through, its next WRITE landing. */
TEST(TcpSessionResume, ComputedResumeIsRefused)
{
    setenv("HCA_TCP_RETRY_TIMEOUT_MS", "20000", 1);
    session_bed bed;
    ASSERT_NO_FATAL_FAILURE(bed.open());
    ASSERT_NO_FATAL_FAILURE(bed.p_writes(1, 1));
    tcpf_hello_t as, ch, verdict, pr;
    ASSERT_NO_FATAL_FAILURE(bed.p_hello(0, &as));
    std::vector<uint8_t> down;
    ASSERT_TRUE(bed.relay->captured(0, false, &down));
    ASSERT_GE(down.size(), (size_t)2 * TCPF_HELLO_LEN);
    tcpf_hello_decode(down.data(), &ch);
    ASSERT_EQ(TCPF_STEP_CHALLENGE, ch.step);

    /* all an eavesdropper with both public keys and its own pair gets */
    tcpf_session_t eve;
    tcpf_hello_t mine;
    memset(&mine, 0, sizeof(mine));
    tcpf_kx_new(&mine);
    memcpy(as.kx_sk, mine.kx_sk, sizeof(as.kx_sk));
    ASSERT_EQ(1, tcpf_prove(&as, &ch, bed.t.addr.host, bed.t.addr.pid,
                            bed.t.addr.ctx_id, bed.t.addr.secret,
                            bed.t.addr.secret, 0, &pr, &eve));

    bed.relay->refuse = 1;
    bed.relay->cut();
    sleep_ms(300); /* the target sees the socket die; the peer redials */
    const uint64_t reconnects0 = tcp_counter(bed.t.dev, "reconnects");

    claimant x;
    ASSERT_TRUE(x.shake(bed.t.addr, as, TCPF_CONT_RESUME, eve.key, &verdict));
    EXPECT_EQ(TCPF_STEP_VERDICT, verdict.step);
    EXPECT_NE(TCPF_HELLO_OK, verdict.status) << "the computed RESUME was "
                                                "taken";
    /* and a WRITE as the peer's QP on its socket goes nowhere */
    tcpf_hdr_t f = forged_write(hca_qp_num(bed.pqp), hca_qp_num(bed.tany),
                                0, (uint64_t)(uintptr_t)bed.tmem,
                                hca_mr_rkey(bed.tmr), 9), a;
    std::vector<uint8_t> junk(64, 0xee);
    uint8_t raw[TCPF_HDR_LEN];
    tcpf_hdr_encode(&f, raw);
    (void)(x.send_all(raw, sizeof(raw)) &&
           x.send_all(junk.data(), junk.size()));
    EXPECT_NE(1, x.next_frame(&a, 1000)) << "the forged WRITE was answered";
    EXPECT_EQ(reconnects0, tcp_counter(bed.t.dev, "reconnects"));
    EXPECT_EQ(-1, check_pattern(bed.tmem, 256, 1)) << "the peer's bytes "
                                                      "were overwritten";

    /* the peer itself resumes, and its session serves */
    bed.relay->refuse = 0;
    ASSERT_NO_FATAL_FAILURE(bed.p_writes(2, 3));
    EXPECT_EQ(-1, check_pattern(bed.tmem, 2 * 256, 3));
    EXPECT_EQ(reconnects0 + 1, tcp_counter(bed.t.dev, "reconnects"));
    unsetenv("HCA_TCP_RETRY_TIMEOUT_MS");
}

/* The legitimate JOIN: a peer with two paths to a target that never
 * dials it (its QP is any-source, so no secret of the peer is known
 * there: only the session key can group the paths).  The peer dials both
 * paths at once; the second CHALLENGE it reads JOINs the first's key.
 * The target counts the join, and a WRITE large enough to stripe lands
 * with its parts on both paths and nothing sent again. */
TEST(TcpSessionJoin, PathsOfAPeerNeverDialledJoinByKey)
{
    const size_t BIG = (4u << 20) + 123;
    const char *old  = getenv("HCA_NET_DEVICES");
    std::string saved = (old != nullptr) ? old : "";
    setenv("HCA_NET_DEVICES", "127.0.0.1,127.0.0.2", 1);
    ctx t, p;
    bool opened = t.open(0, HCA_FABRIC_TCP) && p.open(0, HCA_FABRIC_TCP);
    if (old != nullptr) {
        setenv("HCA_NET_DEVICES", saved.c_str(), 1);
    } else {
        unsetenv("HCA_NET_DEVICES");
    }
    ASSERT_TRUE(opened);
    hca_pd_t *tpd  = t.new_pd();
    cqw *tcq       = t.new_cq(64);
    hca_qp_t *tany = t.new_qp(tpd, tcq, tcq);
    ASSERT_NE(nullptr, tany);
    ASSERT_EQ(0, qp_to_init(tany, REMOTE_ALL));
    ASSERT_EQ(0, qp_to_rtr(tany, t.addr, HCA_QPN_ANY));
    uint8_t *dst  = t.alloc(MEM_MALLOC, BIG);
    hca_mr_t *dmr = t.reg(tpd, dst, BIG, ACCESS_ALL);
    ASSERT_NE(nullptr, dmr);
    memset(dst, SENTINEL, BIG);

    hca_pd_t *ppd = p.new_pd();
    cqw *pcq      = p.new_cq(64);
    hca_qp_t *pqp = p.new_qp(ppd, pcq, pcq);
    ASSERT_NE(nullptr, pqp);
    uint8_t *src  = p.alloc(MEM_MALLOC, BIG);
    hca_mr_t *smr = p.reg(ppd, src, BIG, ACCESS_ALL);
    ASSERT_NE(nullptr, smr);
    ASSERT_EQ(0, connect_qp(pqp, t.addr, hca_qp_num(tany)));

    /* the first WRITE makes the QP's record (a first WQE never stripes) */
    fill_pattern(src, 64, 1);
    hca_sge_t sg     = mk_sge(src, 64, hca_mr_lkey(smr));
    hca_send_wr_t wr = mk_wr(HCA_WR_RDMA_WRITE, &sg, 1, HCA_SEND_SIGNALED, 1,
                             (uint64_t)(uintptr_t)dst, hca_mr_rkey(dmr));
    ASSERT_EQ(0, post_retry(pqp, &wr));
    ASSERT_TRUE(wait_ok(pcq, 1, HCA_WC_RDMA_WRITE));
    /* both paths UP at the target (the second path's handshake ends
     * about when the first's does) */
    double end = now_ms() + TIMEOUT_MS;
    while ((tcp_counter(t.dev, "session_joins") == 0) && (now_ms() < end)) {
        (void)progress_all();
        sleep_ms(1);
    }
    EXPECT_EQ(1u, tcp_counter(t.dev, "session_joins"))
        << "the peer's second path did not join its session";

    const uint64_t striped0 = tcp_counter(p.dev, "striped_writes");
    const uint64_t rtx0     = tcp_counter(p.dev, "retransmits");
    fill_pattern(src, BIG, 2);
    sg    = mk_sge(src, BIG, hca_mr_lkey(smr));
    wr    = mk_wr(HCA_WR_RDMA_WRITE, &sg, 1, HCA_SEND_SIGNALED, 2,
                  (uint64_t)(uintptr_t)dst, hca_mr_rkey(dmr));
    ASSERT_EQ(0, post_retry(pqp, &wr));
    ASSERT_TRUE(wait_ok(pcq, 2, HCA_WC_RDMA_WRITE));
    EXPECT_EQ(-1, check_pattern(dst, BIG, 2));
    EXPECT_EQ(striped0 + 1, tcp_counter(p.dev, "striped_writes"))
        << "the WRITE did not stripe over the two paths";
    EXPECT_EQ(rtx0, tcp_counter(p.dev, "retransmits"))
        << "parts sent again: the paths' records at the target differ";
}

} // namespace
} // namespace hcat
