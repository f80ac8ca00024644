/*
 * ucx_layout_check - compare UCX struct sizes as this project compiles them
 * with the sizes the installed UCX libraries were built with.
 *
 * The UCT module compiles UCX's internal headers (from the UCX source tree)
 * against the installed binaries. A config define that differs from the
 * installed build (ENABLE_STATS, ENABLE_MT, ENABLE_DEBUG_DATA, ...) changes
 * struct layouts silently and corrupts memory at run time. This program is
 * built with exactly the flags of the UCT module (UCX_SRC_CPPFLAGS,
 * UCX_CFLAGS, -std=gnu11), and compares its sizeof() of every struct that
 * `ucx_info -y` reports (and whose header is reachable without verbs/mlx5)
 * with what `ucx_info -y` prints. Any difference is printed and makes the
 * exit status 1; so does a struct that ucx_info no longer reports.
 *
 * usage: ucx_layout_check [-v] [FILE]
 *   FILE  output of `ucx_info -y` ("-" for stdin); default: run
 *         UCX_INFO_PATH -y
 *   -v    print every compared struct
 */

#include <ucs/arch/cpu.h>
#include <ucs/async/async.h>
#include <ucs/async/async_int.h>
#include <ucs/async/pipe.h>
#include <ucs/async/signal.h>
#include <ucs/async/thread.h>
#include <ucs/config/parser.h>
#include <ucs/datastruct/arbiter.h>
#include <ucs/datastruct/callbackq.h>
#include <ucs/datastruct/conn_match.h>
#include <ucs/datastruct/frag_list.h>
#include <ucs/datastruct/list.h>
#include <ucs/datastruct/mpmc.h>
#include <ucs/datastruct/mpool.h>
#include <ucs/datastruct/pgtable.h>
#include <ucs/datastruct/ptr_array.h>
#include <ucs/datastruct/queue_types.h>
#include <ucs/debug/memtrack_int.h>
#include <ucs/memory/memtype_cache.h>
#include <ucs/memory/rcache.h>
#include <ucs/memory/rcache_int.h>
#include <ucs/time/timer_wheel.h>
#include <ucs/time/timerq.h>
#include <ucs/type/class.h>
#include <ucs/type/spinlock.h>
#include <uct/api/uct.h>
#include <uct/base/uct_iface.h>
#include <uct/base/uct_md.h>
#include <uct/sm/self/self.h>
#include <uct/tcp/tcp.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef UCX_INFO_PATH
#define UCX_INFO_PATH "ucx_info"
#endif

typedef struct {
    const char *name;   /* type name as printed by ucx_info -y */
    size_t      size;   /* sizeof() with this project's flags */
    int         found;  /* seen in the ucx_info output */
} layout_entry_t;

#define LAYOUT_ENTRY(_type) {.name = #_type, .size = sizeof(_type)}

static layout_entry_t layout_table[] = {
    /* UCS */
    LAYOUT_ENTRY(ucs_mpool_t),
    LAYOUT_ENTRY(ucs_mpool_chunk_t),
    LAYOUT_ENTRY(ucs_mpool_elem_t),
    LAYOUT_ENTRY(ucs_async_context_t),
    LAYOUT_ENTRY(ucs_async_handler_t),
    LAYOUT_ENTRY(ucs_async_ops_t),
    LAYOUT_ENTRY(ucs_async_pipe_t),
    LAYOUT_ENTRY(ucs_async_signal_context_t),
    LAYOUT_ENTRY(ucs_async_thread_context_t),
    LAYOUT_ENTRY(ucs_class_t),
    LAYOUT_ENTRY(ucs_config_field_t),
    LAYOUT_ENTRY(ucs_config_parser_t),
    LAYOUT_ENTRY(ucs_frag_list_t),
    LAYOUT_ENTRY(ucs_frag_list_elem_t),
    LAYOUT_ENTRY(ucs_frag_list_head_t),
    LAYOUT_ENTRY(ucs_ib_port_spec_t),
    LAYOUT_ENTRY(ucs_list_link_t),
    LAYOUT_ENTRY(ucs_memtrack_entry_t),
    LAYOUT_ENTRY(ucs_mpmc_queue_t),
    LAYOUT_ENTRY(ucs_callbackq_t),
    LAYOUT_ENTRY(ucs_callbackq_elem_t),
    LAYOUT_ENTRY(ucs_ptr_array_t),
    LAYOUT_ENTRY(ucs_queue_elem_t),
    LAYOUT_ENTRY(ucs_queue_head_t),
    LAYOUT_ENTRY(ucs_recursive_spinlock_t),
    LAYOUT_ENTRY(ucs_timer_t),
    LAYOUT_ENTRY(ucs_timer_queue_t),
    LAYOUT_ENTRY(ucs_twheel_t),
    LAYOUT_ENTRY(ucs_wtimer_t),
    LAYOUT_ENTRY(ucs_arbiter_t),
    LAYOUT_ENTRY(ucs_arbiter_group_t),
    LAYOUT_ENTRY(ucs_arbiter_elem_t),
    LAYOUT_ENTRY(ucs_pgtable_t),
    LAYOUT_ENTRY(ucs_pgt_entry_t),
    LAYOUT_ENTRY(ucs_pgt_dir_t),
    LAYOUT_ENTRY(ucs_pgt_region_t),
    LAYOUT_ENTRY(ucs_rcache_t),
    LAYOUT_ENTRY(ucs_rcache_region_t),
    LAYOUT_ENTRY(ucs_conn_match_elem_t),
    LAYOUT_ENTRY(ucs_memory_info_t),
    /* UCT */
    LAYOUT_ENTRY(uct_am_handler_t),
    LAYOUT_ENTRY(uct_base_iface_t),
    LAYOUT_ENTRY(uct_completion_t),
    LAYOUT_ENTRY(uct_ep_t),
    LAYOUT_ENTRY(uct_mem_h),
    LAYOUT_ENTRY(uct_rkey_t),
    LAYOUT_ENTRY(uct_iface_t),
    LAYOUT_ENTRY(uct_iface_attr_t),
    LAYOUT_ENTRY(uct_iface_config_t),
    LAYOUT_ENTRY(uct_iface_mpool_config_t),
    LAYOUT_ENTRY(uct_md_config_t),
    LAYOUT_ENTRY(uct_iface_ops_t),
    LAYOUT_ENTRY(uct_md_t),
    LAYOUT_ENTRY(uct_md_attr_t),
    LAYOUT_ENTRY(uct_md_ops_t),
    LAYOUT_ENTRY(uct_tl_resource_desc_t),
    LAYOUT_ENTRY(uct_rkey_bundle_t),
    LAYOUT_ENTRY(uct_tcp_ep_t),
    LAYOUT_ENTRY(uct_self_ep_t),
};

#define LAYOUT_COUNT (sizeof(layout_table) / sizeof(layout_table[0]))

static layout_entry_t *layout_find(const char *name)
{
    size_t i;

    for (i = 0; i < LAYOUT_COUNT; ++i) {
        if (!strcmp(layout_table[i].name, name)) {
            return &layout_table[i];
        }
    }
    return NULL;
}

/*
 * Parse one line of `ucx_info -y`, e.g.
 *     "    sizeof(ucs_mpool_t) = ................. 16    "
 * Returns 1 and fills name/size on a sizeof line, 0 otherwise.
 */
static int parse_line(const char *line, char *name, size_t name_len,
                      size_t *size_p)
{
    const char *p = strstr(line, "sizeof(");
    const char *end;
    char *num_end;
    unsigned long value;

    if (p == NULL) {
        return 0;
    }
    p  += strlen("sizeof(");
    end = strchr(p, ')');
    if ((end == NULL) || (end == p) || ((size_t)(end - p) >= name_len)) {
        return 0;
    }
    memcpy(name, p, end - p);
    name[end - p] = '\0';

    p = strchr(end, '=');
    if (p == NULL) {
        return 0;
    }
    ++p;
    while ((*p == ' ') || (*p == '.') || (*p == '\t')) {
        ++p;
    }
    errno = 0;
    value = strtoul(p, &num_end, 10);
    if ((num_end == p) || (errno != 0)) {
        return 0;
    }
    *size_p = value;
    return 1;
}

int main(int argc, char **argv)
{
    const char *source = NULL;
    int verbose        = 0;
    int from_popen     = 0;
    unsigned mismatch  = 0;
    unsigned missing   = 0;
    unsigned matched   = 0;
    char line[512], name[256];
    layout_entry_t *entry;
    size_t size, i;
    FILE *in;
    int argi;

    for (argi = 1; argi < argc; ++argi) {
        if (!strcmp(argv[argi], "-v")) {
            verbose = 1;
        } else if (source == NULL) {
            source = argv[argi];
        } else {
            fprintf(stderr, "usage: %s [-v] [ucx_info-y-output|-]\n",
                    argv[0]);
            return 2;
        }
    }

    if (source == NULL) {
        source     = UCX_INFO_PATH " -y";
        in         = popen(source, "r");
        from_popen = 1;
    } else if (!strcmp(source, "-")) {
        in = stdin;
    } else {
        in = fopen(source, "r");
    }
    if (in == NULL) {
        fprintf(stderr, "ucx_layout_check: cannot read '%s': %s\n", source,
                strerror(errno));
        return 2;
    }

    while (fgets(line, sizeof(line), in) != NULL) {
        if (!parse_line(line, name, sizeof(name), &size)) {
            continue;
        }
        entry = layout_find(name);
        if ((entry == NULL) || entry->found) {
            continue; /* not reachable from our headers, or listed twice */
        }
        entry->found = 1;
        if (entry->size != size) {
            printf("ucx_layout_check: MISMATCH sizeof(%s): %zu here, %zu in "
                   "the installed UCX\n", name, entry->size, size);
            ++mismatch;
        } else {
            ++matched;
            if (verbose) {
                printf("ucx_layout_check: ok sizeof(%s) = %zu\n", name, size);
            }
        }
    }

    if (from_popen) {
        if (pclose(in) != 0) {
            fprintf(stderr, "ucx_layout_check: '%s' failed\n", source);
            return 2;
        }
    } else if (in != stdin) {
        fclose(in);
    }

    for (i = 0; i < LAYOUT_COUNT; ++i) {
        if (!layout_table[i].found) {
            printf("ucx_layout_check: MISSING sizeof(%s) = %zu here, not "
                   "reported by '%s'\n", layout_table[i].name,
                   layout_table[i].size, source);
            ++missing;
        }
    }

    printf("ucx_layout_check: %u of %zu struct sizes match the installed "
           "UCX%s\n", matched, (size_t)LAYOUT_COUNT,
           (mismatch || missing) ? " - FAILED" : "");
    return (mismatch || missing) ? 1 : 0;
}
