/*
 * test_uct_rkey_ptr.cc - uct_rkey_ptr: on a peer's device memory it gives
 * a local pointer whose loads see the peer's data (and whose stores the
 * peer sees); on plain registered memory it returns UCS_ERR_UNREACHABLE;
 * a stale or wrong key gives no pointer.
 */
#include "uct_test_common.h"

using namespace hcat;

namespace {

class UctRkeyPtr : public uct_test_base,
                   public with_fabric<topology> {
protected:
    void SetUp() override
    {
        ASSERT_NO_FATAL_FAILURE(make_target(GetParam(), &tgt, entity_config(),
                                            GetFabric()));
        ASSERT_NO_FATAL_FAILURE(
                e.open(topology_config(GetParam(), GetFabric())));
        if (GetParam() != TOPO_LOCAL) {
            ((remote_target*)tgt.get())->set_local(&e);
        }
    }

    void TearDown() override
    {
        if (tgt && (GetParam() != TOPO_LOCAL)) {
            ((remote_target*)tgt.get())->set_local(nullptr);
        }
        e.close();
        tgt.reset();
        uct_test_base::TearDown();
    }

    void device_memory(mem_kind kind)
    {
        const size_t len = 1 << 20;
        target::rbuf r = tgt->alloc(kind, len);
        ASSERT_GT(r.id, 0);
        tgt->fill(r.id, 0, len, 31, 0);
        rkey_holder rk;
        ASSERT_EQ(UCS_OK, rk.unpack(e.component, r.rkey));

        void *p = nullptr;
        ASSERT_EQ(UCS_OK, uct_rkey_ptr(e.component, &rk.b, r.addr, &p))
            << "uct_rkey_ptr on device memory (" << mem_kind_name(kind)
            << ")";
        ASSERT_NE(nullptr, p);
        /* loads see the peer's data, everywhere in the region */
        EXPECT_EQ(-1, pat_check(p, len, 31)) << "at this offset";

        /* an address inside the region maps to the same offset */
        void *q = nullptr;
        ASSERT_EQ(UCS_OK, uct_rkey_ptr(e.component, &rk.b,
                                       r.addr + len - 8, &q));
        EXPECT_EQ((char*)p + len - 8, (char*)q);

        /* later peer writes are seen through the pointer ... */
        tgt->fill(r.id, 4096, 8192, 32, 0);
        EXPECT_EQ(-1, pat_check((char*)p + 4096, 8192, 32));
        /* ... and our stores are seen by the peer */
        pat_fill((char*)p + 65536, 4096, 33);
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        EXPECT_EQ(-1, tgt->check(r.id, 65536, 4096, 33, 0));

        /* outside the region: not a pointer */
        void *bad = nullptr;
        EXPECT_NE(UCS_OK, uct_rkey_ptr(e.component, &rk.b, r.addr + len + 4096,
                                       &bad))
            << "uct_rkey_ptr past the end of the region gave " << bad;
        rk.release();
        tgt->free(r.id);
    }

    std::unique_ptr<target> tgt;
    entity                  e;
};

TEST_P(UctRkeyPtr, IfaceAllocatedDeviceMemory)
{
    device_memory(MEM_IFACE_ALLOC);
}

TEST_P(UctRkeyPtr, MdAllocatedDeviceMemory)
{
    device_memory(MEM_MD_ALLOC);
}

TEST_P(UctRkeyPtr, PlainMemoryIsUnreachable)
{
    target::rbuf r = tgt->alloc(MEM_PLAIN, 65536);
    ASSERT_GT(r.id, 0);
    rkey_holder rk;
    ASSERT_EQ(UCS_OK, rk.unpack(e.component, r.rkey));
    void *p = nullptr;
    EXPECT_EQ(UCS_ERR_UNREACHABLE, uct_rkey_ptr(e.component, &rk.b, r.addr,
                                                &p));
    rk.release();
    tgt->free(r.id);
}

TEST_P(UctRkeyPtr, MappingOutlivesOtherRkeysOfTheSameMemory)
{
    /* two rkeys of one region share the mapping: releasing one keeps the
     * other's pointer valid */
    const size_t len = 65536;
    target::rbuf r = tgt->alloc(MEM_IFACE_ALLOC, len);
    ASSERT_GT(r.id, 0);
    tgt->fill(r.id, 0, len, 41, 0);
    rkey_holder a, b;
    ASSERT_EQ(UCS_OK, a.unpack(e.component, r.rkey));
    ASSERT_EQ(UCS_OK, b.unpack(e.component, r.rkey));
    void *pa = nullptr, *pb = nullptr;
    ASSERT_EQ(UCS_OK, uct_rkey_ptr(e.component, &a.b, r.addr, &pa));
    ASSERT_EQ(UCS_OK, uct_rkey_ptr(e.component, &b.b, r.addr, &pb));
    a.release();
    EXPECT_EQ(-1, pat_check(pb, len, 41));
    b.release();
    tgt->free(r.id);
}

/* Pointers only for a valid key of a registered region: every single-bit
 * change of the key (the packed rkey starts with the 32-bit device key)
 * and the key of a deregistered region give none.  A pointer handed out
 * before the deregistration stays mapped until the rkey is released, as
 * with UCX's posix and xpmem (its loads do not fault). */
TEST_P(UctRkeyPtr, StaleAndWrongKeysGiveNoPointer)
{
    const size_t len = 65536;
    target::rbuf r   = tgt->alloc(MEM_MD_ALLOC, len);
    ASSERT_GT(r.id, 0);
    tgt->fill(r.id, 0, len, 51, 0);
    ASSERT_GE(r.rkey.size(), sizeof(uint32_t));

    int passed = 0;
    for (int bit = 0; bit < 32; ++bit) {
        std::string bad = r.rkey;
        uint32_t key;
        memcpy(&key, &bad[0], sizeof(key));
        key ^= 1u << bit;
        memcpy(&bad[0], &key, sizeof(key));
        rkey_holder rk;
        ASSERT_EQ(UCS_OK, rk.unpack(e.component, bad));
        void *p = nullptr;
        if (uct_rkey_ptr(e.component, &rk.b, r.addr, &p) == UCS_OK) {
            ++passed;
        }
    }
    EXPECT_EQ(0, passed) << "mutated keys gave pointers";

    rkey_holder rk;
    ASSERT_EQ(UCS_OK, rk.unpack(e.component, r.rkey));
    void *p = nullptr;
    ASSERT_EQ(UCS_OK, uct_rkey_ptr(e.component, &rk.b, r.addr, &p));
    tgt->free(r.id); /* deregistered and freed by its owner */
    void *q = nullptr;
    EXPECT_NE(UCS_OK, uct_rkey_ptr(e.component, &rk.b, r.addr, &q))
        << "a pointer for a deregistered region";
    volatile const char *old = (volatile const char*)p;
    EXPECT_EQ(0, old[0] ^ old[0]); /* still mapped */
    rk.release();
}

INSTANTIATE_TEST_SUITE_P(
        hca, UctRkeyPtr,
        on_fabrics(::testing::Values(TOPO_LOCAL, TOPO_REMOTE)),
        fabric_param_name<topology>(topology_name_of));

} /* namespace */
