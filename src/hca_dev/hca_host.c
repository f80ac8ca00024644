/*
 * hca_host.c - who is "the same host" for the shm fabric, and process
 * identity (pid + start time, so a reused pid is not taken for a peer).
 */
#include "hca_util.h"
#include "hca_base.h"
#include "hca_wire.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <stdio.h>

uint64_t hca_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t hca_coarse_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint32_t hca_ns_inode(const char *kind)
{
    char path[64];
    struct stat st;

    snprintf(path, sizeof(path), "/proc/self/ns/%s", kind);
    if (stat(path, &st) != 0) {
        return 0;
    }
    return (uint32_t)st.st_ino;
}

static int hca_parse_hex_uuid(const char *text, uint8_t out[16])
{
    int n = 0;

    for (const char *p = text; *p && n < 32; ++p) {
        int v;
        if (*p == '-') {
            continue;
        }
        if (*p >= '0' && *p <= '9') {
            v = *p - '0';
        } else if (*p >= 'a' && *p <= 'f') {
            v = *p - 'a' + 10;
        } else if (*p >= 'A' && *p <= 'F') {
            v = *p - 'A' + 10;
        } else {
            break;
        }
        if (n % 2 == 0) {
            out[n / 2] = (uint8_t)(v << 4);
        } else {
            out[n / 2] |= (uint8_t)v;
        }
        ++n;
    }
    return (n == 32) ? 0 : -EINVAL;
}

int hca_host_id_get(hca_host_id_t *id)
{
    char buf[64] = {0};
    int fd;
    ssize_t n;

    memset(id, 0, sizeof(*id));
    fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return -errno;
    }
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if ((n <= 0) || (hca_parse_hex_uuid(buf, id->boot_id) != 0)) {
        return -EINVAL;
    }
    id->ipc_ns = hca_ns_inode("ipc");
    id->pid_ns = hca_ns_inode("pid");
    id->net_ns = hca_ns_inode("net");
    return 0;
}

/* FNV-1a over the identity, then a final mix (splitmix64's) so that
 * nearby namespace inodes give unrelated keys. */
uint64_t hca_host_key(const hca_host_id_t *id)
{
    uint32_t ns[3] = {id->ipc_ns, id->pid_ns, id->net_ns};
    uint64_t h     = 0xcbf29ce484222325ull;

    for (size_t i = 0; i < sizeof(id->boot_id); ++i) {
        h = (h ^ id->boot_id[i]) * 0x100000001b3ull;
    }
    for (size_t i = 0; i < sizeof(ns); ++i) {
        h = (h ^ ((const uint8_t*)ns)[i]) * 0x100000001b3ull;
    }
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    h ^= h >> 31;
    return h;
}

int hca_host_id_equal(const hca_host_id_t *a, const hca_host_id_t *b)
{
    return (memcmp(a->boot_id, b->boot_id, sizeof(a->boot_id)) == 0) &&
           (a->ipc_ns == b->ipc_ns) && (a->pid_ns == b->pid_ns) &&
           (a->net_ns == b->net_ns);
}

/* Field 22 of /proc/<pid>/stat: start time in clock ticks since boot.
 * A zombie (killed, not yet reaped by its parent) reports -ESRCH: it will
 * never answer again, though kill(pid, 0) still succeeds. */
int hca_proc_start_time(uint32_t pid, uint64_t *start_p)
{
    char path[64], buf[1024];
    const char *p;
    ssize_t n;
    int fd, field;

    snprintf(path, sizeof(path), "/proc/%u/stat", pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return -errno;
    }
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0) {
        return -EIO;
    }
    buf[n] = '\0';
    /* the command name may hold spaces and ')': skip to the last ')' */
    p = strrchr(buf, ')');
    if (p == NULL) {
        return -EIO;
    }
    if ((p[1] == ' ') && ((p[2] == 'Z') || (p[2] == 'X'))) {
        return -ESRCH;
    }
    for (field = 2; field < 22 && *p; ++p) {
        if (*p == ' ') {
            ++field;
        }
    }
    *start_p = strtoull(p, NULL, 10);
    return 0;
}

int hca_port_addr_alive(const hca_port_addr_t *addr)
{
    hca_host_id_t self;
    char name[HCA_OBJ_NAME_MAX];
    hca_memobj_t obj;
    uint64_t start;
    int alive;

    if ((hca_host_id_get(&self) != 0) || (hca_host_key(&self) != addr->host)) {
        return 1; /* not ours to judge: other hosts answer on their link */
    }
    if ((kill((pid_t)addr->pid, 0) != 0) && (errno == ESRCH)) {
        return 0;
    }
    hca_ctx_name(name, sizeof(name), self.pid_ns, addr->pid, addr->ctx_id);
    if (hca_memobj_map(&obj, name, sizeof(hca_ctx_hdr_t)) != 0) {
        return 0; /* its context is closed */
    }
    alive = (hca_proc_start_time(addr->pid, &start) == 0) &&
            (start == ((hca_ctx_hdr_t*)obj.addr)->start_time);
    hca_memobj_destroy(&obj);
    return alive;
}

int hca_claimer_gone(uint64_t mark)
{
    uint32_t pid = (uint32_t)((mark >> 41) & 0x3fffffu);
    uint64_t start;

    /* gone, a zombie, or its pid now another process's */
    return (hca_proc_start_time(pid, &start) != 0) ||
           (((start & 0x1ffffffull) << 16) != (mark & (0x1ffffffull << 16)));
}
