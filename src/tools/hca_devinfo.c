/*
 * hca_devinfo.c - show the devices of the hca software HCA, like
 * `ibv_devinfo -v` does for verbs devices.
 *
 * usage: hca_devinfo [-d DEV] [-v] [-h]
 *
 * Every device (or only DEV) is opened, queried and closed again, so what
 * is printed is what a consumer opening the device right now would see.
 * With -v the device counters are printed too: host-wide totals of every
 * process that used the device (live queue pairs and contexts, plus what
 * closed ones left in the device's totals); only rows that are not zero
 * are printed.  The tcp fabric's paths are listed with their
 * interfaces' state; their counters (frames, bytes, retransmits,
 * failovers of path N: the sums over every process's path N) are among
 * the fabric's counters.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hca_dev.h"

#define PROG        "hca_devinfo"
#define MAX_DEVICES 64

struct options {
    const char *dev_name;   /* -d: only this device, NULL for all */
    int         verbose;    /* -v: counters as well */
};

static void usage(FILE *out)
{
    fprintf(out,
            "usage: " PROG " [-d DEV] [-v] [-h]\n"
            "  -d DEV  show only device DEV (e.g. hca0)\n"
            "  -v      verbose: print the device counters as well\n"
            "  -h      show this help\n");
}

/* Parses the command line; exits on -h or a bad option. */
static void parse_options(int argc, char **argv, struct options *opt)
{
    int c;

    memset(opt, 0, sizeof(*opt));
    while ((c = getopt(argc, argv, "d:vh")) != -1) {
        switch (c) {
        case 'd':
            opt->dev_name = optarg;
            break;
        case 'v':
            opt->verbose = 1;
            break;
        case 'h':
            usage(stdout);
            exit(0);
        default:
            usage(stderr);
            exit(1);
        }
    }
    if (optind < argc) {
        fprintf(stderr, PROG ": unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        exit(1);
    }
}

/* ------------------------------------------------------------ formatting */

/* The GUID as ibv_devinfo shows it: four 16-bit groups, most significant
 * first, so the output compares directly with what IB users know. */
static void print_guid(const char *label, uint64_t guid)
{
    printf("\t%-24s%04x:%04x:%04x:%04x\n", label,
           (unsigned)(guid >> 48) & 0xffff, (unsigned)(guid >> 32) & 0xffff,
           (unsigned)(guid >> 16) & 0xffff, (unsigned)guid & 0xffff);
}

/* Decodes HCA_ATOMIC_CAP_* into names, keeping unknown bits visible in hex
 * so a newer library is never misreported by an older tool. */
static void print_atomic_caps(uint32_t caps)
{
    static const struct {
        uint32_t    bit;
        const char *name;
    } names[] = {
        { HCA_ATOMIC_CAP_32,     "ATOMIC_32" },
        { HCA_ATOMIC_CAP_64,     "ATOMIC_64" },
        { HCA_ATOMIC_CAP_GLOB,   "ATOMIC_GLOB" },
        { HCA_ATOMIC_CAP_BITOPS, "ATOMIC_BITOPS" },
    };
    uint32_t rest = caps;
    const char *sep = "";
    size_t i;

    printf("\t%-24s0x%x (", "atomic_caps:", caps);
    if (caps == 0)
        printf("ATOMIC_NONE");
    for (i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (!(caps & names[i].bit))
            continue;
        rest &= ~names[i].bit;
        printf("%s%s", sep, names[i].name);
        sep = " ";
    }
    if (rest)
        printf("%s0x%x", sep, rest);
    printf(")\n");
}

static void print_u32(const char *label, uint32_t value)
{
    printf("\t%-24s%" PRIu32 "\n", label, value);
}

static void print_u64(const char *label, uint64_t value)
{
    printf("\t%-24s%" PRIu64 "\n", label, value);
}

/* ------------------------------------------------------------ device */

static void print_device_attr(const hca_device_attr_t *attr)
{
    printf("hca_id:\t%s\n", attr->name);
    printf("\t%-24s%s\n", "fw_ver:", attr->fw_ver);
    print_guid("node_guid:", attr->node_guid);
    printf("\t%-24s0x%04" PRIx32 "\n", "vendor_id:", attr->vendor_id);
    printf("\t%-24s0x%" PRIx32 "\n", "hw_ver:", attr->hw_ver);
    printf("\t%-24s%d\n", "numa_node:", attr->numa_node);
    print_u32("phys_port_cnt:", attr->phys_port_cnt);
    print_u32("max_pd:", attr->max_pd);
    print_u32("max_mr:", attr->max_mr);
    print_u64("max_mr_size:", attr->max_mr_size);
    print_u32("max_qp:", attr->max_qp);
    print_u32("max_qp_wr:", attr->max_qp_wr);
    print_u32("max_sge:", attr->max_sge);
    print_u32("max_cq:", attr->max_cq);
    print_u32("max_cqe:", attr->max_cqe);
    print_u32("max_srq:", attr->max_srq);
    print_u32("max_srq_wr:", attr->max_srq_wr);
    print_u32("max_inline_data:", attr->max_inline_data);
    print_u64("max_msg_size:", attr->max_msg_size);
    print_u32("max_dm:", attr->max_dm);
    print_u64("max_dm_size:", attr->max_dm_size);
    print_atomic_caps(attr->atomic_caps);
}

/* The host identity decides which peers the shm fabric can reach; printing
 * it lets a user see why two processes (containers) do or do not match.
 * The boot id is shown like /proc/sys/kernel/random/boot_id and the
 * namespaces like the /proc/PID/ns links, so both can be compared by eye. */
static void print_host_id(const hca_host_id_t *id)
{
    const uint8_t *b = id->boot_id;
    int i;

    printf("\t%-24s", "boot_id:");
    for (i = 0; i < 16; i++)
        printf("%s%02x", (i == 4 || i == 6 || i == 8 || i == 10) ? "-" : "",
               b[i]);
    printf("\n");
    printf("\t%-24sipc:[%" PRIu32 "]\n", "ipc_ns:", id->ipc_ns);
    printf("\t%-24spid:[%" PRIu32 "]\n", "pid_ns:", id->pid_ns);
    printf("\t%-24snet:[%" PRIu32 "]\n", "net_ns:", id->net_ns);
}

static const char *fabric_mode_str(hca_fabric_mode_t mode)
{
    switch (mode) {
    case HCA_FABRIC_MODE_AUTO:
        return "auto (shm on this host, tcp to others)";
    case HCA_FABRIC_MODE_SHM:
        return "shm (this host only)";
    case HCA_FABRIC_MODE_TCP:
        return "tcp (every peer)";
    default:
        return "unknown";
    }
}

static int print_port(hca_device_t *dev, uint8_t port_num)
{
    hca_port_attr_t pattr;
    int rc;

    memset(&pattr, 0, sizeof(pattr));
    rc = hca_port_query(dev, port_num, &pattr);
    if (rc < 0) {
        fprintf(stderr, PROG ": %s: cannot query port %u: %s\n",
                hca_device_name(dev), port_num, strerror(-rc));
        return rc;
    }
    printf("\t\tport:\t%u\n", port_num);
    printf("\t\t\t%-16s%s (%d)\n", "state:", hca_port_state_str(pattr.state),
           (int)pattr.state);
    printf("\t\t\t%-16s%s (%d)\n", "fabric:", hca_fabric_type_str(pattr.fabric),
           (int)pattr.fabric);
    printf("\t\t\t%-16s%" PRIu32 "\n", "mtu:", pattr.mtu);
    printf("\t\t\t%-16s%" PRIu32 "\n", "max_msg_sz:", pattr.max_msg_sz);
    printf("\t\t\t%-16s%s\n", "single_copy:",
           pattr.single_copy ? "yes" : "no");
    printf("\t\t\t%-16s%s\n", "fabric_mode:",
           fabric_mode_str(pattr.fabric_mode));
    if (pattr.net.family != HCA_NET_NONE) {
        char addr[80];
        hca_net_addr_str(&pattr.net, addr, sizeof(addr));
        printf("\t\t\t%-16s%s\n", "tcp_interface:", pattr.net_dev);
        printf("\t\t\t%-16s%s (this context's listener)\n", "tcp_address:",
               addr);
        /* its paths (UCX_HCA_NET_DEVICES names several): each path's
         * counters are under "tcp fabric" with -v */
        printf("\t\t\t%-16s%" PRIu32 "\n", "tcp_paths:", pattr.n_paths);
        for (uint32_t i = 0; i < pattr.n_paths; ++i) {
            char name[24];
            hca_net_addr_str(&pattr.paths[i].net, addr, sizeof(addr));
            snprintf(name, sizeof(name), "tcp_path%" PRIu32 ":", i);
            printf("\t\t\t%-16s%s %s %s\n", name, pattr.paths[i].dev, addr,
                   pattr.paths[i].up ? "up" : "down");
        }
    } else {
        printf("\t\t\t%-16s%s\n", "tcp_address:", "none (no tcp fabric)");
    }
    return 0;
}

/* ------------------------------------------------------------ counters */

static void print_opcode_counters(const hca_counters_t *cnt)
{
    int printed = 0;
    int op;

    for (op = 0; op < HCA_WR_OPCODE_LAST; op++) {
        if (!cnt->tx_ops[op] && !cnt->tx_bytes[op] &&
            !cnt->rx_ops[op] && !cnt->rx_bytes[op])
            continue;
        if (!printed++)
            printf("\t\t%-20s%12s%14s%12s%14s\n", "opcode", "tx_ops",
                   "tx_bytes", "rx_ops", "rx_bytes");
        printf("\t\t%-20s%12" PRIu64 "%14" PRIu64 "%12" PRIu64 "%14" PRIu64
               "\n", hca_wr_opcode_str((hca_wr_opcode_t)op), cnt->tx_ops[op],
               cnt->tx_bytes[op], cnt->rx_ops[op], cnt->rx_bytes[op]);
    }
    if (!printed)
        printf("\t\t%-20s%s\n", "opcode:", "(no operations)");
}

static void print_error_counters(const hca_counters_t *cnt)
{
    int printed = 0;
    int st;

    /* HCA_WC_SUCCESS is not an error; start after it */
    for (st = HCA_WC_SUCCESS + 1; st < HCA_WC_STATUS_LAST; st++) {
        if (!cnt->errors[st])
            continue;
        if (!printed++)
            printf("\t\terrors:\n");
        printf("\t\t\t%-40s%" PRIu64 "\n",
               hca_wc_status_str((hca_wc_status_t)st), cnt->errors[st]);
    }
    if (!printed)
        printf("\t\t%-20s%s\n", "errors:", "(none)");
}

static void print_fabric_counters(const hca_counters_t *cnt)
{
    printf("\t\t%-20s%12s%14s\n", "fabric", "tx_ops", "tx_bytes");
    for (int f = 0; f < HCA_FABRIC_LAST; f++) {
        uint64_t ops = 0, bytes = 0;

        for (int op = 0; op < HCA_WR_OPCODE_LAST; op++) {
            ops   += cnt->fabric_tx_ops[f][op];
            bytes += cnt->fabric_tx_bytes[f][op];
        }
        printf("\t\t%-20s%12" PRIu64 "%14" PRIu64 "\n",
               hca_fabric_type_str((hca_fabric_type_t)f), ops, bytes);
        for (int op = 0; op < HCA_WR_OPCODE_LAST; op++) {
            if (cnt->fabric_tx_ops[f][op] != 0) {
                printf("\t\t  %-18s%12" PRIu64 "%14" PRIu64 "\n",
                       hca_wr_opcode_str((hca_wr_opcode_t)op),
                       cnt->fabric_tx_ops[f][op], cnt->fabric_tx_bytes[f][op]);
            }
        }
    }
    /* each fabric's own counters, by the names it gives them */
    for (int f = 0; f < HCA_FABRIC_LAST; f++) {
        const char *name;
        int shown = 0;

        if (hca_fabric_counter_name((hca_fabric_type_t)f, 0) == NULL) {
            continue;
        }
        printf("\t\t%s fabric:\n", hca_fabric_type_str((hca_fabric_type_t)f));
        for (unsigned i = 0;
             (name = hca_fabric_counter_name((hca_fabric_type_t)f, i)) != NULL;
             i++) {
            if (cnt->fabric_own[f][i] != 0) {
                printf("\t\t\t%-24s%" PRIu64 "\n", name,
                       cnt->fabric_own[f][i]);
                shown = 1;
            }
        }
        if (!shown) {
            printf("\t\t\t(all zero)\n");
        }
    }
}

static int print_counters(hca_device_t *dev)
{
    hca_counters_t cnt;
    int rc;

    memset(&cnt, 0, sizeof(cnt));
    rc = hca_host_counters(hca_device_name(dev), &cnt);
    if (rc < 0) {
        fprintf(stderr, PROG ": %s: cannot read counters: %s\n",
                hca_device_name(dev), strerror(-rc));
        return rc;
    }
    printf("\tcounters (all processes of this host):\n");
    print_opcode_counters(&cnt);
    print_error_counters(&cnt);
    printf("\t\t%-20s%" PRIu64 "\n", "ring_full:", cnt.ring_full);
    printf("\t\t%-20s%" PRIu64 "\n", "single_copy_ops:", cnt.single_copy_ops);
    printf("\t\t%-20s%" PRIu64 "\n", "mapped_ops:", cnt.mapped_ops);
    printf("\t\t%-20s%" PRIu64 "\n", "responder_ops:", cnt.responder_ops);
    printf("\t\t%-20s%" PRIu64 "\n", "cq_overflows:", cnt.cq_overflows);
    printf("\t\t%-20s%" PRIu64 "\n", "wakeups_sent:", cnt.wakeups_sent);
    print_fabric_counters(&cnt);
    return 0;
}

/* ------------------------------------------------------------ main flow */

/* Prints everything about an opened device; 0 or a negative errno. */
static int show_opened_device(hca_device_t *dev, int verbose)
{
    hca_device_attr_t attr;
    hca_host_id_t host;
    uint32_t port;
    int rc;

    memset(&attr, 0, sizeof(attr));
    rc = hca_device_query(dev, &attr);
    if (rc < 0) {
        fprintf(stderr, PROG ": %s: cannot query device: %s\n",
                hca_device_name(dev), strerror(-rc));
        return rc;
    }
    print_device_attr(&attr);

    memset(&host, 0, sizeof(host));
    rc = hca_host_id_get(&host);
    if (rc < 0) {
        fprintf(stderr, PROG ": cannot get the host id: %s\n", strerror(-rc));
        return rc;
    }
    print_host_id(&host);

    /* ports are numbered from 1, as on IB */
    for (port = 1; port <= attr.phys_port_cnt && port <= UINT8_MAX; port++) {
        rc = print_port(dev, (uint8_t)port);
        if (rc < 0)
            return rc;
    }
    if (verbose)
        return print_counters(dev);
    return 0;
}

/* Opens, shows and closes one device; 0 or a negative errno. */
static int show_device(const char *name, int verbose)
{
    hca_device_t *dev = NULL;
    int rc, close_rc;

    rc = hca_device_open(name, 0, &dev);
    if (rc < 0) {
        fprintf(stderr, PROG ": cannot open device '%s': %s\n", name,
                strerror(-rc));
        return rc;
    }
    rc = show_opened_device(dev, verbose);
    close_rc = hca_device_close(dev);
    if (close_rc < 0) {
        fprintf(stderr, PROG ": cannot close device '%s': %s\n", name,
                strerror(-close_rc));
        if (rc == 0)
            rc = close_rc;
    }
    return rc;
}

/* Unknown names are reported with the list of real ones, so a typo is
 * obvious without a second command. */
static void report_unknown(const char *name, char (*names)[HCA_DEVNAME_MAX],
                           int count)
{
    int i;

    fprintf(stderr, PROG ": no such device '%s' (available:", name);
    for (i = 0; i < count; i++)
        fprintf(stderr, " %.*s", HCA_DEVNAME_MAX, names[i]);
    if (count == 0)
        fprintf(stderr, " none");
    fprintf(stderr, ")\n");
}

static int find_device(const char *name, char (*names)[HCA_DEVNAME_MAX],
                       int count)
{
    int i;

    for (i = 0; i < count; i++)
        if (strncmp(names[i], name, HCA_DEVNAME_MAX) == 0)
            return i;
    return -1;
}

int main(int argc, char **argv)
{
    static char names[MAX_DEVICES][HCA_DEVNAME_MAX];
    struct options opt;
    int count, i;

    parse_options(argc, argv, &opt);

    count = hca_get_device_list(names, MAX_DEVICES);
    if (count < 0) {
        fprintf(stderr, PROG ": cannot list devices: %s\n", strerror(-count));
        return 1;
    }
    /* the library reports every device but wrote at most MAX_DEVICES */
    if (count > MAX_DEVICES)
        count = MAX_DEVICES;
    for (i = 0; i < count; i++)
        names[i][HCA_DEVNAME_MAX - 1] = '\0';

    if (opt.dev_name) {
        if (find_device(opt.dev_name, names, count) < 0) {
            report_unknown(opt.dev_name, names, count);
            return 1;
        }
        return show_device(opt.dev_name, opt.verbose) < 0 ? 1 : 0;
    }

    if (count == 0) {
        fprintf(stderr, PROG ": no hca devices found\n");
        return 1;
    }
    for (i = 0; i < count; i++) {
        /* a blank line between devices, as ibv_devinfo does */
        if (i > 0)
            printf("\n");
        if (show_device(names[i], opt.verbose) < 0)
            return 1;
    }
    return 0;
}
