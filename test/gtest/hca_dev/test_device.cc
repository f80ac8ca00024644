/*
 * test_device.cc - device list, open/close, query, port query, host id,
 * port addresses, string helpers, counters.
 */
#include "test_common.h"

#include <set>

using namespace hcat;

class Device : public hca_test {
};

TEST_F(Device, ListNames)
{
    char names[16][HCA_DEVNAME_MAX];
    memset(names, 0x7f, sizeof(names));
    int n = hca_get_device_list(names, 16);
    ASSERT_GE(n, 1) << "no device";
    std::set<std::string> seen;
    for (int i = 0; i < std::min(n, 16); ++i) {
        ASSERT_NE(nullptr, memchr(names[i], '\0', HCA_DEVNAME_MAX))
                << "name " << i << " not NUL-terminated";
        EXPECT_GT(strlen(names[i]), 0u) << "empty name " << i;
        EXPECT_TRUE(seen.insert(names[i]).second) << "duplicate " << names[i];
    }
    /* max limits what is written, not the count returned */
    char one[2][HCA_DEVNAME_MAX];
    memset(one, 0x7f, sizeof(one));
    EXPECT_EQ(n, hca_get_device_list(one, 1));
    EXPECT_STREQ(names[0], one[0]);
    for (int i = 0; i < HCA_DEVNAME_MAX; ++i) {
        EXPECT_EQ(0x7f, (unsigned char)one[1][i]) << "wrote beyond max";
    }
    char none[1][HCA_DEVNAME_MAX];
    memset(none, 0x7f, sizeof(none));
    EXPECT_EQ(n, hca_get_device_list(none, 0));
    EXPECT_EQ(0x7f, (unsigned char)none[0][0]) << "wrote with max 0";
}

TEST_F(Device, OpenCloseEach)
{
    char names[16][HCA_DEVNAME_MAX];
    int n = hca_get_device_list(names, 16);
    ASSERT_GE(n, 1);
    for (int i = 0; i < std::min(n, 16); ++i) {
        hca_device_t *dev = nullptr;
        ASSERT_EQ(0, hca_device_open(names[i], 0, &dev)) << names[i];
        ASSERT_NE(nullptr, dev);
        ASSERT_NE(nullptr, hca_device_name(dev));
        EXPECT_STREQ(names[i], hca_device_name(dev));
        hca_device_attr_t attr;
        memset(&attr, 0, sizeof(attr));
        EXPECT_EQ(0, hca_device_query(dev, &attr));
        EXPECT_STREQ(names[i], attr.name);
        EXPECT_EQ(0, hca_device_close(dev));
    }
}

TEST_F(Device, OpenUnknown)
{
    hca_device_t *dev = nullptr;
    EXPECT_EQ(-ENODEV, hca_device_open("nosuchdev", 0, &dev));
    EXPECT_EQ(-ENODEV, hca_device_open("", 0, &dev));
    EXPECT_EQ(-ENODEV, hca_device_open("hca999", 0, &dev));
    /* longer than HCA_DEVNAME_MAX: not a prefix match of a real name */
    std::string lng = dev_name() + std::string(2 * HCA_DEVNAME_MAX, 'x');
    EXPECT_EQ(-ENODEV, hca_device_open(lng.c_str(), 0, &dev));
}

TEST_F(Device, OpenRepeatedly)
{
    /* opens and closes do not leak: many cycles work */
    for (int i = 0; i < 50; ++i) {
        hca_device_t *dev = nullptr;
        ASSERT_EQ(0, hca_device_open(dev_name().c_str(), i & 1 ? 0 :
                                     HCA_OPEN_NO_SINGLE_COPY, &dev));
        ASSERT_EQ(0, hca_device_close(dev));
    }
}

TEST_F(Device, QueryAttributes)
{
    ctx c;
    ASSERT_TRUE(c.open());
    const hca_device_attr_t &a = c.attr;
    EXPECT_STREQ(dev_name().c_str(), a.name);
    EXPECT_NE(nullptr, memchr(a.fw_ver, '\0', sizeof(a.fw_ver)));
    EXPECT_NE(0u, a.node_guid);
    EXPECT_GE(a.numa_node, -1);
    EXPECT_GE(a.phys_port_cnt, 1u);
    EXPECT_GE(a.max_pd, 1u);
    EXPECT_GE(a.max_mr, 1u);
    EXPECT_GT(a.max_mr_size, 0u);
    EXPECT_GE(a.max_qp, 1u);
    EXPECT_GE(a.max_qp_wr, 1u);
    EXPECT_GE(a.max_sge, 1u);
    EXPECT_GE(a.max_cq, 1u);
    EXPECT_GE(a.max_cqe, 1u);
    EXPECT_GE(a.max_srq, 1u);
    EXPECT_GE(a.max_srq_wr, 1u);
    EXPECT_GT(a.max_msg_size, 0u);
    EXPECT_GE(a.max_mr_size, a.max_msg_size)
            << "a message of max_msg_size must fit an MR";
    EXPECT_GE(a.max_dm, 1u);
    EXPECT_GT(a.max_dm_size, 0u);
    EXPECT_NE(0u, a.atomic_caps & (HCA_ATOMIC_CAP_32 | HCA_ATOMIC_CAP_64));
    EXPECT_EQ(0u, a.atomic_caps & ~0xfu) << "unknown atomic caps";

    /* the guid is stable per host and device */
    ctx c2;
    ASSERT_TRUE(c2.open(HCA_OPEN_NO_SINGLE_COPY));
    EXPECT_EQ(a.node_guid, c2.attr.node_guid);
    EXPECT_EQ(a.vendor_id, c2.attr.vendor_id);
    EXPECT_EQ(a.max_msg_size, c2.attr.max_msg_size);
}

TEST_F(Device, PortQuery)
{
    ctx c;
    ASSERT_TRUE(c.open());
    for (uint32_t p = 1; p <= c.attr.phys_port_cnt; ++p) {
        hca_port_attr_t pa;
        memset(&pa, 0, sizeof(pa));
        ASSERT_EQ(0, hca_port_query(c.dev, (uint8_t)p, &pa)) << "port " << p;
        EXPECT_EQ(HCA_PORT_ACTIVE, pa.state);
        EXPECT_EQ(HCA_FABRIC_SHM, pa.fabric);
        EXPECT_GT(pa.mtu, 0u);
        EXPECT_GT(pa.max_msg_sz, 0u);
        EXPECT_LE(pa.max_msg_sz, c.attr.max_msg_size);
        EXPECT_LE(pa.single_copy, 1u);
    }
    hca_port_attr_t pa;
    EXPECT_LT(hca_port_query(c.dev, 0, &pa), 0) << "ports are numbered from 1";
    EXPECT_LT(hca_port_query(c.dev, (uint8_t)(c.attr.phys_port_cnt + 1), &pa),
              0);
}

TEST_F(Device, PortNoSingleCopy)
{
    ctx c;
    ASSERT_TRUE(c.open(HCA_OPEN_NO_SINGLE_COPY));
    hca_port_attr_t pa;
    memset(&pa, 0xff, sizeof(pa));
    ASSERT_EQ(0, hca_port_query(c.dev, 1, &pa));
    EXPECT_EQ(0u, pa.single_copy)
            << "HCA_OPEN_NO_SINGLE_COPY: CMA must not be used";
}

TEST_F(Device, HostId)
{
    hca_host_id_t a, b;
    memset(&a, 0, sizeof(a));
    memset(&b, 0, sizeof(b));
    ASSERT_EQ(0, hca_host_id_get(&a));
    ASSERT_EQ(0, hca_host_id_get(&b));
    EXPECT_TRUE(hca_host_id_equal(&a, &a));
    EXPECT_TRUE(hca_host_id_equal(&a, &b));
    EXPECT_TRUE(hca_host_id_equal(&b, &a));
    EXPECT_NE(0u, a.ipc_ns);
    EXPECT_NE(0u, a.pid_ns);
    EXPECT_NE(0u, a.net_ns);
    uint8_t zero[16] = {0};
    EXPECT_NE(0, memcmp(a.boot_id, zero, 16)) << "boot id is all zero";

    hca_host_id_t c = a;
    c.boot_id[7] ^= 1;
    EXPECT_FALSE(hca_host_id_equal(&a, &c)) << "other boot";
    c = a;
    c.ipc_ns ^= 1;
    EXPECT_FALSE(hca_host_id_equal(&a, &c)) << "other IPC namespace";
    c = a;
    c.pid_ns ^= 1;
    EXPECT_FALSE(hca_host_id_equal(&a, &c)) << "other PID namespace";
    c = a;
    c.net_ns ^= 1;
    EXPECT_FALSE(hca_host_id_equal(&a, &c)) << "other net namespace";

    /* the key that addresses carry tells them apart too */
    hca_host_id_t k = a;
    EXPECT_EQ(hca_host_key(&a), hca_host_key(&k));
    k.boot_id[15] ^= 1;
    EXPECT_NE(hca_host_key(&a), hca_host_key(&k)) << "other boot";
    k = a;
    k.pid_ns ^= 1;
    EXPECT_NE(hca_host_key(&a), hca_host_key(&k)) << "other PID namespace";
    k = a;
    k.net_ns += 1;
    EXPECT_NE(hca_host_key(&a), hca_host_key(&k)) << "other net namespace";
}

TEST_F(Device, PortAddress)
{
    ctx c1, c2;
    ASSERT_TRUE(c1.open());
    ASSERT_TRUE(c2.open());
    hca_host_id_t h;
    ASSERT_EQ(0, hca_host_id_get(&h));
    EXPECT_EQ(hca_host_key(&h), c1.addr.host);
    EXPECT_EQ((uint32_t)getpid(), c1.addr.pid);
    EXPECT_EQ((uint32_t)getpid(), c2.addr.pid);
    EXPECT_NE(c1.addr.ctx_id, c2.addr.ctx_id)
            << "two opens in one process need distinct addresses";
    hca_port_addr_t again;
    hca_port_address(c1.dev, &again);
    EXPECT_EQ(0, memcmp(&again, &c1.addr, sizeof(again)));

    EXPECT_TRUE(hca_port_addr_reachable(c1.dev, &c1.addr)) << "itself";
    EXPECT_TRUE(hca_port_addr_reachable(c1.dev, &c2.addr));
    EXPECT_TRUE(hca_port_addr_reachable(c2.dev, &c1.addr));
    EXPECT_EQ(1, hca_port_addr_alive(&c1.addr));

    /* another host: only over tcp, so only with a tcp listener */
    hca_port_addr_t other = c1.addr;
    other.host ^= 0x80;
    EXPECT_EQ(c1.addr.net.family != HCA_NET_NONE,
              !!hca_port_addr_reachable(c1.dev, &other))
            << "another host is reachable exactly when it has a listener";
    other.net.family = HCA_NET_NONE;
    EXPECT_FALSE(hca_port_addr_reachable(c1.dev, &other))
            << "another host without a tcp listener is unreachable";
}

TEST_F(Device, PortAddressAliveDeadProcess)
{
    ctx c;
    ASSERT_TRUE(c.open());
    /* a process that has exited (and been reaped) is gone */
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        _exit(0);
    }
    int st;
    ASSERT_EQ(pid, waitpid(pid, &st, 0));
    hca_port_addr_t dead = c.addr;
    dead.pid             = (uint32_t)pid;
    EXPECT_EQ(0, hca_port_addr_alive(&dead));
    EXPECT_EQ(1, hca_port_addr_alive(&c.addr));
}

TEST_F(Device, WcStatusStrings)
{
    std::set<std::string> seen;
    for (int i = 0; i < HCA_WC_STATUS_LAST; ++i) {
        const char *s = hca_wc_status_str((hca_wc_status_t)i);
        ASSERT_NE(nullptr, s) << "status " << i;
        EXPECT_GT(strlen(s), 0u) << "status " << i;
        EXPECT_TRUE(seen.insert(s).second) << "duplicate string " << s;
    }
    EXPECT_NE(nullptr, hca_wc_status_str(HCA_WC_STATUS_LAST));
    EXPECT_NE(nullptr, hca_wc_status_str((hca_wc_status_t)1000));
}

TEST_F(Device, WrOpcodeStrings)
{
    std::set<std::string> seen;
    for (int i = 0; i < HCA_WR_OPCODE_LAST; ++i) {
        const char *s = hca_wr_opcode_str((hca_wr_opcode_t)i);
        ASSERT_NE(nullptr, s) << "opcode " << i;
        EXPECT_GT(strlen(s), 0u) << "opcode " << i;
        EXPECT_TRUE(seen.insert(s).second) << "duplicate string " << s;
    }
    EXPECT_NE(nullptr, hca_wr_opcode_str(HCA_WR_OPCODE_LAST));
    EXPECT_NE(nullptr, hca_wr_opcode_str((hca_wr_opcode_t)1000));
}

TEST_F(Device, QpStateStrings)
{
    std::set<std::string> seen;
    for (int i = 0; i < HCA_QPS_LAST; ++i) {
        const char *s = hca_qp_state_str((hca_qp_state_t)i);
        ASSERT_NE(nullptr, s) << "state " << i;
        EXPECT_GT(strlen(s), 0u) << "state " << i;
        EXPECT_TRUE(seen.insert(s).second) << "duplicate string " << s;
    }
    EXPECT_NE(nullptr, hca_qp_state_str(HCA_QPS_LAST));
    EXPECT_NE(nullptr, hca_qp_state_str((hca_qp_state_t)1000));
}

TEST_F(Device, PortStateStrings)
{
    const hca_port_state_t st[] = {HCA_PORT_DOWN, HCA_PORT_INIT,
                                   HCA_PORT_ACTIVE};
    std::set<std::string> seen;
    for (hca_port_state_t s : st) {
        const char *p = hca_port_state_str(s);
        ASSERT_NE(nullptr, p) << "port state " << (int)s;
        EXPECT_GT(strlen(p), 0u);
        EXPECT_TRUE(seen.insert(p).second) << "duplicate string " << p;
    }
    EXPECT_NE(nullptr, hca_port_state_str((hca_port_state_t)0));
    EXPECT_NE(nullptr, hca_port_state_str((hca_port_state_t)3));
    EXPECT_NE(nullptr, hca_port_state_str((hca_port_state_t)1000));
}

TEST_F(Device, CountersCountOps)
{
    ctx c;
    local_target t;
    ASSERT_TRUE(c.open());
    ASSERT_TRUE(t.open());
    hca_counters_t base;
    ASSERT_EQ(0, hca_device_counters(c.dev, &base));

    conn cn;
    ASSERT_TRUE(make_conn(c, t, &cn));
    uint8_t *lb = c.alloc(MEM_MALLOC, 4096);
    ASSERT_NE(nullptr, lb);
    hca_mr_t *mr = c.reg(cn.pd, lb, 4096, ACCESS_ALL);
    ASSERT_NE(nullptr, mr);
    uint64_t ra = 0;
    int rb = t.buf(MEM_MALLOC, 4096, &ra);
    ASSERT_GE(rb, 0);
    uint32_t rkey = 0;
    ASSERT_GE(t.mr(cn.tpd, rb, 0, 4096, ACCESS_ALL, &rkey), 0);
    for (int i = 0; i < 3; ++i) {
        hca_sge_t s      = mk_sge(lb, 100, hca_mr_lkey(mr));
        hca_send_wr_t wr = mk_wr(HCA_WR_RDMA_WRITE, &s, 1, HCA_SEND_SIGNALED,
                                 i, ra, rkey);
        ASSERT_EQ(0, post_retry(cn.qp, &wr));
        ASSERT_TRUE(wait_ok(cn.scq, i, HCA_WC_RDMA_WRITE));
    }
    hca_counters_t q;
    ASSERT_EQ(0, hca_qp_counters(cn.qp, &q));
    EXPECT_EQ(3u, q.tx_ops[HCA_WR_RDMA_WRITE]);
    EXPECT_EQ(300u, q.tx_bytes[HCA_WR_RDMA_WRITE]);
    EXPECT_EQ(0u, q.tx_ops[HCA_WR_RDMA_READ]);

    /* device counters include destroyed QPs */
    ASSERT_EQ(0, c.destroy_qp(cn.qp));
    hca_counters_t d;
    ASSERT_EQ(0, hca_device_counters(c.dev, &d));
    EXPECT_EQ(base.tx_ops[HCA_WR_RDMA_WRITE] + 3, d.tx_ops[HCA_WR_RDMA_WRITE]);
    EXPECT_EQ(base.tx_bytes[HCA_WR_RDMA_WRITE] + 300,
              d.tx_bytes[HCA_WR_RDMA_WRITE]);
}
