/*
 * hca_fabric.c - the fabric registry: which fabrics exist, their
 * "unsupported" defaults, and the choice of a fabric for a peer address.
 *
 * Each device context holds a copy of every fabric's ops with the NULL
 * (optional) ones replaced by the defaults below, as libibverbs'
 * verbs_set_ops does; a QP points at its fabric's copy, so the engines
 * call through it without testing anything.
 */
#include "hca_registry.h"
#include "hca_obj.h"

#include <errno.h>
#include <string.h>

/* The fabrics, by hca_fabric_type_t (NULL: not built yet). */
extern const hca_fabric_ops_t hca_fabric_shm_ops;
extern const hca_fabric_ops_t hca_fabric_tcp_ops;
static const hca_fabric_ops_t *const hca_fabrics[HCA_FABRIC_LAST] = {
    [HCA_FABRIC_SHM] = &hca_fabric_shm_ops,
    [HCA_FABRIC_TCP] = &hca_fabric_tcp_ops,
};

/* ---------------------------------------------------------------- defaults */

static int hca_fabric_no_dev_open(hca_device_t *dev)
{
    (void)dev;
    return 0;
}

static void hca_fabric_no_dev_close(hca_device_t *dev)
{
    (void)dev;
}

static int hca_fabric_no_reachable(hca_device_t *dev,
                                   const hca_port_addr_t *addr)
{
    (void)dev;
    (void)addr;
    return 0;
}

static void hca_fabric_no_address(hca_device_t *dev, hca_port_addr_t *addr)
{
    (void)dev;
    (void)addr;
}

static void hca_fabric_no_port_query(hca_device_t *dev, hca_port_attr_t *attr)
{
    (void)dev;
    (void)attr;
}

static void hca_fabric_no_quiesce(hca_qp_t *qp)
{
    (void)qp;
}

static int hca_fabric_no_connect(hca_qp_t *qp)
{
    (void)qp;
    return -EHOSTUNREACH;
}

static void hca_fabric_no_disconnect(hca_qp_t *qp)
{
    (void)qp;
}

static hca_exec_t hca_fabric_no_exec(hca_qp_t *qp, struct hca_wqe *wqe,
                                     hca_wc_status_t *status_p)
{
    (void)qp;
    (void)wqe;
    *status_p = HCA_WC_RETRY_EXC_ERR; /* nobody there */
    return HCA_EXEC_DONE;
}

static int hca_fabric_no_response_ready(const hca_qp_t *qp,
                                        const struct hca_wqe *wqe)
{
    (void)qp;
    (void)wqe;
    return 0;
}

static hca_wc_status_t hca_fabric_no_pull(hca_device_t *dev,
                                          const hca_msg_hdr_t *hdr,
                                          const hca_wire_iov_t *iov,
                                          const struct hca_rwqe *rwqe)
{
    (void)dev;
    (void)hdr;
    (void)iov;
    (void)rwqe;
    return HCA_WC_REM_INV_REQ_ERR;
}

static void hca_fabric_no_answer(hca_device_t *dev, const hca_msg_hdr_t *hdr,
                                 const hca_pull_hdr_t *pull,
                                 hca_wc_status_t status)
{
    (void)dev;
    (void)hdr;
    (void)pull;
    (void)status;
}

static int hca_fabric_no_source_alive(hca_device_t *dev, uint32_t pid,
                                      uint32_t ctx_id)
{
    (void)dev;
    (void)pid;
    (void)ctx_id;
    return 0;
}

static void hca_fabric_no_mr_fence(hca_device_t *dev,
                                   const hca_mpt_entry_t *entry,
                                   uint32_t accessors, int unfenced)
{
    (void)dev;
    (void)entry;
    (void)accessors;
    (void)unfenced;
}

static int hca_fabric_no_poll(hca_device_t *dev)
{
    (void)dev;
    return 0;
}

static void hca_fabric_no_armed(hca_device_t *dev)
{
    (void)dev;
}

static int hca_fabric_no_serve(hca_device_t *dev)
{
    (void)dev;
    return 0;
}

static void hca_fabric_no_owner_armed(hca_device_t *dev)
{
    (void)dev;
}

static hca_wc_status_t hca_fabric_no_peer_status(hca_qp_t *qp)
{
    (void)qp;
    return HCA_WC_RETRY_EXC_ERR;
}

static uint64_t hca_fabric_no_check_peers(hca_device_t *dev)
{
    (void)dev;
    return 0;
}

static int hca_fabric_no_post_direct(hca_qp_t *qp, hca_send_wr_t *wr,
                                     uint64_t length)
{
    (void)qp;
    (void)wr;
    (void)length;
    return 0; /* post the WR */
}

static int hca_fabric_no_send_reserve(hca_qp_t *qp, uint32_t length_hint,
                                      hca_send_slot_t *slot)
{
    (void)qp;
    (void)length_hint;
    (void)slot;
    return -EBUSY;
}

static int hca_fabric_no_send_commit(hca_qp_t *qp, hca_send_slot_t *slot,
                                     uint32_t length, hca_wr_opcode_t opcode,
                                     uint32_t imm_data)
{
    (void)qp;
    (void)slot;
    (void)length;
    (void)opcode;
    (void)imm_data;
    return -EINVAL; /* nothing was reserved */
}

static void hca_fabric_no_send_cancel(hca_qp_t *qp, hca_send_slot_t *slot)
{
    (void)qp;
    (void)slot;
}

static int hca_fabric_no_send_short(hca_qp_t *qp, const void *hdr,
                                    uint32_t hdr_length, const void *data,
                                    uint32_t length, hca_wr_opcode_t opcode,
                                    uint32_t imm_data)
{
    (void)qp;
    (void)hdr;
    (void)hdr_length;
    (void)data;
    (void)length;
    (void)opcode;
    (void)imm_data;
    return -EBUSY;
}

static int hca_fabric_no_write_direct(hca_qp_t *qp, const void *buf,
                                      size_t length, uint64_t remote_addr,
                                      uint32_t rkey)
{
    (void)qp;
    (void)buf;
    (void)length;
    (void)remote_addr;
    (void)rkey;
    return -EAGAIN;
}

static void *hca_fabric_no_direct_ptr(hca_qp_t *qp, uint64_t remote_addr,
                                      uint32_t rkey, size_t length,
                                      unsigned access)
{
    (void)qp;
    (void)remote_addr;
    (void)rkey;
    (void)length;
    (void)access;
    return NULL;
}

static void hca_fabric_no_direct_done(hca_qp_t *qp)
{
    (void)qp;
}

static int hca_fabric_no_atomic_direct(hca_qp_t *qp, hca_wr_opcode_t opcode,
                                       unsigned size, uint64_t remote_addr,
                                       uint32_t rkey, uint64_t compare_add,
                                       uint64_t swap, void *result)
{
    (void)qp;
    (void)opcode;
    (void)size;
    (void)remote_addr;
    (void)rkey;
    (void)compare_add;
    (void)swap;
    (void)result;
    return -EAGAIN;
}

static int hca_fabric_no_rkey_ptr(hca_qp_t *qp, uint64_t remote_addr,
                                  uint32_t rkey, size_t length, void **ptr_p)
{
    (void)qp;
    (void)remote_addr;
    (void)rkey;
    (void)length;
    (void)ptr_p;
    return -ENOENT;
}

#define HCA_FABRIC_DEFAULTS \
    .dev_open       = hca_fabric_no_dev_open, \
    .dev_close      = hca_fabric_no_dev_close, \
    .reachable      = hca_fabric_no_reachable, \
    .address        = hca_fabric_no_address, \
    .port_query     = hca_fabric_no_port_query, \
    .connect        = hca_fabric_no_connect, \
    .disconnect     = hca_fabric_no_disconnect, \
    .quiesce        = hca_fabric_no_quiesce, \
    .exec           = hca_fabric_no_exec, \
    .poll_response  = hca_fabric_no_exec, \
    .response_ready = hca_fabric_no_response_ready, \
    .pull           = hca_fabric_no_pull, \
    .answer         = hca_fabric_no_answer, \
    .source_alive   = hca_fabric_no_source_alive, \
    .mr_fence       = hca_fabric_no_mr_fence, \
    .poll           = hca_fabric_no_poll, \
    .armed          = hca_fabric_no_armed, \
    .serve          = hca_fabric_no_serve, \
    .owner_armed    = hca_fabric_no_owner_armed, \
    .peer_status    = hca_fabric_no_peer_status, \
    .check_peers    = hca_fabric_no_check_peers, \
    .post_direct    = hca_fabric_no_post_direct, \
    .fast = { \
        .caps          = 0, \
        .send_reserve  = hca_fabric_no_send_reserve, \
        .send_commit   = hca_fabric_no_send_commit, \
        .send_cancel   = hca_fabric_no_send_cancel, \
        .send_short    = hca_fabric_no_send_short, \
        .write_direct  = hca_fabric_no_write_direct, \
        .direct_ptr    = hca_fabric_no_direct_ptr, \
        .direct_done   = hca_fabric_no_direct_done, \
        .atomic_direct = hca_fabric_no_atomic_direct, \
    }, \
    .rkey_ptr       = hca_fabric_no_rkey_ptr

static const hca_fabric_ops_t hca_fabric_defaults = {
    .name = "unsupported",
    .type = HCA_FABRIC_LAST,
    HCA_FABRIC_DEFAULTS
};

const hca_fabric_ops_t hca_fabric_none = {
    .name = "none",
    .type = HCA_FABRIC_LAST,
    HCA_FABRIC_DEFAULTS
};

#define HCA_FABRIC_FILL(_to, _from, _field) \
    (_to)->_field = ((_from)->_field != NULL) ? (_from)->_field : \
                    hca_fabric_defaults._field

/* The fabric's ops with its NULL ones replaced by the defaults. */
static void hca_fabric_fill(hca_fabric_ops_t *to, const hca_fabric_ops_t *from)
{
    to->name = from->name;
    to->type = from->type;
    HCA_FABRIC_FILL(to, from, dev_open);
    HCA_FABRIC_FILL(to, from, dev_close);
    HCA_FABRIC_FILL(to, from, reachable);
    HCA_FABRIC_FILL(to, from, address);
    HCA_FABRIC_FILL(to, from, port_query);
    HCA_FABRIC_FILL(to, from, connect);
    HCA_FABRIC_FILL(to, from, disconnect);
    HCA_FABRIC_FILL(to, from, quiesce);
    HCA_FABRIC_FILL(to, from, exec);
    HCA_FABRIC_FILL(to, from, poll_response);
    HCA_FABRIC_FILL(to, from, response_ready);
    HCA_FABRIC_FILL(to, from, pull);
    HCA_FABRIC_FILL(to, from, answer);
    HCA_FABRIC_FILL(to, from, source_alive);
    HCA_FABRIC_FILL(to, from, mr_fence);
    HCA_FABRIC_FILL(to, from, poll);
    HCA_FABRIC_FILL(to, from, armed);
    HCA_FABRIC_FILL(to, from, serve);
    HCA_FABRIC_FILL(to, from, owner_armed);
    HCA_FABRIC_FILL(to, from, peer_status);
    HCA_FABRIC_FILL(to, from, check_peers);
    HCA_FABRIC_FILL(to, from, post_direct);
    to->fast.caps = from->fast.caps;
    HCA_FABRIC_FILL(to, from, fast.send_reserve);
    HCA_FABRIC_FILL(to, from, fast.send_commit);
    HCA_FABRIC_FILL(to, from, fast.send_cancel);
    HCA_FABRIC_FILL(to, from, fast.send_short);
    HCA_FABRIC_FILL(to, from, fast.write_direct);
    HCA_FABRIC_FILL(to, from, fast.direct_ptr);
    HCA_FABRIC_FILL(to, from, fast.direct_done);
    HCA_FABRIC_FILL(to, from, fast.atomic_direct);
    HCA_FABRIC_FILL(to, from, rkey_ptr);
    to->msg_from_qp_peer = from->msg_from_qp_peer;
    /* dm_view_*: not per device (hca_dm_view_open asks the fabrics' own
     * tables, hca_fabrics[]) */
}

/* ---------------------------------------------------------------- registry */

void hca_fabric_close(hca_device_t *dev)
{
    for (int t = HCA_FABRIC_LAST - 1; t >= 0; --t) {
        if (dev->fabric_open[t]) {
            dev->fabric_ops[t].dev_close(dev);
            dev->fabric_open[t] = 0;
        }
    }
}

int hca_fabric_open(hca_device_t *dev)
{
    int rc;

    for (int t = 0; t < HCA_FABRIC_LAST; ++t) {
        if ((hca_fabrics[t] == NULL) ||
            ((t == HCA_FABRIC_TCP) && (dev->fabric_mode == HCA_FABRIC_MODE_SHM))) {
            continue;
        }
        hca_fabric_fill(&dev->fabric_ops[t], hca_fabrics[t]);
        rc = dev->fabric_ops[t].dev_open(dev);
        if (rc != 0) {
            hca_fabric_close(dev); /* the ones opened before it */
            return rc;
        }
        dev->fabric_open[t] = 1;
    }
    return 0;
}

void hca_fabric_quiesce_all(hca_qp_t *qp)
{
    hca_device_t *dev = qp->dev;

    for (int t = 0; t < HCA_FABRIC_LAST; ++t) {
        if (dev->fabric_open[t]) {
            dev->fabric_ops[t].quiesce(qp);
        }
    }
}

void hca_fabric_poll(hca_device_t *dev)
{
    uint32_t mask = atomic_load_explicit(&dev->fabric_polls,
                                         memory_order_relaxed);

    for (int t = 0; mask != 0; ++t, mask >>= 1) {
        if ((mask & 1) && dev->fabric_open[t]) {
            (void)dev->fabric_ops[t].poll(dev);
        }
    }
}

void hca_fabric_armed(hca_device_t *dev)
{
    uint32_t mask = atomic_load_explicit(&dev->fabric_polls,
                                         memory_order_relaxed);

    for (int t = 0; mask != 0; ++t, mask >>= 1) {
        if ((mask & 1) && dev->fabric_open[t]) {
            dev->fabric_ops[t].armed(dev);
        }
    }
}

int hca_fabric_serve(hca_device_t *dev)
{
    int n = 0;

    for (int t = 0; t < HCA_FABRIC_LAST; ++t) {
        if (dev->fabric_open[t]) {
            n += dev->fabric_ops[t].serve(dev);
        }
    }
    return n;
}

void hca_fabric_owner_armed(hca_device_t *dev)
{
    for (int t = 0; t < HCA_FABRIC_LAST; ++t) {
        if (dev->fabric_open[t]) {
            dev->fabric_ops[t].owner_armed(dev);
        }
    }
}

const hca_fabric_ops_t *hca_fabric_for_addr(hca_device_t *dev,
                                            const hca_port_addr_t *addr)
{
    /* in order: the first fabric that reaches it (shm before tcp, unless
     * tcp is forced) */
    for (int t = 0; t < HCA_FABRIC_LAST; ++t) {
        if ((t == HCA_FABRIC_SHM) && (dev->fabric_mode == HCA_FABRIC_MODE_TCP)) {
            continue;
        }
        if (dev->fabric_open[t] &&
            dev->fabric_ops[t].reachable(dev, addr)) {
            return &dev->fabric_ops[t];
        }
    }
    return NULL;
}

/* ---------------------------------------------------------------- dm views */

/* UCT's rkey_ptr has a component, not a device: the fabrics are asked in
 * order, and the first that can map the peer's memory makes the view. */
int hca_dm_view_open(const hca_port_addr_t *addr, uint32_t dm_id,
                     hca_dm_view_t **view_p)
{
    int rc;

    for (int t = 0; t < HCA_FABRIC_LAST; ++t) {
        const hca_fabric_ops_t *f = hca_fabrics[t];

        if ((f == NULL) || (f->dm_view_open == NULL)) {
            continue;
        }
        rc = f->dm_view_open(addr, dm_id, view_p);
        if (rc != -EHOSTUNREACH) {
            if (rc == 0) {
                (*view_p)->fabric = f;
            }
            return rc;
        }
    }
    return -EHOSTUNREACH;
}

int hca_dm_view_ptr(hca_dm_view_t *view, uint32_t rkey, uint64_t remote_addr,
                    void **ptr_p)
{
    return view->fabric->dm_view_ptr(view, rkey, remote_addr, ptr_p);
}

void hca_dm_view_close(hca_dm_view_t *view)
{
    if (view != NULL) {
        view->fabric->dm_view_close(view);
    }
}

/* ---------------------------------------------------------------- counters */

const char *hca_fabric_counter_name(hca_fabric_type_t fabric, unsigned i)
{
    const hca_fabric_ops_t *f;

    if (((unsigned)fabric >= HCA_FABRIC_LAST) ||
        (i >= HCA_FABRIC_COUNTERS_MAX)) {
        return NULL;
    }
    f = hca_fabrics[fabric];
    return ((f == NULL) || (f->counter_name == NULL)) ? NULL :
           f->counter_name(i);
}

int hca_fabric_counter_find(hca_fabric_type_t fabric, const char *name)
{
    const char *n;

    for (unsigned i = 0; (n = hca_fabric_counter_name(fabric, i)) != NULL;
         ++i) {
        if (strcmp(n, name) == 0) {
            return (int)i;
        }
    }
    return -ENOENT;
}
