/*
 * uct_test_common.cc - see uct_test_common.h
 */
#include "uct_test_common.h"

#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>

#include <algorithm>

namespace hcat {

double now_sec()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------ patterns */

uint64_t pat_word(uint64_t seed, uint64_t idx)
{
    uint64_t z = seed * 0x9e3779b97f4a7c15ull + idx + 0x632be59bd9b4e019ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint8_t pat_byte(uint64_t seed, uint64_t k)
{
    return (uint8_t)(pat_word(seed, k >> 3) >> (8 * (k & 7)));
}

void pat_fill(void *buf, size_t len, uint64_t seed, uint64_t pat_off)
{
    uint8_t *p = (uint8_t*)buf;
    size_t i   = 0;

    for (; (i < len) && ((pat_off + i) & 7); ++i) {
        p[i] = pat_byte(seed, pat_off + i);
    }
    for (; i + 8 <= len; i += 8) {
        uint64_t w = pat_word(seed, (pat_off + i) >> 3);
        memcpy(p + i, &w, 8);
    }
    for (; i < len; ++i) {
        p[i] = pat_byte(seed, pat_off + i);
    }
}

ssize_t pat_check(const void *buf, size_t len, uint64_t seed,
                  uint64_t pat_off)
{
    const uint8_t *p = (const uint8_t*)buf;
    size_t i         = 0;

    for (; (i < len) && ((pat_off + i) & 7); ++i) {
        if (p[i] != pat_byte(seed, pat_off + i)) {
            return (ssize_t)i;
        }
    }
    for (; i + 8 <= len; i += 8) {
        uint64_t w = pat_word(seed, (pat_off + i) >> 3), v;
        memcpy(&v, p + i, 8);
        if (v != w) {
            break;
        }
    }
    for (; i < len; ++i) {
        if (p[i] != pat_byte(seed, pat_off + i)) {
            return (ssize_t)i;
        }
    }
    return -1;
}

std::string pat_string(size_t len, uint64_t seed, uint64_t pat_off)
{
    std::string s(len, '\0');
    pat_fill(&s[0], len, seed, pat_off);
    return s;
}

/* ------------------------------------------------------------ channel */

void channel::close_fds()
{
    if (rfd >= 0) {
        ::close(rfd);
    }
    if (wfd >= 0) {
        ::close(wfd);
    }
    rfd = wfd = -1;
}

bool channel::send(const std::string &msg)
{
    std::string buf;
    uint64_t n = msg.size();

    buf.append((const char*)&n, sizeof(n));
    buf += msg;
    size_t done = 0;
    while (done < buf.size()) {
        ssize_t w = ::write(wfd, buf.data() + done, buf.size() - done);
        if (w < 0) {
            if (errno == EINTR) {
                continue;
            }
            return false;
        }
        done += (size_t)w;
    }
    return true;
}

bool channel::readable(int timeout_ms) const
{
    struct pollfd pfd = {rfd, POLLIN, 0};
    int rc;

    do {
        rc = poll(&pfd, 1, timeout_ms);
    } while ((rc < 0) && (errno == EINTR));
    return rc > 0;
}

bool channel::read_all(void *buf, size_t len, int timeout_ms)
{
    deadline dl((timeout_ms < 0) ? 1e9 : timeout_ms / 1000.0);
    size_t done = 0;

    while (done < len) {
        int left = (timeout_ms < 0) ? -1 :
                   std::max(0, (int)((dl.end - now_sec()) * 1000));
        if (!readable(left)) {
            return false;
        }
        ssize_t r = ::read(rfd, (char*)buf + done, len - done);
        if (r < 0) {
            if (errno == EINTR) {
                continue;
            }
            return false;
        }
        if (r == 0) {
            return false; /* EOF */
        }
        done += (size_t)r;
    }
    return true;
}

bool channel::recv(std::string *msg, int timeout_ms)
{
    uint64_t n;

    if (!read_all(&n, sizeof(n), timeout_ms) || (n > (1ull << 31))) {
        return false;
    }
    msg->assign(n, '\0');
    return (n == 0) || read_all(&(*msg)[0], n, std::max(timeout_ms, 10000));
}

void channel_pair(channel *parent, channel *child)
{
    int p2c[2], c2p[2];

    if ((pipe(p2c) != 0) || (pipe(c2p) != 0)) {
        abort();
    }
    *parent = channel(c2p[0], p2c[1]);
    *child  = channel(p2c[0], c2p[1]);
}

/* ------------------------------------------------------------ children */

static std::vector<pid_t> &children()
{
    static std::vector<pid_t> list;
    return list;
}

child fork_child(const std::function<int(channel&)> &body, int alarm_sec)
{
    channel pch, cch;
    child c;

    channel_pair(&pch, &cch);
    fflush(stdout);
    fflush(stderr);
    pid_t ppid = getpid();
    pid_t pid  = fork();
    if (pid < 0) {
        abort();
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != ppid) {
            _exit(111);
        }
        signal(SIGALRM, SIG_DFL);
        alarm(alarm_sec);
        pch.close_fds();
        children().clear(); /* not ours to kill */
        bool had = ::testing::Test::HasFailure();
        int rc;
        try {
            rc = body(cch);
        } catch (...) {
            rc = 98;
        }
        if ((rc == 0) && !had && ::testing::Test::HasFailure()) {
            rc = 1;
        }
        fflush(stdout);
        fflush(stderr);
        _exit(rc);
    }
    cch.close_fds();
    children().push_back(pid);
    c.pid = pid;
    c.ch  = pch;
    return c;
}

static void forget_child(pid_t pid)
{
    auto &l = children();
    l.erase(std::remove(l.begin(), l.end(), pid), l.end());
}

int wait_child(pid_t pid, double timeout_sec)
{
    deadline dl(timeout_sec);
    int status;

    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) {
            forget_child(pid);
            if (WIFEXITED(status)) {
                return WEXITSTATUS(status);
            }
            return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 255;
        }
        if ((r < 0) && (errno != EINTR)) {
            forget_child(pid);
            return 254;
        }
        if (dl.expired()) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            forget_child(pid);
            return -1;
        }
        usleep(1000);
    }
}

void kill_children()
{
    std::vector<pid_t> l = children();
    for (pid_t pid : l) {
        int status;
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
    }
    children().clear();
}

/* ------------------------------------------------------------ entity */

const char *mem_kind_name(mem_kind k)
{
    switch (k) {
    case MEM_IFACE_ALLOC: return "iface_alloc";
    case MEM_MD_ALLOC:    return "md_alloc";
    case MEM_PLAIN:       return "plain_reg";
    default:              return "?";
    }
}

ucs_status_t pack_invalidatable(uct_md_h md, uct_mem_h memh, void *address,
                                size_t length, void *rkey_buffer)
{
#if HCAT_HAVE_INVALIDATE_PACK_FLAGS
    hcat_md_mkey_pack_params_t p;
    p.field_mask = HCAT_MD_MKEY_PACK_FIELD_FLAGS;
    p.flags      = HCAT_MD_MKEY_PACK_FLAG_INVALIDATE_RMA;
    return uct_md_mkey_pack_v2(md, memh, address, length, &p, rkey_buffer);
#else
    (void)address;
    (void)length;
    return uct_md_mkey_pack(md, memh, rkey_buffer);
#endif
}

uct_component_h find_hca_component()
{
    uct_component_h *comps, found = nullptr;
    unsigned n;

    if (uct_query_components(&comps, &n) != UCS_OK) {
        return nullptr;
    }
    for (unsigned i = 0; i < n; ++i) {
        uct_component_attr_t attr;
        attr.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME;
        if ((uct_component_query(comps[i], &attr) == UCS_OK) &&
            !strcmp(attr.name, "hca")) {
            found = comps[i];
        }
    }
    uct_release_component_list(comps);
    return found;
}

ucs_status_t entity::err_handler(void *arg, uct_ep_h ep, ucs_status_t status)
{
    entity *e = (entity*)arg;
    e->errors.push_back({ep, status});
    if (e->in_call) {
        e->handler_in_call++;
    }
    if (e->on_error) {
        e->on_error(ep, status);
    }
    return UCS_OK;
}

std::string hca_config_key(const std::string &field)
{
    static int prefixed = -1;

    if (prefixed < 0) {
        uct_component_h component = find_hca_component();
        uct_md_config_t *mdc;

        prefixed = 0;
        if ((component != nullptr) &&
            (uct_md_config_read(component, NULL, NULL, &mdc) == UCS_OK)) {
            /* DEVICE is a field of hca's md table: set to its default */
            prefixed = (uct_config_modify(mdc, "HCA_DEVICE", "hca0") ==
                        UCS_OK);
            uct_config_release(mdc);
        }
    }
    return prefixed ? "HCA_" + field : field;
}

ucs_status_t hca_config_modify(void *config, const std::string &field,
                               const std::string &value)
{
    return uct_config_modify(config, hca_config_key(field).c_str(),
                             value.c_str());
}

void entity::open(const entity_config &cfg)
{
    uct_md_config_t *mdc;

    component = find_hca_component();
    ASSERT_NE(nullptr, component)
        << "UCT component 'hca' not found: run with "
           "LD_PRELOAD=<builddir>/src/uct/hca/.libs/libuct_hca.so";
    ASSERT_EQ(UCS_OK, uct_md_config_read(component, NULL, NULL, &mdc));
    for (auto &kv : cfg.md_cfg) {
        ucs_status_t st = hca_config_modify(mdc, kv.first, kv.second);
        if (st != UCS_OK) {
            uct_config_release(mdc);
            FAIL() << "md config " << kv.first << "=" << kv.second << ": "
                   << st;
        }
    }
    ucs_status_t st = uct_md_open(component, "hca", mdc, &md);
    uct_config_release(mdc);
    ASSERT_EQ(UCS_OK, st) << "uct_md_open(hca)";
    share_md = false;
    ASSERT_EQ(UCS_OK, uct_md_query(md, &md_attr));
    ASSERT_NO_FATAL_FAILURE(open_iface(cfg));
}

void entity::open_on_md(entity &owner, const entity_config &cfg)
{
    component = owner.component;
    md        = owner.md;
    md_attr   = owner.md_attr;
    share_md  = true;
    ASSERT_NO_FATAL_FAILURE(open_iface(cfg));
}

void entity::open_iface(const entity_config &cfg)
{
    uct_iface_config_t *ic;
    uct_iface_params_t p;

    ASSERT_EQ(UCS_OK, ucs_async_context_create(UCS_ASYNC_MODE_POLL, &async));
    ASSERT_EQ(UCS_OK, uct_worker_create(async, UCS_THREAD_MODE_SINGLE,
                                        &worker));
    ASSERT_EQ(UCS_OK, uct_md_iface_config_read(md, "hca", NULL, NULL, &ic));
    for (auto &kv : cfg.iface_cfg) {
        ucs_status_t st = hca_config_modify(ic, kv.first, kv.second);
        if (st != UCS_OK) {
            uct_config_release(ic);
            FAIL() << "iface config " << kv.first << "=" << kv.second << ": "
                   << st;
        }
    }
    memset(&p, 0, sizeof(p));
    p.field_mask = UCT_IFACE_PARAM_FIELD_OPEN_MODE |
                   UCT_IFACE_PARAM_FIELD_DEVICE |
                   UCT_IFACE_PARAM_FIELD_STATS_ROOT |
                   UCT_IFACE_PARAM_FIELD_RX_HEADROOM |
                   UCT_IFACE_PARAM_FIELD_CPU_MASK |
                   UCT_IFACE_PARAM_FIELD_ERR_HANDLER |
                   UCT_IFACE_PARAM_FIELD_ERR_HANDLER_ARG |
                   UCT_IFACE_PARAM_FIELD_ERR_HANDLER_FLAGS;
    p.open_mode            = UCT_IFACE_OPEN_MODE_DEVICE;
    p.mode.device.tl_name  = "hca";
    p.mode.device.dev_name = "hca0";
    p.stats_root           = NULL;
    p.rx_headroom          = cfg.rx_headroom;
    if (cfg.am_alignment != 0) {
        p.field_mask     |= UCT_IFACE_PARAM_FIELD_AM_ALIGNMENT |
                            UCT_IFACE_PARAM_FIELD_AM_ALIGN_OFFSET;
        p.am_alignment    = cfg.am_alignment;
        p.am_align_offset = cfg.am_align_offset;
    }
    UCS_CPU_ZERO(&p.cpu_mask);
    p.err_handler          = err_handler;
    p.err_handler_arg      = this;
    p.err_handler_flags    = 0;
    ucs_status_t st = uct_iface_open(md, worker, &p, ic, &iface);
    uct_config_release(ic);
    ASSERT_EQ(UCS_OK, st) << "uct_iface_open(hca/hca0)";
    ASSERT_EQ(UCS_OK, uct_iface_query(iface, &attr));
    dev_addr.assign(attr.device_addr_len, '\0');
    iface_addr.assign(attr.iface_addr_len, '\0');
    ASSERT_EQ(UCS_OK, uct_iface_get_device_address(
                      iface, (uct_device_addr_t*)&dev_addr[0]));
    ASSERT_EQ(UCS_OK, uct_iface_get_address(
                      iface, (uct_iface_addr_t*)&iface_addr[0]));
    uct_iface_progress_enable(iface, UCT_PROGRESS_SEND | UCT_PROGRESS_RECV);
}

void entity::close()
{
    for (uct_ep_h ep : eps) {
        uct_ep_destroy(ep);
    }
    eps.clear();
    if (iface != nullptr) {
        uct_iface_close(iface);
        iface = nullptr;
    }
    if (worker != nullptr) {
        uct_worker_destroy(worker);
        worker = nullptr;
    }
    if (async != nullptr) {
        ucs_async_context_destroy(async);
        async = nullptr;
    }
    if ((md != nullptr) && !share_md) {
        uct_md_close(md);
    }
    md = nullptr;
}

uct_ep_h entity::create_ep(const std::string &dev, const std::string &ifa)
{
    uct_ep_params_t p;
    uct_ep_h ep = nullptr;

    memset(&p, 0, sizeof(p));
    p.field_mask = UCT_EP_PARAM_FIELD_IFACE | UCT_EP_PARAM_FIELD_DEV_ADDR |
                   UCT_EP_PARAM_FIELD_IFACE_ADDR;
    p.iface      = iface;
    p.dev_addr   = (const uct_device_addr_t*)dev.data();
    p.iface_addr = (const uct_iface_addr_t*)ifa.data();
    ucs_status_t st = uct_ep_create(&p, &ep);
    EXPECT_EQ(UCS_OK, st) << "uct_ep_create";
    if (st != UCS_OK) {
        return nullptr;
    }
    eps.push_back(ep);
    return ep;
}

void entity::destroy_ep(uct_ep_h ep)
{
    auto it = std::find(eps.begin(), eps.end(), ep);
    if (it != eps.end()) {
        eps.erase(it);
        uct_ep_destroy(ep);
    }
    /* a later ep may get the same address: forget this one's errors */
    errors.erase(std::remove_if(errors.begin(), errors.end(),
                                [ep](const err_rec &r) { return r.ep == ep; }),
                 errors.end());
}

int entity::errors_for(uct_ep_h ep) const
{
    int n = 0;
    for (auto &r : errors) {
        n += (r.ep == ep);
    }
    return n;
}

ucs_status_t entity::last_error_for(uct_ep_h ep) const
{
    ucs_status_t st = UCS_OK;
    for (auto &r : errors) {
        if (r.ep == ep) {
            st = r.status;
        }
    }
    return st;
}

bool wait_for(const std::function<bool()> &cond,
              const std::vector<entity*> &ents, double sec)
{
    deadline dl(sec);

    while (!cond()) {
        if (dl.expired()) {
            return cond();
        }
        for (entity *e : ents) {
            if (e != nullptr) {
                e->progress();
            }
        }
    }
    return true;
}

/* ------------------------------------------------------------ memory */

void buffer::alloc(entity &e, mem_kind k, size_t len)
{
    ent       = &e;
    kind      = k;
    alloc_len = std::max<size_t>(len, 1);
    length    = len;
    memset(&mem, 0, sizeof(mem));

    switch (k) {
    case MEM_IFACE_ALLOC: {
        ucs_status_t st = uct_iface_mem_alloc(e.iface, alloc_len,
                                              UCT_MD_MEM_ACCESS_ALL,
                                              "hca_gtest", &mem);
        ASSERT_EQ(UCS_OK, st) << "uct_iface_mem_alloc(" << alloc_len << ")";
        ptr  = mem.address;
        memh = mem.memh;
        EXPECT_EQ(UCT_ALLOC_METHOD_MD, mem.method)
            << "uct_iface_mem_alloc did not give device (md) memory";
        break;
    }
    case MEM_MD_ALLOC: {
        uct_alloc_method_t method = UCT_ALLOC_METHOD_MD;
        uct_mem_alloc_params_t p;
        memset(&p, 0, sizeof(p));
        p.field_mask = UCT_MEM_ALLOC_PARAM_FIELD_FLAGS |
                       UCT_MEM_ALLOC_PARAM_FIELD_MEM_TYPE |
                       UCT_MEM_ALLOC_PARAM_FIELD_MDS |
                       UCT_MEM_ALLOC_PARAM_FIELD_NAME;
        p.flags      = UCT_MD_MEM_ACCESS_ALL;
        p.mem_type   = UCS_MEMORY_TYPE_HOST;
        p.mds.mds    = &e.md;
        p.mds.count  = 1;
        p.name       = "hca_gtest";
        ucs_status_t st = uct_mem_alloc(alloc_len, &method, 1, &p, &mem);
        ASSERT_EQ(UCS_OK, st) << "uct_mem_alloc(MD, " << alloc_len << ")";
        ASSERT_EQ(UCT_ALLOC_METHOD_MD, mem.method);
        ptr  = mem.address;
        memh = mem.memh;
        break;
    }
    case MEM_PLAIN: {
        ASSERT_EQ(0, posix_memalign(&raw, 64, alloc_len));
        memset(raw, 0, alloc_len);
        ptr = raw;
        ucs_status_t st = uct_md_mem_reg(e.md, raw, alloc_len,
                                         UCT_MD_MEM_ACCESS_ALL, &memh);
        if (st != UCS_OK) {
            ::free(raw);
            raw = ptr = nullptr;
            FAIL() << "uct_md_mem_reg: " << st;
        }
        break;
    }
    default:
        FAIL() << "bad memory kind";
    }
    ASSERT_NE(nullptr, ptr);
    ASSERT_TRUE(memh != UCT_MEM_HANDLE_NULL);
}

void buffer::alloc_subrange(entity &e, mem_kind k, size_t total,
                            size_t reg_off, size_t reg_len)
{
    ASSERT_NO_FATAL_FAILURE(alloc(e, k, total));
    ASSERT_LE(reg_off + reg_len, total);
    ASSERT_EQ(UCS_OK, uct_md_mem_reg(e.md, data() + reg_off, reg_len,
                                     UCT_MD_MEM_ACCESS_ALL, &reg_memh));
}

std::string buffer::rkey() const
{
    std::string s(ent->md_attr.rkey_packed_size, '\0');
    uct_mem_h h = (reg_memh != UCT_MEM_HANDLE_NULL) ? reg_memh : memh;
    EXPECT_EQ(UCS_OK, uct_md_mkey_pack(ent->md, h, &s[0]));
    return s;
}

void buffer::free()
{
    if (ptr == nullptr) {
        return;
    }
    if (reg_memh != UCT_MEM_HANDLE_NULL) {
        EXPECT_EQ(UCS_OK, uct_md_mem_dereg(ent->md, reg_memh));
        reg_memh = UCT_MEM_HANDLE_NULL;
    }
    switch (kind) {
    case MEM_IFACE_ALLOC:
        uct_iface_mem_free(&mem);
        break;
    case MEM_MD_ALLOC:
        EXPECT_EQ(UCS_OK, uct_mem_free(&mem));
        break;
    default:
        EXPECT_EQ(UCS_OK, uct_md_mem_dereg(ent->md, memh));
        ::free(raw);
        raw = nullptr;
        break;
    }
    ptr  = nullptr;
    memh = UCT_MEM_HANDLE_NULL;
}

ucs_status_t rkey_holder::unpack(uct_component_h c, const std::string &packed)
{
    release();
    component = c;
    ucs_status_t st = uct_rkey_unpack(c, packed.data(), &b);
    valid = (st == UCS_OK);
    return st;
}

void rkey_holder::release()
{
    if (valid) {
        EXPECT_EQ(UCS_OK, uct_rkey_release(component, &b));
        valid = false;
    }
}

/* ------------------------------------------------------------ completion */

ucs_status_t retry_send(const std::function<ucs_status_t()> &op,
                        const std::vector<entity*> &ents)
{
    deadline dl;
    ucs_status_t st;

    while ((st = op()) == UCS_ERR_NO_RESOURCE) {
        if (dl.expired()) {
            return UCS_ERR_NO_RESOURCE;
        }
        for (entity *e : ents) {
            if (e != nullptr) {
                e->progress();
            }
        }
    }
    return st;
}

ucs_status_t complete_op(ucs_status_t st, test_comp &comp,
                         const std::vector<entity*> &ents)
{
    if (st != UCS_INPROGRESS) {
        return st;
    }
    if (!wait_for([&] { return comp.calls > 0; }, ents)) {
        return UCS_ERR_TIMED_OUT;
    }
    return comp.status;
}

ucs_status_t flush_ep(uct_ep_h ep, const std::vector<entity*> &ents)
{
    deadline dl;

    for (;;) {
        test_comp comp;
        ucs_status_t st = uct_ep_flush(ep, 0, &comp.uct);
        if (st == UCS_OK) {
            return UCS_OK;
        } else if (st == UCS_INPROGRESS) {
            if (!wait_for([&] { return comp.calls > 0; }, ents)) {
                return UCS_ERR_TIMED_OUT;
            }
            return comp.status;
        } else if (st != UCS_ERR_NO_RESOURCE) {
            return st;
        }
        if (dl.expired()) {
            return UCS_ERR_TIMED_OUT;
        }
        for (entity *e : ents) {
            if (e != nullptr) {
                e->progress();
            }
        }
    }
}

ucs_status_t flush_iface(entity &ent, const std::vector<entity*> &ents)
{
    deadline dl;

    for (;;) {
        ucs_status_t st = uct_iface_flush(ent.iface, 0, NULL);
        if (st == UCS_OK) {
            return UCS_OK;
        } else if (st != UCS_INPROGRESS) {
            /* uct.h: OK or INPROGRESS only (UCP fails a worker flush on
             * anything else, UCS_ERR_NO_RESOURCE included) */
            return st;
        }
        if (dl.expired()) {
            return UCS_ERR_TIMED_OUT;
        }
        for (entity *e : ents) {
            if (e != nullptr) {
                e->progress();
            }
        }
    }
}

uint64_t am_hdr_pack(const am_hdr &h)
{
    uint64_t v;
    memcpy(&v, &h, sizeof(v));
    return v;
}

struct am_pack_arg {
    uint64_t    hdr;
    const void *src;
    size_t      len;
};

static size_t am_pack_cb(void *dest, void *arg)
{
    am_pack_arg *a = (am_pack_arg*)arg;
    memcpy(dest, &a->hdr, sizeof(a->hdr));
    memcpy((char*)dest + sizeof(a->hdr), a->src, a->len);
    return sizeof(a->hdr) + a->len;
}

/* Splits [0, len) of src into up to `cnt` iov entries (first_slot on) */
static size_t make_iov(uct_iov_t *iov, const buffer &src, size_t len,
                       size_t cnt, uct_mem_h memh, size_t off = 0)
{
    size_t n = std::max<size_t>(1, std::min(cnt, std::max<size_t>(len, 1)));
    size_t piece = len / n, pos = 0;

    for (size_t i = 0; i < n; ++i) {
        size_t l      = (i == n - 1) ? (len - pos) : piece;
        iov[i].buffer = src.data() + off + pos;
        iov[i].length = l;
        iov[i].memh   = memh;
        iov[i].stride = 0;
        iov[i].count  = 1;
        pos          += l;
    }
    return n;
}

ucs_status_t send_test_am(uct_ep_h ep, am_method m, const am_hdr &hdr,
                          const buffer &src, size_t iovcnt, test_comp *comp,
                          unsigned flags)
{
    uint64_t h = am_hdr_pack(hdr);
    size_t len = hdr.length;
    uct_iov_t iov[16];

    switch (m) {
    case AM_SHORT:
        return uct_ep_am_short(ep, AM_ID, h, src.data(), (unsigned)len);
    case AM_SHORT_IOV: {
        iov[0].buffer = &h;
        iov[0].length = sizeof(h);
        iov[0].memh   = UCT_MEM_HANDLE_NULL;
        iov[0].stride = 0;
        iov[0].count  = 1;
        /* the header takes one iov entry */
        size_t n = make_iov(iov + 1, src, len,
                            std::max<size_t>(1, std::min<size_t>(iovcnt, 16) - 1),
                            UCT_MEM_HANDLE_NULL);
        return uct_ep_am_short_iov(ep, AM_ID, iov, n + 1);
    }
    case AM_BCOPY: {
        am_pack_arg a = {h, src.data(), len};
        ssize_t r = uct_ep_am_bcopy(ep, AM_ID, am_pack_cb, &a, flags);
        if (r < 0) {
            return (ucs_status_t)r;
        }
        return (r == (ssize_t)(len + sizeof(h))) ? UCS_OK : UCS_ERR_IO_ERROR;
    }
    case AM_ZCOPY: {
        size_t n = make_iov(iov, src, len, std::min<size_t>(iovcnt, 16),
                            src.memh);
        return uct_ep_am_zcopy(ep, AM_ID, &h, sizeof(h), iov, n, flags,
                               comp ? &comp->uct : NULL);
    }
    }
    return UCS_ERR_INVALID_PARAM;
}

/* ------------------------------------------------------------ target */

ucs_status_t target_server::am_cb(void *arg, void *data, size_t length,
                                  unsigned)
{
    target_server *s = (target_server*)arg;
    am_hdr h;

    s->st.count++;
    if (length < sizeof(h)) {
        s->st.bad++;
        if (s->st.first_error.empty()) {
            s->st.first_error = "AM of " + std::to_string(length) +
                                " bytes: shorter than its header";
        }
        return UCS_OK;
    }
    memcpy(&h, data, sizeof(h));
    if (length != sizeof(h) + h.length) {
        s->st.bad++;
        if (s->st.first_error.empty()) {
            s->st.first_error = "AM length " + std::to_string(length) +
                                ", expected 8+" + std::to_string(h.length);
        }
    } else {
        ssize_t bad = pat_check((char*)data + sizeof(h), h.length, h.seed);
        if (bad >= 0) {
            s->st.bad++;
            if (s->st.first_error.empty()) {
                s->st.first_error = "AM payload of " +
                                    std::to_string(h.length) +
                                    " bytes differs at byte " +
                                    std::to_string(bad);
            }
        }
    }
    s->st.bytes += h.length;
    if (h.flags & AM_HDR_ORDERED) {
        if (h.seed != s->next_seq[h.stream]) {
            s->st.order_bad++;
            if (s->st.first_error.empty()) {
                s->st.first_error = "stream " + std::to_string(h.stream) +
                                    ": got seq " + std::to_string(h.seed) +
                                    ", expected " +
                                    std::to_string(s->next_seq[h.stream]);
            }
        }
        s->next_seq[h.stream] = h.seed + 1;
    }
    return UCS_OK;
}

void target_server::open(const entity_config &cfg)
{
    ASSERT_NO_FATAL_FAILURE(ent.open(cfg));
    ASSERT_EQ(UCS_OK, uct_iface_set_am_handler(ent.iface, AM_ID, am_cb, this,
                                               0));
}

int target_server::alloc(mem_kind kind, size_t total, size_t reg_off,
                         size_t reg_len)
{
    std::unique_ptr<buffer> b(new buffer());
    if (reg_len == 0) {
        b->alloc(ent, kind, total);
    } else {
        b->alloc_subrange(ent, kind, total, reg_off, reg_len);
    }
    if (b->ptr == nullptr) {
        return -1;
    }
    int id = next_id++;
    bufs[id] = std::move(b);
    return id;
}

buffer *target_server::get(int id)
{
    auto it = bufs.find(id);
    return (it == bufs.end()) ? nullptr : it->second.get();
}

enum {
    CMD_ALLOC = 1, CMD_FREE, CMD_FILL, CMD_CHECK, CMD_READ, CMD_WRITE,
    CMD_STATS, CMD_RESET, CMD_WAIT_AM, CMD_QUIT
};

static void stats_to_wire(const am_stats &s, wire *w)
{
    w->u64(s.count).u64(s.bytes).u64(s.bad).u64(s.order_bad)
      .blob(s.first_error);
}

static am_stats stats_from_wire(wire *w)
{
    am_stats s;
    s.count       = w->u64();
    s.bytes       = w->u64();
    s.bad         = w->u64();
    s.order_bad   = w->u64();
    s.first_error = w->blob();
    return s;
}

static bool range_ok(buffer *b, uint64_t off, uint64_t len)
{
    return (b != nullptr) && (off <= b->length) && (len <= b->length - off);
}

int target_server::serve(channel &ch)
{
    unsigned idle = 0;

    for (;;) {
        if (ent.progress() != 0) {
            idle = 0;
        } else {
            ++idle;
        }
        if (!ch.readable((idle > 2000) ? 1 : 0)) {
            continue;
        }
        std::string msg;
        if (!ch.recv(&msg, 10000)) {
            return 3; /* the parent is gone */
        }
        wire req(msg), rep;
        uint64_t cmd = req.u64();
        switch (cmd) {
        case CMD_ALLOC: {
            mem_kind k   = (mem_kind)req.u64();
            size_t total = req.u64(), roff = req.u64(), rlen = req.u64();
            int id       = alloc(k, total, roff, rlen);
            buffer *b    = get(id);
            rep.u64((uint64_t)(int64_t)id);
            rep.u64(b ? b->addr(rlen ? roff : 0) : 0);
            rep.u64(b ? b->addr() : 0);
            rep.blob(b ? b->rkey() : std::string());
            break;
        }
        case CMD_FREE:
            free((int)req.u64());
            break;
        case CMD_FILL: {
            buffer *b = get((int)req.u64());
            uint64_t off = req.u64(), len = req.u64(), seed = req.u64(),
                     poff = req.u64();
            if (range_ok(b, off, len)) {
                pat_fill(b->data() + off, len, seed, poff);
                rep.u64(0);
            } else {
                rep.u64((uint64_t)-2);
            }
            break;
        }
        case CMD_CHECK: {
            buffer *b = get((int)req.u64());
            uint64_t off = req.u64(), len = req.u64(), seed = req.u64(),
                     poff = req.u64();
            rep.u64(range_ok(b, off, len) ?
                    (uint64_t)(int64_t)pat_check(b->data() + off, len, seed,
                                                 poff) :
                    (uint64_t)-2);
            break;
        }
        case CMD_READ: {
            buffer *b = get((int)req.u64());
            uint64_t off = req.u64(), len = req.u64();
            rep.blob(range_ok(b, off, len) ?
                     std::string((char*)b->data() + off, len) : "");
            break;
        }
        case CMD_WRITE: {
            buffer *b = get((int)req.u64());
            uint64_t off    = req.u64();
            std::string d   = req.blob();
            if (range_ok(b, off, d.size())) {
                memcpy(b->data() + off, d.data(), d.size());
            }
            break;
        }
        case CMD_STATS:
            stats_to_wire(st, &rep);
            break;
        case CMD_RESET:
            st = am_stats();
            next_seq.assign(256, 0);
            break;
        case CMD_WAIT_AM: {
            uint64_t count = req.u64(), ms = req.u64();
            wait_for([&] { return st.count >= count; }, {&ent}, ms / 1000.0);
            stats_to_wire(st, &rep);
            break;
        }
        case CMD_QUIT:
            ch.send(rep.data);
            return ::testing::Test::HasFailure() ? 1 : 0;
        default:
            return 4;
        }
        if (!ch.send(rep.data)) {
            return 5;
        }
    }
}

uint64_t target::read_u64(int id, size_t off)
{
    std::string s = read(id, off, 8);
    uint64_t v    = 0;
    EXPECT_EQ(8u, s.size());
    memcpy(&v, s.data(), std::min<size_t>(8, s.size()));
    return v;
}

uint32_t target::read_u32(int id, size_t off)
{
    std::string s = read(id, off, 4);
    uint32_t v    = 0;
    EXPECT_EQ(4u, s.size());
    memcpy(&v, s.data(), std::min<size_t>(4, s.size()));
    return v;
}

void target::write_u64(int id, size_t off, uint64_t v)
{
    write(id, off, std::string((char*)&v, 8));
}

void target::write_u32(int id, size_t off, uint32_t v)
{
    write(id, off, std::string((char*)&v, 4));
}

/* local */

void local_target::open(const entity_config &cfg)
{
    ASSERT_NO_FATAL_FAILURE(srv.open(cfg));
    dev_addr   = srv.ent.dev_addr;
    iface_addr = srv.ent.iface_addr;
}

target::rbuf local_target::alloc(mem_kind kind, size_t total, size_t reg_off,
                                 size_t reg_len)
{
    rbuf r;
    r.id      = srv.alloc(kind, total, reg_off, reg_len);
    buffer *b = srv.get(r.id);
    r.addr    = b ? b->addr(reg_len ? reg_off : 0) : 0;
    r.base    = b ? b->addr() : 0;
    r.rkey    = b ? b->rkey() : "";
    EXPECT_NE(nullptr, b);
    return r;
}

void local_target::fill(int id, size_t off, size_t len, uint64_t seed,
                        uint64_t pat_off)
{
    buffer *b = srv.get(id);
    ASSERT_TRUE(range_ok(b, off, len));
    pat_fill(b->data() + off, len, seed, pat_off);
}

int64_t local_target::check(int id, size_t off, size_t len, uint64_t seed,
                            uint64_t pat_off)
{
    buffer *b = srv.get(id);
    if (!range_ok(b, off, len)) {
        return -2;
    }
    return pat_check(b->data() + off, len, seed, pat_off);
}

std::string local_target::read(int id, size_t off, size_t len)
{
    buffer *b = srv.get(id);
    return range_ok(b, off, len) ? std::string((char*)b->data() + off, len) :
                                   "";
}

void local_target::write(int id, size_t off, const std::string &data)
{
    buffer *b = srv.get(id);
    ASSERT_TRUE(range_ok(b, off, data.size()));
    memcpy(b->data() + off, data.data(), data.size());
}

void local_target::reset_stats()
{
    srv.st = am_stats();
    srv.next_seq.assign(256, 0);
}

am_stats local_target::wait_am(uint64_t count, entity *local)
{
    wait_for([&] { return srv.st.count >= count; }, {local, &srv.ent});
    return srv.st;
}

/* remote */

remote_target::~remote_target()
{
    stop();
}

void remote_target::start(const entity_config &cfg)
{
    child c = fork_child([cfg](channel &ch) -> int {
        target_server srv;
        srv.open(cfg);
        if (::testing::Test::HasFatalFailure()) {
            return 2;
        }
        wire w;
        w.blob(srv.ent.dev_addr).blob(srv.ent.iface_addr);
        if (!ch.send(w.data)) {
            return 3;
        }
        return srv.serve(ch);
    });
    pid = c.pid;
    ch  = c.ch;
    std::string msg;
    ASSERT_TRUE(ch.recv(&msg, (int)(TIMEOUT_SEC * 1000)))
        << "the target process did not send its address";
    wire w(msg);
    dev_addr   = w.blob();
    iface_addr = w.blob();
}

void remote_target::stop()
{
    if (pid <= 0) {
        return;
    }
    wire req, rep;
    req.u64(CMD_QUIT);
    local = nullptr;
    rpc(req, &rep, 5.0);
    EXPECT_EQ(0, wait_child(pid)) << "target process exit status";
    ch.close_fds();
    pid = -1;
}

bool remote_target::rpc(const wire &req, wire *reply, double sec)
{
    deadline dl(sec);
    std::string msg;

    if (!ch.send(req.data)) {
        ADD_FAILURE() << "cannot send to the target process";
        return false;
    }
    for (;;) {
        if (local != nullptr) {
            local->progress();
        }
        if (ch.readable((local != nullptr) ? 0 : 10)) {
            if (!ch.recv(&msg, 10000)) {
                ADD_FAILURE() << "the target process closed its pipe";
                return false;
            }
            *reply = wire(msg);
            return true;
        }
        if (dl.expired()) {
            ADD_FAILURE() << "no reply from the target process in " << sec
                          << " s";
            return false;
        }
    }
}

target::rbuf remote_target::alloc(mem_kind kind, size_t total, size_t reg_off,
                                  size_t reg_len)
{
    wire req, rep;
    rbuf r = {-1, 0, 0, ""};

    req.u64(CMD_ALLOC).u64(kind).u64(total).u64(reg_off).u64(reg_len);
    if (rpc(req, &rep)) {
        r.id   = (int)(int64_t)rep.u64();
        r.addr = rep.u64();
        r.base = rep.u64();
        r.rkey = rep.blob();
    }
    EXPECT_GT(r.id, 0) << "remote allocation failed";
    return r;
}

void remote_target::free(int id)
{
    wire req, rep;
    req.u64(CMD_FREE).u64(id);
    rpc(req, &rep);
}

void remote_target::fill(int id, size_t off, size_t len, uint64_t seed,
                         uint64_t pat_off)
{
    wire req, rep;
    req.u64(CMD_FILL).u64(id).u64(off).u64(len).u64(seed).u64(pat_off);
    if (rpc(req, &rep, 60)) {
        EXPECT_EQ(0u, rep.u64()) << "remote fill failed";
    }
}

int64_t remote_target::check(int id, size_t off, size_t len, uint64_t seed,
                             uint64_t pat_off)
{
    wire req, rep;
    req.u64(CMD_CHECK).u64(id).u64(off).u64(len).u64(seed).u64(pat_off);
    if (!rpc(req, &rep, 60)) {
        return -2;
    }
    return (int64_t)rep.u64();
}

std::string remote_target::read(int id, size_t off, size_t len)
{
    wire req, rep;
    req.u64(CMD_READ).u64(id).u64(off).u64(len);
    return rpc(req, &rep) ? rep.blob() : "";
}

void remote_target::write(int id, size_t off, const std::string &data)
{
    wire req, rep;
    req.u64(CMD_WRITE).u64(id).u64(off).blob(data);
    rpc(req, &rep);
}

am_stats remote_target::stats()
{
    wire req, rep;
    req.u64(CMD_STATS);
    if (!rpc(req, &rep)) {
        return am_stats();
    }
    return stats_from_wire(&rep);
}

void remote_target::reset_stats()
{
    wire req, rep;
    req.u64(CMD_RESET);
    rpc(req, &rep);
}

am_stats remote_target::wait_am(uint64_t count, entity *l)
{
    wire req, rep;
    entity *save = local;

    local = l;
    req.u64(CMD_WAIT_AM).u64(count).u64((uint64_t)(TIMEOUT_SEC * 1000));
    bool ok = rpc(req, &rep, TIMEOUT_SEC + 5);
    local   = save;
    return ok ? stats_from_wire(&rep) : am_stats();
}

const char *topology_name(topology t)
{
    switch (t) {
    case TOPO_LOCAL:         return "local";
    case TOPO_REMOTE:        return "remote";
    case TOPO_REMOTE_NO_CMA: return "remote_nocma";
    default:                 return "?";
    }
}

const char *fabric_name(uct_fabric f)
{
    switch (f) {
    case FABRIC_SHM: return "shm";
    case FABRIC_TCP: return "tcp";
    default:         return "?";
    }
}

std::vector<uct_fabric> uct_fabrics()
{
    return {FABRIC_SHM, FABRIC_TCP};
}

cfg_list fabric_md_config(uct_fabric f)
{
    switch (f) {
    case FABRIC_TCP:
        return cfg_list{{"FABRIC", "tcp"}, {"NET_DEVICES", "lo"}};
    case FABRIC_SHM:
    default:
        return cfg_list{{"FABRIC", "shm"}};
    }
}

entity_config fabric_config(uct_fabric f)
{
    entity_config cfg;
    cfg.md_cfg = fabric_md_config(f);
    return cfg;
}

entity_config topology_config(topology t, uct_fabric f)
{
    entity_config cfg;
    cfg.md_cfg = fabric_md_config(f);
    if (t == TOPO_REMOTE_NO_CMA) {
        cfg.md_cfg.push_back({"SINGLE_COPY", "n"});
    }
    return cfg;
}

void topo_sender::open_topo(topology t, const entity_config &sender_extra)
{
    entity_config cfg = topology_config(t, topo_fabric);

    topo = t;
    cfg.md_cfg.insert(cfg.md_cfg.end(), sender_extra.md_cfg.begin(),
                      sender_extra.md_cfg.end());
    cfg.iface_cfg.insert(cfg.iface_cfg.end(), sender_extra.iface_cfg.begin(),
                         sender_extra.iface_cfg.end());
    ASSERT_NO_FATAL_FAILURE(make_target(t, &tgt, entity_config(),
                                        topo_fabric));
    ASSERT_NO_FATAL_FAILURE(sender.open(cfg));
    if (t != TOPO_LOCAL) {
        ((remote_target*)tgt.get())->set_local(&sender);
    }
    ep = sender.create_ep(tgt->dev_addr, tgt->iface_addr);
    ASSERT_NE(nullptr, ep);
    ents = {&sender, tgt->local_entity()};
}

void topo_sender::close_topo()
{
    if (tgt && (topo != TOPO_LOCAL)) {
        ((remote_target*)tgt.get())->set_local(nullptr);
    }
    sender.close();
    tgt.reset();
}

void make_target(topology t, std::unique_ptr<target> *tgt,
                 const entity_config &extra, uct_fabric f)
{
    entity_config cfg = topology_config(t, f);
    cfg.md_cfg.insert(cfg.md_cfg.end(), extra.md_cfg.begin(),
                      extra.md_cfg.end());
    cfg.iface_cfg.insert(cfg.iface_cfg.end(), extra.iface_cfg.begin(),
                         extra.iface_cfg.end());
    cfg.rx_headroom = extra.rx_headroom;
    if (t == TOPO_LOCAL) {
        local_target *l = new local_target();
        tgt->reset(l);
        ASSERT_NO_FATAL_FAILURE(l->open(cfg));
    } else {
        remote_target *r = new remote_target();
        tgt->reset(r);
        ASSERT_NO_FATAL_FAILURE(r->start(cfg));
    }
}

std::string read_memstream(const std::function<void(FILE*)> &fn)
{
    char *buf  = nullptr;
    size_t len = 0;
    FILE *f    = open_memstream(&buf, &len);
    if (f == nullptr) {
        return "";
    }
    fn(f);
    fclose(f);
    std::string s(buf, len);
    ::free(buf);
    return s;
}

} /* namespace hcat */
