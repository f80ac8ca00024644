/*
 * test_export.cc - memory that hca did not allocate, registered in one
 * process and reached from another on the shm fabric (hca_export.c,
 * hca_backing.c): what a peer can map itself (a sysv segment, also one
 * removed with IPC_RMID; a shm_open object, also unlinked; a memfd; a
 * MAP_SHARED file; the segment or name removed before or after the
 * registration) is written and updated directly, through the peer's own
 * mapping (the requester's mapped_ops count it); what it cannot (private
 * memory, a range over two objects, a memfd whose fd was closed, a file of
 * another user) takes the single-copy route, and works the same.  After
 * the owner deregistered, nothing reaches the memory by either route.
 */
#include "test_common.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/stat.h>
#include <string>
#include <unistd.h>

using namespace hcat;

namespace {

enum backing_kind {
    B_SYSV,          /* shmget + shmat */
    B_SYSV_RMID,     /* ... and IPC_RMID before registering (as UCX) */
    B_SHM_OPEN,      /* shm_open + mmap, name kept */
    B_SHM_UNLINKED,  /* ... and shm_unlink, fd kept (as UCX's posix) */
    B_MEMFD,         /* memfd_create, fd kept */
    B_FILE,          /* a regular file, MAP_SHARED */
    B_PRIVATE,       /* malloc'ed */
    B_MEMFD_CLOSED,  /* memfd whose every fd was closed after mmap */
    B_STRADDLE,      /* one range over two memfds, mapped side by side */
    B_OTHER_USER,    /* a file of another user (needs root) */
    B_LAST
};

const char *backing_name(int k)
{
    static const char *names[] = {"Sysv", "SysvRmid", "ShmOpen",
                                  "ShmUnlinked", "Memfd", "File",
                                  "Private", "MemfdClosed", "Straddle",
                                  "OtherUser"};
    return names[k];
}

bool mappable(int k)
{
    return k <= B_FILE;
}

const size_t LEN = 128 * 1024;

/* What the child removes once it registered the memory (B_SYSV and
 * B_SHM_OPEN: a segment or name removed while registered, which peers
 * still reach; nothing is left behind). */
int         made_shmid = -1;
std::string made_name;

void backing_remove_names()
{
    if (made_shmid >= 0) {
        shmctl(made_shmid, IPC_RMID, nullptr);
        made_shmid = -1;
    }
    if (!made_name.empty()) {
        shm_unlink(made_name.c_str());
        made_name.clear();
    }
}

/* The memory of kind k (LEN bytes, page aligned), or nullptr. */
uint8_t *backing_alloc(int k, int *fd_keep)
{
    char name[64];
    void *p = MAP_FAILED;
    int fd  = -1, id;

    *fd_keep = -1;
    switch (k) {
    case B_SYSV:
    case B_SYSV_RMID:
        id = shmget(IPC_PRIVATE, LEN, IPC_CREAT | 0600);
        if (id < 0) {
            return nullptr;
        }
        p = shmat(id, nullptr, 0);
        if ((k == B_SYSV_RMID) || (p == (void*)-1)) {
            shmctl(id, IPC_RMID, nullptr);
        } else {
            made_shmid = id;
        }
        return (p == (void*)-1) ? nullptr : (uint8_t*)p;
    case B_SHM_OPEN:
    case B_SHM_UNLINKED:
        snprintf(name, sizeof(name), "/hca-test-export.%d", getpid());
        fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
        if (fd < 0) {
            return nullptr;
        }
        if (k == B_SHM_UNLINKED) {
            shm_unlink(name);
        } else {
            made_name = name;
        }
        break;
    case B_MEMFD:
    case B_MEMFD_CLOSED:
        fd = memfd_create("hca-test-export", MFD_CLOEXEC);
        break;
    case B_FILE:
    case B_OTHER_USER:
        snprintf(name, sizeof(name), "/tmp/hca-test-export.%d", getpid());
        fd = open(name, O_RDWR | O_CREAT | O_EXCL, 0666);
        if (fd >= 0) {
            unlink(name); /* the mapping and the fd keep it */
            if ((k == B_OTHER_USER) && (fchown(fd, 65534, 65534) != 0)) {
                close(fd);
                return nullptr;
            }
        }
        break;
    case B_PRIVATE:
        p = aligned_alloc(4096, LEN);
        return (uint8_t*)p;
    case B_STRADDLE: {
        int a = memfd_create("hca-test-a", MFD_CLOEXEC);
        int b = memfd_create("hca-test-b", MFD_CLOEXEC);
        uint8_t *base;

        if ((a < 0) || (b < 0) || (ftruncate(a, LEN / 2) != 0) ||
            (ftruncate(b, LEN / 2) != 0)) {
            return nullptr;
        }
        base = (uint8_t*)mmap(nullptr, LEN, PROT_NONE,
                              MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if ((base == MAP_FAILED) ||
            (mmap(base, LEN / 2, PROT_READ | PROT_WRITE,
                  MAP_SHARED | MAP_FIXED, a, 0) == MAP_FAILED) ||
            (mmap(base + LEN / 2, LEN / 2, PROT_READ | PROT_WRITE,
                  MAP_SHARED | MAP_FIXED, b, 0) == MAP_FAILED)) {
            return nullptr;
        }
        *fd_keep = a; /* b is closed: a alone does not span the range */
        close(b);
        return base;
    }
    }
    if ((fd < 0) || (ftruncate(fd, LEN) != 0)) {
        return nullptr;
    }
    p = mmap(nullptr, LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (k == B_MEMFD_CLOSED) {
        close(fd);
    } else {
        *fd_keep = fd;
    }
    return (p == MAP_FAILED) ? nullptr : (uint8_t*)p;
}

class Export : public hca_test, public ::testing::WithParamInterface<int> {
};

const uint64_t CTR0 = 1000;

} // namespace

/* The child registers memory of the kind; the parent writes 1000 bytes at
 * offset 100 and adds 1 five times to the word at 4096 (direct when the
 * kind is mappable, else by WRs), then, after the child deregistered,
 * tries both again: refused, and nothing changed. */
TEST_P(Export, ReachedByTheBestRouteAndRevoked)
{
    const int kind = GetParam();
    if ((kind == B_OTHER_USER) && (geteuid() != 0)) {
        GTEST_SKIP() << "a file of another user needs root to make";
    }
    child_t *ch = fork_child([kind](int rfd, int wfd) {
        int fd_keep;
        uint8_t *m = backing_alloc(kind, &fd_keep);
        if (m == nullptr) {
            backing_remove_names();
        }
        ASSERT_NE(nullptr, m) << "cannot make " << backing_name(kind)
                              << " memory: " << strerror(errno);
        memset(m, SENTINEL, LEN);
        memcpy(m + 4096, &CTR0, 8);
        ctx c;
        ASSERT_TRUE(c.open(0));
        hca_pd_t *pd = c.new_pd();
        cqw *cq      = c.new_cq(16);
        ASSERT_NE(nullptr, cq);
        hca_qp_t *qp = c.new_qp(pd, cq, cq, c.caps(16));
        ASSERT_NE(nullptr, qp);
        hca_mr_t *mr = c.reg(pd, m, LEN, ACCESS_ALL);
        backing_remove_names();
        ASSERT_NE(nullptr, mr);
        peer_info pp;
        ASSERT_TRUE(recv_msg(rfd, &pp));
        ASSERT_EQ(0, connect_qp(qp, pp.addr, pp.qpn[0]));
        peer_info me;
        memset(&me, 0, sizeof(me));
        me.addr     = c.addr;
        me.qpn[0]   = hca_qp_num(qp);
        me.raddr[0] = (uint64_t)(uintptr_t)m;
        me.rkey[0]  = hca_mr_rkey(mr);
        ASSERT_TRUE(send_msg(wfd, me));
        ASSERT_TRUE(expect_token(rfd, 1));
        EXPECT_EQ(-1, check_pattern(m + 100, 1000, 31));
        EXPECT_EQ(-1, check_byte(m, 100, SENTINEL));
        EXPECT_EQ(-1, check_byte(m + 1100, 4096 - 1100, SENTINEL));
        EXPECT_EQ(-1, check_byte(m + 4104, LEN - 4104, SENTINEL));
        uint64_t ctr;
        memcpy(&ctr, m + 4096, 8);
        EXPECT_EQ(CTR0 + 5, ctr);
        memset(m, SENTINEL, LEN);
        ASSERT_EQ(0, c.dereg(mr));
        ASSERT_TRUE(send_token(wfd, 2));
        ASSERT_TRUE(expect_token(rfd, 3));
        EXPECT_EQ(-1, check_byte(m, LEN, SENTINEL))
                << "memory changed after its deregistration";
        ASSERT_TRUE(send_token(wfd, 4));
    });
    ASSERT_NE(nullptr, ch);

    ctx c;
    ASSERT_TRUE(c.open(0));
    hca_pd_t *pd = c.new_pd();
    cqw *cq      = c.new_cq(64);
    ASSERT_NE(nullptr, cq);
    hca_qp_t *qp = c.new_qp(pd, cq, cq, c.caps(16));
    ASSERT_NE(nullptr, qp);
    uint8_t *src = c.alloc(MEM_MALLOC, 4096);
    ASSERT_NE(nullptr, src);
    fill_pattern(src, 1000, 31);
    hca_mr_t *smr = c.reg(pd, src, 4096, ACCESS_ALL);
    ASSERT_NE(nullptr, smr);
    peer_info me;
    memset(&me, 0, sizeof(me));
    me.addr   = c.addr;
    me.qpn[0] = hca_qp_num(qp);
    ASSERT_TRUE(send_msg(ch->wfd, me));
    peer_info pi;
    ASSERT_TRUE(recv_msg(ch->rfd, &pi));
    ASSERT_EQ(0, connect_qp(qp, pi.addr, pi.qpn[0]));

    hca_counters_t before, after;
    ASSERT_EQ(0, hca_qp_counters(qp, &before));
    int rc = fast_write_direct(qp, src, 1000, pi.raddr[0] + 100, pi.rkey[0]);
    if (mappable(kind)) {
        EXPECT_EQ(0, rc) << backing_name(kind)
                         << " memory was not written directly";
    } else {
        EXPECT_EQ(-EAGAIN, rc);
    }
    if (rc != 0) {
        hca_sge_t sg     = mk_sge(src, 1000, hca_mr_lkey(smr));
        hca_send_wr_t wr = mk_wr(HCA_WR_RDMA_WRITE, &sg, 1,
                                 HCA_SEND_SIGNALED, 1, pi.raddr[0] + 100,
                                 pi.rkey[0]);
        ASSERT_EQ(0, post_retry(qp, &wr));
        ASSERT_TRUE(wait_status(cq, 1, HCA_WC_SUCCESS));
    }
    for (int i = 0; i < 5; ++i) {
        uint64_t old = 0;
        rc = fast_atomic_direct(qp, HCA_WR_ATOMIC_FETCH_ADD, 8,
                                pi.raddr[0] + 4096, pi.rkey[0], 1, 0, &old);
        if (mappable(kind)) {
            EXPECT_EQ(0, rc);
        }
        if (rc != 0) {
            hca_sge_t sg     = mk_sge(src + 2048, 8, hca_mr_lkey(smr));
            hca_send_wr_t wr = mk_wr(HCA_WR_ATOMIC_FETCH_ADD, &sg, 1,
                                     HCA_SEND_SIGNALED, 10 + i,
                                     pi.raddr[0] + 4096, pi.rkey[0]);
            wr.compare_add = 1;
            ASSERT_EQ(0, post_retry(qp, &wr));
            ASSERT_TRUE(wait_status(cq, 10 + i, HCA_WC_SUCCESS));
            memcpy(&old, src + 2048, 8);
        }
        EXPECT_EQ(CTR0 + i, old);
    }
    ASSERT_EQ(0, hca_qp_counters(qp, &after));
    if (mappable(kind)) {
        EXPECT_EQ(before.mapped_ops + 6, after.mapped_ops)
                << "the write and the five atomics were not direct";
    } else {
        EXPECT_EQ(before.mapped_ops, after.mapped_ops)
                << backing_name(kind) << " memory cannot be mapped by a "
                                         "peer, yet an access was mapped";
    }
    ASSERT_TRUE(send_token(ch->wfd, 1));
    ASSERT_TRUE(expect_token(ch->rfd, 2));

    /* deregistered: the direct path refuses, a WR fails, nothing lands */
    EXPECT_EQ(-EAGAIN, fast_write_direct(qp, src, 64, pi.raddr[0] + 100,
                                         pi.rkey[0]));
    hca_sge_t sg     = mk_sge(src, 64, hca_mr_lkey(smr));
    hca_send_wr_t wr = mk_wr(HCA_WR_RDMA_WRITE, &sg, 1, HCA_SEND_SIGNALED, 99,
                             pi.raddr[0] + 100, pi.rkey[0]);
    ASSERT_EQ(0, post_retry(qp, &wr));
    EXPECT_TRUE(wait_status(cq, 99, HCA_WC_REM_ACCESS_ERR));
    ASSERT_TRUE(send_token(ch->wfd, 3));
    EXPECT_TRUE(expect_token(ch->rfd, 4));
    EXPECT_TRUE(wait_child(ch));
}

INSTANTIATE_TEST_SUITE_P(Kinds, Export, ::testing::Range(0, (int)B_LAST),
                         [](const ::testing::TestParamInfo<int> &info) {
                             return std::string(backing_name(info.param));
                         });

/* The owner deregisters a sysv segment that a peer reached directly,
 * detaches and removes it, and registers a new segment (often at the same
 * address): the old key reaches nothing by either route, and the new one
 * reaches the new segment directly, never the peer's mapping of the old
 * one. */
class ExportStale : public hca_test {
};

TEST_F(ExportStale, UnmappedSegmentNeverReached)
{
    child_t *ch = fork_child([](int rfd, int wfd) {
        ctx c;
        ASSERT_TRUE(c.open(0));
        hca_pd_t *pd = c.new_pd();
        cqw *cq      = c.new_cq(16);
        ASSERT_NE(nullptr, cq);
        hca_qp_t *qp = c.new_qp(pd, cq, cq, c.caps(16));
        ASSERT_NE(nullptr, qp);
        peer_info pp;
        ASSERT_TRUE(recv_msg(rfd, &pp));
        ASSERT_EQ(0, connect_qp(qp, pp.addr, pp.qpn[0]));
        uint8_t *seg[2];
        for (int round = 0; round < 2; ++round) {
            int id = shmget(IPC_PRIVATE, LEN, IPC_CREAT | 0600);
            ASSERT_GE(id, 0);
            seg[round] = (uint8_t*)shmat(id, nullptr, 0);
            shmctl(id, IPC_RMID, nullptr); /* as UCX's sysv allocator */
            ASSERT_NE((void*)-1, (void*)seg[round]);
            memset(seg[round], SENTINEL, LEN);
            hca_mr_t *mr = c.reg(pd, seg[round], LEN, ACCESS_ALL);
            ASSERT_NE(nullptr, mr);
            peer_info me;
            memset(&me, 0, sizeof(me));
            me.addr     = c.addr;
            me.qpn[0]   = hca_qp_num(qp);
            me.raddr[0] = (uint64_t)(uintptr_t)seg[round];
            me.rkey[0]  = hca_mr_rkey(mr);
            ASSERT_TRUE(send_msg(wfd, me));
            ASSERT_TRUE(expect_token(rfd, 1 + round));
            EXPECT_EQ(-1, check_pattern(seg[round] + 64, 512, 40 + round))
                    << "round " << round;
            EXPECT_EQ(-1, check_byte(seg[round], 64, SENTINEL));
            EXPECT_EQ(-1, check_byte(seg[round] + 576, LEN - 576, SENTINEL));
            ASSERT_EQ(0, c.dereg(mr));
            if (round == 0) {
                ASSERT_EQ(0, shmdt(seg[0])); /* gone: its pages freed */
            }
        }
        ASSERT_TRUE(send_token(wfd, 3));
        ASSERT_TRUE(expect_token(rfd, 4));
        EXPECT_EQ(-1, check_byte(seg[1], 64, SENTINEL));
        EXPECT_EQ(-1, check_byte(seg[1] + 576, LEN - 576, SENTINEL));
        EXPECT_EQ(-1, check_pattern(seg[1] + 64, 512, 41))
                << "the deregistered segment was written";
        ASSERT_TRUE(send_token(wfd, 5));
    });
    ASSERT_NE(nullptr, ch);

    ctx c;
    ASSERT_TRUE(c.open(0));
    hca_pd_t *pd = c.new_pd();
    cqw *cq      = c.new_cq(64);
    ASSERT_NE(nullptr, cq);
    hca_qp_t *qp = c.new_qp(pd, cq, cq, c.caps(16));
    ASSERT_NE(nullptr, qp);
    uint8_t *src = c.alloc(MEM_MALLOC, 4096);
    ASSERT_NE(nullptr, src);
    hca_mr_t *smr = c.reg(pd, src, 4096, ACCESS_ALL);
    ASSERT_NE(nullptr, smr);
    peer_info me;
    memset(&me, 0, sizeof(me));
    me.addr   = c.addr;
    me.qpn[0] = hca_qp_num(qp);
    ASSERT_TRUE(send_msg(ch->wfd, me));
    peer_info old_key, keys[2];
    memset(&old_key, 0, sizeof(old_key));
    for (int round = 0; round < 2; ++round) {
        peer_info &pi = keys[round];
        ASSERT_TRUE(recv_msg(ch->rfd, &pi));
        if (round == 0) {
            ASSERT_EQ(0, connect_qp(qp, pi.addr, pi.qpn[0]));
            old_key = pi;
        } else {
            /* the old key, after its segment was deregistered and
             * detached: refused by the direct path (a WR is tried last:
             * its error moves the QP to ERR) */
            EXPECT_EQ(-EAGAIN, fast_write_direct(qp, src, 512,
                                                 old_key.raddr[0] + 64,
                                                 old_key.rkey[0]));
        }
        fill_pattern(src, 512, 40 + round);
        EXPECT_EQ(0, fast_write_direct(qp, src, 512, pi.raddr[0] + 64,
                                       pi.rkey[0]))
                << "round " << round << ": not written directly";
        ASSERT_TRUE(send_token(ch->wfd, 1 + round));
    }
    ASSERT_TRUE(expect_token(ch->rfd, 3));
    /* both keys deregistered now: nothing lands */
    fill_pattern(src, 512, 99);
    for (int round = 0; round < 2; ++round) {
        EXPECT_EQ(-EAGAIN, fast_write_direct(qp, src, 512,
                                             keys[round].raddr[0] + 64,
                                             keys[round].rkey[0]));
    }
    hca_sge_t sg     = mk_sge(src, 512, hca_mr_lkey(smr));
    hca_send_wr_t wr = mk_wr(HCA_WR_RDMA_WRITE, &sg, 1, HCA_SEND_SIGNALED, 7,
                             old_key.raddr[0] + 64, old_key.rkey[0]);
    ASSERT_EQ(0, post_retry(qp, &wr));
    EXPECT_TRUE(wait_status(cq, 7, HCA_WC_REM_ACCESS_ERR));
    ASSERT_TRUE(send_token(ch->wfd, 4));
    EXPECT_TRUE(expect_token(ch->rfd, 5));
    EXPECT_TRUE(wait_child(ch));
}
