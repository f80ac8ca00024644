/*
 * hca_backing.c - what backs a range of this process's memory, and the
 * mapping of such an object by another process of the host.
 *
 * Memory that hca did not allocate is often shared already: UCX's sysv
 * and posix allocators, an MPI's shared windows, shm_open, a memfd, a
 * MAP_SHARED file.  The owner finds the object in /proc/self/maps at
 * registration, and publishes how a peer opens it (hca_export_entry_t):
 * a sysv segment by its shmid, a file through an fd the owner holds open
 * (/proc/<pid>/fd/<fd>, which also reaches unlinked files and memfds).  A
 * peer then maps the whole object and accesses it with loads and stores,
 * under the MPT's checks.  Anything else (private or anonymous memory, a
 * range over several objects, a read-only mapping) has no backing here:
 * the caller takes another route.
 *
 * A peer checks what it opened against what the owner published (the
 * file's device and inode, the segment's creator and size) and that it
 * belongs to our user: a file descriptor or shmid reused in between, or
 * an object of someone else, is never mapped.
 */
#include "hca_base.h"
#include "hca_wire.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

/* One line of /proc/self/maps. */
typedef struct hca_vma {
    uint64_t start, end, offset, ino;
    unsigned major, minor;
    char     perms[8];
    const char *path;           /* into the line; "" if none */
} hca_vma_t;

static int hca_vma_parse(char *line, hca_vma_t *vma)
{
    unsigned long long start, end, offset, ino;
    size_t n;
    int pos = 0;

    if ((sscanf(line, "%llx-%llx %7s %llx %x:%x %llu %n", &start, &end,
                vma->perms, &offset, &vma->major, &vma->minor, &ino, &pos)
         != 7) || (pos == 0)) {
        return -1;
    }
    vma->start  = start;
    vma->end    = end;
    vma->offset = offset;
    vma->ino    = ino;
    vma->path   = line + pos;
    n           = strlen(vma->path);
    if ((n > 0) && (line[pos + n - 1] == '\n')) {
        line[pos + n - 1] = '\0';
    }
    return 0;
}

/* Shared, readable and writable: what a peer's read, write and atomic
 * need (a read-only mapping takes another route). */
static int hca_vma_shared_rw(const hca_vma_t *vma)
{
    return (vma->perms[0] == 'r') && (vma->perms[1] == 'w') &&
           (vma->perms[3] == 's') && (vma->ino != 0);
}

/* The next VMA continues the object of `first` if it starts where the
 * last one ended, at the file offset that follows. */
static int hca_vma_continues(const hca_vma_t *first, const hca_vma_t *prev,
                             const hca_vma_t *next)
{
    return (next->start == prev->end) &&
           (next->offset == prev->offset + (prev->end - prev->start)) &&
           (next->ino == first->ino) && (next->major == first->major) &&
           (next->minor == first->minor) && hca_vma_shared_rw(next) &&
           (strcmp(next->path, first->path) == 0);
}

static const char hca_deleted_suffix[] = " (deleted)";

/* 1 if the page at addr is private anonymous memory in RAM (the heap, a
 * stack, malloc's mmaps): /proc/self/pagemap's entry says present and not
 * "file page or shared anonymous" (bit 61).  One pread instead of reading
 * every line of /proc/self/maps, for the memory most registrations are
 * of; anything else (not yet touched, swapped, unreadable) is looked up
 * in the maps. */
#define HCA_PAGEMAP_PRESENT     (1ull << 63)
#define HCA_PAGEMAP_FILE_SHARED (1ull << 61)

static pthread_mutex_t hca_pagemap_lock = PTHREAD_MUTEX_INITIALIZER;
static int             hca_pagemap_fd   = -1;
static pid_t           hca_pagemap_pid  = -1; /* whose pagemap it is: a
                                                 forked child inherits
                                                 its parent's fd */

static int hca_page_is_private_anon(uintptr_t addr)
{
    long page = sysconf(_SC_PAGESIZE);
    pid_t self = getpid();
    uint64_t entry;
    ssize_t n = -1;

    pthread_mutex_lock(&hca_pagemap_lock);
    if (hca_pagemap_pid != self) {
        /* the parent's fd is left alone: after a fork its number may
         * have been closed and taken by something else */
        hca_pagemap_fd  = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
        hca_pagemap_pid = self;
    }
    if ((hca_pagemap_fd >= 0) && (page > 0)) {
        n = pread(hca_pagemap_fd, &entry, sizeof(entry),
                  (off_t)((addr / (uintptr_t)page) * sizeof(entry)));
    }
    pthread_mutex_unlock(&hca_pagemap_lock);
    if (n != (ssize_t)sizeof(entry)) {
        return 0;
    }
    return (entry & HCA_PAGEMAP_PRESENT) &&
           !(entry & HCA_PAGEMAP_FILE_SHARED);
}

int hca_backing_find(uintptr_t addr, size_t length, hca_backing_t *b)
{
    uint64_t end = (uint64_t)addr + length;
    hca_vma_t first = {0}, prev = {0}, vma = {0};
    char *line = NULL, *first_line = NULL;
    size_t cap = 0;
    int found  = 0, rc = -ENOENT;
    FILE *maps;

    memset(b, 0, sizeof(*b));
    if ((length == 0) || hca_page_is_private_anon(addr)) {
        return -ENOENT;
    }
    maps = fopen("/proc/self/maps", "re");
    if (maps == NULL) {
        return -errno;
    }
    while (getline(&line, &cap, maps) > 0) {
        if (hca_vma_parse(line, &vma) != 0) {
            continue;
        }
        if (!found) {
            if ((addr < vma.start) || (addr >= vma.end)) {
                continue;
            }
            if (!hca_vma_shared_rw(&vma)) {
                break; /* private or read-only */
            }
            /* keep the first line: its path is compared with the next */
            first_line = strdup(line);
            if (first_line == NULL) {
                rc = -ENOMEM;
                break;
            }
            first      = vma;
            first.path = first_line + (vma.path - line);
            found      = 1;
        } else if (!hca_vma_continues(&first, &prev, &vma)) {
            break; /* a hole, or another object */
        }
        prev = vma;
        if (end <= vma.end) {
            rc = 0;
            break;
        }
    }
    fclose(maps);
    free(line);
    if (rc != 0) {
        free(first_line);
        return rc;
    }

    b->offset = first.offset + ((uint64_t)addr - first.start);
    b->dev    = makedev(first.major, first.minor);
    b->ino    = first.ino;
    snprintf(b->path, sizeof(b->path), "%s", first.path);
    free(first_line);
    {
        size_t n = strlen(b->path), s = sizeof(hca_deleted_suffix) - 1;

        if ((n > s) && (strcmp(b->path + n - s, hca_deleted_suffix) == 0)) {
            b->path[n - s] = '\0';
            b->deleted     = 1;
        }
    }
    /* a sysv segment shows as /SYSV<key, 8 hex digits> (deleted), on the
     * kernel's internal shm mount (major 0), with its shmid as inode */
    {
        unsigned key;
        int end = 0;

        if ((sscanf(b->path, "/SYSV%8x%n", &key, &end) == 1) &&
            (end == 13) && (b->path[13] == '\0') && b->deleted &&
            (major(b->dev) == 0)) {
            b->kind    = HCA_EXPORT_SYSV;
            b->handle  = b->ino;
            b->sysv_key = key;
            return 0;
        }
    }
    if (strncmp(b->path, "/SYSV", 5) == 0) {
        return -ENOENT; /* looks like one, is not: never guessed at */
    }
    if (b->path[0] == '/') {
        b->kind = HCA_EXPORT_FILE;
    } else {
        return -ENOENT; /* [anon_shmem] and the like: nothing to open */
    }
    return 0;
}

/* ------------------------------------------------------------- owner */

static int hca_fd_is(int fd, uint64_t dev, uint64_t ino)
{
    struct stat st;

    return (fstat(fd, &st) == 0) && S_ISREG(st.st_mode) &&
           ((uint64_t)st.st_dev == dev) && ((uint64_t)st.st_ino == ino);
}

/* An fd of our own on the file: by its path if it still has one, else
 * reopened from a descriptor of the process that has it open (a memfd, an
 * unlinked shm object). */
static int hca_backing_open_file(const hca_backing_t *b)
{
    char path[300];
    struct dirent *de;
    struct stat st;
    DIR *dir;
    int fd;

    /* the path first, if it is still the file: never opened otherwise (a
     * device node or a FIFO would act on the open) */
    if (!b->deleted && (stat(b->path, &st) == 0) && S_ISREG(st.st_mode) &&
        ((uint64_t)st.st_dev == b->dev) && ((uint64_t)st.st_ino == b->ino)) {
        fd = open(b->path, O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
        if (fd >= 0) {
            if (hca_fd_is(fd, b->dev, b->ino)) {
                return fd;
            }
            close(fd);
        }
    }
    dir = opendir("/proc/self/fd");
    if (dir == NULL) {
        return -errno;
    }
    fd = -ENOENT;
    while ((de = readdir(dir)) != NULL) {
        if (de->d_name[0] == '.') {
            continue;
        }
        snprintf(path, sizeof(path), "/proc/self/fd/%s", de->d_name);
        if ((stat(path, &st) != 0) || !S_ISREG(st.st_mode) ||
            ((uint64_t)st.st_dev != b->dev) ||
            ((uint64_t)st.st_ino != b->ino)) {
            continue;
        }
        fd = open(path, O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
        if ((fd >= 0) && !hca_fd_is(fd, b->dev, b->ino)) {
            close(fd);
            fd = -ENOENT;
        }
        if (fd >= 0) {
            break;
        }
        fd = -ENOENT;
    }
    closedir(dir);
    return fd;
}

int hca_backing_export(const hca_backing_t *b, uint64_t length,
                       hca_export_entry_t *e, int *fd_p)
{
    uint64_t end = b->offset + length;
    struct shmid_ds ds;
    struct stat st;
    int fd;

    memset(e, 0, sizeof(*e));
    *fd_p = -1;
    if (end < b->offset) {
        return -EINVAL;
    }
    if (b->kind == HCA_EXPORT_SYSV) {
        if ((b->handle > INT32_MAX) ||
            (shmctl((int)b->handle, IPC_STAT, &ds) != 0) ||
            ((unsigned)ds.shm_perm.__key != b->sysv_key) ||
            ((uint64_t)ds.shm_segsz < end)) {
            return -ENOENT;
        }
        e->kind   = HCA_EXPORT_SYSV;
        e->handle = b->handle;
        e->size   = ds.shm_segsz;
        e->stamp  = (uint64_t)ds.shm_cpid;
        return 0;
    }
    if (b->kind != HCA_EXPORT_FILE) {
        return -ENOENT;
    }
    fd = hca_backing_open_file(b);
    if (fd < 0) {
        return fd;
    }
    if ((fstat(fd, &st) != 0) || ((uint64_t)st.st_size < end)) {
        close(fd);
        return -ENOENT;
    }
    e->kind   = HCA_EXPORT_FILE;
    e->handle = (uint64_t)fd;
    e->dev    = b->dev;
    e->ino    = b->ino;
    e->size   = (uint64_t)st.st_size;
    *fd_p     = fd;
    return 0;
}

/* -------------------------------------------------------------- peer */

int hca_backing_map(const hca_export_entry_t *e, uint32_t owner_pid,
                    hca_memobj_t *obj)
{
    char path[64];
    struct shmid_ds ds;
    struct stat st;
    void *addr;
    int fd, rc;

    memset(obj, 0, sizeof(*obj));
    if ((e->size == 0) || (e->size > HCA_BACKING_MAX_SIZE)) {
        return -EPROTO;
    }
    if (e->kind == HCA_EXPORT_SYSV) {
        if ((e->handle > INT32_MAX) ||
            (shmctl((int)e->handle, IPC_STAT, &ds) != 0)) {
            return -ENOENT;
        }
        if ((ds.shm_perm.uid != geteuid()) ||
            ((uint64_t)ds.shm_cpid != e->stamp) ||
            ((uint64_t)ds.shm_segsz != e->size)) {
            return -EACCES; /* another segment, or someone else's */
        }
        addr = shmat((int)e->handle, NULL, 0);
        if (addr == (void*)-1) {
            return -errno;
        }
        obj->addr   = addr;
        obj->length = e->size;
        obj->sysv   = 1;
        return 0;
    }
    if ((e->kind != HCA_EXPORT_FILE) || (e->handle > INT32_MAX)) {
        return -EPROTO;
    }
    snprintf(path, sizeof(path), "/proc/%u/fd/%u", owner_pid,
             (unsigned)e->handle);
    /* what the descriptor is now, before it is opened: the owner may have
     * withdrawn the export and the number gone to a device or a FIFO,
     * which an open would act on */
    if ((stat(path, &st) != 0) || !S_ISREG(st.st_mode) ||
        ((uint64_t)st.st_dev != e->dev) || ((uint64_t)st.st_ino != e->ino)) {
        return -EACCES;
    }
    fd = open(path, O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        return -errno;
    }
    if ((fstat(fd, &st) != 0) || !S_ISREG(st.st_mode) ||
        ((uint64_t)st.st_dev != e->dev) || ((uint64_t)st.st_ino != e->ino) ||
        (st.st_uid != geteuid()) || ((uint64_t)st.st_size < e->size)) {
        close(fd);
        return -EACCES; /* the fd was reused, or the file is not ours */
    }
    addr = mmap(NULL, e->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    rc   = -errno;
    close(fd);
    if (addr == MAP_FAILED) {
        return rc;
    }
    obj->addr   = addr;
    obj->length = e->size;
    return 0;
}
