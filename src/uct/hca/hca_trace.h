/*
 * hca_trace.h - every operation printed at UCS_LOG_LEVEL_TRACE_DATA, as
 * UCX's own transports print theirs: what `UCX_LOG_LEVEL=data` shows a
 * user who debugs a job.  Active messages go through UCX's AM tracer
 * (uct_iface_trace_am, which lets UCP decode its headers); RMA and atomics
 * are one line each.  ucs_trace_data is one predictable branch when the
 * level is off, and nothing at all in a UCX built with a lower maximum
 * level (UCS_MAX_LOG_LEVEL, Debian's packages among them).
 */
#ifndef UCT_HCA_TRACE_H
#define UCT_HCA_TRACE_H

#include <ucs/debug/log.h>
#include <inttypes.h>

/* _op: "PUT_SHORT", "GET_ZCOPY", ...; the local side, then the remote */
#define uct_hca_trace_rma(_ep, _op, _buffer, _length, _raddr, _rkey) \
    ucs_trace_data("hca ep %p: %s [buffer %p length %zu] remote 0x%" PRIx64 \
                   " rkey 0x%" PRIx64, (void*)(_ep), (_op), \
                   (const void*)(_buffer), (size_t)(_length), \
                   (uint64_t)(_raddr), (uint64_t)(_rkey))

/* _size 4 or 8; _result NULL for a post */
#define uct_hca_trace_amo(_ep, _op, _size, _value, _result, _raddr, _rkey) \
    ucs_trace_data("hca ep %p: ATOMIC%u %d [value 0x%" PRIx64 "%s] remote " \
                   "0x%" PRIx64 " rkey 0x%" PRIx64, (void*)(_ep), \
                   (unsigned)(_size) * 8, (int)(_op), (uint64_t)(_value), \
                   ((_result) != NULL) ? " fetch" : "", (uint64_t)(_raddr), \
                   (uint64_t)(_rkey))

#endif
