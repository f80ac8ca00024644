/*
 * test_threads.cc - one device context used by several threads at once, as
 * UCP does with a worker per thread: registration and deregistration race
 * with RDMA traffic of QPs that belong to other threads.
 */
#include <gtest/gtest.h>

#include "hca_dev.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

namespace {

const unsigned ACCESS = HCA_ACCESS_LOCAL_WRITE | HCA_ACCESS_REMOTE_WRITE |
                        HCA_ACCESS_REMOTE_READ | HCA_ACCESS_REMOTE_ATOMIC;

/* Two connected QPs with their own CQs: one "worker". */
struct worker_pair {
    hca_cq_t *cqa = nullptr, *cqb = nullptr;
    hca_qp_t *a = nullptr, *b = nullptr;

    bool open(hca_device_t *dev, hca_pd_t *pd)
    {
        hca_qp_init_attr_t ia = {};
        hca_port_addr_t addr;
        hca_qp_attr_t at = {};

        if ((hca_cq_create(dev, 256, &cqa) != 0) ||
            (hca_cq_create(dev, 256, &cqb) != 0)) {
            return false;
        }
        ia.max_send_wr  = 64;
        ia.max_recv_wr  = 64;
        ia.max_send_sge = 1;
        ia.max_recv_sge = 1;
        ia.send_cq = ia.recv_cq = cqa;
        if (hca_qp_create(pd, &ia, &a) != 0) {
            return false;
        }
        ia.send_cq = ia.recv_cq = cqb;
        if (hca_qp_create(pd, &ia, &b) != 0) {
            return false;
        }
        hca_port_address(dev, &addr);
        at.qp_state = HCA_QPS_INIT;
        at.access   = ACCESS;
        if ((hca_qp_modify(a, &at, HCA_QP_ATTR_STATE | HCA_QP_ATTR_ACCESS) !=
             0) ||
            (hca_qp_modify(b, &at, HCA_QP_ATTR_STATE | HCA_QP_ATTR_ACCESS) !=
             0)) {
            return false;
        }
        at.qp_state    = HCA_QPS_RTR;
        at.dest        = addr;
        at.dest_qp_num = hca_qp_num(b);
        if (hca_qp_modify(a, &at, HCA_QP_ATTR_STATE | HCA_QP_ATTR_DEST) != 0) {
            return false;
        }
        at.dest_qp_num = hca_qp_num(a);
        if (hca_qp_modify(b, &at, HCA_QP_ATTR_STATE | HCA_QP_ATTR_DEST) != 0) {
            return false;
        }
        at.qp_state = HCA_QPS_RTS;
        return (hca_qp_modify(a, &at, HCA_QP_ATTR_STATE) == 0) &&
               (hca_qp_modify(b, &at, HCA_QP_ATTR_STATE) == 0);
    }

    void close()
    {
        if (a) hca_qp_destroy(a);
        if (b) hca_qp_destroy(b);
        if (cqa) hca_cq_destroy(cqa);
        if (cqb) hca_cq_destroy(cqb);
    }
};

/* Signalled WR -> its completion, bounded. */
bool wait_one(hca_cq_t *cq, hca_wc_t *wc)
{
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < end) {
        int n = hca_cq_poll(cq, 1, wc);
        if (n == 1) {
            return true;
        }
        if (n < 0) {
            return false;
        }
    }
    return false;
}

} // namespace

TEST(Threads, RegistrationRacesTraffic)
{
    hca_device_t *dev = nullptr;
    hca_pd_t *pd      = nullptr;
    ASSERT_EQ(0, hca_device_open("hca0", 0, &dev));
    ASSERT_EQ(0, hca_pd_alloc(dev, &pd));

    const int workers = 2, writes = 50000;
    std::vector<worker_pair> pairs(workers);
    for (auto &p : pairs) {
        ASSERT_TRUE(p.open(dev, pd));
    }

    std::atomic<bool> stop{false};
    std::atomic<int> reg_errors{0}, key_clashes{0}, regs{0};

    /* registrar threads: register and deregister as fast as they can; the
     * keys that are live at the same time must all differ */
    auto registrar = [&](int seed) {
        std::vector<uint8_t> buf(1 << 16);
        while (!stop.load()) {
            hca_mr_t *mr[8];
            std::set<uint32_t> keys;
            for (int i = 0; i < 8; ++i) {
                size_t off = (size_t)((seed * 131 + i * 977) % 4096);
                if (hca_mr_reg(pd, buf.data() + off, 4096, ACCESS, &mr[i]) !=
                    0) {
                    reg_errors++;
                    mr[i] = nullptr;
                    continue;
                }
                if (!keys.insert(hca_mr_rkey(mr[i])).second) {
                    key_clashes++;
                }
            }
            for (int i = 0; i < 8; ++i) {
                if (mr[i] && (hca_mr_dereg(mr[i]) != 0)) {
                    reg_errors++;
                }
            }
            regs += 8;
        }
    };

    /* traffic threads: each owns one worker pair (its QPs and CQs) */
    std::vector<int> bad(workers, 0);
    auto traffic = [&](int w) {
        worker_pair &p = pairs[w];
        std::vector<uint8_t> src(4096), dst(4096, 0);
        hca_mr_t *smr = nullptr, *dmr = nullptr;
        if ((hca_mr_reg(pd, src.data(), src.size(), ACCESS, &smr) != 0) ||
            (hca_mr_reg(pd, dst.data(), dst.size(), ACCESS, &dmr) != 0)) {
            bad[w] = -1;
            return;
        }
        for (int i = 0; i < writes && !bad[w]; ++i) {
            size_t len = 1 + (size_t)((i * 37 + w) % 4096);
            memset(src.data(), (int)(i + w), len);
            hca_sge_t sge = {(uint64_t)(uintptr_t)src.data(), (uint32_t)len,
                             hca_mr_lkey(smr)};
            hca_send_wr_t wr = {};
            hca_send_wr_t *badwr;
            hca_wc_t wc;
            wr.wr_id            = (uint64_t)i;
            wr.sg_list          = &sge;
            wr.num_sge          = 1;
            wr.opcode           = HCA_WR_RDMA_WRITE;
            wr.send_flags       = HCA_SEND_SIGNALED;
            wr.rdma.remote_addr = (uint64_t)(uintptr_t)dst.data();
            wr.rdma.rkey        = hca_mr_rkey(dmr);
            if ((hca_post_send(p.a, &wr, &badwr) != 0) ||
                !wait_one(p.cqa, &wc) || (wc.status != HCA_WC_SUCCESS) ||
                (memcmp(src.data(), dst.data(), len) != 0)) {
                bad[w] = i + 1;
            }
        }
        hca_mr_dereg(smr);
        hca_mr_dereg(dmr);
    };

    std::vector<std::thread> threads;
    threads.emplace_back(registrar, 1);
    threads.emplace_back(registrar, 2);
    std::vector<std::thread> movers;
    for (int w = 0; w < workers; ++w) {
        movers.emplace_back(traffic, w);
    }
    for (auto &t : movers) {
        t.join();
    }
    stop = true;
    for (auto &t : threads) {
        t.join();
    }

    for (int w = 0; w < workers; ++w) {
        EXPECT_EQ(0, bad[w]) << "worker " << w << " failed at write "
                             << bad[w];
    }
    EXPECT_EQ(0, reg_errors.load());
    EXPECT_EQ(0, key_clashes.load());
    EXPECT_GT(regs.load(), 0);

    for (auto &p : pairs) {
        p.close();
    }
    EXPECT_EQ(0, hca_pd_dealloc(pd));
    EXPECT_EQ(0, hca_device_close(dev));
}
