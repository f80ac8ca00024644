#!/usr/bin/env python3
"""Writes the seed corpus of the harnesses (test/fuzz/corpus/<harness>/):
small valid inputs in the formats documented at the top of fuzz_ring.c,
fuzz_svc.c and fuzz_tcp.c, from which libFuzzer mutates.  Run it after changing a format;
the files are deterministic."""

import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))

# hca_wire.h
SEND, SEND_PULL, WRITE_IMM, NOP = 1, 2, 3, 4
FIRST, LAST, WITH_IMM = 1, 2, 4
NEAR, ALIGNED = 40, 64
# fuzz_ring.c
CTL_INPLACE, CTL_ANY, CTL_POLL, CTL_RNR = 1, 2, 4, 8
PID_SELF, PID_CHILD = 0, 1
# hca_dev.h
WR_RDMA_WRITE, WR_RDMA_READ, WR_FETCH_ADD, WR_CMP_SWP = 2, 4, 5, 6
# fuzz_svc.c
MR_RW, MR_DM = 0, 1
ADDR_MOD = 2


def msg(op, flags=0, length=0, msg_len=0, data_off=NEAR, num_iov=0, ctl=0,
        pid=PID_SELF, imm=0, payload=b"", pull=None):
    """One ring record; the source and destination selectors are 0 (the
    connected sender QP, the target QP)."""
    rec = struct.pack("<9B3I3I", ctl, op, flags, num_iov, data_off,
                      pid, 0, 0, 0, 0, 0, 0, imm, length, msg_len)
    if pull is None:
        return rec + struct.pack("<BH", 0, len(payload)) + payload
    resp_idx, resp_stamp, iovs = pull
    rec += struct.pack("<BIIB", 1, resp_idx, resp_stamp, len(iovs))
    for sel, val, ln in iovs:
        rec += struct.pack("<BQQ", sel, val, ln)
    return rec


def req(opcode, size=0, rkey_sel=MR_RW, addr_sel=ADDR_MOD, addr=0,
        length=0, operand=0, swap=0, resp_idx=0, resp_stamp=1):
    """One service record from the connected sender QP to the victim's
    own-RQ QP."""
    return struct.pack("<9B4I2I4Q", opcode, size, 0, 0, 0, 0, 0, rkey_sel,
                       addr_sel, 0, 0, 0, 0, resp_idx, resp_stamp, addr,
                       length, operand, swap)


RING = {
    "send": msg(SEND, FIRST | LAST, 16, 16, payload=bytes(range(16))),
    "send_imm_inplace": msg(SEND, FIRST | LAST | WITH_IMM, 8, 8,
                            ctl=CTL_INPLACE, imm=0x1234,
                            payload=b"inplace!"),
    "send_aligned": msg(SEND, FIRST | LAST, 1024, 1024, data_off=ALIGNED,
                        payload=bytes(1024)),
    "fragments": msg(SEND, FIRST, 8192, 9000, data_off=ALIGNED,
                     payload=b"\x11" * 64) +
                 msg(SEND, LAST, 808, 9000, data_off=ALIGNED,
                     payload=b"\x22" * 64),
    "send_pull_self": msg(SEND_PULL, 0, 24, 1024, num_iov=1,
                          pull=(0, 1, [(0, 0, 1024)])),
    "send_pull_child": msg(SEND_PULL, 0, 40, 3000, num_iov=2,
                           pid=PID_CHILD, ctl=CTL_ANY,
                           pull=(1, 7, [(0, 0, 1000), (0, 4096, 2000)])),
    "write_imm": msg(WRITE_IMM, WITH_IMM, 0, 4096, imm=0xabcd),
    "nop": msg(NOP) + msg(SEND, FIRST | LAST, 4, 4, ctl=CTL_POLL,
                          payload=b"abcd"),
    "rnr": msg(SEND, FIRST | LAST, 4, 4, ctl=CTL_POLL | CTL_RNR,
               payload=b"wait") + msg(SEND, FIRST | LAST, 4, 4,
                                      ctl=CTL_POLL, payload=b"next"),
}

SVC = {
    "fetch_add": req(WR_FETCH_ADD, 8, addr=8, operand=1),
    "cmp_swp32": req(WR_CMP_SWP, 4, rkey_sel=MR_DM, addr=12, operand=0,
                     swap=5),
    "read": req(WR_RDMA_READ, addr=0, length=256),
    "write_dm": req(WR_RDMA_WRITE, rkey_sel=MR_DM, addr=512, length=1024),
}

# hca_tcp_wire.h
T_SEND, T_WRITE, T_READ, T_ATOMIC, T_ACK, T_READ_RESP, T_KEEPALIVE, T_BYE = \
    range(1, 9)
T_FIRST, T_LAST, T_IMM, T_ATOMIC32, T_START = 1, 2, 4, 8, 16
SYN_PSN_SEQ = 0x80
# fuzz_tcp.c: mode bits, selectors
M_SHAPED, M_HELLO, M_HELLO_FIX = 1, 2, 4
S_DST_REQ, S_SRC_PEER, S_RAW_RKEY, S_FIX_RANGE = 2, 8, 0x10, 0x40
H_RAW_MAC, H_RAW_PROOF, H_CLAIM_PEER = 1, 2, 4  # fuzz_tcp.c: hello sel
S2_SEG, S2_ALIGN = 1, 2
A_FETCH_ADD, A_CMP_SWP = 1, 0        # indexes into fuzz_tcp.c's atomics[]
MR_START = 32                        # shaped address: MR + this - 32


def hdr(opcode, flags=0, length=0, src=0, dst=0, rkey=0, addr=0,
        resp_idx=0, resp_stamp=0, offset=0, total=0, imm=0, atomic_op=0,
        operand=0, swap=0, syndrome=0, version=3, psn=0):
    """A hca_tcp_hdr_t (72 bytes)."""
    return struct.pack("<4B5IQ5IB3xQQ", version, opcode, flags, syndrome,
                       length, src, dst, psn, rkey, addr, resp_idx,
                       resp_stamp, offset, total, imm, atomic_op, operand,
                       swap)


def frame(opcode, sel=0, sel2=0, payload=b"", **kw):
    """A shaped frame: fuzz_tcp.c maps the opcode byte to 1 + op % 8."""
    kw.setdefault("length", len(payload))
    return struct.pack("<BB", sel, sel2) + hdr(opcode - 1, **kw) + payload


def hello(sel=0, mac=0, proof=0):
    """An input HELLO (magic, version, step, destination fixed by
    M_HELLO_FIX), its sel, and the PROOF's raw MAC and identity proof."""
    return struct.pack("<IHBBQIIQIIQQQ", 0, 0, 0, 0, 0xf022, 1, 2, 0, 0, 0,
                       0x1111, 0, 0) + struct.pack("<BQQ", sel, mac, proof)


TCP = {
    "write": bytes([M_SHAPED]) +
             frame(T_WRITE, flags=T_LAST | T_START, addr=MR_START, total=64,
                   payload=bytes(range(64))),
    "write_parts": bytes([M_SHAPED]) +
                   frame(T_WRITE, flags=T_START, addr=MR_START, total=128,
                         payload=b"\x01" * 64) +
                   frame(T_WRITE, flags=T_LAST, addr=MR_START + 64, psn=1,
                         offset=64, total=128, payload=b"\x02" * 64),
    "write_imm": bytes([M_SHAPED]) +
                 frame(T_WRITE, flags=T_LAST | T_IMM | T_START,
                       addr=MR_START + 512,
                       total=16, imm=0x1234, payload=b"i" * 16),
    "write_bad_rkey": bytes([M_SHAPED]) +
                      frame(T_WRITE, sel=S_RAW_RKEY, flags=T_LAST | T_START,
                            rkey=0xdead, addr=MR_START, total=8,
                            payload=b"nak!nak!") +
                      frame(T_WRITE, flags=T_LAST, addr=MR_START, total=8,
                            psn=1, payload=b"dropped!"),
    "read": bytes([M_SHAPED]) + frame(T_READ, flags=T_START, addr=MR_START,
                                      total=256),
    "fetch_add": bytes([M_SHAPED]) +
                 frame(T_ATOMIC, sel2=S2_ALIGN, flags=T_START,
                       addr=MR_START + 8, atomic_op=A_FETCH_ADD, operand=1),
    "cmp_swp32": bytes([M_SHAPED]) +
                 frame(T_ATOMIC, sel2=S2_ALIGN, flags=T_ATOMIC32 | T_START,
                       addr=MR_START + 16, atomic_op=A_CMP_SWP, operand=0,
                       swap=5),
    "send": bytes([M_SHAPED]) +
            frame(T_SEND, flags=T_FIRST | T_LAST | T_START, total=100,
                  payload=b"s" * 100),
    "send_frags": bytes([M_SHAPED]) +
                  frame(T_SEND, flags=T_FIRST | T_START, total=9000,
                        payload=b"\x11" * 8000) +
                  frame(T_SEND, flags=T_LAST | T_IMM, offset=8000, psn=1,
                        total=9000, imm=7, payload=b"\x22" * 1000),
    "ack": bytes([M_SHAPED]) +
           frame(T_ACK, sel=S_DST_REQ, resp_idx=0, resp_stamp=1) +
           frame(T_KEEPALIVE),
    "read_resp": bytes([M_SHAPED]) +
                 frame(T_READ_RESP, sel=S_DST_REQ, flags=T_LAST, total=32,
                       resp_stamp=1, payload=b"r" * 32),
    "write_seg_max": bytes([M_SHAPED]) +
                     frame(T_WRITE, sel=S_FIX_RANGE, sel2=S2_SEG,
                           flags=T_LAST, addr=MR_START, length=65536),
    "raw_bad_opcode": bytes([0]) + hdr(99, length=0),
    "raw_keepalive": bytes([0]) + hdr(T_KEEPALIVE) + hdr(T_KEEPALIVE),
    "hello_bad_secret": bytes([M_HELLO | M_HELLO_FIX]) +
                        hello(sel=H_RAW_MAC, mac=0x1234),
    # the identity check: a WRITE to the RTS QP from its peer's QPN over a
    # connection that claims to be that peer, proven and not
    "hello_peer_proven": bytes([M_HELLO | M_HELLO_FIX | M_SHAPED]) +
                         hello(sel=H_CLAIM_PEER) +
                         frame(T_WRITE, sel=S_DST_REQ | S_SRC_PEER,
                               flags=T_LAST | T_START, addr=MR_START,
                               total=4, payload=b"id!!"),
    "hello_peer_unproven": bytes([M_HELLO | M_HELLO_FIX | M_SHAPED]) +
                           hello(sel=H_CLAIM_PEER | H_RAW_PROOF,
                                 proof=0x5eed) +
                           frame(T_WRITE, sel=S_DST_REQ | S_SRC_PEER,
                                 flags=T_LAST | T_START, addr=MR_START,
                                 total=4, payload=b"no!!"),
    "hello_then_write": bytes([M_HELLO | M_HELLO_FIX | M_SHAPED]) +
                        hello() +
                        frame(T_WRITE, flags=T_LAST | T_START, addr=MR_START,
                              total=4, payload=b"ok!!"),
    # sequence numbers (docs/TCP-WIRE.md "Sequence, duplicates, replay"):
    # a duplicate WRITE (acknowledged, not placed again), a frame ahead of
    # a gap (one PSN_SEQ NAK), an atomic sent again (its saved value), a
    # READ again, a frame with no F_START for an unknown requester QP, an
    # answer for what was never sent, and a go-back NAK to our RTS QP
    "dup_write": bytes([M_SHAPED]) +
                 frame(T_WRITE, flags=T_LAST | T_START, addr=MR_START,
                       total=8, psn=5, payload=b"first!!!") +
                 frame(T_WRITE, flags=T_LAST, addr=MR_START, total=8,
                       psn=5, payload=b"second!!"),
    "psn_ahead": bytes([M_SHAPED]) +
                 frame(T_WRITE, flags=T_LAST | T_START, addr=MR_START,
                       total=4, psn=10, payload=b"psn0") +
                 frame(T_WRITE, flags=T_LAST, addr=MR_START, total=4,
                       psn=12, payload=b"gap!") +
                 frame(T_WRITE, flags=T_LAST, addr=MR_START, total=4,
                       psn=13, payload=b"gap2") +
                 frame(T_WRITE, flags=T_LAST, addr=MR_START, total=4,
                       psn=11, payload=b"psn1"),
    "atomic_replay": bytes([M_SHAPED]) +
                     frame(T_ATOMIC, sel2=S2_ALIGN, flags=T_START, psn=3,
                           addr=MR_START + 8, atomic_op=A_FETCH_ADD,
                           operand=1) +
                     frame(T_ATOMIC, sel2=S2_ALIGN, psn=3,
                           addr=MR_START + 8, atomic_op=A_FETCH_ADD,
                           operand=1) +
                     frame(T_ATOMIC, sel2=S2_ALIGN, psn=4,
                           addr=MR_START + 8, atomic_op=A_FETCH_ADD,
                           operand=1),
    "read_again": bytes([M_SHAPED]) +
                  frame(T_READ, flags=T_START, psn=7, addr=MR_START,
                        total=64) +
                  frame(T_READ, psn=7, addr=MR_START, total=64),
    "no_start": bytes([M_SHAPED]) +
                frame(T_WRITE, flags=T_LAST, addr=MR_START, total=4, psn=9,
                      payload=b"lost"),
    "ack_unsent": bytes([M_SHAPED]) +
                  frame(T_ACK, sel=S_DST_REQ, psn=0x1234, resp_idx=0,
                        resp_stamp=1) +
                  frame(T_ACK, sel=S_DST_REQ, syndrome=SYN_PSN_SEQ,
                        psn=0x4321),
}


def write(harness, seeds):
    d = os.path.join(HERE, "corpus", harness)
    os.makedirs(d, exist_ok=True)
    for name, data in seeds.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)


write("fuzz_ring", RING)
write("fuzz_svc", SVC)
write("fuzz_tcp", TCP)
