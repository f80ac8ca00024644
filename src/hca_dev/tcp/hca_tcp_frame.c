/*
 * hca_tcp_frame.c - the checks of every frame header and hello that the
 * tcp fabric reads from the network, before any field is used.  Pure
 * functions of the bytes read (the fuzz harness calls them directly).
 */
#include "hca_obj.h"
#include "hca_tcp_wire.h"

#include <stddef.h>
#include <string.h>

_Static_assert(HCA_MAX_MSG <= UINT32_MAX, "total and offset are 32 bits");

const char *const hca_tcp_hdr_err_name[HCA_TCP_HDR_LAST] = {
    [HCA_TCP_HDR_OK]       = "ok",
    [HCA_TCP_HDR_VERSION]  = "bad version",
    [HCA_TCP_HDR_OPCODE]   = "bad opcode",
    [HCA_TCP_HDR_FLAGS]    = "bad flags",
    [HCA_TCP_HDR_LENGTH]   = "length over the limit",
    [HCA_TCP_HDR_RANGE]    = "offset, length and total disagree",
    [HCA_TCP_HDR_ATOMIC]   = "bad atomic",
    [HCA_TCP_HDR_SYNDROME] = "bad syndrome",
};

/* The flags each opcode may carry. */
static const uint8_t hca_tcp_op_flags[HCA_TCP_OP_LAST] = {
    [HCA_TCP_OP_SEND]      = HCA_TCP_F_FIRST | HCA_TCP_F_LAST | HCA_TCP_F_IMM |
                             HCA_TCP_F_START,
    [HCA_TCP_OP_WRITE]     = HCA_TCP_F_LAST | HCA_TCP_F_IMM | HCA_TCP_F_START |
                             HCA_TCP_F_STRIPED,
    [HCA_TCP_OP_READ]      = HCA_TCP_F_START | HCA_TCP_F_STRIPED,
    [HCA_TCP_OP_ATOMIC]    = HCA_TCP_F_ATOMIC32 | HCA_TCP_F_START,
    [HCA_TCP_OP_ACK]       = 0,
    [HCA_TCP_OP_READ_RESP] = HCA_TCP_F_LAST | HCA_TCP_F_STRIPED,
    [HCA_TCP_OP_KEEPALIVE] = 0,
    [HCA_TCP_OP_BYE]       = 0,
};

/* [offset, offset + length) lies in a total-byte message, total is a
 * message size we take, and LAST says whether it ends it. */
static int hca_tcp_part_ok(const hca_tcp_hdr_t *hdr)
{
    uint64_t end = (uint64_t)hdr->offset + hdr->length;

    return (hdr->total <= HCA_MAX_MSG) && (end <= hdr->total) &&
           (((hdr->flags & HCA_TCP_F_LAST) != 0) == (end == hdr->total));
}

static int hca_tcp_atomic_op(uint8_t op)
{
    switch (op) {
    case HCA_WR_ATOMIC_CMP_SWP:
    case HCA_WR_ATOMIC_FETCH_ADD:
    case HCA_WR_ATOMIC_ADD:
    case HCA_WR_ATOMIC_FETCH_AND:
    case HCA_WR_ATOMIC_AND:
    case HCA_WR_ATOMIC_FETCH_OR:
    case HCA_WR_ATOMIC_OR:
    case HCA_WR_ATOMIC_FETCH_XOR:
    case HCA_WR_ATOMIC_XOR:
    case HCA_WR_ATOMIC_SWAP:
        return 1;
    default:
        return 0;
    }
}

hca_tcp_hdr_err_t hca_tcp_hdr_check(const hca_tcp_hdr_t *hdr)
{
    if (hdr->version != HCA_TCP_VERSION) {
        return HCA_TCP_HDR_VERSION;
    }
    if ((hdr->opcode == 0) || (hdr->opcode >= HCA_TCP_OP_LAST)) {
        return HCA_TCP_HDR_OPCODE;
    }
    if (hdr->flags & ~hca_tcp_op_flags[hdr->opcode]) {
        return HCA_TCP_HDR_FLAGS;
    }
    if ((hdr->opcode != HCA_TCP_OP_ACK) && (hdr->syndrome != 0)) {
        return HCA_TCP_HDR_SYNDROME;
    }

    switch ((hca_tcp_op_t)hdr->opcode) {
    case HCA_TCP_OP_SEND:
        if (hdr->length > HCA_TCP_SEND_MAX) {
            return HCA_TCP_HDR_LENGTH;
        }
        if (!hca_tcp_part_ok(hdr) ||
            (((hdr->flags & HCA_TCP_F_FIRST) != 0) != (hdr->offset == 0))) {
            return HCA_TCP_HDR_RANGE;
        }
        return HCA_TCP_HDR_OK;
    case HCA_TCP_OP_WRITE:
        /* the remote address is the request's, not the stream's: one
         * that wraps is refused by the responder (a NAK), and the
         * connection goes on */
        if (hdr->length > HCA_TCP_SEG_MAX) {
            return HCA_TCP_HDR_LENGTH;
        }
        if (!hca_tcp_part_ok(hdr) ||
            ((hdr->flags & HCA_TCP_F_IMM) && !(hdr->flags & HCA_TCP_F_LAST))) {
            return HCA_TCP_HDR_RANGE;
        }
        /* a striped part says by its offset which part it is: whole
         * parts only, and no notice (hca_tcp_rel.c places parts out of
         * order, and a notice cannot wait) */
        if ((hdr->flags & HCA_TCP_F_STRIPED) &&
            ((hdr->flags & HCA_TCP_F_IMM) ||
             (hdr->offset % HCA_TCP_SEG_MAX != 0))) {
            return HCA_TCP_HDR_RANGE;
        }
        return HCA_TCP_HDR_OK;
    case HCA_TCP_OP_READ:
        /* the address and the size read (total) are the request's: the
         * responder refuses a bad one with a NAK */
        if (hdr->length != 0) {
            return HCA_TCP_HDR_LENGTH;
        }
        if (hdr->offset > hdr->total) {
            /* offset: where its answer is to start (a READ sent again
             * after part of its answer came) */
            return HCA_TCP_HDR_RANGE;
        }
        return HCA_TCP_HDR_OK;
    case HCA_TCP_OP_ATOMIC:
        /* a misaligned or wrapping address is the responder's
         * REM_ACCESS_ERR (its MPT check), as on shm: well formed,
         * refused */
        if (hdr->length != 0) {
            return HCA_TCP_HDR_LENGTH;
        }
        if (!hca_tcp_atomic_op(hdr->atomic_op)) {
            return HCA_TCP_HDR_ATOMIC;
        }
        return HCA_TCP_HDR_OK;
    case HCA_TCP_OP_ACK:
        if (hdr->length != 0) {
            return HCA_TCP_HDR_LENGTH;
        }
        if ((hdr->syndrome >= HCA_WC_STATUS_LAST) &&
            (hdr->syndrome != HCA_TCP_SYN_PSN_SEQ)) {
            return HCA_TCP_HDR_SYNDROME;
        }
        return HCA_TCP_HDR_OK;
    case HCA_TCP_OP_READ_RESP:
        if (hdr->length > HCA_TCP_SEG_MAX) {
            return HCA_TCP_HDR_LENGTH;
        }
        /* a striped answer's part says by its offset which part it is
         * (the requester's bitmap): whole parts, the last may be short */
        if ((hdr->flags & HCA_TCP_F_STRIPED) &&
            ((hdr->offset % HCA_TCP_SEG_MAX != 0) ||
             ((hdr->length != HCA_TCP_SEG_MAX) &&
              !(hdr->flags & HCA_TCP_F_LAST)))) {
            return HCA_TCP_HDR_RANGE;
        }
        return hca_tcp_part_ok(hdr) ? HCA_TCP_HDR_OK : HCA_TCP_HDR_RANGE;
    case HCA_TCP_OP_KEEPALIVE:
    case HCA_TCP_OP_BYE:
        return (hdr->length == 0) ? HCA_TCP_HDR_OK : HCA_TCP_HDR_LENGTH;
    default:
        return HCA_TCP_HDR_OPCODE;
    }
}

int hca_tcp_hello_check(const hca_tcp_hello_t *hello)
{
    return (hello->magic == HCA_TCP_MAGIC) &&
           (hello->version == HCA_TCP_VERSION) &&
           (hello->status < HCA_TCP_HELLO_LAST) &&
           (hello->step >= HCA_TCP_STEP_HELLO) &&
           (hello->step < HCA_TCP_STEP_LAST) &&
           (hello->cont < HCA_TCP_CONT_LAST) &&
           ((hello->cont == HCA_TCP_CONT_NONE) ||
            (hello->step == HCA_TCP_STEP_PROOF)) &&
           (memcmp(hello->reserved, "\0\0\0\0\0\0\0",
                   sizeof(hello->reserved)) == 0);
}
