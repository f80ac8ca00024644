/*
 * test_common.cc - the definitions of the helpers and fixtures declared in
 * test_common.h (see there for what they are).  They live here, compiled
 * once, rather than in the header that every test file includes.
 */
#include "test_common.h"

std::ostream &operator<<(std::ostream &os, hca_wc_opcode_t o)
{
    static const char *names[] = {"WC_SEND", "WC_RDMA_WRITE", "WC_RDMA_READ",
                                  "WC_ATOMIC", "WC_RECV",
                                  "WC_RECV_RDMA_WITH_IMM"};
    if ((unsigned)o < sizeof(names) / sizeof(names[0])) {
        return os << names[o];
    }
    return os << "WC_OPCODE(" << (int)o << ")";
}


namespace hcat {

std::string wc_str(const hca_wc_t &wc)
{
    std::ostringstream os;
    os << "{wr_id=" << wc.wr_id << " status=" << wc.status
       << " opcode=" << wc.opcode << " byte_len=" << wc.byte_len
       << " imm=0x" << std::hex << wc.imm_data << std::dec
       << " qp_num=" << wc.qp_num << " src_qp=" << wc.src_qp
       << " wc_flags=" << wc.wc_flags << " vendor_err=" << wc.vendor_err
       << "}";
    return os.str();
}

uint64_t pattern_word(uint64_t seed, uint64_t k)
{
    uint64_t x = (k + 1) * 0x9E3779B97F4A7C15ull ^
                 (seed * 0xD1B54A32D192ED03ull + 0x632BE59BD9B4E019ull);
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 32;
    /* flip the low bit of every byte equal to a sentinel (exact zero-byte
     * detection of x ^ sentinel) */
    const uint64_t lo7 = 0x7F7F7F7F7F7F7F7Full;
    uint64_t v1 = x ^ 0xA5A5A5A5A5A5A5A5ull;
    uint64_t v2 = x ^ 0x5A5A5A5A5A5A5A5Aull;
    uint64_t z1 = ~(((v1 & lo7) + lo7) | v1 | lo7);
    uint64_t z2 = ~(((v2 & lo7) + lo7) | v2 | lo7);
    return x ^ ((z1 | z2) >> 7);
}

void fill_pattern(void *p, size_t len, uint64_t seed)
{
    uint8_t *b = (uint8_t*)p;
    size_t k = 0;
    for (; k + 8 <= len; k += 8) {
        uint64_t w = pattern_word(seed, k >> 3);
        memcpy(b + k, &w, 8);
    }
    if (k < len) {
        uint64_t w = pattern_word(seed, k >> 3);
        memcpy(b + k, &w, len - k);
    }
}

int64_t first_diff(const uint8_t *b, size_t k, size_t n, uint64_t w)
{
    const uint8_t *e = (const uint8_t*)&w;
    for (size_t j = 0; j < n; ++j) {
        if (b[k + j] != e[j]) {
            return (int64_t)(k + j);
        }
    }
    return -1;
}

int64_t check_pattern(const void *p, size_t len, uint64_t seed)
{
    const uint8_t *b = (const uint8_t*)p;
    size_t k         = 0;
    for (; k + 8 <= len; k += 8) {
        uint64_t w = pattern_word(seed, k >> 3), v;
        memcpy(&v, b + k, 8);
        if (v != w) {
            return first_diff(b, k, 8, w);
        }
    }
    if (k < len) {
        return first_diff(b, k, len - k, pattern_word(seed, k >> 3));
    }
    return -1;
}

int64_t check_byte(const void *p, size_t len, uint8_t v)
{
    const uint8_t *b = (const uint8_t*)p;
    uint64_t w;
    memset(&w, v, sizeof(w));
    size_t k = 0;
    for (; k + 8 <= len; k += 8) {
        uint64_t x;
        memcpy(&x, b + k, 8);
        if (x != w) {
            return first_diff(b, k, 8, w);
        }
    }
    return (k < len) ? first_diff(b, k, len - k, w) : -1;
}

void do_fill(void *p, size_t len, fillspec f)
{
    if (f.byte >= 0) {
        memset(p, f.byte, len);
    } else {
        fill_pattern(p, len, f.seed);
    }
}

std::string dev_name()
{
    const char *env = getenv("HCA_TEST_DEVICE");
    if (env && *env) {
        return env;
    }
    char names[16][HCA_DEVNAME_MAX];
    memset(names, 0, sizeof(names));
    int n = hca_get_device_list(names, 16);
    if (n <= 0) {
        return "hca0";
    }
    names[0][HCA_DEVNAME_MAX - 1] = '\0';
    return names[0];
}

const char *fabric_name(hca_fabric_type_t f)
{
    switch (f) {
    case HCA_FABRIC_SHM:
        return "Shm";
    case HCA_FABRIC_TCP:
        return "Tcp";
    default:
        return "UnknownFabric";
    }
}

int open_device_for(hca_fabric_type_t fabric, unsigned flags,
                    hca_device_t **dev)
{
    hca_open_attr_t attr = {};

    attr.flags = flags;
    switch (fabric) {
    case HCA_FABRIC_SHM:
        attr.fabric = HCA_FABRIC_MODE_SHM;
        return hca_device_open_attr(dev_name().c_str(), &attr, dev);
    case HCA_FABRIC_TCP:
        attr.fabric      = HCA_FABRIC_MODE_TCP;
        /* loopback, or the paths a test sets (127.0.0.1,127.0.0.2) */
        attr.net_devices = (getenv("HCA_NET_DEVICES") != nullptr) ?
                           getenv("HCA_NET_DEVICES") : "lo";
        return hca_device_open_attr(dev_name().c_str(), &attr, dev);
    default:
        *dev = nullptr;
        return -ENOTSUP;
    }
}

int cqw::poll_once()
{
    if (cq == nullptr) {
        return 0;
    }
    hca_wc_t wc[32];
    int n = hca_cq_poll(cq, 32, wc);
    if (n < 0) {
        err = n;
        return n;
    }
    for (int i = 0; i < n; ++i) {
        q.push_back(wc[i]);
    }
    return n;
}

bool cqw::pop(hca_wc_t *wc)
{
    if (q.empty()) {
        return false;
    }
    *wc = q.front();
    q.pop_front();
    return true;
}

int progress_all()
{
    int total = 0;
    auto &r   = cq_registry();
    for (size_t i = 0; i < r.size(); ++i) {
        int n = r[i]->poll_once();
        if (n > 0) {
            total += n;
        }
    }
    return total;
}

::testing::AssertionResult wait_wc(cqw *c, hca_wc_t *wc,
                                   int timeout_ms)
{
    double end = now_ms() + timeout_ms;
    for (;;) {
        if (c->pop(wc)) {
            return ::testing::AssertionSuccess();
        }
        if (c->err != 0) {
            return ::testing::AssertionFailure()
                   << "hca_cq_poll returned " << c->err;
        }
        if (now_ms() > end) {
            return ::testing::AssertionFailure()
                   << "timeout (" << timeout_ms
                   << " ms) waiting for a completion";
        }
        if (progress_all() == 0) {
            sched_yield();
        }
    }
}

::testing::AssertionResult wait_wcs(cqw *c, size_t n,
                                    std::vector<hca_wc_t> *out,
                                    int timeout_ms)
{
    double end = now_ms() + timeout_ms;
    while (out->size() < n) {
        hca_wc_t wc;
        if (c->pop(&wc)) {
            out->push_back(wc);
            continue;
        }
        if (c->err != 0) {
            return ::testing::AssertionFailure()
                   << "hca_cq_poll returned " << c->err << " after "
                   << out->size() << " of " << n << " completions";
        }
        if (now_ms() > end) {
            return ::testing::AssertionFailure()
                   << "timeout (" << timeout_ms << " ms): got "
                   << out->size() << " of " << n << " completions";
        }
        if (progress_all() == 0) {
            sched_yield();
        }
    }
    return ::testing::AssertionSuccess();
}

::testing::AssertionResult wait_ok(cqw *c, uint64_t wr_id,
                                   hca_wc_opcode_t opcode,
                                   hca_wc_t *out,
                                   int timeout_ms)
{
    hca_wc_t wc;
    ::testing::AssertionResult r = wait_wc(c, &wc, timeout_ms);
    if (!r) {
        return r;
    }
    if (out != nullptr) {
        *out = wc;
    }
    if ((wc.status != HCA_WC_SUCCESS) || (wc.wr_id != wr_id) ||
        (wc.opcode != opcode)) {
        return ::testing::AssertionFailure()
               << "unexpected completion " << wc_str(wc) << ", expected wr_id "
               << wr_id << " opcode " << opcode << " status SUCCESS";
    }
    return ::testing::AssertionSuccess();
}

::testing::AssertionResult wait_status(cqw *c, uint64_t wr_id,
                                       hca_wc_status_t st,
                                       hca_wc_t *out,
                                       int timeout_ms)
{
    hca_wc_t wc;
    ::testing::AssertionResult r = wait_wc(c, &wc, timeout_ms);
    if (!r) {
        return r;
    }
    if (out != nullptr) {
        *out = wc;
    }
    if ((wc.status != st) || (wc.wr_id != wr_id)) {
        return ::testing::AssertionFailure()
               << "unexpected completion " << wc_str(wc) << ", expected wr_id "
               << wr_id << " status " << st;
    }
    return ::testing::AssertionSuccess();
}

::testing::AssertionResult expect_no_wc(cqw *c, int ms)
{
    double end = now_ms() + ms;
    while (now_ms() < end) {
        progress_all();
        hca_wc_t wc;
        if (c->pop(&wc)) {
            return ::testing::AssertionFailure()
                   << "unexpected completion " << wc_str(wc);
        }
        sched_yield();
    }
    return ::testing::AssertionSuccess();
}

int qp_to_init(hca_qp_t *qp, unsigned access)
{
    hca_qp_attr_t a;
    memset(&a, 0, sizeof(a));
    a.qp_state = HCA_QPS_INIT;
    a.access   = access;
    return hca_qp_modify(qp, &a, HCA_QP_ATTR_STATE | HCA_QP_ATTR_ACCESS);
}

int qp_to_rtr(hca_qp_t *qp, const hca_port_addr_t &dest,
              uint32_t dest_qpn)
{
    hca_qp_attr_t a;
    memset(&a, 0, sizeof(a));
    a.qp_state    = HCA_QPS_RTR;
    a.dest        = dest;
    a.dest_qp_num = dest_qpn;
    return hca_qp_modify(qp, &a, HCA_QP_ATTR_STATE | HCA_QP_ATTR_DEST);
}

int connect_qp(hca_qp_t *qp, const hca_port_addr_t &dest,
               uint32_t dest_qpn, unsigned access)
{
    int rc = qp_to_init(qp, access);
    if (rc == 0) {
        rc = qp_to_rtr(qp, dest, dest_qpn);
    }
    if (rc == 0) {
        rc = qp_to_rts(qp);
    }
    return rc;
}

hca_sge_t mk_sge(const void *addr, size_t len, uint32_t lkey)
{
    hca_sge_t s;
    s.addr   = (uint64_t)(uintptr_t)addr;
    s.length = (uint32_t)len;
    s.lkey   = lkey;
    return s;
}

hca_send_wr_t mk_wr(hca_wr_opcode_t op, hca_sge_t *sg, int nsge,
                    unsigned flags,
                    uint64_t wr_id, uint64_t raddr,
                    uint32_t rkey)
{
    hca_send_wr_t wr;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id            = wr_id;
    wr.next             = nullptr;
    wr.sg_list          = sg;
    wr.num_sge          = nsge;
    wr.opcode           = op;
    wr.send_flags       = flags;
    wr.rdma.remote_addr = raddr;
    wr.rdma.rkey        = rkey;
    return wr;
}

int post_retry(hca_qp_t *qp, hca_send_wr_t *wr,
               int timeout_ms)
{
    double end          = now_ms() + timeout_ms;
    hca_send_wr_t *cur  = wr;
    for (;;) {
        hca_send_wr_t *bad = nullptr;
        int rc             = hca_post_send(qp, cur, &bad);
        if (rc == 0) {
            return 0;
        }
        if ((rc != -EAGAIN) && (rc != -ENOMEM)) {
            return rc;
        }
        if (bad != nullptr) {
            cur = bad;
        }
        if (now_ms() > end) {
            return rc;
        }
        if (progress_all() == 0) {
            sched_yield();
        }
    }
}

int post_recv1(hca_qp_t *qp, const void *addr, size_t len,
               uint32_t lkey, uint64_t wr_id, int nsge)
{
    hca_sge_t s      = mk_sge(addr, len, lkey);
    hca_recv_wr_t wr;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id         = wr_id;
    wr.sg_list       = (nsge > 0) ? &s : nullptr;
    wr.num_sge       = nsge;
    hca_recv_wr_t *bad = nullptr;
    return hca_post_recv(qp, &wr, &bad);
}

int post_srq_recv1(hca_srq_t *srq, const void *addr, size_t len,
                   uint32_t lkey, uint64_t wr_id)
{
    hca_sge_t s      = mk_sge(addr, len, lkey);
    hca_recv_wr_t wr;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id         = wr_id;
    wr.sg_list       = &s;
    wr.num_sge       = 1;
    hca_recv_wr_t *bad = nullptr;
    return hca_post_srq_recv(srq, &wr, &bad);
}

::testing::AssertionResult ctx::open(unsigned fl,
                                     hca_fabric_type_t fab)
{
    flags       = fl;
    fabric      = fab;
    int rc      = open_device_for(fab, fl, &dev);
    if ((rc != 0) || (dev == nullptr)) {
        dev = nullptr;
        return ::testing::AssertionFailure()
               << "hca_device_open(" << dev_name() << ", " << fl
               << ") for fabric " << fabric_name(fab) << " = " << rc;
    }
    rc = hca_device_query(dev, &attr);
    if (rc != 0) {
        return ::testing::AssertionFailure()
               << "hca_device_query = " << rc;
    }
    hca_port_attr_t pa;
    rc = hca_port_query(dev, 1, &pa);
    if (rc != 0) {
        return ::testing::AssertionFailure()
               << "hca_port_query = " << rc;
    }
    if (pa.fabric != fab) {
        return ::testing::AssertionFailure()
               << "opened for fabric " << fabric_name(fab)
               << ", the port is on " << fabric_name(pa.fabric);
    }
    hca_port_address(dev, &addr);
    return ::testing::AssertionSuccess();
}

void ctx::close()
{
    for (auto *qp : qps) {
        EXPECT_EQ(0, hca_qp_destroy(qp)) << "hca_qp_destroy";
    }
    qps.clear();
    for (auto *srq : srqs) {
        EXPECT_EQ(0, hca_srq_destroy(srq)) << "hca_srq_destroy";
    }
    srqs.clear();
    for (auto &c : cqs) {
        cq_unregister(c.get());
        if (c->cq != nullptr) {
            EXPECT_EQ(0, hca_cq_destroy(c->cq)) << "hca_cq_destroy";
        }
    }
    cqs.clear();
    for (auto *mr : mrs) {
        EXPECT_EQ(0, hca_mr_dereg(mr)) << "hca_mr_dereg";
    }
    mrs.clear();
    for (auto *pd : pds) {
        EXPECT_EQ(0, hca_pd_dealloc(pd)) << "hca_pd_dealloc";
    }
    pds.clear();
    for (auto &b : bufs) {
        if (b.dm != nullptr) {
            EXPECT_EQ(0, hca_dm_free(b.dm)) << "hca_dm_free";
        } else {
            free(b.p);
        }
    }
    bufs.clear();
    if (dev != nullptr) {
        EXPECT_EQ(0, hca_device_close(dev)) << "hca_device_close";
        dev = nullptr;
    }
}

qp_caps ctx::caps(uint32_t depth) const
{
    qp_caps c;
    c.send_wr     = std::min<uint32_t>(depth, attr.max_qp_wr);
    c.recv_wr     = std::min<uint32_t>(depth, attr.max_qp_wr);
    c.send_sge    = std::min<uint32_t>(4, attr.max_sge);
    c.recv_sge    = std::min<uint32_t>(4, attr.max_sge);
    c.inline_data = std::min<uint32_t>(64, attr.max_inline_data);
    return c;
}

hca_pd_t *ctx::new_pd()
{
    hca_pd_t *pd = nullptr;
    int rc       = hca_pd_alloc(dev, &pd);
    if ((rc != 0) || (pd == nullptr)) {
        ADD_FAILURE() << "hca_pd_alloc = " << rc;
        return nullptr;
    }
    pds.push_back(pd);
    return pd;
}

cqw *ctx::new_cq(int cqe, bool reg)
{
    std::unique_ptr<cqw> c(new cqw);
    int rc = hca_cq_create(dev, cqe, &c->cq);
    if ((rc != 0) || (c->cq == nullptr)) {
        ADD_FAILURE() << "hca_cq_create(" << cqe << ") = " << rc;
        return nullptr;
    }
    cqw *raw = c.get();
    cqs.push_back(std::move(c));
    if (reg) {
        cq_registry().push_back(raw);
    }
    return raw;
}

int ctx::destroy_cq(cqw *c)
{
    cq_unregister(c);
    int rc = hca_cq_destroy(c->cq);
    if (rc == 0) {
        for (auto it = cqs.begin(); it != cqs.end(); ++it) {
            if (it->get() == c) {
                cqs.erase(it);
                break;
            }
        }
    } else {
        cq_registry().push_back(c);
    }
    return rc;
}

hca_qp_t *ctx::new_qp(hca_pd_t *pd, cqw *scq, cqw *rcq, const qp_caps &cp,
                      hca_srq_t *srq)
{
    hca_qp_init_attr_t ia;
    memset(&ia, 0, sizeof(ia));
    ia.send_cq         = scq ? scq->cq : nullptr;
    ia.recv_cq         = rcq ? rcq->cq : nullptr;
    ia.srq             = srq;
    ia.max_send_wr     = cp.send_wr;
    ia.max_recv_wr     = cp.recv_wr;
    ia.max_send_sge    = cp.send_sge;
    ia.max_recv_sge    = cp.recv_sge;
    ia.max_inline_data = cp.inline_data;
    ia.sq_sig_all      = cp.sig_all;
    ia.quiet_flush     = cp.quiet_flush;
    hca_qp_t *qp       = nullptr;
    int rc             = hca_qp_create(pd, &ia, &qp);
    if ((rc != 0) || (qp == nullptr)) {
        ADD_FAILURE() << "hca_qp_create = " << rc;
        return nullptr;
    }
    qps.push_back(qp);
    return qp;
}

int ctx::destroy_qp(hca_qp_t *qp)
{
    int rc = hca_qp_destroy(qp);
    if (rc == 0) {
        qps.erase(std::remove(qps.begin(), qps.end(), qp), qps.end());
    }
    return rc;
}

hca_srq_t *ctx::new_srq(hca_pd_t *pd, uint32_t max_wr, uint32_t max_sge)
{
    hca_srq_init_attr_t ia;
    ia.max_wr      = max_wr;
    ia.max_sge     = max_sge;
    hca_srq_t *srq = nullptr;
    int rc         = hca_srq_create(pd, &ia, &srq);
    if ((rc != 0) || (srq == nullptr)) {
        ADD_FAILURE() << "hca_srq_create(" << max_wr << ") = " << rc;
        return nullptr;
    }
    srqs.push_back(srq);
    return srq;
}

hca_mr_t *ctx::reg(hca_pd_t *pd, void *p, size_t len, unsigned access)
{
    hca_mr_t *mr = nullptr;
    int rc       = hca_mr_reg(pd, p, len, access, &mr);
    if ((rc != 0) || (mr == nullptr)) {
        ADD_FAILURE() << "hca_mr_reg(" << p << ", " << len << ", 0x"
                      << std::hex << access << std::dec << ") = " << rc;
        return nullptr;
    }
    mrs.push_back(mr);
    return mr;
}

int ctx::dereg(hca_mr_t *mr)
{
    int rc = hca_mr_dereg(mr);
    if (rc == 0) {
        forget(mr);
    }
    return rc;
}

uint8_t *ctx::alloc(mem_kind_t kind, size_t len)
{
    buf_t b = {nullptr, len, nullptr};
    if (kind == MEM_DM) {
        int rc = hca_dm_alloc(dev, len, &b.dm);
        if ((rc != 0) || (b.dm == nullptr)) {
            alloc_err = rc ? rc : -ENOMEM;
            return nullptr;
        }
        b.p = (uint8_t*)hca_dm_addr(b.dm);
        if (b.p == nullptr) {
            alloc_err = -EFAULT;
            hca_dm_free(b.dm);
            return nullptr;
        }
    } else {
        b.p = (uint8_t*)malloc(len ? len : 1);
        if (b.p == nullptr) {
            alloc_err = -ENOMEM;
            return nullptr;
        }
    }
    bufs.push_back(b);
    return b.p;
}

bool write_all(int fd, const void *p, size_t len)
{
    const uint8_t *b = (const uint8_t*)p;
    while (len > 0) {
        ssize_t n = write(fd, b, len);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            return false;
        }
        b   += n;
        len -= (size_t)n;
    }
    return true;
}

bool read_all(int fd, void *p, size_t len, int timeout_ms)
{
    uint8_t *b = (uint8_t*)p;
    double end = now_ms() + timeout_ms;
    while (len > 0) {
        int left = (int)(end - now_ms());
        if (left < 0) {
            return false;
        }
        struct pollfd pfd = {fd, POLLIN, 0};
        int r             = poll(&pfd, 1, left);
        if (r < 0) {
            if (errno == EINTR) {
                continue;
            }
            return false;
        }
        if (r == 0) {
            return false;
        }
        ssize_t n = read(fd, b, len);
        if (n < 0) {
            if ((errno == EINTR) || (errno == EAGAIN)) {
                continue;
            }
            return false;
        }
        if (n == 0) {
            return false;
        }
        b   += n;
        len -= (size_t)n;
    }
    return true;
}

::testing::AssertionResult expect_token(int fd, uint32_t tok,
                                        int timeout_ms)
{
    uint32_t got = 0;
    if (!recv_msg(fd, &got, timeout_ms)) {
        return ::testing::AssertionFailure()
               << "no message from the peer (expected token 0x" << std::hex
               << tok << ") within " << std::dec << timeout_ms << " ms";
    }
    if (got != tok) {
        return ::testing::AssertionFailure()
               << "got token 0x" << std::hex << got << " expected 0x" << tok;
    }
    return ::testing::AssertionSuccess();
}

child_t *fork_child(const std::function<void(int rfd, int wfd)> &body,
                    unsigned watchdog_s)
{
    int p2c[2], c2p[2];
    if (pipe2(p2c, O_CLOEXEC) != 0) {
        ADD_FAILURE() << "pipe2: " << strerror(errno);
        return nullptr;
    }
    if (pipe2(c2p, O_CLOEXEC) != 0) {
        ADD_FAILURE() << "pipe2: " << strerror(errno);
        close(p2c[0]);
        close(p2c[1]);
        return nullptr;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t parent = getpid();
    pid_t pid    = fork();
    if (pid < 0) {
        ADD_FAILURE() << "fork: " << strerror(errno);
        close(p2c[0]);
        close(p2c[1]);
        close(c2p[0]);
        close(c2p[1]);
        return nullptr;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) {
            _exit(98);
        }
        close(p2c[1]);
        close(c2p[0]);
        /* the pipes of the other children are not ours: close them so that
         * those children see EOF when the parent goes away */
        for (auto &c : child_registry()) {
            if (c->rfd >= 0) {
                close(c->rfd);
            }
            if (c->wfd >= 0) {
                close(c->wfd);
            }
            c->pid = -1;
        }
        for (auto &c : child_registry()) {
            c.release();   /* not ours; never delete what we do not own */
        }
        child_registry().clear();
        cq_registry().clear();
        in_child() = true;
        signal(SIGPIPE, SIG_IGN);
        signal(SIGALRM, SIG_DFL);
        alarm(watchdog_s);

        const ::testing::TestResult *res = current_result();
        int n0 = res ? res->total_part_count() : 0;
        body(p2c[0], c2p[1]);
        int failed = 0;
        if (res != nullptr) {
            for (int i = n0; i < res->total_part_count(); ++i) {
                if (res->GetTestPartResult(i).failed()) {
                    failed = 1;
                }
            }
        }
        if (failed) {
            fprintf(stderr, "[child %d] failed\n", (int)getpid());
        }
        fflush(stdout);
        fflush(stderr);
        _exit(failed);
    }
    close(p2c[0]);
    close(c2p[1]);
    std::unique_ptr<child_t> c(new child_t);
    c->pid      = pid;
    c->rfd      = c2p[0];
    c->wfd      = p2c[1];
    child_t *raw = c.get();
    child_registry().push_back(std::move(c));
    return raw;
}

::testing::AssertionResult wait_child(child_t *c,
                                      int timeout_ms)
{
    if (c == nullptr) {
        return ::testing::AssertionFailure() << "no child";
    }
    if (!c->reaped) {
        double end = now_ms() + timeout_ms;
        for (;;) {
            int st    = 0;
            pid_t r   = waitpid(c->pid, &st, WNOHANG);
            if (r == c->pid) {
                c->reaped = true;
                c->status = st;
                break;
            }
            if ((r < 0) && (errno != EINTR)) {
                return ::testing::AssertionFailure()
                       << "waitpid(" << c->pid << "): " << strerror(errno);
            }
            if (now_ms() > end) {
                kill(c->pid, SIGKILL);
                waitpid(c->pid, &st, 0);
                c->reaped = true;
                c->status = st;
                return ::testing::AssertionFailure()
                       << "child " << c->pid << " did not exit within "
                       << timeout_ms << " ms (killed)";
            }
            sleep_ms(1);
        }
    }
    if (WIFEXITED(c->status) && (WEXITSTATUS(c->status) == 0)) {
        return ::testing::AssertionSuccess();
    }
    if (WIFEXITED(c->status)) {
        return ::testing::AssertionFailure()
               << "child " << c->pid << " exited with status "
               << WEXITSTATUS(c->status)
               << " (its failures are reported above)";
    }
    if (WIFSIGNALED(c->status)) {
        return ::testing::AssertionFailure()
               << "child " << c->pid << " killed by signal "
               << WTERMSIG(c->status)
               << (WTERMSIG(c->status) == SIGALRM ? " (watchdog)" : "");
    }
    return ::testing::AssertionFailure() << "child " << c->pid << " status "
                                         << c->status;
}

void kill_child(child_t *c)
{
    if ((c != nullptr) && !c->reaped && (c->pid > 0)) {
        int st = 0;
        kill(c->pid, SIGKILL);
        waitpid(c->pid, &st, 0);
        c->reaped = true;
        c->status = st;
    }
}

void close_child_fds(child_t *c)
{
    if (c->rfd >= 0) {
        close(c->rfd);
        c->rfd = -1;
    }
    if (c->wfd >= 0) {
        close(c->wfd);
        c->wfd = -1;
    }
}

bool reap_all_children()
{
    bool signaled = false;
    for (auto &c : child_registry()) {
        kill_child(c.get());
        close_child_fds(c.get());
        if (c->reaped && WIFSIGNALED(c->status)) {
            signaled = true;
        }
    }
    child_registry().clear();
    return signaled;
}

std::vector<std::string> shm_entries_of(pid_t pid)
{
    std::vector<std::string> out;
    DIR *d = opendir("/dev/shm");
    if (d == nullptr) {
        return out;
    }
    std::string pids = std::to_string((long)pid);
    while (struct dirent *e = readdir(d)) {
        std::string n = e->d_name;
        if (n.compare(0, 4, "hca.") != 0) {
            continue;
        }
        size_t a = n.find('.', 4);           /* end of <pidns> */
        if (a == std::string::npos) {
            continue;
        }
        size_t b = n.find('.', a + 1);       /* end of <pid> */
        if (b == std::string::npos) {
            continue;
        }
        if (n.substr(a + 1, b - a - 1) == pids) {
            out.push_back(n);
        }
    }
    closedir(d);
    return out;
}

std::string join(const std::vector<std::string> &v)
{
    std::string s;
    for (auto &x : v) {
        s += (s.empty() ? "" : " ") + x;
    }
    return s;
}

std::string rseq_str(const recv_seq_result &r)
{
    static const char *kinds[] = {"ok", "error completion", "out of order",
                                  "wrong byte_len", "payload mismatch",
                                  "timeout", "post_recv failed"};
    std::ostringstream os;
    os << "received " << r.received << " in order, "
       << (r.bad_kind < 7 ? kinds[r.bad_kind] : "?") << ": expected seq "
       << r.expected_seq << " got " << r.got_seq << " detail " << r.detail
       << ", extra " << r.extra;
    return os.str();
}

int local_target::pd()
{
    hca_pd_t *p = c.new_pd();
    if (p == nullptr) {
        return -ENOMEM;
    }
    pds.push_back(p);
    return (int)pds.size() - 1;
}

int local_target::qp(int pd, uint32_t *qpn, uint32_t depth)
{
    if ((pd < 0) || (pd >= (int)pds.size())) {
        return -EINVAL;
    }
    tqp t;
    t.scq = c.new_cq(2 * depth + 16);
    t.rcq = c.new_cq(2 * depth + 16);
    if ((t.scq == nullptr) || (t.rcq == nullptr)) {
        return -ENOMEM;
    }
    t.qp = c.new_qp(pds[pd], t.scq, t.rcq, c.caps(depth));
    if (t.qp == nullptr) {
        return -ENOMEM;
    }
    *qpn = hca_qp_num(t.qp);
    qps.push_back(t);
    return (int)qps.size() - 1;
}

int local_target::destroy_qp(int q)
{
    if (!valid_qp(q)) {
        return -EINVAL;
    }
    int rc = c.destroy_qp(qps[q].qp);
    if (rc == 0) {
        qps[q].qp = nullptr;
    }
    return rc;
}

int local_target::buf(mem_kind_t kind, size_t len, uint64_t *addr)
{
    uint8_t *p = c.alloc(kind, len);
    if (p == nullptr) {
        return c.alloc_err ? c.alloc_err : -ENOMEM;
    }
    buf_t b = {p, len, nullptr};
    bufs.push_back(b);
    *addr = (uint64_t)(uintptr_t)p;
    return (int)bufs.size() - 1;
}

int local_target::mr(int p, int b, size_t off, size_t len, unsigned access,
                     uint32_t *rkey)
{
    if ((p < 0) || (p >= (int)pds.size()) || !valid_range(b, off, len)) {
        return -EINVAL;
    }
    hca_mr_t *m = nullptr;
    int rc      = hca_mr_reg(pds[p], bufs[b].p + off, len, access, &m);
    if (rc != 0) {
        return (rc < 0) ? rc : -EINVAL;
    }
    c.mrs.push_back(m);
    mrs.push_back(m);
    *rkey = hca_mr_rkey(m);
    return (int)mrs.size() - 1;
}

int local_target::dereg(int m)
{
    if ((m < 0) || (m >= (int)mrs.size()) || (mrs[m] == nullptr)) {
        return -EINVAL;
    }
    int rc = c.dereg(mrs[m]);
    if (rc == 0) {
        mrs[m] = nullptr;
    }
    return rc;
}

int local_target::fill(int b, size_t off, size_t len, fillspec f)
{
    if (!valid_range(b, off, len)) {
        return -EINVAL;
    }
    do_fill(bufs[b].p + off, len, f);
    return 0;
}

int local_target::read(int b, size_t off, void *p, size_t len)
{
    if (!valid_range(b, off, len)) {
        return -EINVAL;
    }
    memcpy(p, bufs[b].p + off, len);
    return 0;
}

int local_target::write(int b, size_t off, const void *p, size_t len)
{
    if (!valid_range(b, off, len)) {
        return -EINVAL;
    }
    memcpy(bufs[b].p + off, p, len);
    return 0;
}

int local_target::post_recv(int q, int m, int b, size_t off, size_t len,
                            uint64_t wr_id, int count, size_t stride)
{
    if (!valid_qp(q)) {
        return -EINVAL;
    }
    for (int i = 0; i < count; ++i) {
        int rc;
        if (m < 0) {
            rc = post_recv1(qps[q].qp, nullptr, 0, 0, wr_id + i, 0);
        } else {
            if ((m >= (int)mrs.size()) || (mrs[m] == nullptr) ||
                !valid_range(b, off + i * stride, len)) {
                return -EINVAL;
            }
            rc = post_recv1(qps[q].qp, bufs[b].p + off + i * stride, len,
                            hca_mr_lkey(mrs[m]), wr_id + i, 1);
        }
        if (rc != 0) {
            return rc;
        }
    }
    return 0;
}

int local_target::poll_recv(int q, int n, std::vector<hca_wc_t> *wcs,
                            int timeout_ms)
{
    if (!valid_qp(q)) {
        return -EINVAL;
    }
    double end = now_ms() + timeout_ms;
    int got    = 0;
    while (got < n) {
        hca_wc_t wc;
        if (qps[q].rcq->pop(&wc)) {
            wcs->push_back(wc);
            ++got;
            continue;
        }
        if (qps[q].rcq->err != 0) {
            return qps[q].rcq->err;
        }
        if (now_ms() > end) {
            break;
        }
        if (progress_all() == 0) {
            sched_yield();
        }
    }
    return got;
}

int local_target::recv_seq_start(int q, int b, int m, size_t slot,
                                 uint64_t count, uint32_t window)
{
    if (!valid_qp(q) || (m < 0) || (m >= (int)mrs.size()) ||
        !valid_range(b, 0, slot * window) || (slot < 8)) {
        return -EINVAL;
    }
    memset(&rs.res, 0, sizeof(rs.res));
    rs.qp     = q;
    rs.buf    = b;
    rs.mr     = m;
    rs.slot   = slot;
    rs.count  = count;
    rs.window = window;
    int rc    = post_recv(q, m, b, 0, slot, 0, (int)window, slot);
    if (rc != 0) {
        return rc;
    }
    rs.active = true;
    return 0;
}

void local_target::pump()
{
    if (!rs.active) {
        return;
    }
    progress_all();
    recv_seq_result &r = rs.res;
    hca_wc_t wc;
    while (qps[rs.qp].rcq->pop(&wc)) {
        if (r.bad_kind != RSEQ_OK) {
            continue;
        }
        if (r.received >= rs.count) {
            r.extra++;
            continue;
        }
        r.expected_seq = r.received;
        if (wc.status != HCA_WC_SUCCESS) {
            r.bad_kind = RSEQ_STATUS;
            r.detail   = wc.status;
            continue;
        }
        uint64_t slot = wc.wr_id;
        if (slot >= rs.window) {
            r.bad_kind = RSEQ_SEQ;
            r.detail   = slot;
            continue;
        }
        const uint8_t *p = bufs[rs.buf].p + slot * rs.slot;
        uint64_t seq;
        memcpy(&seq, p, 8);
        r.got_seq = seq;
        if (seq != r.received) {
            r.bad_kind = RSEQ_SEQ;
            continue;
        }
        size_t len = seq_msg_len(seq, rs.slot);
        if (wc.byte_len != len) {
            r.bad_kind = RSEQ_LEN;
            r.detail   = wc.byte_len;
            continue;
        }
        int64_t bad = check_pattern(p + 8, len - 8, seq);
        if (bad >= 0) {
            r.bad_kind = RSEQ_DATA;
            r.detail   = (uint64_t)bad + 8;
            continue;
        }
        r.received++;
        int rc = post_recv(rs.qp, rs.mr, rs.buf, slot * rs.slot, rs.slot,
                           slot, 1, 0);
        if (rc != 0) {
            r.bad_kind = RSEQ_POST;
            r.detail   = (uint64_t)-rc;
        }
    }
}

int local_target::recv_seq_finish(recv_seq_result *res, int timeout_ms)
{
    if (!rs.active) {
        return -EINVAL;
    }
    double end = now_ms() + timeout_ms;
    while ((rs.res.received < rs.count) && (rs.res.bad_kind == RSEQ_OK)) {
        if (now_ms() > end) {
            rs.res.bad_kind     = RSEQ_TIMEOUT;
            rs.res.expected_seq = rs.res.received;
            break;
        }
        pump();
        sched_yield();
    }
    /* nothing beyond count may arrive */
    double tail = now_ms() + 50;
    while (now_ms() < tail) {
        pump();
    }
    rs.active = false;
    *res      = rs.res;
    return 0;
}

void target_server(int rfd, int wfd, unsigned flags,
                   hca_fabric_type_t fab)
{
    local_target t;
    rpc_hello h;
    memset(&h, 0, sizeof(h));
    ::testing::AssertionResult ok = t.open(flags, fab);
    h.rc   = ok ? 0 : -1;
    h.addr = t.c.addr;
    h.attr = t.c.attr;
    if (!send_msg(wfd, h) || !ok) {
        EXPECT_TRUE(ok);
        return;
    }
    for (;;) {
        rpc_cmd cmd;
        if (!recv_msg(rfd, &cmd, 120000)) {
            return;   /* parent gone */
        }
        rpc_reply r;
        memset(&r, 0, sizeof(r));
        std::vector<hca_wc_t> wcs;
        const int64_t *a = cmd.a;
        switch (cmd.op) {
        case RPC_PD:
            r.rc = t.pd();
            break;
        case RPC_QP: {
            uint32_t qpn = 0;
            r.rc         = t.qp((int)a[0], &qpn, (uint32_t)a[1]);
            r.v[0]       = qpn;
            break;
        }
        case RPC_CONNECT:
            r.rc = t.connect((int)a[0], cmd.addr, (uint32_t)a[1],
                             (unsigned)a[2]);
            break;
        case RPC_DESTROY_QP:
            r.rc = t.destroy_qp((int)a[0]);
            break;
        case RPC_QP_STATE:
            r.rc = t.qp_state((int)a[0]);
            break;
        case RPC_BUF: {
            uint64_t addr = 0;
            r.rc          = t.buf((mem_kind_t)a[0], (size_t)a[1], &addr);
            r.v[0]        = (int64_t)addr;
            break;
        }
        case RPC_MR: {
            uint32_t rkey = 0;
            r.rc   = t.mr((int)a[0], (int)a[1], (size_t)a[2], (size_t)a[3],
                          (unsigned)a[4], &rkey);
            r.v[0] = rkey;
            break;
        }
        case RPC_DEREG:
            r.rc = t.dereg((int)a[0]);
            break;
        case RPC_FILL: {
            fillspec f = {(int)a[3], (uint64_t)a[4]};
            r.rc       = t.fill((int)a[0], (size_t)a[1], (size_t)a[2], f);
            break;
        }
        case RPC_CHECK: {
            fillspec f = {(int)a[3], (uint64_t)a[4]};
            r.rc       = t.check((int)a[0], (size_t)a[1], (size_t)a[2], f);
            break;
        }
        case RPC_READ:
            r.rc = (a[2] > 64) ? -EINVAL
                               : t.read((int)a[0], (size_t)a[1], r.data,
                                        (size_t)a[2]);
            break;
        case RPC_WRITE:
            r.rc = (a[2] > 64) ? -EINVAL
                               : t.write((int)a[0], (size_t)a[1], cmd.data,
                                         (size_t)a[2]);
            break;
        case RPC_POST_RECV:
            r.rc = t.post_recv((int)a[0], (int)a[1], (int)a[2], (size_t)a[3],
                               (size_t)a[4], (uint64_t)a[5], (int)a[6],
                               (size_t)a[7]);
            break;
        case RPC_POLL_RECV:
            r.rc = t.poll_recv((int)a[0], (int)std::min<int64_t>(a[1], 1024),
                               &wcs, (int)a[2]);
            break;
        case RPC_RECV_SEQ:
            r.rc = t.recv_seq_start((int)a[0], (int)a[1], (int)a[2],
                                    (size_t)a[3], (uint64_t)a[4],
                                    (uint32_t)a[5]);
            if (r.rc == 0) {
                r.rc = t.recv_seq_finish(&r.rseq, (int)a[6]);
            }
            break;
        case RPC_QUIT:
            t.c.close();
            r.rc = ::testing::Test::HasFailure() ? -EIO : 0;
            send_msg(wfd, r);
            return;
        default:
            r.rc = -ENOSYS;
            break;
        }
        r.nwc = (int32_t)wcs.size();
        if (!send_msg(wfd, r) ||
            (!wcs.empty() &&
             !write_all(wfd, wcs.data(), wcs.size() * sizeof(hca_wc_t)))) {
            return;
        }
    }
}

::testing::AssertionResult remote_target::start(unsigned flags,
                                                hca_fabric_type_t fab,
                                                unsigned watchdog_s)
{
    child = fork_child([flags, fab](int rfd, int wfd) {
        target_server(rfd, wfd, flags, fab);
    }, watchdog_s);
    if (child == nullptr) {
        dead = true;
        return ::testing::AssertionFailure() << "fork failed";
    }
    rpc_hello h;
    if (!recv_msg(child->rfd, &h, TIMEOUT_MS) || (h.rc != 0)) {
        dead = true;
        return ::testing::AssertionFailure()
               << "target child did not open the device";
    }
    addr_ = h.addr;
    attr_ = h.attr;
    return ::testing::AssertionSuccess();
}

void remote_target::stop()
{
    if (child == nullptr) {
        return;
    }
    if (dead || busy) {
        /* already reported; do not wait for a child that may hang */
        kill_child(child);
    } else {
        rpc_cmd cmd;
        memset(&cmd, 0, sizeof(cmd));
        cmd.op = RPC_QUIT;
        rpc_reply r;
        if (send_msg(child->wfd, cmd) &&
            recv_msg(child->rfd, &r, TIMEOUT_MS)) {
            EXPECT_EQ(0, r.rc) << "target child reported failures";
        }
        EXPECT_TRUE(wait_child(child, TIMEOUT_MS)) << "target child";
    }
    close_child_fds(child);
    child = nullptr;
}

bool remote_target::send_cmd(const rpc_cmd &cmd)
{
    if (dead || (child == nullptr)) {
        return false;
    }
    if (!send_msg(child->wfd, cmd)) {
        dead = true;
        ADD_FAILURE() << "target child: cannot send a command";
        return false;
    }
    return true;
}

bool remote_target::recv_reply(rpc_reply *r, std::vector<hca_wc_t> *wcs,
                               int timeout_ms)
{
    double end = now_ms() + timeout_ms;
    while (!fd_readable(child->rfd, 0)) {
        if (now_ms() > end) {
            dead = true;
            ADD_FAILURE() << "target child: no reply within "
                          << timeout_ms << " ms";
            return false;
        }
        if (progress_all() == 0) {
            sched_yield();
        }
    }
    if (!recv_msg(child->rfd, r, TIMEOUT_MS)) {
        dead = true;
        ADD_FAILURE() << "target child: lost (EOF)";
        return false;
    }
    if (r->nwc > 0) {
        std::vector<hca_wc_t> tmp(r->nwc);
        if (!read_all(child->rfd, tmp.data(),
                      tmp.size() * sizeof(hca_wc_t), TIMEOUT_MS)) {
            dead = true;
            ADD_FAILURE() << "target child: short reply";
            return false;
        }
        if (wcs != nullptr) {
            wcs->insert(wcs->end(), tmp.begin(), tmp.end());
        }
    }
    return true;
}

int64_t remote_target::call(rpc_cmd &cmd, rpc_reply *out,
                            std::vector<hca_wc_t> *wcs,
                            int timeout_ms)
{
    rpc_reply r;
    if (busy || !send_cmd(cmd) || !recv_reply(&r, wcs, timeout_ms)) {
        return -EPIPE;
    }
    if (out != nullptr) {
        *out = r;
    }
    return r.rc;
}

rpc_cmd remote_target::mk(int op, std::initializer_list<int64_t> args)
{
    rpc_cmd c;
    memset(&c, 0, sizeof(c));
    c.op  = op;
    int i = 0;
    for (int64_t x : args) {
        c.a[i++] = x;
    }
    return c;
}

int remote_target::qp(int pd, uint32_t *qpn, uint32_t depth)
{
    rpc_cmd c = mk(RPC_QP, {pd, depth});
    rpc_reply r;
    int rc    = (int)call(c, &r);
    if (rc >= 0) {
        *qpn = (uint32_t)r.v[0];
    }
    return rc;
}

int remote_target::buf(mem_kind_t kind, size_t len, uint64_t *addr)
{
    rpc_cmd c = mk(RPC_BUF, {kind, (int64_t)len});
    rpc_reply r;
    int rc    = (int)call(c, &r);
    if (rc >= 0) {
        *addr = (uint64_t)r.v[0];
    }
    return rc;
}

int remote_target::mr(int p, int b, size_t off, size_t len, unsigned access,
                      uint32_t *rkey)
{
    rpc_cmd c = mk(RPC_MR, {p, b, (int64_t)off, (int64_t)len, access});
    rpc_reply r;
    int rc    = (int)call(c, &r);
    if (rc >= 0) {
        *rkey = (uint32_t)r.v[0];
    }
    return rc;
}

int remote_target::read(int b, size_t off, void *p, size_t len)
{
    rpc_cmd c = mk(RPC_READ, {b, (int64_t)off, (int64_t)len});
    rpc_reply r;
    int rc    = (int)call(c, &r);
    if ((rc == 0) && (len <= 64)) {
        memcpy(p, r.data, len);
    }
    return rc;
}

int remote_target::write(int b, size_t off, const void *p, size_t len)
{
    if (len > 64) {
        return -EINVAL;
    }
    rpc_cmd c = mk(RPC_WRITE, {b, (int64_t)off, (int64_t)len});
    memcpy(c.data, p, len);
    return (int)call(c);
}

int remote_target::recv_seq_start(int q, int b, int m, size_t slot,
                                  uint64_t count, uint32_t window)
{
    /* the child runs the whole receive loop; the reply is collected by
     * recv_seq_finish() */
    rpc_cmd c = mk(RPC_RECV_SEQ, {q, b, m, (int64_t)slot, (int64_t)count,
                                  window, 6 * TIMEOUT_MS});
    if (busy || !send_cmd(c)) {
        return -EPIPE;
    }
    busy = true;
    return 0;
}

int remote_target::recv_seq_finish(recv_seq_result *res, int timeout_ms)
{
    if (!busy) {
        return -EINVAL;
    }
    rpc_reply r;
    if (!recv_reply(&r, nullptr, timeout_ms + TIMEOUT_MS)) {
        return -EPIPE;
    }
    busy = false;
    *res = r.rseq;
    return (int)r.rc;
}

void hca_test::TearDown()
{
    if (reap_all_children() && !in_child()) {
        /* a killed child leaves its /dev/shm objects; an open reclaims
         * them, so that the suite leaves nothing behind */
        hca_device_t *dev = nullptr;
        if (hca_device_open(dev_name().c_str(), 0, &dev) == 0) {
            hca_device_close(dev);
        }
    }
}

::testing::AssertionResult make_conn(ctx &c, target &t, conn *cn,
                                     int tpd,
                                     unsigned t_access,
                                     hca_pd_t *pd,
                                     uint32_t depth)
{
    cn->pd = pd ? pd : c.new_pd();
    if (cn->pd == nullptr) {
        return ::testing::AssertionFailure() << "no PD";
    }
    cn->scq = c.new_cq(2 * depth + 16);
    cn->rcq = c.new_cq(2 * depth + 16);
    if ((cn->scq == nullptr) || (cn->rcq == nullptr)) {
        return ::testing::AssertionFailure() << "no CQ";
    }
    cn->qp = c.new_qp(cn->pd, cn->scq, cn->rcq, c.caps(depth));
    if (cn->qp == nullptr) {
        return ::testing::AssertionFailure() << "no QP";
    }
    cn->qpn = hca_qp_num(cn->qp);
    cn->tpd = (tpd >= 0) ? tpd : t.pd();
    if (cn->tpd < 0) {
        return ::testing::AssertionFailure() << "target PD: " << cn->tpd;
    }
    cn->tqp = t.qp(cn->tpd, &cn->tqpn, depth);
    if (cn->tqp < 0) {
        return ::testing::AssertionFailure() << "target QP: " << cn->tqp;
    }
    int rc = t.connect(cn->tqp, c.addr, cn->qpn, t_access);
    if (rc != 0) {
        return ::testing::AssertionFailure() << "target connect: " << rc;
    }
    rc = connect_qp(cn->qp, t.port_addr(), cn->tqpn, REMOTE_ALL);
    if (rc != 0) {
        return ::testing::AssertionFailure() << "local connect: " << rc;
    }
    return ::testing::AssertionSuccess();
}

::testing::AssertionResult post_and_wait(hca_qp_t *qp, cqw *scq,
                                         hca_send_wr_t *wr,
                                         hca_wc_opcode_t opc,
                                         hca_wc_t *wc,
                                         int timeout_ms)
{
    int rc = post_retry(qp, wr);
    if (rc != 0) {
        return ::testing::AssertionFailure()
               << "post of wr_id " << wr->wr_id << " = " << rc;
    }
    return wait_ok(scq, wr->wr_id, opc, wc, timeout_ms);
}

::testing::AssertionResult make_qp_pair(ctx &a, ctx &b, qp_pair *p)
{
    p->pd1 = a.new_pd();
    p->pd2 = (&a == &b) ? p->pd1 : b.new_pd();
    p->s1  = a.new_cq(64);
    p->r1  = a.new_cq(64);
    p->s2  = b.new_cq(64);
    p->r2  = b.new_cq(64);
    if ((p->pd1 == nullptr) || (p->pd2 == nullptr) || (p->r2 == nullptr)) {
        return ::testing::AssertionFailure() << "PDs / CQs of the pair";
    }
    p->q1 = a.new_qp(p->pd1, p->s1, p->r1);
    p->q2 = b.new_qp(p->pd2, p->s2, p->r2);
    if ((p->q1 == nullptr) || (p->q2 == nullptr)) {
        return ::testing::AssertionFailure() << "QPs of the pair";
    }
    int rc = connect_qp(p->q2, a.addr, hca_qp_num(p->q1));
    if (rc == 0) {
        rc = connect_qp(p->q1, b.addr, hca_qp_num(p->q2));
    }
    if (rc != 0) {
        return ::testing::AssertionFailure() << "connect_qp = " << rc;
    }
    return ::testing::AssertionSuccess();
}

std::vector<seam_t> seams(std::vector<target_kind_t> kinds)
{
    std::vector<seam_t> v;
    for (hca_fabric_type_t f : test_fabrics()) {
        for (target_kind_t k : kinds) {
            v.push_back({f, k});
        }
    }
    return v;
}

const char *op_short_name(hca_wr_opcode_t op)
{
    static const char *n[] = {"SEND", "SEND_IMM", "WRITE", "WRITE_IMM",
                              "READ", "FETCH_ADD", "CMP_SWP", "SWAP",
                              "FETCH_AND", "FETCH_OR", "FETCH_XOR", "ADD",
                              "AND", "OR", "XOR"};
    return ((unsigned)op < HCA_WR_OPCODE_LAST) ? n[op] : "OP";
}

uint64_t atomic_result(hca_wr_opcode_t op, uint64_t old, uint64_t a,
                       uint64_t swap, uint64_t mask)
{
    uint64_t r;
    switch (op) {
    case HCA_WR_ATOMIC_FETCH_ADD:
    case HCA_WR_ATOMIC_ADD:
        r = old + a;
        break;
    case HCA_WR_ATOMIC_CMP_SWP:
        r = ((old & mask) == (a & mask)) ? swap : old;
        break;
    case HCA_WR_ATOMIC_SWAP:
        r = a;
        break;
    case HCA_WR_ATOMIC_FETCH_AND:
    case HCA_WR_ATOMIC_AND:
        r = old & a;
        break;
    case HCA_WR_ATOMIC_FETCH_OR:
    case HCA_WR_ATOMIC_OR:
        r = old | a;
        break;
    case HCA_WR_ATOMIC_FETCH_XOR:
    case HCA_WR_ATOMIC_XOR:
        r = old ^ a;
        break;
    default:
        r = old;
        break;
    }
    return r & mask;
}

hca_wc_opcode_t wc_opcode_of(hca_wr_opcode_t op)
{
    switch (op) {
    case HCA_WR_SEND:
    case HCA_WR_SEND_WITH_IMM:
        return HCA_WC_SEND;
    case HCA_WR_RDMA_WRITE:
    case HCA_WR_RDMA_WRITE_WITH_IMM:
        return HCA_WC_RDMA_WRITE;
    case HCA_WR_RDMA_READ:
        return HCA_WC_RDMA_READ;
    default:
        return HCA_WC_ATOMIC;
    }
}

void run_data_op(ctx &c, target &t, hca_wr_opcode_t op, size_t size,
                 size_t loff, size_t roff, mem_kind_t kind,
                 uint64_t seed)
{
    const hca_device_attr_t ta = t.dev_attr();
    if ((kind == MEM_DM) &&
        ((size + std::max(loff, roff) + GUARD > c.attr.max_dm_size) ||
         (size + std::max(loff, roff) + GUARD > ta.max_dm_size))) {
        GTEST_SKIP() << "size " << size << " exceeds max_dm_size "
                     << c.attr.max_dm_size;
    }
    ASSERT_LE(size, c.attr.max_msg_size);

    conn cn;
    ASSERT_TRUE(make_conn(c, t, &cn));

    uint8_t *lb = c.alloc(kind, loff + size + GUARD);
    if (lb == nullptr) {
        if (kind == MEM_MALLOC) {
            GTEST_SKIP() << "malloc(" << (loff + size + GUARD) << ") failed";
        }
        FAIL() << "hca_dm_alloc(" << (loff + size + GUARD)
               << ") = " << c.alloc_err;
    }
    hca_mr_t *lmr = c.reg(cn.pd, lb + loff, size, ACCESS_ALL);
    ASSERT_NE(nullptr, lmr);

    uint64_t ra = 0;
    int rb      = t.buf(kind, roff + size + GUARD, &ra);
    if ((rb == -ENOMEM) && (kind == MEM_MALLOC)) {
        GTEST_SKIP() << "target malloc(" << (roff + size + GUARD)
                     << ") failed";
    }
    ASSERT_GE(rb, 0) << "target buffer of " << (roff + size + GUARD)
                     << " bytes (" << mem_kind_name(kind) << ")";
    uint32_t rkey = 0;
    int rmr       = t.mr(cn.tpd, rb, roff, size, ACCESS_ALL, &rkey);
    ASSERT_GE(rmr, 0) << "target hca_mr_reg";

    const uint64_t rstart = ra + roff;
    const int      tmo    = xfer_timeout_ms(size);
    hca_sge_t sg          = mk_sge(lb + loff, size, hca_mr_lkey(lmr));
    hca_send_wr_t wr      = mk_wr(op, &sg, 1, HCA_SEND_SIGNALED, 0x5500 + op,
                                  rstart, rkey);
    wr.imm_data           = IMM_VALUE;

    memset(lb, LSENTINEL, loff);
    memset(lb + loff + size, LSENTINEL, GUARD);

    if (op == HCA_WR_RDMA_READ) {
        memset(lb + loff, LSENTINEL, size);
        ASSERT_EQ(0, t.fill(rb, 0, roff, BYTE(SENTINEL)));
        ASSERT_EQ(0, t.fill(rb, roff, size, PAT(seed)));
        ASSERT_EQ(0, t.fill(rb, roff + size, GUARD, BYTE(SENTINEL)));
    } else {
        fill_pattern(lb + loff, size, seed);
        ASSERT_EQ(0, t.fill(rb, 0, roff + size + GUARD, BYTE(SENTINEL)));
    }

    const bool two_sided = (op == HCA_WR_SEND) ||
                           (op == HCA_WR_SEND_WITH_IMM) ||
                           (op == HCA_WR_RDMA_WRITE_WITH_IMM);
    if (op == HCA_WR_RDMA_WRITE_WITH_IMM) {
        ASSERT_EQ(0, t.post_recv(cn.tqp, -1, -1, 0, 0, 0x77, 1, 0));
    } else if (two_sided) {
        ASSERT_EQ(0, t.post_recv(cn.tqp, rmr, rb, roff, size, 0x77, 1, 0));
    }

    ASSERT_EQ(0, post_retry(cn.qp, &wr, tmo)) << "hca_post_send";

    if (two_sided) {
        std::vector<hca_wc_t> wcs;
        ASSERT_EQ(1, t.poll_recv(cn.tqp, 1, &wcs, tmo))
                << "no receive completion at the target";
        const hca_wc_t &rwc = wcs[0];
        EXPECT_EQ(HCA_WC_SUCCESS, rwc.status) << wc_str(rwc);
        EXPECT_EQ(0x77u, rwc.wr_id);
        EXPECT_EQ((uint32_t)size, rwc.byte_len) << wc_str(rwc);
        EXPECT_EQ(cn.qpn, rwc.src_qp) << wc_str(rwc);
        EXPECT_EQ(cn.tqpn, rwc.qp_num) << wc_str(rwc);
        if (op == HCA_WR_SEND) {
            EXPECT_EQ(HCA_WC_RECV, rwc.opcode);
            EXPECT_EQ(0u, rwc.wc_flags & HCA_WC_WITH_IMM);
        } else {
            EXPECT_EQ((op == HCA_WR_SEND_WITH_IMM) ? HCA_WC_RECV
                                                   : HCA_WC_RECV_RDMA_WITH_IMM,
                      rwc.opcode);
            EXPECT_NE(0u, rwc.wc_flags & HCA_WC_WITH_IMM) << wc_str(rwc);
            EXPECT_EQ(IMM_VALUE, rwc.imm_data) << wc_str(rwc);
        }
    }

    hca_wc_t wc;
    ASSERT_TRUE(wait_ok(cn.scq, wr.wr_id, wc_opcode_of(op), &wc, tmo));
    EXPECT_EQ(cn.qpn, wc.qp_num);
    if (c.flags & HCA_OPEN_NO_SINGLE_COPY) {
        hca_counters_t cnt;
        ASSERT_EQ(0, hca_device_counters(c.dev, &cnt));
        EXPECT_EQ(0u, cnt.single_copy_ops)
                << "HCA_OPEN_NO_SINGLE_COPY, yet CMA was used";
    }

    if (op == HCA_WR_RDMA_READ) {
        EXPECT_EQ(-1, check_pattern(lb + loff, size, seed))
                << "RDMA_READ data: first differing byte";
        EXPECT_EQ(-1, check_byte(lb, loff, LSENTINEL))
                << "RDMA_READ wrote before the local buffer";
        EXPECT_EQ(-1, check_byte(lb + loff + size, GUARD, LSENTINEL))
                << "RDMA_READ wrote past the local buffer";
        EXPECT_EQ(-1, t.check(rb, roff, size, PAT(seed)))
                << "RDMA_READ changed the target";
    } else {
        /* the completion means the data is placed: check right away */
        EXPECT_EQ(-1, t.check(rb, roff, size, PAT(seed)))
                << "target data: first differing byte";
        EXPECT_EQ(-1, t.check(rb, 0, roff, BYTE(SENTINEL)))
                << "wrote before the target buffer";
        EXPECT_EQ(-1, t.check(rb, roff + size, GUARD, BYTE(SENTINEL)))
                << "wrote past the target buffer";
        EXPECT_EQ(-1, check_pattern(lb + loff, size, seed))
                << "the source changed";
    }
    EXPECT_EQ(HCA_QPS_RTS, hca_qp_state(cn.qp));
}

atomic_vals atomic_operands(hca_wr_opcode_t op, bool is32)
{
    atomic_vals v;
    v.init = is32 ? 0xfffffff5ull : 0x12345678fffffff5ull;
    v.swap = 0;
    switch (op) {
    case HCA_WR_ATOMIC_FETCH_ADD:
    case HCA_WR_ATOMIC_ADD:
        v.a = 0x10;   /* carries across 32 bits (64) / wraps (32) */
        break;
    case HCA_WR_ATOMIC_CMP_SWP:
        v.a    = v.init;
        v.swap = is32 ? 0x0badc0deull : 0x0badc0de0badf00dull;
        break;
    case HCA_WR_ATOMIC_SWAP:
        v.a = is32 ? 0xcafebeefull : 0xfeedfacecafebeefull;
        break;
    case HCA_WR_ATOMIC_FETCH_AND:
    case HCA_WR_ATOMIC_AND:
        v.a = is32 ? 0xf0f0ff0full : 0xff00ff00f0f0ff0full;
        break;
    case HCA_WR_ATOMIC_FETCH_OR:
    case HCA_WR_ATOMIC_OR:
        v.a = is32 ? 0x0f0f0000ull : 0x00ff00000f0f0000ull;
        break;
    default:
        v.a = is32 ? 0x5a5aa5a5ull : 0x5a5aa5a5c3c33c3cull;
        break;
    }
    return v;
}

bool atomic_supported(const hca_device_attr_t &a, hca_wr_opcode_t op,
                      bool is32, std::string *why)
{
    if (is32 && !(a.atomic_caps & HCA_ATOMIC_CAP_32)) {
        *why = "no HCA_ATOMIC_CAP_32";
        return false;
    }
    if (!is32 && !(a.atomic_caps & HCA_ATOMIC_CAP_64)) {
        *why = "no HCA_ATOMIC_CAP_64";
        return false;
    }
    if (is_bitop(op) && !(a.atomic_caps & HCA_ATOMIC_CAP_BITOPS)) {
        *why = "no HCA_ATOMIC_CAP_BITOPS";
        return false;
    }
    return true;
}

void run_atomic(ctx &c, target &t, hca_wr_opcode_t op, bool is32,
                mem_kind_t kind)
{
    std::string why;
    if (!atomic_supported(c.attr, op, is32, &why)) {
        GTEST_SKIP() << why;
    }
    const size_t   width = is32 ? 4 : 8;
    const uint64_t mask  = is32 ? 0xffffffffull : ~0ull;
    const size_t   voff  = is32 ? 20 : 16;   /* remote value offset */
    const size_t   loff  = is32 ? 12 : 8;    /* local result offset */

    conn cn;
    ASSERT_TRUE(make_conn(c, t, &cn));
    uint8_t *lb = c.alloc(kind, 64);
    ASSERT_NE(nullptr, lb) << "alloc " << c.alloc_err;
    hca_mr_t *lmr = c.reg(cn.pd, lb, 64, ACCESS_ALL);
    ASSERT_NE(nullptr, lmr);
    uint64_t ra = 0;
    int rb      = t.buf(kind, 64, &ra);
    ASSERT_GE(rb, 0);
    uint32_t rkey = 0;
    ASSERT_GE(t.mr(cn.tpd, rb, 0, 64, ACCESS_ALL, &rkey), 0);

    atomic_vals v = atomic_operands(op, is32);
    int rounds    = (op == HCA_WR_ATOMIC_CMP_SWP) ? 2 : 1;
    uint64_t cur  = v.init;
    ASSERT_EQ(0, t.fill(rb, 0, 64, BYTE(SENTINEL)));
    ASSERT_EQ(0, t.write(rb, voff, &v.init, width));

    for (int round = 0; round < rounds; ++round) {
        uint64_t a = v.a;
        if ((op == HCA_WR_ATOMIC_CMP_SWP) && (round == 0)) {
            a = v.init ^ 0x100;   /* does not match */
        }
        memset(lb, LSENTINEL, 64);
        const bool fetch = is_fetching_op(op);
        hca_sge_t sg     = mk_sge(lb + loff, width, hca_mr_lkey(lmr));
        hca_send_wr_t wr = mk_wr(op, fetch ? &sg : nullptr, fetch ? 1 : 0,
                                 HCA_SEND_SIGNALED |
                                         (is32 ? HCA_SEND_ATOMIC32 : 0),
                                 0xa700 + round, ra + voff, rkey);
        wr.compare_add   = a;
        wr.swap          = v.swap;
        ASSERT_EQ(0, post_retry(cn.qp, &wr)) << "hca_post_send";
        ASSERT_TRUE(wait_ok(cn.scq, wr.wr_id, HCA_WC_ATOMIC));

        uint64_t expect = atomic_result(op, cur, a, v.swap, mask);
        uint8_t rem[64];
        ASSERT_EQ(0, t.read(rb, 0, rem, 64));
        uint64_t now = 0;
        memcpy(&now, rem + voff, width);
        EXPECT_EQ(expect, now)
                << std::hex << "target value: old 0x" << cur << " operand 0x"
                << a << " swap 0x" << v.swap;
        EXPECT_EQ(-1, check_byte(rem, voff, SENTINEL))
                << "bytes before the target value changed";
        EXPECT_EQ(-1, check_byte(rem + voff + width, 64 - voff - width,
                                 SENTINEL))
                << "bytes after the target value changed";
        if (fetch) {
            uint64_t old = 0;
            memcpy(&old, lb + loff, width);
            EXPECT_EQ(cur, old) << "fetched value";
            EXPECT_EQ(-1, check_byte(lb, loff, LSENTINEL));
            EXPECT_EQ(-1, check_byte(lb + loff + width, 64 - loff - width,
                                     LSENTINEL))
                    << "the result overflowed its " << width << " bytes";
        } else {
            EXPECT_EQ(-1, check_byte(lb, 64, LSENTINEL))
                    << "a post atomic wrote local memory";
        }
        cur = expect;
    }
}

const char *mpt_case_name(mpt_case_t c)
{
    static const char *n[] = {"UnknownRkey", "StaleRkey",   "ReusedEntry",
                              "RangeBefore", "RangeAfter",  "NoRight",
                              "QpNoRight",   "OtherPd",     "Misaligned",
                              "BadLkey",     "LocalRange",  "LocalNoWrite"};
    return ((unsigned)c < MPT_CASE_LAST) ? n[c] : "?";
}

bool mpt_valid(mpt_case_t cs, mpt_op_t op)
{
    switch (cs) {
    case MPT_UNKNOWN_RKEY:
    case MPT_STALE_RKEY:
    case MPT_REUSED_ENTRY:
    case MPT_RANGE_BEFORE:
    case MPT_RANGE_AFTER:
    case MPT_NO_RIGHT:
    case MPT_OTHER_PD:
        return op != MOP_SEND;
    case MPT_QP_NO_RIGHT:
        return (op == MOP_WRITE) || (op == MOP_READ) || (op == MOP_FADD64);
    case MPT_MISALIGNED:
        return mop_is_atomic(op);
    case MPT_BAD_LKEY:
        return (op == MOP_WRITE) || (op == MOP_READ) || (op == MOP_FADD64) ||
               (op == MOP_SEND);
    case MPT_LOCAL_RANGE:
        return (op == MOP_WRITE) || (op == MOP_READ) || (op == MOP_SEND);
    case MPT_LOCAL_NO_WRITE:
        return (op == MOP_READ) || (op == MOP_FADD64);
    default:
        return false;
    }
}

std::vector<mpt_param> mpt_params()
{
    std::vector<mpt_param> v;
    for (int k = 0; k < 2; ++k) {
        for (int c = 0; c < MPT_CASE_LAST; ++c) {
            for (int o = 0; o < MOP_LAST; ++o) {
                if (mpt_valid((mpt_case_t)c, (mpt_op_t)o)) {
                    mpt_param p = {(mpt_case_t)c, (mpt_op_t)o, (mem_kind_t)k};
                    v.push_back(p);
                }
            }
        }
    }
    return v;
}

unsigned mop_right(mpt_op_t o)
{
    switch (o) {
    case MOP_WRITE:
    case MOP_WRITE_IMM:
        return HCA_ACCESS_REMOTE_WRITE;
    case MOP_READ:
        return HCA_ACCESS_REMOTE_READ;
    case MOP_SEND:
        return 0;
    default:
        return HCA_ACCESS_REMOTE_ATOMIC;
    }
}

hca_wr_opcode_t mop_opcode(mpt_op_t o)
{
    switch (o) {
    case MOP_WRITE:
        return HCA_WR_RDMA_WRITE;
    case MOP_WRITE_IMM:
        return HCA_WR_RDMA_WRITE_WITH_IMM;
    case MOP_READ:
        return HCA_WR_RDMA_READ;
    case MOP_FADD64:
    case MOP_FADD32:
        return HCA_WR_ATOMIC_FETCH_ADD;
    case MOP_CSWAP64:
        return HCA_WR_ATOMIC_CMP_SWP;
    case MOP_ADD64:
        return HCA_WR_ATOMIC_ADD;
    default:
        return HCA_WR_SEND;
    }
}

void run_mpt_check(ctx &c, target &t, mpt_case_t cs, mpt_op_t op,
                   mem_kind_t kind)
{
    const bool atomic = mop_is_atomic(op);
    const size_t width = (op == MOP_FADD32) ? 4 : 8;
    if (atomic) {
        std::string why;
        if (!atomic_supported(c.attr, mop_opcode(op), op == MOP_FADD32,
                              &why)) {
            GTEST_SKIP() << why;
        }
    }

    /* Target layout: a buffer of BUFSZ bytes; the MR covers
     * [MOFF, MOFF+RLEN).  Data ops move L bytes.  For atomics the MR starts
     * at offset 1 so that "1 byte before the MR" is an aligned address (0),
     * and ends 1 byte before the end of the aligned word at offset 64. */
    const size_t BUFSZ = 8192;
    const size_t MOFF  = atomic ? 1 : 64;
    const size_t RLEN  = atomic ? (64 + width - 2) : 4096;
    const size_t L     = atomic ? width : 64;
    const size_t VOFF  = atomic ? 8 : MOFF;   /* a valid target offset */

    unsigned mr_access = ACCESS_ALL;
    unsigned qp_access = REMOTE_ALL;
    if (cs == MPT_NO_RIGHT) {
        mr_access &= ~mop_right(op);
    }
    if (cs == MPT_QP_NO_RIGHT) {
        qp_access &= ~mop_right(op);
    }

    int tpd_mr = t.pd();
    ASSERT_GE(tpd_mr, 0);
    int tpd_qp = tpd_mr;
    if (cs == MPT_OTHER_PD) {
        tpd_qp = t.pd();
        ASSERT_GE(tpd_qp, 0);
    }
    uint64_t ra = 0;
    int rb      = t.buf(kind, BUFSZ, &ra);
    ASSERT_GE(rb, 0);
    ASSERT_EQ(0, t.fill(rb, 0, BUFSZ, BYTE(SENTINEL)));
    uint32_t rkey = 0;
    int rmr       = t.mr(tpd_mr, rb, MOFF, RLEN, mr_access, &rkey);
    ASSERT_GE(rmr, 0);

    conn cn;
    ASSERT_TRUE(make_conn(c, t, &cn, tpd_qp, qp_access));

    /* local memory: [64, 64+4096) registered */
    uint8_t *lb = c.alloc(kind, BUFSZ);
    ASSERT_NE(nullptr, lb);
    unsigned l_access = (cs == MPT_LOCAL_NO_WRITE) ? 0u : ACCESS_ALL;
    hca_mr_t *lmr     = c.reg(cn.pd, lb + 64, 4096, l_access);
    ASSERT_NE(nullptr, lmr);

    const bool reads_local = (op == MOP_READ) || (op == MOP_FADD64) ||
                             (op == MOP_FADD32) || (op == MOP_CSWAP64);
    auto prep_local = [&]() {
        memset(lb, LSENTINEL, BUFSZ);
        if (!reads_local) {
            fill_pattern(lb + 64, 4096, 77);
        }
    };

    /* builds the WR of this op on (raddr, key) with local SGE (laddr, lkey) */
    hca_sge_t sg;
    hca_send_wr_t wr;
    auto build = [&](uint64_t raddr, uint32_t key, uint8_t *laddr,
                     uint32_t lkey, uint64_t wr_id) {
        sg = mk_sge(laddr, L, lkey);
        int nsge = (op == MOP_ADD64) ? 0 : 1;
        wr = mk_wr(mop_opcode(op), nsge ? &sg : nullptr, nsge,
                   HCA_SEND_SIGNALED |
                           ((op == MOP_FADD32) ? HCA_SEND_ATOMIC32 : 0),
                   wr_id, raddr, key);
        wr.imm_data    = IMM_VALUE;
        wr.compare_add = 1;
        wr.swap        = 2;
    };

    /* a successful op on the valid range with key k over connection n */
    auto do_valid = [&](conn &n, uint32_t k, uint64_t wr_id) {
        prep_local();
        if (op == MOP_WRITE_IMM) {
            ASSERT_EQ(0, t.post_recv(n.tqp, -1, -1, 0, 0, 1, 1, 0));
        }
        build(ra + VOFF, k, lb + 64, hca_mr_lkey(lmr), wr_id);
        ASSERT_EQ(0, post_retry(n.qp, &wr));
        ASSERT_TRUE(wait_ok(n.scq, wr_id, wc_opcode_of(mop_opcode(op))))
                << "the valid operation must succeed";
        if (op == MOP_WRITE_IMM) {
            std::vector<hca_wc_t> w;
            ASSERT_EQ(1, t.poll_recv(n.tqp, 1, &w, TIMEOUT_MS));
        }
        if ((op == MOP_WRITE) || (op == MOP_WRITE_IMM)) {
            EXPECT_EQ(-1, t.check(rb, VOFF, L, PAT(77)));
        }
    };

    uint32_t key    = rkey;
    uint64_t raddr  = ra + VOFF;
    uint8_t *laddr  = lb + 64;
    uint32_t lkey   = hca_mr_lkey(lmr);
    uint32_t newkey = 0;

    switch (cs) {
    case MPT_UNKNOWN_RKEY:
        key = ~rkey;
        break;
    case MPT_STALE_RKEY:
        ASSERT_NO_FATAL_FAILURE(do_valid(cn, rkey, 1));
        ASSERT_EQ(0, t.dereg(rmr));
        ASSERT_EQ(0, t.fill(rb, 0, BUFSZ, BYTE(SENTINEL)));
        break;
    case MPT_REUSED_ENTRY: {
        ASSERT_NO_FATAL_FAILURE(do_valid(cn, rkey, 1));
        ASSERT_EQ(0, t.dereg(rmr));
        int m2 = t.mr(tpd_mr, rb, MOFF, RLEN, mr_access, &newkey);
        ASSERT_GE(m2, 0);
        EXPECT_NE(rkey, newkey) << "a reused MPT entry must get a new key";
        ASSERT_EQ(0, t.fill(rb, 0, BUFSZ, BYTE(SENTINEL)));
        break;
    }
    case MPT_RANGE_BEFORE:
        raddr = ra + MOFF - 1;
        break;
    case MPT_RANGE_AFTER:
        raddr = atomic ? (ra + 64) : (ra + MOFF + RLEN - L + 1);
        break;
    case MPT_MISALIGNED:
        raddr = ra + 8 + ((op == MOP_FADD32)    ? 2
                          : (op == MOP_CSWAP64) ? 1
                          : (op == MOP_ADD64)   ? 2
                                                : 4);
        break;
    case MPT_BAD_LKEY:
        lkey = ~lkey;
        break;
    case MPT_LOCAL_RANGE:
        laddr = lb + 64 + 4096 - L + 1;
        break;
    default:
        break;
    }

    const bool local_err = (cs == MPT_BAD_LKEY) || (cs == MPT_LOCAL_RANGE) ||
                           (cs == MPT_LOCAL_NO_WRITE);

    prep_local();
    if (op == MOP_WRITE_IMM) {
        ASSERT_EQ(0, t.post_recv(cn.tqp, -1, -1, 0, 0, 2, 1, 0));
    } else if (op == MOP_SEND) {
        ASSERT_EQ(0, t.post_recv(cn.tqp, rmr, rb, MOFF, 4096, 2, 1, 0));
    }
    build(raddr, key, laddr, lkey, 0xe4404);
    ASSERT_EQ(0, post_retry(cn.qp, &wr));
    hca_wc_t wc;
    ASSERT_TRUE(wait_wc(cn.scq, &wc));
    EXPECT_EQ(0xe4404u, wc.wr_id);
    if (local_err) {
        EXPECT_EQ(HCA_WC_LOC_PROT_ERR, wc.status) << wc_str(wc);
    } else if (cs == MPT_QP_NO_RIGHT) {
        /* the header does not say which of the two a QP-level refusal
         * gives */
        EXPECT_TRUE((wc.status == HCA_WC_REM_ACCESS_ERR) ||
                    (wc.status == HCA_WC_REM_INV_REQ_ERR))
                << wc_str(wc);
    } else {
        EXPECT_EQ(HCA_WC_REM_ACCESS_ERR, wc.status) << wc_str(wc);
    }

    EXPECT_EQ(-1, t.check(rb, 0, BUFSZ, BYTE(SENTINEL)))
            << "target memory changed (first changed byte)";
    if (reads_local) {
        EXPECT_EQ(-1, check_byte(lb, BUFSZ, LSENTINEL))
                << "local memory changed (first changed byte)";
    }
    /* IB RC: an error moves the requester QP to ERR (what posting to a QP
     * in ERR does is checked by Qp.PostInErrFlushes) */
    EXPECT_EQ(HCA_QPS_ERR, hca_qp_state(cn.qp));

    if (cs == MPT_REUSED_ENTRY) {
        /* the new key works (on a fresh connection) */
        conn cn2;
        ASSERT_TRUE(make_conn(c, t, &cn2, tpd_qp, qp_access, cn.pd));
        ASSERT_NO_FATAL_FAILURE(do_valid(cn2, newkey, 3));
        if (op == MOP_READ) {
            EXPECT_EQ(-1, check_byte(lb + 64, L, SENTINEL))
                    << "READ with the new key";
        }
        /* and the old one still fails */
        conn cn3;
        ASSERT_TRUE(make_conn(c, t, &cn3, tpd_qp, qp_access, cn.pd));
        prep_local();
        ASSERT_EQ(0, t.fill(rb, 0, BUFSZ, BYTE(SENTINEL)));
        if (op == MOP_WRITE_IMM) {
            ASSERT_EQ(0, t.post_recv(cn3.tqp, -1, -1, 0, 0, 4, 1, 0));
        }
        build(ra + VOFF, rkey, lb + 64, hca_mr_lkey(lmr), 4);
        ASSERT_EQ(0, post_retry(cn3.qp, &wr));
        ASSERT_TRUE(wait_status(cn3.scq, 4, HCA_WC_REM_ACCESS_ERR));
        EXPECT_EQ(-1, t.check(rb, 0, BUFSZ, BYTE(SENTINEL)));
    }
}

void run_fence(ctx &c, target &t, mem_kind_t kind)
{
    const size_t MAXL = 256 * 1024;
    conn cn;
    ASSERT_TRUE(make_conn(c, t, &cn));
    uint8_t *src = c.alloc(kind, MAXL);
    uint8_t *dst = c.alloc(kind, MAXL);
    ASSERT_NE(nullptr, src);
    ASSERT_NE(nullptr, dst);
    hca_mr_t *smr = c.reg(cn.pd, src, MAXL, ACCESS_ALL);
    hca_mr_t *dmr = c.reg(cn.pd, dst, MAXL, ACCESS_ALL);
    ASSERT_NE(nullptr, smr);
    ASSERT_NE(nullptr, dmr);
    uint64_t ra = 0;
    int rb      = t.buf(kind, MAXL, &ra);
    ASSERT_GE(rb, 0);
    uint32_t rkey = 0;
    ASSERT_GE(t.mr(cn.tpd, rb, 0, MAXL, ACCESS_ALL, &rkey), 0);
    ASSERT_EQ(0, t.fill(rb, 0, MAXL, BYTE(SENTINEL)));

    static const size_t lens[] = {8, 100, 4096, 65536, 262144};
    for (int i = 0; i < 30; ++i) {
        size_t L = lens[i % 5];
        fill_pattern(src, L, 1000 + i);
        memset(dst, LSENTINEL, L);
        hca_sge_t s1 = mk_sge(src, L, hca_mr_lkey(smr));
        hca_sge_t s2 = mk_sge(dst, L, hca_mr_lkey(dmr));
        hca_send_wr_t w1 = mk_wr(HCA_WR_RDMA_WRITE, &s1, 1, 0, 100 + i, ra,
                                 rkey);
        hca_send_wr_t w2 = mk_wr(HCA_WR_RDMA_READ, &s2, 1,
                                 HCA_SEND_SIGNALED | HCA_SEND_FENCE, 200 + i,
                                 ra, rkey);
        w1.next = &w2;
        ASSERT_EQ(0, post_retry(cn.qp, &w1));
        ASSERT_TRUE(wait_ok(cn.scq, 200 + i, HCA_WC_RDMA_READ));
        ASSERT_EQ(-1, check_pattern(dst, L, 1000 + i))
                << "fenced READ of " << L << " bytes did not see the WRITE";
    }

    if (!(c.attr.atomic_caps & HCA_ATOMIC_CAP_64)) {
        return;
    }
    uint64_t last = 0;
    for (int i = 0; i < 60; ++i) {
        /* every 4th: a big write whose last word the atomic then hits */
        size_t L      = (i % 4 == 0) ? 65536 : 8;
        size_t aoff   = L - 8;
        fill_pattern(src, L, 5000 + i);
        uint64_t v;
        memcpy(&v, src + aoff, 8);
        memset(dst, LSENTINEL, 8);
        hca_sge_t s1 = mk_sge(src, L, hca_mr_lkey(smr));
        hca_sge_t s2 = mk_sge(dst, 8, hca_mr_lkey(dmr));
        hca_send_wr_t w1 = mk_wr(HCA_WR_RDMA_WRITE, &s1, 1, 0, 300 + i, ra,
                                 rkey);
        hca_send_wr_t w2 = mk_wr((i & 1) ? HCA_WR_ATOMIC_FETCH_ADD
                                         : HCA_WR_ATOMIC_CMP_SWP,
                                 &s2, 1, HCA_SEND_SIGNALED | HCA_SEND_FENCE,
                                 400 + i, ra + aoff, rkey);
        w2.compare_add = (i & 1) ? 1 : v;
        w2.swap        = v + 1;
        w1.next        = &w2;
        ASSERT_EQ(0, post_retry(cn.qp, &w1));
        ASSERT_TRUE(wait_ok(cn.scq, 400 + i, HCA_WC_ATOMIC));
        uint64_t got;
        memcpy(&got, dst, 8);
        ASSERT_EQ(v, got) << "fenced atomic did not see the WRITE (i=" << i
                          << ")";
        last = v + 1;
        uint64_t now = 0;
        ASSERT_EQ(0, t.read(rb, aoff, &now, 8));
        ASSERT_EQ(last, now);
    }
}

void run_placement(ctx &c, target &t, mem_kind_t kind)
{
    const size_t MAXL = 1 << 20;
    conn cn;
    ASSERT_TRUE(make_conn(c, t, &cn));
    uint8_t *src = c.alloc(kind, 9 * 65536 + MAXL);
    ASSERT_NE(nullptr, src);
    hca_mr_t *smr = c.reg(cn.pd, src, 9 * 65536 + MAXL, ACCESS_ALL);
    ASSERT_NE(nullptr, smr);
    uint64_t ra = 0;
    int rb      = t.buf(kind, MAXL, &ra);
    ASSERT_GE(rb, 0);
    uint32_t rkey = 0;
    ASSERT_GE(t.mr(cn.tpd, rb, 0, MAXL, ACCESS_ALL, &rkey), 0);

    static const size_t lens[] = {1, 63, 4096, 65537, 1 << 20};
    for (int i = 0; i < 25; ++i) {
        size_t L = lens[i % 5];
        fill_pattern(src, L, 9000 + i);
        hca_sge_t s      = mk_sge(src, L, hca_mr_lkey(smr));
        hca_send_wr_t wr = mk_wr(HCA_WR_RDMA_WRITE, &s, 1, HCA_SEND_SIGNALED,
                                 i, ra, rkey);
        ASSERT_EQ(0, post_retry(cn.qp, &wr));
        ASSERT_TRUE(wait_ok(cn.scq, i, HCA_WC_RDMA_WRITE));
        ASSERT_EQ(-1, t.check(rb, 0, L, PAT(9000 + i)))
                << "WRITE of " << L << " bytes completed before placement";
    }

    /* 8 unsignaled writes and a signaled one: its completion means every
     * earlier one is placed too */
    hca_sge_t sg[9];
    hca_send_wr_t wr[9];
    for (int j = 0; j < 9; ++j) {
        fill_pattern(src + j * 65536, 65536, 7000 + j);
        sg[j] = mk_sge(src + j * 65536, 65536, hca_mr_lkey(smr));
        wr[j] = mk_wr(HCA_WR_RDMA_WRITE, &sg[j], 1,
                      (j == 8) ? HCA_SEND_SIGNALED : 0, 50 + j,
                      ra + j * 65536, rkey);
        wr[j].next = (j < 8) ? &wr[j + 1] : nullptr;
    }
    ASSERT_EQ(0, post_retry(cn.qp, &wr[0]));
    ASSERT_TRUE(wait_ok(cn.scq, 58, HCA_WC_RDMA_WRITE));
    for (int j = 0; j < 9; ++j) {
        EXPECT_EQ(-1, t.check(rb, j * 65536, 65536, PAT(7000 + j)))
                << "unsignaled WRITE " << j << " not placed";
    }
    EXPECT_EQ(0u, hca_qp_outstanding(cn.qp));
}

void run_ordering(ctx &c, target &t, uint64_t count,
                  int timeout_ms)
{
    const size_t   SLOT   = 72 * 1024;
    const uint32_t WINDOW = 64;
    const uint32_t DEPTH  = 128;
    conn cn;
    ASSERT_TRUE(make_conn(c, t, &cn, -1, REMOTE_ALL, nullptr, DEPTH));
    uint64_t ra = 0;
    int rb      = t.buf(MEM_MALLOC, SLOT * WINDOW, &ra);
    ASSERT_GE(rb, 0);
    uint32_t rkey = 0;
    int rmr       = t.mr(cn.tpd, rb, 0, SLOT * WINDOW, ACCESS_ALL, &rkey);
    ASSERT_GE(rmr, 0);
    uint8_t *src = c.alloc(MEM_MALLOC, SLOT * DEPTH);
    ASSERT_NE(nullptr, src);
    hca_mr_t *smr = c.reg(cn.pd, src, SLOT * DEPTH, ACCESS_ALL);
    ASSERT_NE(nullptr, smr);

    ASSERT_EQ(0, t.recv_seq_start(cn.tqp, rb, rmr, SLOT, count, WINDOW));
    uint64_t next = 0, done = 0, retries = 0;
    double end    = now_ms() + timeout_ms;
    while (done < count) {
        if ((next < count) && (next - done < DEPTH)) {
            size_t L   = seq_msg_len(next, SLOT);
            uint8_t *p = src + (next % DEPTH) * SLOT;
            seq_msg_fill(p, next, L);
            hca_sge_t s      = mk_sge(p, L, hca_mr_lkey(smr));
            hca_send_wr_t wr = mk_wr(HCA_WR_SEND, &s, 1, HCA_SEND_SIGNALED,
                                     next);
            hca_send_wr_t *bad = nullptr;
            int rc             = hca_post_send(cn.qp, &wr, &bad);
            if (rc == 0) {
                ++next;
            } else if ((rc == -EAGAIN) || (rc == -ENOMEM)) {
                ++retries;
            } else {
                FAIL() << "hca_post_send of message " << next << ": " << rc;
            }
        }
        t.pump();
        progress_all();
        hca_wc_t wc;
        while (cn.scq->pop(&wc)) {
            ASSERT_EQ(HCA_WC_SUCCESS, wc.status) << wc_str(wc);
            ASSERT_EQ(done, wc.wr_id) << "send completions out of order";
            ++done;
        }
        ASSERT_EQ(0, cn.scq->err);
        ASSERT_LT(now_ms(), end) << "sent " << next << " completed " << done
                                 << " of " << count;
    }
    recv_seq_result res;
    ASSERT_EQ(0, t.recv_seq_finish(&res, timeout_ms));
    EXPECT_EQ(count, res.received) << rseq_str(res);
    EXPECT_EQ((uint32_t)RSEQ_OK, res.bad_kind) << rseq_str(res);
    EXPECT_EQ(0u, res.extra) << rseq_str(res);
}

std::string size_name(size_t s)
{
    if (s == SIZE_MAX_MSG) {
        return "max";
    }
    if ((s >= (1 << 20)) && (s % (1 << 20) == 0)) {
        return std::to_string(s >> 20) + "M";
    }
    return std::to_string(s);
}

} /* namespace hcat */
