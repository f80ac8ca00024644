/*
 * hca_stats.c - counters per QP and per device context.
 */
#include "hca_base.h"
#include "hca_obj.h"
#include "hca_counters.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdio.h>

void hca_counters_add(hca_counters_t *to, const hca_counters_t *from)
{
    const uint64_t *src = (const uint64_t*)from;
    uint64_t *dst       = (uint64_t*)to;

    _Static_assert(sizeof(hca_counters_t) % sizeof(uint64_t) == 0,
                   "counters are all uint64_t");
    for (size_t i = 0; i < sizeof(*to) / sizeof(uint64_t); ++i) {
        dst[i] += src[i];
    }
}

int hca_device_counters(hca_device_t *dev, hca_counters_t *cnt)
{
    pthread_mutex_lock(&dev->lock);
    *cnt = dev->retired;
    hca_counters_add(cnt, dev->svc_cnt);
    for (uint32_t i = 1; i < HCA_MAX_QP; ++i) {
        if (dev->qps[i] != NULL) {
            hca_counters_t q;

            hca_tally_read(dev->qps[i], &q);
            hca_counters_add(cnt, &q);
        }
    }
    pthread_mutex_unlock(&dev->lock);
    return 0;
}

/* Host-wide totals of closed QPs and contexts of a device:
 * /dev/shm/hca.<pidns>.stats.<dev>.<size>, created by the first user, never
 * removed (it is a counter, like a NIC's).  The size of hca_counters_t is
 * in the name: a library of another layout keeps its own totals, and can
 * never shrink the object under our mapping. */
static void hca_stats_name(char *buf, size_t len, uint32_t pidns,
                           const char *devname)
{
    snprintf(buf, len, "/hca.%u.stats.%s.%zu", pidns, devname,
             sizeof(hca_counters_t));
}

static int hca_stats_map(uint32_t pidns, const char *devname, int create,
                         hca_memobj_t *shm)
{
    struct stat st;
    char name[HCA_OBJ_NAME_MAX];
    int fd;

    hca_stats_name(name, sizeof(name), pidns, devname);
    memset(shm, 0, sizeof(*shm));
    fd = shm_open(name, O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0), 0600);
    if (fd < 0) {
        return -errno;
    }
    /* another user's (planted, or theirs): not ours to count in, and a
     * short one would fault our stores */
    if ((fstat(fd, &st) != 0) || (st.st_uid != geteuid())) {
        close(fd);
        return -EACCES;
    }
    /* every creator sets the same size: a race is harmless */
    if (create && (ftruncate(fd, sizeof(hca_counters_t)) != 0)) {
        close(fd);
        return -errno;
    }
    if (!create && ((size_t)st.st_size < sizeof(hca_counters_t))) {
        close(fd);
        return -EPROTO;
    }
    shm->addr = mmap(NULL, sizeof(hca_counters_t), PROT_READ | PROT_WRITE,
                     MAP_SHARED, fd, 0);
    close(fd);
    if (shm->addr == MAP_FAILED) {
        shm->addr = NULL;
        return -ENOMEM;
    }
    shm->length = sizeof(hca_counters_t);
    return 0;
}

void hca_stats_open(hca_device_t *dev)
{
    if (hca_stats_map(dev->pidns, dev->name, 1, &dev->host_stats) != 0) {
        dev->host_stats.addr = NULL; /* totals are a courtesy */
    }
}

/* Any thread: adds counters of a closing object to the host totals. */
void hca_stats_retire(hca_device_t *dev, const hca_counters_t *cnt)
{
    uint64_t *dst       = dev->host_stats.addr;
    const uint64_t *src = (const uint64_t*)cnt;

    if (dst == NULL) {
        return;
    }
    for (size_t i = 0; i < sizeof(*cnt) / sizeof(uint64_t); ++i) {
        if (src[i] != 0) {
            __atomic_fetch_add(&dst[i], src[i], __ATOMIC_RELAXED);
        }
    }
}

void hca_stats_close(hca_device_t *dev)
{
    hca_stats_retire(dev, dev->svc_cnt);
    hca_memobj_destroy(&dev->host_stats);
}

/* Adds the counters object at offset `off` of the object `name`. */
static void hca_stats_add_object(const char *name, int is_ctx,
                                 hca_counters_t *cnt)
{
    hca_counters_t snap;
    uint64_t off;
    hca_memobj_t obj;

    if (hca_memobj_map(&obj, name, 128) != 0) {
        return;
    }
    /* only objects of our layout: another version's counters differ */
    if (is_ctx) {
        const hca_ctx_hdr_t *hdr = obj.addr;
        off = ((hdr->magic == HCA_WIRE_MAGIC) &&
               (hdr->version == HCA_WIRE_VERSION)) ? hdr->counters_offset : 0;
    } else {
        const hca_qobj_hdr_t *hdr = obj.addr;
        off = ((hdr->magic == HCA_WIRE_MAGIC) &&
               (hdr->resp_offset >= hdr->counters_offset + sizeof(snap))) ?
              hdr->counters_offset : 0;
    }
    if ((off != 0) && (off + sizeof(snap) <= obj.length)) {
        memcpy(&snap, (uint8_t*)obj.addr + off, sizeof(snap));
        hca_counters_add(cnt, &snap);
    }
    hca_memobj_destroy(&obj);
}

int hca_host_counters(const char *devname, hca_counters_t *cnt)
{
    uint32_t pidns = hca_ns_inode("pid");
    struct dirent *de;
    hca_memobj_t obj;
    char path[300];
    DIR *dir;

    memset(cnt, 0, sizeof(*cnt));
    if ((devname == NULL) || (strncmp(devname, "hca", 3) != 0)) {
        return -ENODEV;
    }
    {
        char names[64][HCA_DEVNAME_MAX];
        int n = hca_get_device_list(names, 64), found = 0;
        for (int i = 0; i < n && i < 64; ++i) {
            found |= (strcmp(names[i], devname) == 0);
        }
        if (!found) {
            return -ENODEV;
        }
    }
    if (hca_stats_map(pidns, devname, 0, &obj) == 0) {
        hca_counters_add(cnt, obj.addr);
        hca_memobj_destroy(&obj);
    }
    /* and what live contexts have not retired yet (every device of the
     * host shares the shm namespace: contexts name their device in the
     * ctx header only by the stats they retire, so live objects count
     * for every device - one device per node is the common case) */
    dir = opendir("/dev/shm");
    if (dir == NULL) {
        return 0;
    }
    while ((de = readdir(dir)) != NULL) {
        unsigned ns, pid, ctx, nonce;
        int pos = 0, kind = 0;

        if ((sscanf(de->d_name, "hca.%u.%u.%u.%n", &ns, &pid, &ctx, &pos) !=
             3) || (pos == 0) || (ns != pidns)) {
            continue;
        }
        snprintf(path, sizeof(path), "/%s", de->d_name);
        if (strcmp(de->d_name + pos, "ctx0") == 0) {
            hca_stats_add_object(path, 1, cnt);
            continue;
        }
        /* the other objects have the nonce before their kind
         * (hca_memobj.c): <nonce>.q<id> is a QP's */
        if ((sscanf(de->d_name + pos, "%8x.%n", &nonce, &kind) == 1) &&
            (kind != 0) && (de->d_name[pos + kind] == 'q')) {
            hca_stats_add_object(path, 0, cnt);
        }
    }
    closedir(dir);
    return 0;
}
