/*
 * test_uct_rcache.cc - the md's registration cache (UCX_HCA_RCACHE), with
 * the semantics of UCX's IB md and its rcache:
 *   - registering the same buffer again is a hit: the same key;
 *   - uct_md_mem_dereg keeps a cached region registered (its rkey works);
 *   - a real deregistration ends it: UCT_MD_MEM_DEREG_FLAG_INVALIDATE (at
 *     the last holder's deregistration, which invokes the completion once
 *     per invalidating call, as UCX's IB md with ucs_rcache), an munmap or
 *     free() that unmaps the memory, eviction over the limits,
 *     uct_mem_free of device memory holding a cached sub-registration;
 *     after it no remote access passes with the old key and nothing lands;
 *   - memory reused at new (or the same) addresses moves correct data;
 *   - every entry in use: registrations go on uncached.
 * The target side is a second worker in this process (the cache and its
 * memory hook live there), on each fabric.
 */
#include "uct_test_common.h"

#include <malloc.h>
#include <stdlib.h>
#include <algorithm>
#include <set>
#include <sys/mman.h>

using namespace hcat;

namespace {

const size_t PG = 4096;

/* As the md's UCT_HCA_RCACHE_SHARE_IN_USE (hca_rcache.c): built against
 * UCX 1.13 a region in use takes more registrations of its range, and its
 * INVALIDATE completions wait for the last of them (UCX's IB md with
 * ucs_rcache); against later UCX, whose UCP wants them in the call, a
 * region in use has one user. */
const bool SHARES_IN_USE = (UCT_VERNO_MAJOR == 1) && (UCT_VERNO_MINOR < 14);

class UctRcache : public uct_test_base, public with_fabric<int> {
protected:
    void SetUp() override
    {
        open_with(cfg_list());
    }

    void open_with(const cfg_list &rcache_cfg)
    {
        entity_config tc = fabric_config(GetFabric());
        /* the md's own cache (off by default where UCP caches hca's
         * registrations itself, UCX >= 1.14) */
        tc.md_cfg.push_back({"RCACHE", "y"});
        for (auto &kv : rcache_cfg) {
            tc.md_cfg.push_back(kv);
        }
        ASSERT_NO_FATAL_FAILURE(tgt.open(tc));
        ASSERT_NO_FATAL_FAILURE(snd.open(fabric_config(GetFabric())));
        ents = {&snd, &tgt};
        ASSERT_NO_FATAL_FAILURE(local.alloc(snd, MEM_PLAIN, 1 << 16));
    }

    void TearDown() override
    {
        reopen();
        uct_test_base::TearDown();
    }

    /* closes both sides, for open_with() with other settings */
    void reopen()
    {
        local.free();
        snd.close();
        tgt.close();
    }

    uct_mem_h reg(void *p, size_t len)
    {
        uct_mem_h memh = UCT_MEM_HANDLE_NULL;
        EXPECT_EQ(UCS_OK, uct_md_mem_reg(tgt.md, p, len,
                                         UCT_MD_MEM_ACCESS_ALL, &memh));
        regions[memh] = std::make_pair(p, len);
        return memh;
    }

    /* as UCP packs the keys of its rendezvous lanes: one that an
     * invalidating deregistration may end */
    std::string pack(uct_mem_h memh)
    {
        std::string key(tgt.md_attr.rkey_packed_size, '\0');
        auto r = regions.find(memh);
        EXPECT_TRUE(r != regions.end()) << "not registered here";
        EXPECT_EQ(UCS_OK, pack_invalidatable(tgt.md, memh, r->second.first,
                                             r->second.second, &key[0]));
        return key;
    }

    std::map<uct_mem_h, std::pair<void*, size_t>> regions;

    /* A get (put: of pattern seed) of len bytes at raddr with the packed
     * key, on a fresh ep, from/into local: UCS_OK when it worked, else the
     * error it produced (return, completion or error handler). */
    ucs_status_t remote_op(bool put, uint64_t raddr, const std::string &key,
                           size_t len, uint64_t seed)
    {
        rkey_holder rk;
        test_comp comp;
        ucs_status_t st;

        EXPECT_EQ(UCS_OK, rk.unpack(snd.component, key));
        uct_ep_h ep = snd.connect_to(tgt);
        EXPECT_NE(nullptr, ep);
        if (put) {
            pat_fill(local.data(), len, seed);
        } else {
            memset(local.data(), 0, len);
        }
        uct_iov_t iov = {local.data(), len, local.memh, 0, 1};
        st = retry_send([&] {
            comp.reset();
            return put ? uct_ep_put_zcopy(ep, &iov, 1, raddr, rk.rkey(),
                                          &comp.uct) :
                         uct_ep_get_zcopy(ep, &iov, 1, raddr, rk.rkey(),
                                          &comp.uct);
        }, ents);
        st = complete_op(st, comp, ents);
        if (st == UCS_OK) {
            st = flush_ep(ep, ents);
        }
        if ((st == UCS_OK) && (snd.errors_for(ep) > 0)) {
            st = snd.last_error_for(ep);
        }
        snd.destroy_ep(ep);
        return st;
    }

    ucs_status_t remote_get(uint64_t raddr, const std::string &key,
                            size_t len)
    {
        return remote_op(false, raddr, key, len, 0);
    }

    ucs_status_t remote_put(uint64_t raddr, const std::string &key,
                            size_t len, uint64_t seed)
    {
        return remote_op(true, raddr, key, len, seed);
    }

    void dereg(uct_mem_h memh) { EXPECT_EQ(UCS_OK, uct_md_mem_dereg(tgt.md, memh)); }

    /* uct_md_mem_dereg_v2 with flags (0 or
     * UCT_MD_MEM_DEREG_FLAG_INVALIDATE) and a completion, every field set
     * as UCX's test_md sets them */
    ucs_status_t dereg_v2(uct_mem_h memh, unsigned flags,
                          uct_completion_t *comp)
    {
        hcat_md_mem_dereg_params_t p;

        p.field_mask = HCAT_MD_MEM_DEREG_FIELD_MEMH |
                       HCAT_MD_MEM_DEREG_FIELD_FLAGS |
                       HCAT_MD_MEM_DEREG_FIELD_COMPLETION;
        p.memh       = memh;
        p.flags      = flags;
        p.comp       = comp;
        return uct_md_mem_dereg_v2(tgt.md, &p);
    }

    ucs_status_t dereg_invalidate(uct_mem_h memh, test_comp &comp)
    {
        return dereg_v2(memh, HCAT_MD_MEM_DEREG_FLAG_INVALIDATE, &comp.uct);
    }

    /* UCX's test_md.invalidate on this md: one buffer registered n times
     * (the same memh each time, from the cache), then deregistered in
     * reverse order, every other call with INVALIDATE and one completion
     * whose count is the number of those calls: uct_invoke_completion
     * once per invalidating call, all when the region is deregistered at
     * the last call, so the callback runs once, at the end.  last_inv:
     * the last call invalidates (UCX's order) or is a plain one (then
     * only the last holder, not the last invalidation, may complete).
     * Without SHARES_IN_USE each registration is a region of its own and
     * each invalidating call completes in the call: the callback runs at
     * the last of them.  dead_keys: the keys of invalidated regions, which
     * no later registration may get back. */
    void invalidate_mixed(unsigned n, bool last_inv,
                          std::set<std::string> &dead_keys)
    {
        std::vector<char> buf(1 << 20);
        std::vector<uct_mem_h> memhs;
        std::vector<std::string> keys;
        test_comp comp;
        unsigned invs = 0, last_call = 0;

        for (unsigned i = 0; i < n; ++i) {
            /* the last call has the parity of n - 1 */
            if (((i & 1) == ((n - 1) & 1)) == last_inv) {
                ++invs;
                last_call = i;
            }
        }
        if (SHARES_IN_USE) {
            last_call = n - 1; /* the last holder's */
        }
        comp.reset(invs);
        for (unsigned i = 0; i < n; ++i) {
            memhs.push_back(reg(buf.data(), buf.size()));
            keys.push_back(pack(memhs.back()));
            if (SHARES_IN_USE) {
                ASSERT_EQ(memhs[0], memhs.back())
                    << "n=" << n << ": registration " << i << " was no hit";
            }
            EXPECT_EQ(0u, dead_keys.count(keys.back()))
                << "n=" << n << ": the key of an invalidated region came "
                << "back";
        }
        for (unsigned i = 0; i < n; ++i) {
            bool inv = ((i & 1) == ((n - 1) & 1)) == last_inv;

            ASSERT_EQ(0, comp.calls)
                << "n=" << n << " last_inv=" << last_inv
                << ": completed before deregistration " << i << " of " << n
                << " (" << invs << " invalidating; count now "
                << comp.uct.count << ")";
            ASSERT_EQ(UCS_OK,
                      dereg_v2(memhs.back(),
                               inv ? HCAT_MD_MEM_DEREG_FLAG_INVALIDATE : 0,
                               &comp.uct));
            if (inv) {
                dead_keys.insert(keys.back());
            }
            memhs.pop_back();
            keys.pop_back();
            if ((invs > 0) && (i == last_call)) {
                break; /* the completion is due: checked below */
            }
        }
        EXPECT_EQ((invs > 0) ? 1 : 0, comp.calls)
            << "n=" << n << " last_inv=" << last_inv << " (" << invs
            << " invalidating; count now " << comp.uct.count << ")";
        if (invs > 0) {
            EXPECT_EQ(0, comp.uct.count);
            EXPECT_EQ(UCS_OK, comp.status);
        }
        /* the plain calls after the last invalidating one (regions of
         * their own) */
        while (!memhs.empty()) {
            dereg(memhs.back());
            memhs.pop_back();
        }
        EXPECT_EQ((invs > 0) ? 1 : 0, comp.calls);
    }

    /* malloc maps a 4 MiB buffer and free unmaps it (threshold 256 KiB):
     * the cached key of a page of it must end, even for new memory mapped
     * at the same address, where nothing may land */
    void free_that_unmaps()
    {
        /* AddressSanitizer's allocator has no mallopt (returns 0): then
         * its own policy decides, and the check below tells */
        (void)mallopt(M_MMAP_THRESHOLD, 256 * 1024);
        ASSERT_NO_FATAL_FAILURE(open_with(cfg_list()));
        const size_t len = 4ul << 20;
        char *p = (char*)malloc(len);
        ASSERT_NE(nullptr, p);
        uint64_t addr = ((uintptr_t)p + PG - 1) & ~(uint64_t)(PG - 1);
        memset((void*)(uintptr_t)addr, 1, PG);
        uct_mem_h m = reg((void*)(uintptr_t)addr, PG);
        std::string k = pack(m);
        dereg(m);
        ASSERT_EQ(UCS_OK, remote_get(addr, k, 64)) << "cached";
        free(p);
        void *q = mmap((void*)(uintptr_t)addr, 4 * PG, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1,
                       0);
        if ((q == MAP_FAILED) && (errno == EEXIST)) {
            /* the allocator kept the block mapped (UCX's malloc hooks,
             * installed once UCP ran in this process, ignore the
             * threshold): nothing was unmapped, nothing to revoke */
            kept_mapped = true;
            return;
        }
        ASSERT_EQ((void*)(uintptr_t)addr, q) << strerror(errno);
        pat_fill(q, 4 * PG, 41);
        EXPECT_NE(UCS_OK, remote_put(addr, k, 64, 42))
            << "the key of freed (unmapped) memory still worked";
        EXPECT_EQ(-1, pat_check(q, 4 * PG, 41)) << "a byte landed";
        EXPECT_NE(UCS_OK, remote_get(addr, k, 64));
        munmap(q, 4 * PG);
    }

    entity               tgt, snd;
    buffer               local;
    std::vector<entity*> ents;
    bool                 kept_mapped = false;
};

TEST_P(UctRcache, SameBufferIsAHit)
{
    std::vector<char> buf(4 * PG);
    uct_mem_h m1 = reg(buf.data(), PG);
    std::string k1 = pack(m1);
    dereg(m1);
    uct_mem_h m2 = reg(buf.data(), PG);
    EXPECT_EQ(k1, pack(m2)) << "the second registration made a new key";
    uct_mem_h m2b = reg(buf.data(), PG);
    std::string k2b = pack(m2b);
    if (SHARES_IN_USE) {
        EXPECT_EQ(m2, m2b) << "the same range, held, is shared";
    } else {
        EXPECT_NE(m2, m2b) << "a region in use took a second user";
    }
    /* a shorter range at the same start: not while the region is held
     * (its users would wait for each other's INVALIDATE), ... */
    uct_mem_h m3 = reg(buf.data(), 64);
    EXPECT_NE(k1, pack(m3));
    dereg(m3);
    dereg(m2b);
    dereg(m2);
    /* ... but once it is idle, the cached region covers it (a range the
     * 64-byte region just made does not cover; without SHARES_IN_USE m2b's
     * region is another idle one that does) */
    m3 = reg(buf.data(), 128);
    std::string k3 = pack(m3);
    EXPECT_TRUE((k3 == k1) || (!SHARES_IN_USE && (k3 == k2b)));
    dereg(m3);
    /* a longer one is not: a new region */
    uct_mem_h m4 = reg(buf.data(), 2 * PG);
    EXPECT_NE(k1, pack(m4));
    dereg(m4);
}

TEST_P(UctRcache, WithoutTheCacheEveryRegistrationIsNew)
{
    reopen();
    ASSERT_NO_FATAL_FAILURE(open_with({{"RCACHE", "n"}}));
    std::vector<char> buf(PG);
    uct_mem_h m1 = reg(buf.data(), PG);
    std::string k1 = pack(m1);
    dereg(m1);
    ASSERT_NE(UCS_OK, remote_get((uintptr_t)buf.data(), k1, 64))
        << "an uncached deregistration must end the key";
    uct_mem_h m2 = reg(buf.data(), PG);
    EXPECT_NE(k1, pack(m2));
    dereg(m2);
}

TEST_P(UctRcache, CachedKeyWorksAfterDeregUntilInvalidated)
{
    std::vector<char> buf(PG);
    pat_fill(buf.data(), PG, 5);
    uct_mem_h m = reg(buf.data(), PG);
    std::string k = pack(m);
    dereg(m);
    /* as with UCX's IB md and its rcache: the region stays registered */
    ASSERT_EQ(UCS_OK, remote_get((uintptr_t)buf.data(), k, PG));
    EXPECT_EQ(-1, pat_check(local.data(), PG, 5));

    /* a deregistration with INVALIDATE is a real one: the completion
     * comes, then the key fails and nothing lands */
    m = reg(buf.data(), PG);
    EXPECT_EQ(k, pack(m));
    test_comp comp;
    ASSERT_EQ(UCS_OK, dereg_invalidate(m, comp));
    EXPECT_EQ(1, comp.calls);
    EXPECT_EQ(UCS_OK, comp.status);
    ucs_status_t st = remote_put((uintptr_t)buf.data(), k, 64, 6);
    EXPECT_NE(UCS_OK, st) << "the key of an invalidated region still worked";
    EXPECT_EQ(-1, pat_check(buf.data(), PG, 5)) << "a byte landed";
    /* as rc reports a remote access error, and as UCP's rendezvous abort
     * on an invalidated buffer requires of a failed ep (UCX's
     * test_ucp_peer_failure_rndv_abort.*_memory_invalidation) */
    EXPECT_TRUE((st == UCS_ERR_CONNECTION_RESET) ||
                (st == UCS_ERR_ENDPOINT_TIMEOUT)) << "put: " << st;
    st = remote_get((uintptr_t)buf.data(), k, 64);
    EXPECT_TRUE((st == UCS_ERR_CONNECTION_RESET) ||
                (st == UCS_ERR_ENDPOINT_TIMEOUT)) << "get: " << st;
    /* registering again makes a new region with a new key */
    m = reg(buf.data(), PG);
    EXPECT_NE(k, pack(m));
    dereg(m);
}

/* As ucs_rcache's region invalidation for UCX's IB md: the invalidated
 * region takes no new hits, but a user still holding the same registration
 * keeps its key; the region is deregistered, and the completion invoked,
 * at that user's deregistration.  Without SHARES_IN_USE the two users hold
 * regions of their own: the invalidated one ends, and completes, in the
 * call, and the other's key works on. */
TEST_P(UctRcache, InvalidateWhileAnotherHolderKeepsIt)
{
    std::vector<char> buf(PG);
    pat_fill(buf.data(), PG, 7);
    uct_mem_h a = reg(buf.data(), PG);
    uct_mem_h b = reg(buf.data(), PG); /* the same region, twice held */
    std::string k = pack(a);
    std::string kb = pack(b);
    EXPECT_EQ(SHARES_IN_USE, k == kb);
    test_comp comp;
    ASSERT_EQ(UCS_OK, dereg_invalidate(a, comp));
    if (SHARES_IN_USE) {
        EXPECT_EQ(0, comp.calls) << "completed while b still holds the region";
    } else {
        EXPECT_EQ(1, comp.calls);
        EXPECT_NE(UCS_OK, remote_put((uintptr_t)buf.data(), k, 64, 8));
        EXPECT_EQ(-1, pat_check(buf.data(), PG, 7)) << "a byte landed";
    }
    /* b's key still works ... */
    ASSERT_EQ(UCS_OK, remote_get((uintptr_t)buf.data(), kb, PG));
    EXPECT_EQ(-1, pat_check(local.data(), PG, 7));
    /* ... but the region takes no new hits */
    uct_mem_h c = reg(buf.data(), PG);
    std::string k2 = pack(c);
    EXPECT_NE(k, k2) << "a hit on the invalidated region";
    /* b's deregistration (a plain one) is the last: the region goes, the
     * completion comes, and the old key fails without writing */
    dereg(b);
    EXPECT_EQ(1, comp.calls);
    EXPECT_EQ(UCS_OK, comp.status);
    EXPECT_NE(UCS_OK, remote_put((uintptr_t)buf.data(), k, 64, 8));
    EXPECT_EQ(-1, pat_check(buf.data(), PG, 7)) << "a byte landed";
    ASSERT_EQ(UCS_OK, remote_get((uintptr_t)buf.data(), k2, 64)) << "c's key";
    dereg(c);
}

/* UCX's test_md.invalidate (test/gtest/uct/test_md.cc): n registrations of
 * one buffer, n/2 plain and n/2 invalidating deregistrations mixed; the
 * completion counted once per invalidating call and called once, at the
 * last deregistration - in UCX's order (the last call invalidates) and
 * with a plain call last. */
TEST_P(UctRcache, InvalidateMixedCompletesOnceAtTheLastHolder)
{
    std::set<std::string> dead_keys;

    for (unsigned n = 1; n < 64; ++n) {
        ASSERT_NO_FATAL_FAILURE(invalidate_mixed(n, true, dead_keys));
        if (n > 1) { /* n = 1 with a plain call: nothing invalidates */
            ASSERT_NO_FATAL_FAILURE(invalidate_mixed(n, false, dead_keys));
        }
    }
}

/* A registration inside a region another user holds (UCP registering a
 * request's buffer inside the application's ucp_mem_map region) is a
 * region of its own: its INVALIDATE completes at its own deregistration,
 * not when the application unmaps (UCP's purge of a failed endpoint waits
 * for that completion before it completes the request, and the
 * application unmaps after its requests completed). */
TEST_P(UctRcache, InvalidateInsideAHeldRegionDoesNotWaitForIt)
{
    std::vector<char> buf(16 * PG);
    pat_fill(buf.data(), buf.size(), 21);
    uct_mem_h map = reg(buf.data(), buf.size()); /* ucp_mem_map */
    std::string kmap = pack(map);
    uct_mem_h req = reg(buf.data(), 2 * PG);     /* a request's buffer */
    EXPECT_NE(map, req) << "joined the region another user holds";
    std::string kreq = pack(req);
    EXPECT_NE(kmap, kreq);
    test_comp comp;
    ASSERT_EQ(UCS_OK, dereg_invalidate(req, comp));
    EXPECT_EQ(1, comp.calls) << "waited for the other user's region";
    EXPECT_EQ(UCS_OK, comp.status);
    EXPECT_NE(UCS_OK, remote_put((uintptr_t)buf.data(), kreq, 64, 22))
        << "the invalidated key still worked";
    EXPECT_EQ(-1, pat_check(buf.data(), buf.size(), 21)) << "a byte landed";
    /* the application's key is untouched */
    ASSERT_EQ(UCS_OK, remote_get((uintptr_t)buf.data(), kmap, 64));
    EXPECT_EQ(-1, pat_check(local.data(), 64, 21));
    dereg(map);
    /* idle, the big region serves a shorter range again */
    uct_mem_h again = reg(buf.data(), 2 * PG);
    EXPECT_EQ(map, again);
    dereg(again);
}

/* A region unmapped while a user holds its registration: the key ends at
 * once; the holder's deregistration afterwards frees it (no crash, no
 * second deregistration). */
TEST_P(UctRcache, MunmapWhileHeldEndsTheKey)
{
    const size_t len = 4 * PG;
    void *p = mmap(nullptr, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(MAP_FAILED, p);
    uct_mem_h m = reg(p, len);
    std::string k = pack(m);
    ASSERT_EQ(UCS_OK, remote_get((uintptr_t)p, k, 64));
    ASSERT_EQ(0, munmap(p, len));
    void *q = mmap(p, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    ASSERT_EQ(p, q);
    pat_fill(q, len, 51);
    EXPECT_NE(UCS_OK, remote_put((uintptr_t)q, k, 64, 52));
    EXPECT_EQ(-1, pat_check(q, len, 51)) << "a byte landed";
    dereg(m);
    uct_mem_h m2 = reg(q, len);
    EXPECT_NE(k, pack(m2));
    ASSERT_EQ(UCS_OK, remote_put((uintptr_t)q, pack(m2), 64, 53));
    EXPECT_EQ(-1, pat_check(q, 64, 53));
    dereg(m2);
    ASSERT_EQ(0, munmap(q, len));
}

TEST_P(UctRcache, MunmapRevokesTheKey)
{
    const size_t len = 16 * PG;
    void *p = mmap(nullptr, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(MAP_FAILED, p);
    pat_fill(p, len, 11);
    uct_mem_h m = reg((char*)p + PG, 4 * PG);
    std::string k = pack(m);
    dereg(m);
    ASSERT_EQ(UCS_OK, remote_get((uintptr_t)p + PG, k, 64)) << "cached";
    /* unmapping a part of the region revokes it */
    ASSERT_EQ(0, munmap((char*)p + 2 * PG, PG));
    EXPECT_NE(UCS_OK, remote_get((uintptr_t)p + PG, k, 64))
        << "the key of a region whose memory was unmapped still worked";
    ASSERT_EQ(0, munmap(p, len));

    /* new memory at the same address: a new key; the old one fails there
     * and writes nothing */
    void *q = mmap(p, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    ASSERT_EQ(p, q);
    pat_fill(q, len, 12);
    EXPECT_NE(UCS_OK, remote_put((uintptr_t)q + PG, k, 64, 13));
    EXPECT_EQ(-1, pat_check(q, len, 12)) << "a byte landed with the old key";
    m = reg((char*)q + PG, 4 * PG);
    std::string k2 = pack(m);
    EXPECT_NE(k, k2);
    ASSERT_EQ(UCS_OK, remote_put((uintptr_t)q + PG, k2, 64, 14));
    EXPECT_EQ(-1, pat_check((char*)q + PG, 64, 14));
    dereg(m);
    ASSERT_EQ(0, munmap(q, len));
}

/* In a child process: whether free() unmaps is the allocator's choice
 * (glibc's mmap threshold moves, UCX's malloc hooks replace it), so the
 * child fixes it with mallopt, which would otherwise stay for the rest of
 * the suite. */
TEST_P(UctRcache, FreeThatUnmapsRevokesTheKey)
{
    reopen();
    child c = fork_child([&](channel &) {
        free_that_unmaps();
        reopen();
        return kept_mapped ? 77 : 0;
    });
    int st = wait_child(c.pid, 60);
    if (st == 77) {
        GTEST_SKIP() << "free() kept the 4 MiB block mapped in this process "
                        "(UCX's malloc hooks): the unmap path is "
                        "MunmapRevokesTheKey's";
    }
    EXPECT_EQ(0, st) << "the child failed (its output is above)";
}

TEST_P(UctRcache, ReusedBuffersMoveCorrectData)
{
    /* buffers freed and allocated again, at old and new addresses, of
     * changing lengths: every transfer with the current key is right */
    for (int i = 0; i < 200; ++i) {
        size_t len = PG / 2 + (size_t)(i * 997) % (12 * PG);
        char *p    = (char*)malloc(len);
        ASSERT_NE(nullptr, p);
        memset(p, 0, len);
        uct_mem_h m = reg(p, len);
        std::string k = pack(m);
        size_t n = std::min(len, (size_t)(1 << 16));
        ASSERT_EQ(UCS_OK, remote_put((uintptr_t)p, k, n, 100 + i)) << i;
        ASSERT_EQ(-1, pat_check(p, n, 100 + i)) << "iteration " << i;
        pat_fill(p, n, 500 + i);
        ASSERT_EQ(UCS_OK, remote_get((uintptr_t)p, k, n)) << i;
        ASSERT_EQ(-1, pat_check(local.data(), n, 500 + i)) << i;
        dereg(m);
        free(p);
    }
}

TEST_P(UctRcache, EvictionOverTheLimitEndsTheOldestKeys)
{
    reopen();
    ASSERT_NO_FATAL_FAILURE(open_with({{"RCACHE_MAX_REGIONS", "4"}}));
    std::vector<char> buf(16 * PG);
    std::vector<std::string> keys;
    for (int i = 0; i < 8; ++i) {
        uct_mem_h m = reg(&buf[i * PG], PG);
        keys.push_back(pack(m));
        dereg(m);
    }
    /* the 4 newest stay cached, the 4 oldest were deregistered */
    for (int i = 0; i < 8; ++i) {
        ucs_status_t st = remote_get((uintptr_t)&buf[i * PG], keys[i], 64);
        if (i < 4) {
            EXPECT_NE(UCS_OK, st) << "evicted region " << i << " still works";
        } else {
            EXPECT_EQ(UCS_OK, st) << "cached region " << i;
        }
    }
    /* the size limit evicts too */
    reopen();
    ASSERT_NO_FATAL_FAILURE(open_with({{"RCACHE_MAX_SIZE", "8k"}}));
    keys.clear();
    for (int i = 0; i < 4; ++i) {   /* 4 idle regions of 4 KiB: 2 fit */
        uct_mem_h m = reg(&buf[i * PG], PG);
        keys.push_back(pack(m));
        dereg(m);
    }
    for (int i = 0; i < 4; ++i) {
        ucs_status_t st = remote_get((uintptr_t)&buf[i * PG], keys[i], 64);
        if (i < 2) {
            EXPECT_NE(UCS_OK, st) << "region " << i << " over the size limit";
        } else {
            EXPECT_EQ(UCS_OK, st) << "cached region " << i;
        }
    }
    /* a region larger than the limit is not kept once idle */
    uct_mem_h big = reg(&buf[8 * PG], 4 * PG);
    std::string bk = pack(big);
    dereg(big);
    EXPECT_NE(UCS_OK, remote_get((uintptr_t)&buf[8 * PG], bk, 64));
}

TEST_P(UctRcache, EveryEntryInUseRegistersUncached)
{
    reopen();
    ASSERT_NO_FATAL_FAILURE(open_with({{"RCACHE_MAX_REGIONS", "2"}}));
    std::vector<char> buf(8 * PG);
    pat_fill(buf.data(), buf.size(), 21);
    std::vector<uct_mem_h> mh;
    std::vector<std::string> keys;
    for (int i = 0; i < 5; ++i) {
        mh.push_back(reg(&buf[i * PG], PG));
        keys.push_back(pack(mh.back()));
    }
    for (int i = 0; i < 5; ++i) {
        ASSERT_EQ(UCS_OK, remote_get((uintptr_t)&buf[i * PG], keys[i], PG))
            << i;
        EXPECT_EQ(-1, pat_check(local.data(), PG, 21, i * PG)) << i;
    }
    for (uct_mem_h m : mh) {
        dereg(m);
    }
    /* the uncached ones were really deregistered */
    EXPECT_NE(UCS_OK, remote_get((uintptr_t)&buf[4 * PG], keys[4], 64));
}

TEST_P(UctRcache, MemFreeEndsCachedRegistrationsInside)
{
    uct_allocated_memory_t mem;
    uct_alloc_method_t method = UCT_ALLOC_METHOD_MD;
    uct_mem_alloc_params_t ap;
    memset(&ap, 0, sizeof(ap));
    ap.field_mask = UCT_MEM_ALLOC_PARAM_FIELD_FLAGS |
                    UCT_MEM_ALLOC_PARAM_FIELD_MDS |
                    UCT_MEM_ALLOC_PARAM_FIELD_NAME;
    ap.flags      = UCT_MD_MEM_ACCESS_ALL;
    ap.mds.mds    = &tgt.md;
    ap.mds.count  = 1;
    ap.name       = "rcache test";
    ASSERT_EQ(UCS_OK, uct_mem_alloc(16 * PG, &method, 1, &ap, &mem));
    char *p = (char*)mem.address;
    pat_fill(p, 16 * PG, 31);
    uct_mem_h m = reg(p + 2 * PG, 2 * PG); /* a buffer inside device memory */
    std::string k = pack(m);
    dereg(m);
    ASSERT_EQ(UCS_OK, remote_get((uintptr_t)p + 2 * PG, k, PG));
    EXPECT_EQ(-1, pat_check(local.data(), PG, 31, 2 * PG));
    /* the cached sub-registration must not keep the device memory */
    ASSERT_EQ(UCS_OK, uct_mem_free(&mem));
    EXPECT_NE(UCS_OK, remote_get((uintptr_t)p + 2 * PG, k, 64));
}

INSTANTIATE_TEST_SUITE_P(hca, UctRcache, on_fabrics(::testing::Values(0)),
                         fabric_param_name<int>(
                                 [](const ::testing::TestParamInfo<int> &) {
                                     return std::string("local");
                                 }));

} /* namespace */
