/*
 * hca_fault.c - fault injection, so that the error paths that random
 * kills reach only by chance are tested deterministically: a peer's
 * object that cannot be mapped, a failed registration, answers that come
 * late, an owner that stops consuming its receive rings.
 *
 * Set by the environment at device open (off when unset):
 *   HCA_FAULT="map=0.5,reg=0.1,answer_delay_us=2000,ring_stall_ms=300"
 *   HCA_FAULT="tcp_loss=0.01,tcp_dup=0.01,tcp_reset=0.001"   (per frame)
 *   HCA_FAULT="tcp_reset_ms=100,tcp_reset_for_ms=2000"
 *   HCA_FAULT="tcp_relisten_ms=300"
 *   HCA_FAULT="tcp_delay=0.01,tcp_delay_us=5000"
 */
#include "hca_util.h"
#include "hca_log.h"
#include "hca_base.h"
#include "hca_obj.h"

#include <stdlib.h>
#include <string.h>

/* The probability faults, by their names in HCA_FAULT. */
static const char *const hca_fault_names[HCA_FAULT_LAST] = {
    [HCA_FAULT_MAP]       = "map",
    [HCA_FAULT_REG]       = "reg",
    [HCA_FAULT_TCP_LOSS]  = "tcp_loss",
    [HCA_FAULT_TCP_DUP]   = "tcp_dup",
    [HCA_FAULT_TCP_RESET] = "tcp_reset",
    [HCA_FAULT_TCP_DELAY] = "tcp_delay",
};

static int hca_fault_kind_of(const char *name)
{
    for (int i = 0; i < HCA_FAULT_LAST; ++i) {
        if (!strcmp(name, hca_fault_names[i])) {
            return i;
        }
    }
    return -1;
}

void hca_fault_init(hca_fault_cfg_t *cfg)
{
    const char *env = getenv("HCA_FAULT");
    char buf[256], *save = NULL;

    memset(cfg, 0, sizeof(*cfg));
    if ((env == NULL) || (*env == '\0')) {
        return;
    }
    snprintf(buf, sizeof(buf), "%s", env);
    for (char *tok = strtok_r(buf, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        double v;
        if (eq == NULL) {
            hca_log("HCA_FAULT: ignoring '%s' (expected name=value)", tok);
            continue;
        }
        *eq = '\0';
        v   = strtod(eq + 1, NULL);
        int kind = hca_fault_kind_of(tok);
        if (kind >= 0) {
            v = (v < 0) ? 0 : (v > 1) ? 1 : v;
            cfg->prob[kind] = (uint32_t)(v * 4294967295.0);
        } else if (!strcmp(tok, "tcp_reset_ms")) {
            cfg->tcp_reset_ms = (uint32_t)v;
        } else if (!strcmp(tok, "tcp_reset_for_ms")) {
            cfg->tcp_reset_for_ms = (uint32_t)v;
        } else if (!strcmp(tok, "tcp_delay_us")) {
            cfg->tcp_delay_us = (uint32_t)v;
        } else if (!strcmp(tok, "tcp_relisten_ms")) {
            cfg->tcp_relisten_ms = (uint32_t)v;
        } else if (!strcmp(tok, "answer_delay_us")) {
            cfg->answer_delay_us = (uint32_t)v;
        } else if (!strcmp(tok, "ring_stall_ms")) {
            cfg->ring_stall_ms = (uint32_t)v;
        } else {
            hca_log("HCA_FAULT: unknown fault '%s'", tok);
            continue;
        }
        cfg->enabled = 1;
    }
    if (cfg->enabled) {
        hca_log("fault injection on: %s", env);
    }
}

int hca_fault_hit(hca_fault_cfg_t *cfg, hca_fault_kind_t kind)
{
    /* splitmix64 of a shared sequence: any thread, no lock */
    uint64_t z = atomic_fetch_add(&cfg->seq, 1) + 0x9e3779b97f4a7c15ull;

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (cfg->prob[kind] != 0) && ((uint32_t)z <= cfg->prob[kind]);
}

int hca_fault_ring_stalled(const hca_fault_cfg_t *cfg)
{
    uint64_t ms = hca_now_ns() / 1000000ull;

    return (ms % (2ull * cfg->ring_stall_ms)) < cfg->ring_stall_ms;
}
