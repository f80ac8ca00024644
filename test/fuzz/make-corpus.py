#!/usr/bin/env python3
"""Writes the seed corpus of the harnesses (test/fuzz/corpus/<harness>/):
small valid inputs in the formats documented at the top of fuzz_ring.c and
fuzz_svc.c, from which libFuzzer mutates.  Run it after changing a format;
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


def write(harness, seeds):
    d = os.path.join(HERE, "corpus", harness)
    os.makedirs(d, exist_ok=True)
    for name, data in seeds.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)


write("fuzz_ring", RING)
write("fuzz_svc", SVC)
