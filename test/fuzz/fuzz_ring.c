/*
 * fuzz_ring.c - libFuzzer harness: forged messages in the victim's
 * receive rings, consumed by the responder (hca_ingress_poll, run by
 * hca_cq_poll) and by hca_recv_peek for the in-place QP.
 *
 * Input: up to FZ_MAX_MSGS records, each (little-endian; a record cut
 * short by the end of the input reads zeros):
 *
 *   u8  ctl        bits 0-1: the victim QP whose ring gets it: 0,3 own RQ,
 *                  1 in-place QP, 2 any-source QP
 *                  bit 2: let the victim poll right after this message
 *                  bit 3: ... without posting receives first (RNR)
 *   u8  op, flags, num_iov, data_off       hca_msg_hdr_t fields, raw
 *   u8  sel_pid    &3: 0,3 this process, 1 a forked child (no context),
 *                  2 a pid that cannot exist
 *   u8  sel_ctx    &3: 0,3 the sender context, 1 the victim's own, 2 raw
 *   u8  sel_src    &7: 0,6,7 the sender QP of the target QP (its peer), 1
 *                  another sender QP, 2 the target QP itself, 3 another
 *                  victim QP, 4 raw, 5 the sender QP's index with another
 *                  generation
 *   u8  sel_dst    &7: 0,5-7 the target QP, 1 another victim QP (on
 *                  another ring), 2 the target's sender QP, 3 raw,
 *                  4 the target's index with another generation
 *   u32 raw_ctx, raw_src, raw_dst           used when a selector says raw
 *   u32 imm, length, msg_len                raw
 *   u8  kind       &1: 0 raw payload: u16 n, then n bytes
 *                      1 pull descriptor: u32 resp_idx, u32 resp_stamp,
 *                        u8 n (<= 16) iovs of {u8 sel, u64 val, u64 len};
 *                        address by sel&3: 0 fz_pull_src + (int16)val,
 *                        1 val itself, 2 the receive buffer + (int32)val,
 *                        3 fz_pull_src + (int32)val
 *
 * The payload is written at data_off in the slot (the header, written
 * after it, wins where they overlap; the stamp is only ever written by
 * hca_ring_publish).  Each input starts from restarted victim QPs and ends
 * with both rings drained (fz_drain), so inputs do not depend on each
 * other.
 */
#include "fuzz_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FZ_MAX_MSGS 16
#define FZ_MAX_IOV  16

enum {
    FZ_CTL_QP   = 3u,
    FZ_CTL_POLL = 1u << 2,
    FZ_CTL_RNR  = 1u << 3
};

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fz_world_init();
    return 0;
}

static uint64_t fz_iov_addr(const fz_world_t *w, uint8_t sel, uint64_t val)
{
    switch (sel & 3) {
    case 0:
        return (uint64_t)(uintptr_t)fz_pull_src + (int64_t)(int16_t)val;
    case 1:
        return val;
    case 2:
        return (uint64_t)(uintptr_t)w->rbuf[FZ_RECV_SGE - 1] +
               (int64_t)(int32_t)val;
    default:
        return (uint64_t)(uintptr_t)fz_pull_src + (int64_t)(int32_t)val;
    }
}

/* Builds the payload the record describes into buf; returns its size. */
static size_t fz_payload(const fz_world_t *w, fz_in_t *in, uint8_t *buf,
                         size_t cap)
{
    size_t len = 0;

    if ((fz_u8(in) & 1) == 0) {
        size_t n = fz_u16(in);
        n        = (n < in->n) ? n : in->n;
        n        = (n < cap) ? n : cap;
        memcpy(buf, in->p, n);
        in->p += n;
        in->n -= n;
        return n;
    }

    hca_pull_hdr_t pull;
    pull.resp_idx   = fz_u32(in);
    pull.resp_stamp = fz_u32(in);
    memcpy(buf, &pull, sizeof(pull));
    len = sizeof(pull);

    uint8_t n = fz_u8(in);
    for (uint8_t i = 0; (i < n) && (i < FZ_MAX_IOV) &&
                        (len + sizeof(hca_wire_iov_t) <= cap); ++i) {
        hca_wire_iov_t iov;
        uint8_t sel  = fz_u8(in);
        uint64_t val = fz_u64(in);
        iov.addr     = fz_iov_addr(w, sel, val);
        iov.length   = fz_u64(in);
        memcpy(buf + len, &iov, sizeof(iov));
        len += sizeof(iov);
    }
    return len;
}

/* 1 if the iovs of a SEND_PULL all lie in fz_pull_src (for the
 * "self-pull" mask: the receiver copies from them in its own process). */
static int fz_pull_sane(const hca_msg_hdr_t *hdr, const uint8_t *payload,
                        size_t plen)
{
    const uint64_t base = (uint64_t)(uintptr_t)fz_pull_src;

    for (uint32_t i = 0; i < hdr->num_iov; ++i) {
        size_t off = sizeof(hca_pull_hdr_t) + i * sizeof(hca_wire_iov_t);
        hca_wire_iov_t iov = {0, 0};
        if (off + sizeof(iov) <= plen) {
            memcpy(&iov, payload + off, sizeof(iov));
        }
        if ((iov.addr < base) || (iov.addr - base > FZ_PULL_SRC) ||
            (iov.length > FZ_PULL_SRC - (iov.addr - base))) {
            return 0;
        }
    }
    return 1;
}

/* Claims a slot of the victim's ring qp as the sender context (a peer)
 * does; a full ring is drained first (the victim consumes it). */
static uint64_t fz_claim(fz_world_t *w, int qp, int *wake_p)
{
    hca_ring_t *ring = &w->ring[qp]->ring;
    uint64_t idx;

    for (int tries = 0; hca_ring_claim(ring, &idx, wake_p) != 0; ++tries) {
        if (tries > 0) {
            fz_fail("ring of QP %d still full after a drain", qp);
        }
        fz_drain(w);
    }
    return idx;
}

/* One forged message: the slot is written as a peer would, then
 * published. */
static void fz_message(fz_world_t *w, fz_in_t *in)
{
    static uint8_t payload[HCA_RING_SLOT_SIZE];
    uint8_t ctl = fz_u8(in);
    int qp      = ((ctl & FZ_CTL_QP) < FZ_NUM_QP) ? (ctl & FZ_CTL_QP) :
                                                    FZ_QP_RQ;
    hca_msg_hdr_t hdr;
    uint8_t sel_pid, sel_ctx, sel_src, sel_dst;
    uint32_t raw_ctx, raw_src, raw_dst;
    size_t plen, off;
    uint64_t idx;
    uint8_t *slot;
    int wake = 0;

    memset(&hdr, 0, sizeof(hdr));
    hdr.op       = fz_u8(in);
    hdr.flags    = fz_u8(in);
    hdr.num_iov  = fz_u8(in);
    hdr.data_off = fz_u8(in);
    sel_pid      = fz_u8(in);
    sel_ctx      = fz_u8(in);
    sel_src      = fz_u8(in);
    sel_dst      = fz_u8(in);
    raw_ctx      = fz_u32(in);
    raw_src      = fz_u32(in);
    raw_dst      = fz_u32(in);
    hdr.imm      = fz_u32(in);
    hdr.length   = fz_u32(in);
    hdr.msg_len  = fz_u32(in);
    hdr.src_pid  = fz_pick_pid(w, sel_pid);
    hdr.src_ctx  = fz_pick_ctx(w, sel_ctx, raw_ctx);
    hdr.src_qpn  = fz_pick_src_qpn(w, qp, sel_src, raw_src);
    hdr.dst_qpn  = fz_pick_dst_qpn(w, qp, sel_dst, raw_dst);

    /* the payload may run to the end of the slot, from any data_off */
    plen = fz_payload(w, in, payload, sizeof(payload));
    if ((hdr.op == HCA_MSG_SEND_PULL) && (hdr.src_pid == w->vaddr.pid) &&
        !fz_pull_sane(&hdr, payload, plen) && fz_masked("self-pull")) {
        hdr.src_pid = w->dead_pid; /* the receiver would copy from them */
    }

    if (fz_verbose()) {
        fprintf(stderr, "ring %d: op %u flags 0x%x num_iov %u data_off %u "
                "src %u/%u/0x%x dst 0x%x imm 0x%x length %u msg_len %u "
                "payload %zu bytes, ctl 0x%x\n", qp, hdr.op, hdr.flags,
                hdr.num_iov, hdr.data_off, hdr.src_pid, hdr.src_ctx,
                hdr.src_qpn, hdr.dst_qpn, hdr.imm, hdr.length, hdr.msg_len,
                plen, ctl);
        for (size_t i = sizeof(hca_pull_hdr_t);
             (hdr.op == HCA_MSG_SEND_PULL) &&
             (i + sizeof(hca_wire_iov_t) <= plen);
             i += sizeof(hca_wire_iov_t)) {
            hca_wire_iov_t iov;
            memcpy(&iov, payload + i, sizeof(iov));
            fprintf(stderr, "    iov addr 0x%llx length %llu\n",
                    (unsigned long long)iov.addr,
                    (unsigned long long)iov.length);
        }
    }
    idx  = fz_claim(w, qp, &wake);
    slot = hca_ring_slot(&w->ring[qp]->ring, idx);
    /* the whole slot: nothing of an earlier input shows through */
    memset(slot + sizeof(hdr.stamp), 0,
           HCA_RING_SLOT_SIZE - sizeof(hdr.stamp));
    off = (hdr.data_off > sizeof(hdr.stamp)) ? hdr.data_off :
                                               sizeof(hdr.stamp);
    if ((off < HCA_RING_SLOT_SIZE) && (off - hdr.data_off < plen)) {
        size_t n = plen - (off - hdr.data_off);
        n        = (n < HCA_RING_SLOT_SIZE - off) ? n :
                                                    HCA_RING_SLOT_SIZE - off;
        memcpy(slot + off, payload + (off - hdr.data_off), n);
    }
    memcpy(slot + sizeof(hdr.stamp), (uint8_t*)&hdr + sizeof(hdr.stamp),
           sizeof(hdr) - sizeof(hdr.stamp));
    hca_ring_publish(&w->ring[qp]->ring, idx);
    /* no wake-up even if the claim asks for one: the victim's CQ is never
     * armed (this harness polls it), so nobody sleeps on this ring */
    (void)wake;

    if (ctl & FZ_CTL_POLL) {
        for (int i = 0; (i < FZ_NUM_QP) && !(ctl & FZ_CTL_RNR); ++i) {
            fz_recv_fill(w, i);
        }
        fz_victim_poll(w);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_world_t *w = fz_world_get();
    fz_in_t in    = {.p = data, .n = size};

    for (int qp = 0; qp < FZ_NUM_QP; ++qp) {
        fz_qp_restart(w, qp);
    }
    for (int i = 0; (i < FZ_MAX_MSGS) && (in.n > 0); ++i) {
        fz_message(w, &in);
    }
    fz_drain(w);
    return 0;
}
