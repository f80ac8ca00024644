/*
 * hca_memobj.c - POSIX shared-memory objects of a device context: naming, creation
 * (mode 0600, on the device's NUMA node), mapping by peers, removal on
 * close, and reclaiming the objects of owners that died.
 *
 * Names: /dev/shm/hca.<pidns>.<pid>.<ctx>.ctx0 for the context, and
 * /dev/shm/hca.<pidns>.<pid>.<ctx>.<nonce>.<kind><id> for the others,
 * where nonce is random and published in the context's header: another
 * user can plant a context name (the owner then takes another context
 * id), but not the others.  The owner creates "ctx" first and removes it
 * last, so a ctx object that exists tells a live owner (pid + start time
 * in its header) from a dead one.  Objects are 0600 and only mapped if
 * they belong to our user.
 */
#include "hca_log.h"
#include "hca_base.h"
#include "hca_wire.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <numa.h>
#include <numaif.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/stat.h>
#include <unistd.h>

void hca_ctx_name(char *buf, size_t len, uint32_t pidns, uint32_t pid,
                  uint32_t ctx)
{
    snprintf(buf, len, "/hca.%u.%u.%u.ctx0", pidns, pid, ctx);
}

void hca_obj_name(char *buf, size_t len, uint32_t pidns, uint32_t pid,
                  uint32_t ctx, uint32_t nonce, const char *kind, uint64_t id)
{
    snprintf(buf, len, "/hca.%u.%u.%u.%08x.%s%llu", pidns, pid, ctx, nonce,
             kind, (unsigned long long)id);
}

int hca_memobj_create(hca_memobj_t *obj, const char *name, size_t length,
                   int numa_node)
{
    int fd, rc;

    memset(obj, 0, sizeof(*obj));
    fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if ((fd < 0) && (errno == EEXIST)) {
        /* a leftover of an earlier process with our pid; if it cannot be
         * removed it is another user's (/dev/shm is sticky): -EEXIST,
         * and the caller picks another name */
        if (shm_unlink(name) != 0) {
            return -EEXIST;
        }
        fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    }
    if (fd < 0) {
        rc = -errno;
        hca_log("shm_open(%s) failed: %s", name, strerror(errno));
        return rc;
    }
    if (ftruncate(fd, (off_t)length) != 0) {
        rc = -errno;
        goto err_unlink;
    }
    obj->addr = mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                     0);
    if (obj->addr == MAP_FAILED) {
        rc = -errno;
        goto err_unlink;
    }
    close(fd);
    if ((numa_node >= 0) && (numa_available() >= 0)) {
        /* before first touch, so the pages come from the device's node */
        numa_tonode_memory(obj->addr, length, numa_node);
    }
    obj->length = length;
    obj->owner  = 1;
    snprintf(obj->name, sizeof(obj->name), "%s", name);
    return 0;

err_unlink:
    close(fd);
    shm_unlink(name);
    obj->addr = NULL;
    return rc;
}

int hca_memobj_map(hca_memobj_t *obj, const char *name, size_t min_length)
{
    struct stat st;
    int fd, rc;

    memset(obj, 0, sizeof(*obj));
    fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) {
        return -errno;
    }
    if (fstat(fd, &st) != 0) {
        rc = -errno;
        close(fd);
        return rc;
    }
    if ((st.st_uid != geteuid()) || (st.st_mode & 077)) {
        /* not made by a process of our user, or open to others: one
         * planted by someone else (root included: hca connects the
         * processes of one user, both ways) */
        close(fd);
        return -EACCES;
    }
    if ((size_t)st.st_size < min_length) {
        close(fd);
        return -EPROTO;
    }
    obj->addr = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE,
                     MAP_SHARED, fd, 0);
    rc        = -errno;
    close(fd);
    if (obj->addr == MAP_FAILED) {
        obj->addr = NULL;
        return rc;
    }
    obj->length = (size_t)st.st_size;
    obj->owner  = 0;
    snprintf(obj->name, sizeof(obj->name), "%s", name);
    return 0;
}

void hca_memobj_destroy(hca_memobj_t *obj)
{
    if (obj->addr != NULL) {
        if (obj->sysv) {
            shmdt(obj->addr);
        } else {
            munmap(obj->addr, obj->length);
        }
        obj->addr = NULL;
    }
    if (obj->owner) {
        shm_unlink(obj->name);
        obj->owner = 0;
    }
}

/* 1 if the objects of (pid, ctx) belong to a dead owner. */
static int hca_memobj_owner_dead(uint32_t pidns, uint32_t pid, uint32_t ctx)
{
    char name[HCA_OBJ_NAME_MAX];
    hca_memobj_t obj;
    uint64_t start;
    int dead;

    if ((kill((pid_t)pid, 0) != 0) && (errno == ESRCH)) {
        return 1;
    }
    hca_ctx_name(name, sizeof(name), pidns, pid, ctx);
    if (hca_memobj_map(&obj, name, sizeof(hca_ctx_hdr_t)) != 0) {
        return 0; /* being created or closed by a live owner */
    }
    /* magic is written last at creation and cleared first at close: a
     * header without it belongs to a live owner that is opening or
     * closing, whatever its start_time says yet */
    dead = (((hca_ctx_hdr_t*)obj.addr)->magic == HCA_WIRE_MAGIC) &&
           ((hca_proc_start_time(pid, &start) != 0) ||
            (start != ((hca_ctx_hdr_t*)obj.addr)->start_time));
    hca_memobj_destroy(&obj);
    return dead;
}

void hca_memobj_reclaim(uint32_t pidns, uint32_t self_pid, int first_open)
{
    DIR *dir = opendir("/dev/shm");
    struct dirent *de;
    char path[300];

    if (dir == NULL) {
        return;
    }
    while ((de = readdir(dir)) != NULL) {
        unsigned ns, pid, ctx;
        int pos = 0;

        if ((sscanf(de->d_name, "hca.%u.%u.%u.%n", &ns, &pid, &ctx, &pos)
             != 3) || (pos == 0) || (ns != pidns)) {
            continue;
        }
        if (pid == self_pid) {
            if (!first_open) {
                continue; /* our own live contexts */
            }
        } else if (!hca_memobj_owner_dead(pidns, pid, ctx)) {
            continue;
        }
        snprintf(path, sizeof(path), "/%s", de->d_name);
        shm_unlink(path);
    }
    closedir(dir);
}
