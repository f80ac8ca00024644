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
TCP_VERSION = 5
T_SEND, T_WRITE, T_READ, T_ATOMIC, T_ACK, T_READ_RESP, T_KEEPALIVE, T_BYE = \
    range(1, 9)
T_FIRST, T_LAST, T_IMM, T_ATOMIC32, T_START = 1, 2, 4, 8, 16
SYN_PSN_SEQ = 0x80
HCA_TCP_MAGIC = 0x50544348
STEP_HELLO = 1
CONT_RESUME = 1
# fuzz_tcp.c: mode bits, selectors
M_SHAPED, M_HELLO, M_HELLO_FIX, M_TWICE, M_KEEP, M_THRICE, M_INTERLEAVE = \
    1, 2, 4, 8, 16, 32, 64
S_DST_REQ, S_SRC_PEER, S_RAW_RKEY, S_FIX_RANGE = 2, 8, 0x10, 0x40
# fuzz_tcp.c: a HELLO section's sel
H_RAW_MAC, H_RAW_PROOF, H_CLAIM_PEER, H_RAW_KX, H_CLAIM_PREV = \
    1, 2, 4, 8, 0x80
C_RESUME_RAW, C_JOIN_RAW, C_RESUME, C_JOIN, C_BAD, C_RESUME_OLD, C_JOIN_OLD = \
    range(1, 8)                      # a HELLO section's sel >> 4
S2_SEG, S2_ALIGN = 1, 2
A_FETCH_ADD, A_CMP_SWP = 1, 0        # indexes into fuzz_tcp.c's atomics[]
MR_START = 32                        # shaped address: MR + this - 32
INCARN = 0x1ca7a7105eed              # a claimed incarnation: resumable

# X25519 public keys: the base point (a valid key the harness has no secret
# of), and low-order points (libsodium's blacklist): 0 (order 4 with 1),
# 1, and one of order 8
KX_BASE = bytes([9]) + bytes(31)
KX_ZERO = bytes(32)
KX_ONE = bytes([1]) + bytes(31)
KX_ORDER8 = bytes([0xe0, 0xeb, 0x7a, 0x7c, 0x3b, 0x41, 0xb8, 0xae, 0x16,
                   0x56, 0xe3, 0xfa, 0xf1, 0x9f, 0xc4, 0x6a, 0xda, 0x09,
                   0x8d, 0xeb, 0x9c, 0x32, 0xb1, 0xfd, 0x86, 0x62, 0x05,
                   0x16, 0x5f, 0x49, 0xb8, 0x00])


def hdr(opcode, flags=0, length=0, src=0, dst=0, rkey=0, addr=0,
        resp_idx=0, resp_stamp=0, offset=0, total=0, imm=0, atomic_op=0,
        operand=0, swap=0, syndrome=0, version=TCP_VERSION, psn=0):
    """A hca_tcp_hdr_t (72 bytes)."""
    return struct.pack("<4B5IQ5IB3xQQ", version, opcode, flags, syndrome,
                       length, src, dst, psn, rkey, addr, resp_idx,
                       resp_stamp, offset, total, imm, atomic_op, operand,
                       swap)


def frame(opcode, sel=0, sel2=0, payload=b"", **kw):
    """A shaped frame: fuzz_tcp.c maps the opcode byte to 1 + op % 8."""
    kw.setdefault("length", len(payload))
    return struct.pack("<BB", sel, sel2) + hdr(opcode - 1, **kw) + payload


def mac16(text):
    """16 bytes of a raw MAC (never the right one)."""
    return text.ljust(16, b"\0")[:16]


def hello(sel=0, cont=0, incarn=0, kx=KX_ZERO, mac=b"", proof=b"",
          cont_mac=b"", src=(0xf022, 1, 2), magic=0, version=0, step=0,
          hello_cont=0, reserved=bytes(7)):
    """A HELLO section: the 144-byte hca_tcp_hello_t (magic, version, step
    and destination as given: 0, for M_HELLO_FIX to fix), its sel (with
    `cont` in bits 4-6), then the PROOF's raw mac, proof and cont_mac."""
    h = struct.pack("<IHBBQIIQIIQQB7s32s16s16s16s", magic, version, step, 0,
                    src[0], src[1], src[2], 0, 0, 0, 0x1111, incarn,
                    hello_cont, reserved, kx, bytes(16), bytes(16),
                    bytes(16))
    assert len(h) == 144
    return h + struct.pack("<B", sel | (cont << 4)) + mac16(mac) + \
        mac16(proof) + mac16(cont_mac)


FIXED = bytes([M_HELLO | M_HELLO_FIX | M_SHAPED])
TWICE = bytes([M_HELLO | M_HELLO_FIX | M_TWICE | M_SHAPED])
KEEP = bytes([M_HELLO | M_HELLO_FIX | M_TWICE | M_KEEP | M_SHAPED])
THRICE = bytes([M_HELLO | M_HELLO_FIX | M_TWICE | M_THRICE | M_SHAPED])
EARLY = bytes([M_HELLO | M_HELLO_FIX | M_TWICE | M_INTERLEAVE | M_SHAPED])
WRITE = frame(T_WRITE, flags=T_LAST | T_START, addr=MR_START, total=4,
              payload=b"ok!!")
# a WRITE to the RTS QP from its peer's QPN: served only over a connection
# that proves it is that peer
PEER_WRITE = frame(T_WRITE, sel=S_DST_REQ | S_SRC_PEER,
                   flags=T_LAST | T_START, addr=MR_START, total=4,
                   payload=b"id!!")

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
                        hello(sel=H_RAW_MAC, mac=b"\x34\x12"),
    # the identity check: a WRITE to the RTS QP from its peer's QPN over a
    # connection that claims to be that peer, proven and not
    "hello_peer_proven": FIXED + hello(sel=H_CLAIM_PEER) + PEER_WRITE,
    "hello_peer_unproven": FIXED + hello(sel=H_CLAIM_PEER | H_RAW_PROOF,
                                         proof=b"\xed\x5e") + PEER_WRITE,
    "hello_then_write": FIXED + hello() + WRITE,
    # the key exchange: a HELLO's own key, valid (the base point: the
    # harness has no session key) or low-order (BAD_KEY)
    "hello_kx_base": FIXED + hello(sel=H_RAW_KX, kx=KX_BASE) + WRITE,
    "hello_kx_zero": FIXED + hello(sel=H_RAW_KX, kx=KX_ZERO),
    "hello_kx_one": FIXED + hello(sel=H_RAW_KX, kx=KX_ONE),
    "hello_kx_order8": FIXED + hello(sel=H_RAW_KX, kx=KX_ORDER8),
    # hello_check: a HELLO with a cont, or reserved bytes (BAD_VERSION);
    # a PROOF with a cont that does not exist
    "hello_cont": bytes([M_HELLO]) +
                  hello(magic=HCA_TCP_MAGIC, version=TCP_VERSION,
                        step=STEP_HELLO, hello_cont=CONT_RESUME),
    "hello_reserved": bytes([M_HELLO]) +
                      hello(magic=HCA_TCP_MAGIC, version=TCP_VERSION,
                            step=STEP_HELLO, reserved=b"\x01" + bytes(6)),
    "proof_bad_cont": FIXED + hello(cont=C_BAD, incarn=INCARN),
    # continuations that prove nothing: a RESUME is refused (NO_CONTEXT), a
    # JOIN gets records of its own
    "resume_raw": FIXED + hello(cont=C_RESUME_RAW, incarn=INCARN,
                                cont_mac=b"resume?"),
    "join_raw": FIXED + hello(cont=C_JOIN_RAW, incarn=INCARN,
                              cont_mac=b"join?") + WRITE,
    # two connections in one input: the first closed, the second continues
    # its session with its key (RESUME: the same connection object goes on,
    # its VERDICT proves the key back; JOIN: its records shared)
    "resume": TWICE + hello(incarn=INCARN) +
              hello(sel=H_CLAIM_PREV, cont=C_RESUME) + WRITE,
    "resume_bad_secret": TWICE + hello(incarn=INCARN) +
                         hello(sel=H_CLAIM_PREV | H_RAW_MAC, cont=C_RESUME,
                               mac=b"nope"),
    "resume_incarn0": TWICE + hello() +
                      hello(sel=H_CLAIM_PREV, cont=C_RESUME),
    "resume_other_claim": TWICE + hello(incarn=INCARN) +
                          hello(cont=C_RESUME, incarn=INCARN,
                                src=(0xf023, 1, 2)),
    "resume_peer_proven": TWICE + hello(sel=H_CLAIM_PEER, incarn=INCARN) +
                          hello(sel=H_CLAIM_PREV, cont=C_RESUME) +
                          PEER_WRITE,
    "resume_peer_bad_proof": TWICE +
                             hello(sel=H_CLAIM_PEER, incarn=INCARN) +
                             hello(sel=H_CLAIM_PREV | H_RAW_PROOF,
                                   cont=C_RESUME, proof=b"stolen") +
                             PEER_WRITE,
    # the first connection still open (UP at the victim, which has not
    # seen its socket die): a RESUME takes its session onto the new socket
    "resume_up": KEEP + hello(incarn=INCARN) +
                 hello(sel=H_CLAIM_PREV, cont=C_RESUME) + WRITE,
    "resume_up_incarn0": KEEP + hello() +
                         hello(sel=H_CLAIM_PREV, cont=C_RESUME) + WRITE,
    "join_up": KEEP + hello(incarn=INCARN) +
               hello(sel=H_CLAIM_PREV, cont=C_JOIN) + WRITE,
    # three: a session resumed, then continued with the key before its last
    # (what a connector whose VERDICT was lost still has)
    "resume_old": THRICE + hello(incarn=INCARN) +
                  hello(sel=H_CLAIM_PREV, cont=C_RESUME) +
                  hello(sel=H_CLAIM_PREV, cont=C_RESUME_OLD) + WRITE,
    "join_old": THRICE + hello(incarn=INCARN) +
                hello(sel=H_CLAIM_PREV, cont=C_RESUME) +
                hello(sel=H_CLAIM_PREV, cont=C_JOIN_OLD) + WRITE,
    # two paths dialled at once: the first waits after its CHALLENGE while
    # the second's JOIN proves the first's key (records of its own until
    # the first comes UP: then the victim groups them), or a RESUME of it
    # (no session yet: NO_CONTEXT); then the first's PROOF (its section's
    # sel: a JOIN or RESUME now names the second), the frames on the first
    "join_early": EARLY + hello(incarn=INCARN) +
                  hello(sel=H_CLAIM_PREV, cont=C_JOIN) + WRITE,
    "join_early_back": EARLY + hello(incarn=INCARN, cont=C_JOIN) +
                       hello(sel=H_CLAIM_PREV, cont=C_JOIN) + WRITE,
    "resume_early": EARLY + hello(incarn=INCARN) +
                    hello(sel=H_CLAIM_PREV, cont=C_RESUME) + WRITE,
    "resume_early_back": EARLY + hello(incarn=INCARN, cont=C_RESUME) +
                         hello(sel=H_CLAIM_PREV) + WRITE,
    "join": TWICE + hello(incarn=INCARN) +
            hello(sel=H_CLAIM_PREV, cont=C_JOIN) + WRITE,
    "join_peer_proven": TWICE + hello(sel=H_CLAIM_PEER, incarn=INCARN) +
                        hello(sel=H_CLAIM_PREV, cont=C_JOIN) + PEER_WRITE,
    # the victim's own identity and incarnation (from the first
    # connection's CHALLENGE), proven: the session rule shares the records
    # of the victim's own connection to itself (both proven by its secret)
    "hello_victim_incarn": TWICE + hello() +
                           hello(sel=H_CLAIM_PEER | H_CLAIM_PREV) +
                           PEER_WRITE,
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
