/*
 * hca_tcp_refusal.c - the tcp fabric's refusals, logged: a flood of bad
 * hellos, connections or records must not become a flood of lines.  Every
 * part of the fabric that refuses a peer calls it (last in the fabric's
 * call order: docs/layers.map).
 */
#include "hca_tcp_fabric.h"
#include "hca_log.h"

#include <stdarg.h>
#include <stdio.h>

/* A refusal, logged at most once per HCA_TCP_LOG_NS with the count of
 * those not logged since (the thread: a flood of bad hellos or
 * connections must not become a flood of lines). */
void hca_tcp_refusal(hca_tcp_dev_t *tcp, const char *fmt, ...)
{
    uint64_t now = hca_now_ns();
    char line[256];
    va_list ap;

    if ((tcp->log_ns != 0) && (now - tcp->log_ns < HCA_TCP_LOG_NS)) {
        tcp->log_held++;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    if (tcp->log_held > 0) {
        hca_log("tcp fabric: %s (and %u refusals not logged)", line,
                tcp->log_held);
    } else {
        hca_log("tcp fabric: %s", line);
    }
    tcp->log_ns   = now;
    tcp->log_held = 0;
}
