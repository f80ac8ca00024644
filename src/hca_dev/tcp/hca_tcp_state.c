/*
 * hca_tcp_state.c - the tcp fabric's two state machines, each with its
 * names, its legal transitions and the one function that changes it
 * (which checks the transition and traces it under HCA_TRACE=1).
 *
 * A connection (hca_tcp_conn_state_t, conn->state, any thread reads it):
 *
 *     NEW --connect()--> CONNECTING --hello sent--> HELLO --proofs--> UP
 *      \--accept()---------------------------------> HELLO
 *     UP --socket lost--> LINKING (a connection that can resume: was UP,
 *                                  its peer a context with an incarnation)
 *     LINKING --the dialler dials again--> CONNECTING ... HELLO --> UP
 *     CONNECTING, HELLO (of a connection that was UP) --failed--> LINKING
 *     LINKING --the acceptor takes a new socket that resumes it--> UP
 *     NEW, CONNECTING, HELLO, UP, LINKING --kill--> DEAD (conn->fail says
 *                                                     why)
 *
 * Its receiver (hca_tcp_rx_state_t, conn->rx.state, under rx_lock):
 *
 *     HELLO --handshake done--> HDR --a payload to place--> PAYLOAD
 *     HDR, PAYLOAD --refused--> DISCARD --payload read--> HDR
 *     PAYLOAD --a SEND fragment and its ring full--> PARKED --room--> HDR
 *     PAYLOAD --placed--> HDR
 *     any --the connection dies (hca_tcp_rx_abort)--> DISCARD
 *     DISCARD --a new socket (hca_tcp_conn_io_reset)--> HELLO or HDR
 *
 * A transition the tables do not allow is a bug of this fabric: it is
 * logged with both names and the process aborts, as an assertion would
 * (the fuzz harness drives these machines with hostile frames).
 */
#include "hca_tcp_fabric.h"
#include "hca_log.h"

#include <stdlib.h>

static const char *const hca_tcp_conn_state_names[] = {
    [HCA_TCP_CONN_NEW]        = "NEW",
    [HCA_TCP_CONN_CONNECTING] = "CONNECTING",
    [HCA_TCP_CONN_HELLO]      = "HELLO",
    [HCA_TCP_CONN_UP]         = "UP",
    [HCA_TCP_CONN_LINKING]    = "LINKING",
    [HCA_TCP_CONN_DEAD]       = "DEAD",
};

#define HCA_TCP_BIT(_s) (1u << (_s))

/* the states each state may go to */
static const unsigned hca_tcp_conn_next[] = {
    [HCA_TCP_CONN_NEW]        = HCA_TCP_BIT(HCA_TCP_CONN_CONNECTING) |
                                HCA_TCP_BIT(HCA_TCP_CONN_HELLO) |
                                HCA_TCP_BIT(HCA_TCP_CONN_DEAD),
    [HCA_TCP_CONN_CONNECTING] = HCA_TCP_BIT(HCA_TCP_CONN_HELLO) |
                                HCA_TCP_BIT(HCA_TCP_CONN_LINKING) |
                                HCA_TCP_BIT(HCA_TCP_CONN_DEAD),
    [HCA_TCP_CONN_HELLO]      = HCA_TCP_BIT(HCA_TCP_CONN_UP) |
                                HCA_TCP_BIT(HCA_TCP_CONN_LINKING) |
                                HCA_TCP_BIT(HCA_TCP_CONN_DEAD),
    [HCA_TCP_CONN_UP]         = HCA_TCP_BIT(HCA_TCP_CONN_LINKING) |
                                HCA_TCP_BIT(HCA_TCP_CONN_DEAD),
    [HCA_TCP_CONN_LINKING]    = HCA_TCP_BIT(HCA_TCP_CONN_CONNECTING) |
                                HCA_TCP_BIT(HCA_TCP_CONN_UP) |
                                HCA_TCP_BIT(HCA_TCP_CONN_DEAD),
    [HCA_TCP_CONN_DEAD]       = 0,
};

static const char *const hca_tcp_rx_state_names[] = {
    [HCA_TCP_RX_HELLO]   = "HELLO",
    [HCA_TCP_RX_HDR]     = "HDR",
    [HCA_TCP_RX_PAYLOAD] = "PAYLOAD",
    [HCA_TCP_RX_DISCARD] = "DISCARD",
    [HCA_TCP_RX_PARKED]  = "PARKED",
};

static const unsigned hca_tcp_rx_next[] = {
    [HCA_TCP_RX_HELLO]   = HCA_TCP_BIT(HCA_TCP_RX_HDR) |
                           HCA_TCP_BIT(HCA_TCP_RX_DISCARD),
    [HCA_TCP_RX_HDR]     = HCA_TCP_BIT(HCA_TCP_RX_HDR) |
                           HCA_TCP_BIT(HCA_TCP_RX_PAYLOAD) |
                           HCA_TCP_BIT(HCA_TCP_RX_DISCARD),
    [HCA_TCP_RX_PAYLOAD] = HCA_TCP_BIT(HCA_TCP_RX_HDR) |
                           HCA_TCP_BIT(HCA_TCP_RX_DISCARD) |
                           HCA_TCP_BIT(HCA_TCP_RX_PARKED),
    [HCA_TCP_RX_DISCARD] = HCA_TCP_BIT(HCA_TCP_RX_HDR) |
                           HCA_TCP_BIT(HCA_TCP_RX_DISCARD) |
                           HCA_TCP_BIT(HCA_TCP_RX_HELLO),
    [HCA_TCP_RX_PARKED]  = HCA_TCP_BIT(HCA_TCP_RX_HDR) |
                           HCA_TCP_BIT(HCA_TCP_RX_DISCARD),
};

const char *hca_tcp_conn_state_str(int state)
{
    return ((unsigned)state <= HCA_TCP_CONN_DEAD) ?
           hca_tcp_conn_state_names[state] : "?";
}

const char *hca_tcp_rx_state_str(int state)
{
    return ((unsigned)state <= HCA_TCP_RX_PARKED) ?
           hca_tcp_rx_state_names[state] : "?";
}

static _Noreturn void hca_tcp_state_bug(const char *machine,
                                           const char *from, const char *to,
                                           const char *where)
{
    hca_log("tcp fabric: BUG: %s state %s -> %s at %s", machine, from, to,
            where);
    abort();
}

int hca_tcp_conn_to_at(hca_tcp_conn_t *conn, hca_tcp_conn_state_t to,
                       const char *where)
{
    int from = atomic_load(&conn->state);

    do {
        if ((unsigned)from > HCA_TCP_CONN_DEAD) {
            hca_tcp_state_bug("connection", "?", hca_tcp_conn_state_str(to),
                              where);
        }
        if ((from == HCA_TCP_CONN_DEAD) ||
            ((from == HCA_TCP_CONN_LINKING) && (to == HCA_TCP_CONN_LINKING))) {
            return -1; /* another thread killed it (or lost its socket)
                          first: not a bug */
        }
        if (!(hca_tcp_conn_next[from] & HCA_TCP_BIT(to))) {
            hca_tcp_state_bug("connection", hca_tcp_conn_state_str(from),
                              hca_tcp_conn_state_str(to), where);
        }
        /* release: what the state publishes (UP: the handshake's
         * results) is seen by a thread that acquires it */
    } while (!atomic_compare_exchange_weak_explicit(&conn->state, &from,
                                                    (int)to,
                                                    memory_order_acq_rel,
                                                    memory_order_acquire));
    if (HCA_UNLIKELY(conn->trace)) {
        hca_log("tcp fabric: connection %s pid %u ctx %u: %s -> %s at %s",
                conn->outbound ? "to" : "from", conn->peer.pid,
                conn->peer.ctx_id, hca_tcp_conn_state_str(from),
                hca_tcp_conn_state_str(to), where);
    }
    return from;
}

void hca_tcp_rx_to_at(hca_tcp_conn_t *conn, hca_tcp_rx_state_t to,
                      const char *where)
{
    unsigned from = (unsigned)conn->rx.state;

    if ((from > HCA_TCP_RX_PARKED) ||
        !(hca_tcp_rx_next[from] & HCA_TCP_BIT(to))) {
        hca_tcp_state_bug("receive", hca_tcp_rx_state_str((int)from),
                          hca_tcp_rx_state_str(to), where);
    }
    if (HCA_UNLIKELY(conn->trace) && (from != (unsigned)to)) {
        hca_log("tcp fabric: receive from pid %u ctx %u: %s -> %s at %s",
                conn->peer.pid, conn->peer.ctx_id,
                hca_tcp_rx_state_str((int)from), hca_tcp_rx_state_str(to),
                where);
    }
    conn->rx.state = to;
}
