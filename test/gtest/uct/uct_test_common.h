/*
 * uct_test_common.h - helpers of the gtest_uct suite: the hca transport
 * driven through UCX's public UCT API only (<uct/api/uct.h>), the way stock
 * UCX 1.13 sees it when libuct_hca.so is LD_PRELOADed.
 *
 *  - entity: component "hca" -> md -> worker -> iface "hca"/"hca0", with
 *    UCX_HCA_* settings applied through uct_config_modify, an error handler
 *    that records (ep, status) and endpoint creation from addresses.
 *  - buffer: memory of one of three kinds - device memory from
 *    uct_iface_mem_alloc, device memory from uct_mem_alloc(MD) and plain
 *    malloc'ed memory registered with uct_md_mem_reg - plus its packed rkey.
 *  - child processes: fork_child() runs a function in a forked child (which
 *    _exit()s with its status; a watchdog alarm and PDEATHSIG bound it),
 *    channel is a pair of pipes with length-prefixed messages and timeouts.
 *  - target: the passive side of the data tests.  It owns an entity and
 *    buffers, verifies received active messages (pattern + per-stream
 *    sequence) and answers fill/check/read/write requests.  It runs in this
 *    process (local_target, a second worker) or in a forked child
 *    (remote_target, driven over pipes), so that one test body covers both.
 *
 * Every wait has a deadline (TIMEOUT_SEC): a broken transport fails tests,
 * it does not hang them.
 */
#ifndef HCA_GTEST_UCT_TEST_COMMON_H
#define HCA_GTEST_UCT_TEST_COMMON_H

#include <gtest/gtest.h>

#include <uct/api/uct.h>

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

/* uct_md_mem_dereg_v2 is exported by libuct, but Debian does not install
 * uct/api/v2/uct_v2.h: its 1.13.1 declarations, as published there */
extern "C" {
typedef struct hcat_md_mem_dereg_params {
    uint64_t          field_mask;
    unsigned          flags;
    uct_mem_h         memh;
    uct_completion_t *comp;
} hcat_md_mem_dereg_params_t;
enum {
    HCAT_MD_MEM_DEREG_FIELD_MEMH       = UCS_BIT(0),
    HCAT_MD_MEM_DEREG_FIELD_FLAGS      = UCS_BIT(1),
    HCAT_MD_MEM_DEREG_FIELD_COMPLETION = UCS_BIT(2),
    HCAT_MD_MEM_DEREG_FLAG_INVALIDATE  = UCS_BIT(0)
};
ucs_status_t uct_md_mem_dereg_v2(uct_md_h md,
                                 const hcat_md_mem_dereg_params_t *params);

/* and from 1.15 on, the key that UCT_MD_MEM_DEREG_FLAG_INVALIDATE
 * invalidates: packed by uct_md_mkey_pack_v2 with an INVALIDATE flag
 * ("in order for UCT_MD_MEM_DEREG_FLAG_INVALIDATE flag to function the
 * UCT_MD_MKEY_PACK_FLAG_INVALIDATE_RMA and/or _AMO flag must be set",
 * uct_v2.h) */
#define HCAT_HAVE_INVALIDATE_PACK_FLAGS \
    ((UCT_VERNO_MAJOR > 1) || (UCT_VERNO_MINOR >= 15))
#if HCAT_HAVE_INVALIDATE_PACK_FLAGS
typedef struct hcat_md_mkey_pack_params {
    uint64_t field_mask;
    unsigned flags;
} hcat_md_mkey_pack_params_t;
enum {
    HCAT_MD_MKEY_PACK_FIELD_FLAGS         = UCS_BIT(0),
    HCAT_MD_MKEY_PACK_FLAG_INVALIDATE_RMA = UCS_BIT(0)
};
ucs_status_t uct_md_mkey_pack_v2(uct_md_h md, uct_mem_h memh, void *address,
                                 size_t length,
                                 const hcat_md_mkey_pack_params_t *params,
                                 void *mkey_buffer);
#endif
}

/* googletest prints ucs_status_t by name */
inline std::ostream &operator<<(std::ostream &os, ucs_status_t s)
{
    return os << ucs_status_string(s) << "(" << (int)s << ")";
}

namespace hcat {

/* a packed key that a deregistration with UCT_MD_MEM_DEREG_FLAG_INVALIDATE
 * may invalidate (the plain one before UCX 1.15) */
ucs_status_t pack_invalidatable(uct_md_h md, uct_mem_h memh, void *address,
                                size_t length, void *rkey_buffer);

constexpr double TIMEOUT_SEC  = 15.0;  /* every wait loop */
constexpr int    CHILD_ALARM  = 90;    /* a child's own watchdog (s) */
constexpr uint8_t AM_ID       = 7;
constexpr size_t MAX_ZCOPY_CAP = 256ul << 20;

double now_sec();

struct deadline {
    double end;
    explicit deadline(double sec = TIMEOUT_SEC) : end(now_sec() + sec) {}
    bool expired() const { return now_sec() > end; }
};

/* ------------------------------------------------------------ patterns */
/* Byte k of pattern `seed` is byte (k % 8) of pat_word(seed, k / 8): any
 * window of a pattern can be produced and checked from its offset. */
uint64_t pat_word(uint64_t seed, uint64_t idx);
void     pat_fill(void *buf, size_t len, uint64_t seed, uint64_t pat_off = 0);
/* -1 if equal, else the index (in buf) of the first wrong byte */
ssize_t  pat_check(const void *buf, size_t len, uint64_t seed,
                   uint64_t pat_off = 0);
std::string pat_string(size_t len, uint64_t seed, uint64_t pat_off = 0);

/* ------------------------------------------------------------ channel */
class channel {
public:
    channel() : rfd(-1), wfd(-1) {}
    channel(int r, int w) : rfd(r), wfd(w) {}
    void close_fds();
    bool send(const std::string &msg);                /* length-prefixed */
    /* false on timeout/EOF; timeout_ms < 0 waits forever */
    bool recv(std::string *msg, int timeout_ms);
    bool readable(int timeout_ms) const;
    int rfd, wfd;
private:
    bool read_all(void *buf, size_t len, int timeout_ms);
};

/* Two pipes: ends[0] is the parent's, ends[1] the child's. */
void channel_pair(channel *parent, channel *child);

/* Simple serialization of requests/replies. */
class wire {
public:
    wire() : pos(0) {}
    explicit wire(const std::string &s) : data(s), pos(0) {}
    wire &u64(uint64_t v) { data.append((const char*)&v, sizeof(v)); return *this; }
    wire &blob(const std::string &s) { u64(s.size()); data += s; return *this; }
    uint64_t u64() {
        uint64_t v = 0;
        if (pos + sizeof(v) <= data.size()) {
            memcpy(&v, data.data() + pos, sizeof(v));
        }
        pos += sizeof(v);
        return v;
    }
    std::string blob() {
        size_t n = u64();
        std::string s = (pos <= data.size()) ? data.substr(pos, n) : "";
        pos += n;
        return s;
    }
    std::string data;
    size_t pos;
};

/* ------------------------------------------------------------ children */
struct child {
    pid_t   pid;
    channel ch;
};

/* Runs body(channel) in a forked child; the child exits with body's return
 * value (1 if a googletest assertion failed in it and body returned 0). */
child fork_child(const std::function<int(channel&)> &body,
                 int alarm_sec = CHILD_ALARM);
/* Waits for the child; returns its exit status, 128+sig if killed by a
 * signal, -1 if it did not end in time (then it is killed). */
int wait_child(pid_t pid, double timeout_sec = TIMEOUT_SEC);
/* Kills (SIGKILL) and reaps every child not yet waited for. */
void kill_children();

/* ------------------------------------------------------------ entity */
enum mem_kind {
    MEM_IFACE_ALLOC = 0, /* uct_iface_mem_alloc: device memory */
    MEM_MD_ALLOC,        /* uct_mem_alloc(UCT_ALLOC_METHOD_MD) */
    MEM_PLAIN,           /* malloc + uct_md_mem_reg */
    MEM_KIND_LAST
};
const char *mem_kind_name(mem_kind k);

typedef std::vector<std::pair<std::string, std::string>> cfg_list;

struct entity_config {
    cfg_list md_cfg;       /* e.g. {"SINGLE_COPY", "n"} */
    cfg_list iface_cfg;    /* e.g. {"RX_QUEUE_LEN", "8"} */
    size_t   rx_headroom = 0;
    size_t   am_alignment    = 0;  /* != 0: UCT_IFACE_PARAM_FIELD_AM_* */
    size_t   am_align_offset = 0;
};

uct_component_h find_hca_component();

/*
 * The name under which uct_config_modify (and UCP's cached keys) find one of
 * hca's fields, e.g. "RX_QUEUE_LEN": UCX 1.13 matches a table's own field
 * names; later versions match the table prefix plus the field name,
 * "HCA_RX_QUEUE_LEN" (ucs/config/parser.c, ucs_config_prefix_name_match),
 * and UCP >= 1.20 refuses a key that no table has.  Which one the UCX in
 * this process does is probed once, on the md's own table.
 */
std::string hca_config_key(const std::string &field);

/* uct_config_modify of one of hca's fields, by its unprefixed name */
ucs_status_t hca_config_modify(void *config, const std::string &field,
                               const std::string &value);

class entity {
public:
    struct err_rec {
        uct_ep_h     ep;
        ucs_status_t status;
    };

    entity() : component(nullptr), md(nullptr), async(nullptr),
               worker(nullptr), iface(nullptr), share_md(false) {}
    ~entity() { close(); }
    entity(const entity&) = delete;
    entity &operator=(const entity&) = delete;

    /* googletest assertions: call as ASSERT_NO_FATAL_FAILURE(e.open()) */
    void open(const entity_config &cfg = entity_config());
    /* second iface on another entity's md (and component) */
    void open_on_md(entity &md_owner, const entity_config &cfg = entity_config());
    void close();

    uct_ep_h create_ep(const std::string &dev_addr,
                       const std::string &iface_addr);
    uct_ep_h connect_to(const entity &peer) {
        return create_ep(peer.dev_addr, peer.iface_addr);
    }
    void destroy_ep(uct_ep_h ep);

    unsigned progress() { return uct_worker_progress(worker); }
    int errors_for(uct_ep_h ep) const;
    ucs_status_t last_error_for(uct_ep_h ep) const;

    uct_component_h     component;
    uct_md_h            md;
    ucs_async_context_t *async;
    uct_worker_h        worker;
    uct_iface_h         iface;
    uct_iface_attr_t    attr;
    uct_md_attr_t       md_attr;
    std::string         dev_addr, iface_addr;
    std::vector<err_rec> errors;
    std::vector<uct_ep_h> eps;
    /* set by tests around a send/ep_check call: the error handler must run
     * from progress, never from inside such a call */
    bool                in_call = false;
    int                 handler_in_call = 0;
    /* called by the error handler after recording (may destroy eps) */
    std::function<void(uct_ep_h, ucs_status_t)> on_error;

private:
    void open_iface(const entity_config &cfg);
    static ucs_status_t err_handler(void *arg, uct_ep_h ep,
                                    ucs_status_t status);
    bool share_md;
};

/* Progress every entity given until cond() or the deadline. */
bool wait_for(const std::function<bool()> &cond,
              const std::vector<entity*> &ents, double sec = TIMEOUT_SEC);

/* ------------------------------------------------------------ memory */
class buffer {
public:
    buffer() : ent(nullptr), kind(MEM_PLAIN), ptr(nullptr), length(0),
               memh(UCT_MEM_HANDLE_NULL), raw(nullptr), alloc_len(0),
               reg_memh(UCT_MEM_HANDLE_NULL) { memset(&mem, 0, sizeof(mem)); }
    ~buffer() { free(); }
    buffer(const buffer&) = delete;
    buffer &operator=(const buffer&) = delete;

    /* Allocates `len` bytes of `kind` (at least 1 byte). */
    void alloc(entity &e, mem_kind kind, size_t len);
    /* Allocates total bytes and registers only [reg_off, reg_off+reg_len):
     * the rkey covers that sub-range (device kinds: a registration inside
     * device memory). ptr/length describe the whole allocation. */
    void alloc_subrange(entity &e, mem_kind kind, size_t total, size_t reg_off,
                        size_t reg_len);
    void free();
    uint8_t *data() const { return (uint8_t*)ptr; }
    uint64_t addr(size_t off = 0) const { return (uint64_t)(uintptr_t)ptr + off; }
    std::string rkey() const;    /* packed */

    entity   *ent;
    mem_kind  kind;
    void     *ptr;
    size_t    length;
    uct_mem_h memh;              /* for local zcopy use (whole allocation) */
private:
    void                    *raw;
    size_t                   alloc_len;
    uct_allocated_memory_t   mem;
    uct_mem_h                reg_memh;  /* sub-range registration */
};

/* An unpacked remote key */
struct rkey_holder {
    rkey_holder() : component(nullptr), valid(false) { b.rkey = UCT_INVALID_RKEY; b.handle = nullptr; b.type = nullptr; }
    ~rkey_holder() { release(); }
    ucs_status_t unpack(uct_component_h c, const std::string &packed);
    void release();
    uct_rkey_t rkey() const { return b.rkey; }
    uct_component_h   component;
    uct_rkey_bundle_t b;
    bool              valid;
};

/* ------------------------------------------------------------ completions */
struct test_comp {
    uct_completion_t uct;
    int              calls;
    ucs_status_t     status;   /* status of the last call */
    test_comp() { reset(); }
    void reset(int count = 1) {
        uct.func   = cb;
        uct.count  = count;
        uct.status = UCS_OK;
        calls      = 0;
        status     = UCS_ERR_LAST;
    }
    static void cb(uct_completion_t *self) {
        test_comp *c = (test_comp*)self;   /* uct is the first member */
        c->calls++;
        c->status = self->status;
    }
};

/* A completion that records how many other completions of its group had
 * been called when it ran: a flush must complete after every operation
 * issued before it. */
struct ordered_comp {
    uct_completion_t uct;       /* first: the completion is found by cast */
    int             *done;      /* shared counter of the group */
    int              calls;
    int              seen;      /* *done when called */
    ucs_status_t     status;

    void reset(int *counter)
    {
        uct.func   = cb;
        uct.count  = 1;
        uct.status = UCS_OK;
        done       = counter;
        calls      = 0;
        seen       = -1;
        status     = UCS_ERR_LAST;
    }
    void done_now()   /* the operation completed inside its call */
    {
        calls     = 1;
        seen      = (*done)++;
        status    = UCS_OK;
        uct.count = 0;
    }
    static void cb(uct_completion_t *self)
    {
        ordered_comp *c = (ordered_comp*)self;
        c->calls++;
        c->seen   = *c->done;
        c->status = self->status;
        ++*c->done;
    }
};

/* Sends again on UCS_ERR_NO_RESOURCE (progressing) until anything else or
 * the deadline; returns the final status. */
ucs_status_t retry_send(const std::function<ucs_status_t()> &op,
                        const std::vector<entity*> &ents);
/* uct_ep_flush until UCS_OK (progressing); UCS_ERR_TIMED_OUT on deadline */
ucs_status_t flush_ep(uct_ep_h ep, const std::vector<entity*> &ents);
ucs_status_t flush_iface(entity &e, const std::vector<entity*> &ents);
/* Completes a zcopy/get/fetch: status from the op; if INPROGRESS waits for
 * comp; returns the final status (UCS_ERR_TIMED_OUT on deadline). */
ucs_status_t complete_op(ucs_status_t st, test_comp &comp,
                         const std::vector<entity*> &ents);

/* The AM header used by the tests: what lets a receiver verify a message */
struct am_hdr {
    uint32_t seed;    /* pattern seed of the payload / sequence number */
    uint16_t length;  /* payload bytes after the header */
    uint8_t  stream;  /* ordering stream */
    uint8_t  flags;   /* AM_HDR_ORDERED: seed is a sequence in the stream */
};
static_assert(sizeof(am_hdr) == 8, "am_hdr is the 64-bit UCT AM header");
enum { AM_HDR_ORDERED = 1 };
uint64_t am_hdr_pack(const am_hdr &h);

/* Sends one test AM of `payload` bytes (pattern of hdr.seed) with the
 * given method. `src` is a registered buffer holding the payload at offset
 * 0 (used by zcopy, whose payload is split into `iovcnt` pieces). */
enum am_method { AM_SHORT = 0, AM_SHORT_IOV, AM_BCOPY, AM_ZCOPY };
ucs_status_t send_test_am(uct_ep_h ep, am_method m, const am_hdr &hdr,
                          const buffer &src, size_t iovcnt,
                          test_comp *comp, unsigned flags = 0);

/* ------------------------------------------------------------ target */
struct am_stats {
    uint64_t count     = 0;  /* messages */
    uint64_t bytes     = 0;  /* payload bytes */
    uint64_t bad       = 0;  /* wrong length or payload */
    uint64_t order_bad = 0;  /* out-of-order in an ordered stream */
    std::string first_error;
};

/* The passive side, as run in its own process or worker */
class target_server {
public:
    target_server() : next_id(1) { next_seq.assign(256, 0); }
    void open(const entity_config &cfg);
    int  alloc(mem_kind kind, size_t total, size_t reg_off, size_t reg_len);
    buffer *get(int id);
    void free(int id) { bufs.erase(id); }
    /* the child's command loop */
    int serve(channel &ch);

    entity ent;
    std::map<int, std::unique_ptr<buffer>> bufs;
    int next_id;
    am_stats st;
    std::vector<uint32_t> next_seq;
    static ucs_status_t am_cb(void *arg, void *data, size_t length,
                              unsigned flags);
};

class target {
public:
    virtual ~target() {}
    struct rbuf {
        int         id;
        uint64_t    addr;    /* of the registered range */
        uint64_t    base;    /* of the whole allocation */
        std::string rkey;
    };
    /* allocation of total bytes; the registration covers
     * [reg_off, reg_off + reg_len) (reg_len 0: everything) */
    virtual rbuf alloc(mem_kind kind, size_t total, size_t reg_off = 0,
                       size_t reg_len = 0) = 0;
    virtual void free(int id) = 0;
    virtual void fill(int id, size_t off, size_t len, uint64_t seed,
                      uint64_t pat_off) = 0;
    /* -1 ok, else offset of the first wrong byte (relative to off); -2 on
     * a failed request */
    virtual int64_t check(int id, size_t off, size_t len, uint64_t seed,
                          uint64_t pat_off) = 0;
    virtual std::string read(int id, size_t off, size_t len) = 0;
    virtual void write(int id, size_t off, const std::string &data) = 0;
    virtual am_stats stats() = 0;
    virtual void reset_stats() = 0;
    /* waits (progressing the target and `local`) until count messages
     * arrived since the last reset; returns the stats */
    virtual am_stats wait_am(uint64_t count, entity *local) = 0;
    /* progress the target if it lives in this process */
    virtual void progress() {}
    virtual entity *local_entity() { return nullptr; }
    virtual const char *name() const = 0;

    uint64_t    read_u64(int id, size_t off);
    uint32_t    read_u32(int id, size_t off);
    void        write_u64(int id, size_t off, uint64_t v);
    void        write_u32(int id, size_t off, uint32_t v);

    std::string dev_addr, iface_addr;
};

class local_target : public target {
public:
    void open(const entity_config &cfg);
    rbuf alloc(mem_kind kind, size_t total, size_t reg_off, size_t reg_len) override;
    void free(int id) override { srv.free(id); }
    void fill(int id, size_t off, size_t len, uint64_t seed, uint64_t pat_off) override;
    int64_t check(int id, size_t off, size_t len, uint64_t seed, uint64_t pat_off) override;
    std::string read(int id, size_t off, size_t len) override;
    void write(int id, size_t off, const std::string &data) override;
    am_stats stats() override { return srv.st; }
    void reset_stats() override;
    am_stats wait_am(uint64_t count, entity *local) override;
    void progress() override { srv.ent.progress(); }
    entity *local_entity() override { return &srv.ent; }
    const char *name() const override { return "local"; }
    target_server srv;
};

class remote_target : public target {
public:
    remote_target() : pid(-1), local(nullptr) {}
    ~remote_target();
    /* forks the child; it opens its entity after the fork */
    void start(const entity_config &cfg);
    void stop();
    rbuf alloc(mem_kind kind, size_t total, size_t reg_off, size_t reg_len) override;
    void free(int id) override;
    void fill(int id, size_t off, size_t len, uint64_t seed, uint64_t pat_off) override;
    int64_t check(int id, size_t off, size_t len, uint64_t seed, uint64_t pat_off) override;
    std::string read(int id, size_t off, size_t len) override;
    void write(int id, size_t off, const std::string &data) override;
    am_stats stats() override;
    void reset_stats() override;
    am_stats wait_am(uint64_t count, entity *local) override;
    const char *name() const override { return "remote"; }
    /* the entity progressed while waiting for replies */
    void set_local(entity *e) { local = e; }
    bool rpc(const wire &req, wire *reply, double sec = TIMEOUT_SEC);

    pid_t   pid;
    channel ch;
    entity *local;
};

enum topology {
    TOPO_LOCAL = 0,        /* two workers in this process */
    TOPO_REMOTE,           /* target in a forked child */
    TOPO_REMOTE_NO_CMA,    /* child, both sides SINGLE_COPY=n (responder) */
    TOPO_LAST
};
const char *topology_name(topology t);

/* The fabric of the hca device under the transport: the fabric axis of the
 * parameterised suites (uct_fabrics() x topology [x memory kind]). */
enum uct_fabric {
    FABRIC_SHM = 0,        /* processes of one host */
    FABRIC_TCP,            /* tcp forced between them (on lo): what peers
                              on other hosts use */
    FABRIC_LAST
};
const char *fabric_name(uct_fabric f);
/* The fabrics the parameterised suites run on. */
std::vector<uct_fabric> uct_fabrics();
/* The hook where a fabric becomes configuration: the md options of both
 * sides (what UCX_HCA_<NAME> sets): UCX_HCA_FABRIC, and for tcp the
 * interface. */
cfg_list fabric_md_config(uct_fabric f);
/* An entity_config with only the fabric's md options. */
entity_config fabric_config(uct_fabric f);

/* The configuration of both sides of a topology on a fabric. */
entity_config topology_config(topology t, uct_fabric f = FABRIC_SHM);
/* Creates the target of a topology (forks for the remote ones). */
void make_target(topology t, std::unique_ptr<target> *tgt,
                 const entity_config &extra = entity_config(),
                 uct_fabric f = FABRIC_SHM);

/* A sender entity with one ep to a target of a topology (a second worker
 * here, or a forked child): what the data test fixtures share. */
struct topo_sender {
    topology                topo = TOPO_LOCAL;
    uct_fabric              topo_fabric = FABRIC_SHM;   /* set before open */
    std::unique_ptr<target> tgt;
    entity                  sender;
    uct_ep_h                ep = nullptr;
    std::vector<entity*>    ents;   /* to progress: sender, local target */

    /* googletest assertions: ASSERT_NO_FATAL_FAILURE(open_topo(...)) */
    void open_topo(topology t, const entity_config &sender_extra =
                                       entity_config());
    void close_topo();
};

/* Base fixture: kills leftover children in TearDown */
class uct_test_base : public ::testing::Test {
protected:
    void TearDown() override { kill_children(); }
};

/* The parameter of a suite on the fabric axis: (fabric, P).  GetParam()
 * gives P, as it did before the axis; GetFabric() the fabric.  Instantiate
 * with on_fabrics(generator of P) and fabric_param_name<P>(namer of P). */
template <class P>
class with_fabric
    : public ::testing::WithParamInterface<std::tuple<uct_fabric, P>> {
public:
    typedef ::testing::WithParamInterface<std::tuple<uct_fabric, P>> base;

    static const P &GetParam()
    {
        return std::get<1>(base::GetParam());
    }

    static uct_fabric GetFabric()
    {
        return std::get<0>(base::GetParam());
    }
};

template <class G>
auto on_fabrics(const G &gen)
        -> decltype(::testing::Combine(::testing::ValuesIn(uct_fabrics()),
                                       gen))
{
    return ::testing::Combine(::testing::ValuesIn(uct_fabrics()), gen);
}

/* The name of a topology parameter ("local", "remote"...). */
inline std::string topology_name_of(const ::testing::TestParamInfo<topology> &i)
{
    return topology_name(i.param);
}

/* "<fabric>_<the name of P>", e.g. shm_remote_plain */
template <class P, class F>
std::function<std::string(
        const ::testing::TestParamInfo<std::tuple<uct_fabric, P>> &)>
fabric_param_name(F namer)
{
    return [namer](const ::testing::TestParamInfo<std::tuple<uct_fabric, P>>
                           &i) {
        return std::string(fabric_name(std::get<0>(i.param))) + "_" +
               namer(::testing::TestParamInfo<P>(std::get<1>(i.param),
                                                 i.index));
    };
}

/* Reads a file descriptor's full text (for ucp print-info checks) */
std::string read_memstream(const std::function<void(FILE*)> &fn);

} /* namespace hcat */

#endif
