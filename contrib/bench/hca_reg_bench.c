/*
 * hca_reg_bench.c - what a registration plus a deregistration costs, in
 * one process, the ways hca could do it:
 *
 *   device     hca_mr_reg + hca_mr_dereg (no cache)
 *   ucs_rcache UCX's registration cache over the same device calls
 *              (ucs_rcache_get + ucs_rcache_region_put; what UCX's IB md
 *              does), with the memory events UCX's IB md asks for
 *   md         uct_md_mem_reg + uct_md_mem_dereg on the hca md, with its
 *              own cache (UCX_HCA_RCACHE=y) and without (=n); needs the
 *              module: LD_PRELOAD=<build>/src/uct/hca/.libs/libuct_hca.so
 *
 * each for the same buffer again and again (the UCP pattern: a cache hit)
 * and for 256 buffers in turn.  Prints ns per reg+dereg pair, the median
 * of 5 rounds.  It informs md_query's reg_cost (docs/PERF.md).
 *
 * usage: hca_reg_bench [iterations]      (default 200000)
 */
#include <hca_dev.h>

#include <hca_compat.h>   /* the UCX versions' differences */
#include <ucs/memory/rcache.h>
#include <ucm/api/ucm.h>
#include <uct/api/uct.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define BUFS    256
#define BUFSIZE 4096
#define ROUNDS  5

typedef struct {
    ucs_rcache_region_t super;
    hca_mr_t           *mr;
} bench_region_t;

static hca_pd_t *g_pd;
static char     *g_buf;
static long      g_iters;

static double now_ns(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double*)a, y = *(const double*)b;

    return (x > y) - (x < y);
}

static void *buf_of(long i, int many)
{
    return g_buf + (many ? (size_t)(i % BUFS) * BUFSIZE : 0);
}

/* ----------------------------------------------------------- the ways */

static const unsigned access_all = HCA_ACCESS_LOCAL_WRITE |
                                   HCA_ACCESS_REMOTE_WRITE |
                                   HCA_ACCESS_REMOTE_READ |
                                   HCA_ACCESS_REMOTE_ATOMIC;

static int run_device(int many)
{
    hca_mr_t *mr;

    for (long i = 0; i < g_iters; ++i) {
        if (hca_mr_reg(g_pd, buf_of(i, many), BUFSIZE, access_all, &mr) != 0) {
            return -1;
        }
        hca_mr_dereg(mr);
    }
    return 0;
}

static ucs_status_t rc_mem_reg(void *context, ucs_rcache_t *rcache, void *arg,
                               ucs_rcache_region_t *rregion, uint16_t flags)
{
    bench_region_t *r = ucs_derived_of(rregion, bench_region_t);

    return (hca_mr_reg(g_pd, (void*)r->super.super.start,
                       r->super.super.end - r->super.super.start, access_all,
                       &r->mr) == 0) ? UCS_OK : UCS_ERR_IO_ERROR;
}

static void rc_mem_dereg(void *context, ucs_rcache_t *rcache,
                         ucs_rcache_region_t *rregion)
{
    hca_mr_dereg(ucs_derived_of(rregion, bench_region_t)->mr);
}

static void rc_dump(void *context, ucs_rcache_t *rcache,
                    ucs_rcache_region_t *rregion, char *buf, size_t max)
{
    buf[0] = '\0';
}

static const ucs_rcache_ops_t rc_ops = {
    .mem_reg     = rc_mem_reg,
    .mem_dereg   = rc_mem_dereg,
    .dump_region = rc_dump,
};

static ucs_rcache_t *g_rcache;

static int run_rcache(int many)
{
    ucs_rcache_region_t *region;

    for (long i = 0; i < g_iters; ++i) {
        if (UCT_HCA_RCACHE_GET(g_rcache, buf_of(i, many), BUFSIZE, 64,
                               PROT_READ | PROT_WRITE, NULL,
                               &region) != UCS_OK) {
            return -1;
        }
        ucs_rcache_region_put(g_rcache, region);
    }
    return 0;
}

static uct_md_h g_md;

static int run_md(int many)
{
    uct_mem_h memh;

    for (long i = 0; i < g_iters; ++i) {
        if (uct_md_mem_reg(g_md, buf_of(i, many), BUFSIZE,
                           UCT_MD_MEM_ACCESS_ALL, &memh) != UCS_OK) {
            return -1;
        }
        uct_md_mem_dereg(g_md, memh);
    }
    return 0;
}

static void measure(const char *name, int (*run)(int))
{
    double t[ROUNDS];

    for (int many = 0; many <= 1; ++many) {
        if (run(many) != 0) { /* warm-up */
            printf("%-22s %-12s failed\n", name, many ? "256 buffers" : "same buffer");
            return;
        }
        for (int r = 0; r < ROUNDS; ++r) {
            double t0 = now_ns();
            run(many);
            t[r] = (now_ns() - t0) / (double)g_iters;
        }
        qsort(t, ROUNDS, sizeof(t[0]), cmp_double);
        printf("%-22s %-12s %8.1f ns per reg+dereg\n", name,
               many ? "256 buffers" : "same buffer", t[ROUNDS / 2]);
    }
}

static uct_component_h find_hca(void)
{
    uct_component_h *comps;
    uct_component_h found = NULL;
    unsigned n;

    if (uct_query_components(&comps, &n) != UCS_OK) {
        return NULL;
    }
    for (unsigned i = 0; i < n; ++i) {
        uct_component_attr_t attr = {.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME};

        if ((uct_component_query(comps[i], &attr) == UCS_OK) &&
            !strcmp(attr.name, "hca")) {
            found = comps[i];
        }
    }
    return found;
}

static void measure_md(uct_component_h comp, const char *rcache)
{
    uct_md_config_t *config;
    char name[64];

    if (uct_md_config_read(comp, NULL, NULL, &config) != UCS_OK) {
        return;
    }
    uct_config_modify(config, "RCACHE", rcache);
    if (uct_md_open(comp, "hca", config, &g_md) == UCS_OK) {
        snprintf(name, sizeof(name), "md RCACHE=%s", rcache);
        measure(name, run_md);
        uct_md_close(g_md);
    }
    uct_config_release(config);
}

int main(int argc, char **argv)
{
    ucs_rcache_params_t params;
    hca_device_t *dev;
    uct_component_h comp;

    g_iters = (argc > 1) ? atol(argv[1]) : 200000;
    g_buf   = mmap(NULL, (size_t)BUFS * BUFSIZE, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if ((g_buf == MAP_FAILED) || (hca_device_open("hca0", 0, &dev) != 0) ||
        (hca_pd_alloc(dev, &g_pd) != 0)) {
        fprintf(stderr, "hca_reg_bench: cannot set up the device\n");
        return 1;
    }
    memset(g_buf, 1, (size_t)BUFS * BUFSIZE);
    printf("hca_reg_bench: %ld iterations, %d-byte buffers, median of %d\n",
           g_iters, BUFSIZE, ROUNDS);
    measure("device (no cache)", run_device);

    memset(&params, 0, sizeof(params));
    params.region_struct_size = sizeof(bench_region_t);
    UCT_HCA_RCACHE_PARAMS_SET_ALIGNMENT(&params, 64, 4096);
    params.ucm_events         = UCM_EVENT_VM_UNMAPPED;
    params.ucm_event_priority = 1000;
    params.ops                = &rc_ops;
    params.max_regions        = ULONG_MAX;
    params.max_size           = SIZE_MAX;
    params.max_unreleased     = SIZE_MAX;
    if (ucs_rcache_create(&params, "bench", NULL, &g_rcache) == UCS_OK) {
        measure("ucs_rcache", run_rcache);
        ucs_rcache_destroy(g_rcache);
    } else {
        printf("ucs_rcache             cannot be created\n");
    }

    comp = find_hca();
    if (comp != NULL) {
        measure_md(comp, "y");
        measure_md(comp, "n");
    } else {
        printf("md                     not measured: no hca component "
               "(LD_PRELOAD the module)\n");
    }
    hca_pd_dealloc(g_pd);
    hca_device_close(dev);
    return 0;
}
