/*
 * fuzz_svc.c - libFuzzer harness: forged requests in the victim's service
 * ring (dev->svc), executed by its service thread (hca_svc_handle).
 *
 * Input: up to FZ_MAX_REQS records of 65 bytes (little-endian; a record cut
 * short by the end of the input reads zeros):
 *
 *   u8  opcode, size                        raw
 *   u8  sel_pid    &3: 0,3 this process, 1 a forked child, 2 no such pid
 *   u8  sel_ctx    &3: 0,3 the sender context, 1 the victim's own, 2 raw
 *   u8  sel_tgt    &3: the victim QP the selectors below are relative to
 *                  (as ctl in fuzz_ring.c: 0,3 own RQ, 1 in-place, 2 any
 *                  source; each allows other remote access)
 *   u8  sel_src    &7: requester QP, as in fuzz_ring.c
 *   u8  sel_dst    &7: target QP, as in fuzz_ring.c
 *   u8  sel_rkey   &7: 0,7 read/write/atomic MR, 1 one in device memory,
 *                  2 remote-read-only, 3 a receive buffer's (local only),
 *                  4 a deregistered MR's key, 5 raw, 6 an MR of another PD
 *   u8  sel_addr   &3: 0 MR start + (int16)addr, 1 addr itself,
 *                  2 MR start + addr % 4096, 3 MR start + (int32)addr
 *   u32 raw_ctx, raw_src, raw_dst, raw_rkey
 *   u32 resp_idx, resp_stamp
 *   u64 addr, length, operand, swap
 *
 * Each request is followed by a harmless one that the thread drops (its
 * requester does not exist); once the thread has taken that one, it has
 * finished the forged one (it handles requests in ring order).  Then the
 * answer, if it landed in a response slot of ours, is checked: a request
 * the victim should refuse must not succeed.
 */
#include "fuzz_common.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FZ_MAX_REQS 8
#define FZ_WAIT_NS  (10ull * 1000000000ull) /* a stuck thread is a finding */

typedef struct fz_mr_pick {
    hca_mr_t *mr;     /* NULL: raw or stale key */
    uint32_t  rkey;
    uint64_t  base;   /* for addresses relative to the MR */
} fz_mr_pick_t;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fz_world_init();
    return 0;
}

static fz_mr_pick_t fz_pick_mr(const fz_world_t *w, uint8_t sel, uint32_t raw)
{
    fz_mr_pick_t p = {.mr = w->mr_rw};

    switch (sel & 7) {
    case 1:
        p.mr = w->mr_dm;
        break;
    case 2:
        p.mr = w->mr_ro;
        break;
    case 3:
        p.mr = w->rmr[0];
        break;
    case 4:
        p.mr   = NULL;
        p.rkey = w->stale_key;
        break;
    case 5:
        p.mr   = NULL;
        p.rkey = raw;
        break;
    case 6:
        p.mr = w->mr_pd2;
        break;
    default:
        break;
    }
    if (p.mr != NULL) {
        p.rkey = hca_mr_rkey(p.mr);
        p.base = (uint64_t)(uintptr_t)p.mr->addr;
    } else {
        p.base = (uint64_t)(uintptr_t)w->mem_rw;
    }
    return p;
}

static uint64_t fz_pick_addr(const fz_mr_pick_t *p, uint8_t sel, uint64_t val)
{
    switch (sel & 3) {
    case 0:
        return p->base + (int64_t)(int16_t)val;
    case 1:
        return val;
    case 2:
        return p->base + (val % FZ_MR_LEN);
    default:
        return p->base + (int64_t)(int32_t)val;
    }
}

/* The QP of ours a (pid, ctx, qpn) names, or NULL. */
static hca_qp_t *fz_our_qp(const fz_world_t *w, const hca_svc_req_t *req)
{
    if (req->src_pid != w->vaddr.pid) {
        return NULL;
    }
    for (int i = 0; i < FZ_NUM_QP; ++i) {
        if ((req->src_ctx == w->vaddr.ctx_id) &&
            (req->src_qpn == hca_qp_num(w->vqp[i]))) {
            return w->vqp[i];
        }
        if ((req->src_ctx == w->saddr.ctx_id) &&
            (req->src_qpn == hca_qp_num(w->sqp[i]))) {
            return w->sqp[i];
        }
    }
    return NULL;
}

/* Its response slot for req, or NULL (then nobody can be answered). */
static hca_resp_slot_t *fz_resp_slot(const fz_world_t *w,
                                     const hca_svc_req_t *req)
{
    hca_qp_t *qp = fz_our_qp(w, req);

    if (qp == NULL) {
        return NULL;
    }
    if (req->resp_idx >= ((hca_qobj_hdr_t*)qp->qobj.addr)->sq_depth) {
        return NULL;
    }
    return &qp->resp[req->resp_idx];
}

/* What the responder may execute, from the request, the QPs and the MRs
 * as this harness set them up (independent of the library's checks). */
static int fz_svc_allowed(const fz_world_t *w, const hca_svc_req_t *req)
{
    const struct {
        hca_mr_t *mr;
        unsigned  access;
    } mrs[] = {
        {w->mr_rw, HCA_ACCESS_REMOTE_WRITE | HCA_ACCESS_REMOTE_READ |
                   HCA_ACCESS_REMOTE_ATOMIC},
        {w->mr_dm, HCA_ACCESS_REMOTE_WRITE | HCA_ACCESS_REMOTE_READ |
                   HCA_ACCESS_REMOTE_ATOMIC},
        {w->mr_ro, HCA_ACCESS_REMOTE_READ},
    };
    const hca_opcode_info_t *info;
    unsigned qp_access, align = 1;
    uint64_t len;
    int t = -1;

    if (req->opcode >= HCA_WR_OPCODE_LAST) {
        return 0;
    }
    info = &hca_opcode[req->opcode];
    for (int i = 0; i < FZ_NUM_QP; ++i) {
        if (req->dst_qpn == hca_qp_num(w->vqp[i])) {
            t = i;
        }
    }
    /* only the connected peer may use a QP, any source an any-source
     * target */
    if ((t < 0) ||
        ((t != FZ_QP_ANY) &&
         ((req->src_pid != w->saddr.pid) ||
          (req->src_ctx != w->saddr.ctx_id) ||
          (req->src_qpn != hca_qp_num(w->sqp[t]))))) {
        return 0;
    }
    if (info->flags & HCA_OPF_ATOMIC) {
        if ((req->size != 4) && (req->size != 8)) {
            return 0;
        }
        len   = req->size;
        align = req->size;
    } else if ((req->opcode == HCA_WR_RDMA_WRITE) ||
               (req->opcode == HCA_WR_RDMA_WRITE_WITH_IMM) ||
               (req->opcode == HCA_WR_RDMA_READ)) {
        if (req->length > HCA_BOUNCE_SIZE) {
            return 0;
        }
        len = req->length;
    } else {
        return 0;
    }
    qp_access = fz_victim_access(t);
    if ((qp_access & info->rem_access) != info->rem_access) {
        return 0;
    }
    for (size_t i = 0; i < sizeof(mrs) / sizeof(mrs[0]); ++i) {
        uint64_t base = (uint64_t)(uintptr_t)mrs[i].mr->addr;
        if ((req->rkey == hca_mr_rkey(mrs[i].mr)) &&
            ((mrs[i].access & info->rem_access) == info->rem_access) &&
            (req->remote_addr >= base) &&
            (req->remote_addr - base <= FZ_MR_LEN) &&
            (len <= FZ_MR_LEN - (req->remote_addr - base)) &&
            (req->remote_addr % align == 0)) {
            return 1;
        }
    }
    return 0;
}

/* Writes req into the next slot of the victim's service ring as a peer
 * does; returns its index. */
static uint64_t fz_svc_post(fz_world_t *w, const hca_svc_req_t *req)
{
    hca_ring_t *ring = &w->vpeer->svc;
    uint64_t idx;
    uint8_t *slot;
    int wake = 0;

    if (hca_ring_claim(ring, &idx, &wake) != 0) {
        /* we wait for every request we post: the ring cannot fill */
        fz_fail("service ring full: head %llu tail %llu",
                (unsigned long long)atomic_load(&ring->hdr->head),
                (unsigned long long)atomic_load(&ring->hdr->tail));
    }
    slot = hca_ring_slot(ring, idx);
    memcpy(slot + sizeof(req->stamp), (const uint8_t*)req + sizeof(req->stamp),
           sizeof(*req) - sizeof(req->stamp));
    hca_ring_publish(ring, idx);
    if (wake) {
        fz_wake_svc(w);
    }
    return idx;
}

static uint64_t fz_now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void fz_svc_wait(fz_world_t *w, uint64_t idx, const hca_svc_req_t *req)
{
    hca_ring_hdr_t *hdr = w->vpeer->svc.hdr;
    uint64_t start      = fz_now_ns();

    while (atomic_load(&hdr->tail) <= idx) {
        if (fz_now_ns() - start > FZ_WAIT_NS) {
            fz_fail("service thread stuck: tail %llu, waiting for %llu; "
                    "last forged request opcode %u size %u rkey 0x%x "
                    "addr 0x%llx length %llu",
                    (unsigned long long)atomic_load(&hdr->tail),
                    (unsigned long long)idx, req->opcode, req->size,
                    req->rkey, (unsigned long long)req->remote_addr,
                    (unsigned long long)req->length);
        }
        sched_yield();
    }
}

static void fz_request(fz_world_t *w, fz_in_t *in)
{
    hca_svc_req_t req, fence;
    uint8_t sel_pid, sel_ctx, sel_tgt, sel_src, sel_dst, sel_rkey, sel_addr;
    uint32_t raw_ctx, raw_src, raw_dst, raw_rkey;
    hca_resp_slot_t *slot;
    fz_mr_pick_t mr;
    uint64_t idx;
    int tgt;

    memset(&req, 0, sizeof(req));
    req.opcode      = fz_u8(in);
    req.size        = fz_u8(in);
    sel_pid         = fz_u8(in);
    sel_ctx         = fz_u8(in);
    sel_tgt         = fz_u8(in) & 3;
    sel_src         = fz_u8(in);
    sel_dst         = fz_u8(in);
    sel_rkey        = fz_u8(in);
    sel_addr        = fz_u8(in);
    raw_ctx         = fz_u32(in);
    raw_src         = fz_u32(in);
    raw_dst         = fz_u32(in);
    raw_rkey        = fz_u32(in);
    req.resp_idx    = fz_u32(in);
    req.resp_stamp  = fz_u32(in);
    mr              = fz_pick_mr(w, sel_rkey, raw_rkey);
    req.remote_addr = fz_pick_addr(&mr, sel_addr, fz_u64(in));
    req.length      = fz_u64(in);
    req.operand     = fz_u64(in);
    req.swap        = fz_u64(in);
    req.src_pid     = fz_pick_pid(w, sel_pid);
    req.src_ctx     = fz_pick_ctx(w, sel_ctx, raw_ctx);
    tgt             = (sel_tgt < FZ_NUM_QP) ? sel_tgt : FZ_QP_RQ;
    req.src_qpn     = fz_pick_src_qpn(w, tgt, sel_src, raw_src);
    req.dst_qpn     = fz_pick_dst_qpn(w, tgt, sel_dst, raw_dst);
    req.rkey        = mr.rkey;

    if (fz_verbose()) {
        fprintf(stderr, "svc: opcode %u size %u src %u/%u/0x%x dst 0x%x "
                "rkey 0x%x addr 0x%llx length %llu resp %u/%u\n",
                req.opcode, req.size, req.src_pid, req.src_ctx, req.src_qpn,
                req.dst_qpn, req.rkey, (unsigned long long)req.remote_addr,
                (unsigned long long)req.length, req.resp_idx,
                req.resp_stamp);
    }
    /* an answer is recognised by its stamp: start from another one */
    slot = fz_resp_slot(w, &req);
    if (slot != NULL) {
        atomic_store(&slot->stamp, ~req.resp_stamp);
    }

    memset(&fence, 0, sizeof(fence));
    fence.src_pid = w->dead_pid;
    fz_svc_post(w, &req);
    idx = fz_svc_post(w, &fence);
    fz_svc_wait(w, idx, &req);

    if (fz_verbose()) {
        if ((slot != NULL) && (atomic_load(&slot->stamp) == req.resp_stamp)) {
            fprintf(stderr, "  answer %s value 0x%llx\n",
                    hca_wc_status_str(slot->status),
                    (unsigned long long)slot->value);
        } else {
            fprintf(stderr, "  no answer in a slot of ours\n");
        }
    }
    if ((slot != NULL) &&
        (atomic_load(&slot->stamp) == req.resp_stamp) &&
        (slot->status == HCA_WC_SUCCESS) && !fz_svc_allowed(w, &req)) {
        fz_fail("service executed a request it must refuse: opcode %u "
                "size %u src %u/%u/0x%x dst 0x%x rkey 0x%x addr 0x%llx "
                "length %llu", req.opcode, req.size, req.src_pid,
                req.src_ctx, req.src_qpn, req.dst_qpn, req.rkey,
                (unsigned long long)req.remote_addr,
                (unsigned long long)req.length);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_world_t *w = fz_world_get();
    fz_in_t in    = {.p = data, .n = size};

    for (int i = 0; (i < FZ_MAX_REQS) && (in.n > 0); ++i) {
        fz_request(w, &in);
    }
    return 0;
}
