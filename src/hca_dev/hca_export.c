/*
 * hca_export.c - the export table: shared objects outside hca (sysv
 * segments, shared files, memfds) that back registered memory, published
 * in the ctx object so that peers on this host map them and reach the
 * memory directly, as they reach device memory (hca_wire.h "exports").
 *
 * One export per object, shared by every MR inside it and withdrawn with
 * the last; its id is never reused, so a peer's mapping cached by id is
 * never taken for another object.  Finding the object costs a read of
 * /proc/self/maps, at registration only (UCX's rcache keeps
 * registrations).  HCA_EXPORT=0 turns exports off: peers then reach such
 * memory as any other (CMA or the responder).
 */
#include "hca_base.h"
#include "hca_obj.h"
#include "hca_state.h"

#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

static int hca_export_same(const struct hca_export *ex,
                           const hca_export_entry_t *e)
{
    if (ex->kind != e->kind) {
        return 0;
    }
    if (e->kind == HCA_EXPORT_SYSV) {
        return (ex->handle == e->handle) && (ex->stamp == e->stamp);
    }
    return (ex->dev == e->dev) && (ex->ino == e->ino);
}

static struct hca_export *hca_export_find(hca_device_t *dev,
                                          const hca_export_entry_t *e)
{
    for (struct hca_export *ex = dev->export_list; ex != NULL;
         ex = ex->next) {
        if (hca_export_same(ex, e)) {
            return ex;
        }
    }
    return NULL;
}

/* One more MR in ex if [offset, offset+length) lies in what peers map of
 * it (a file that grew since keeps its export for what it was), else
 * NULL: no export for that MR (dev->lock). */
static struct hca_export *hca_export_hold(struct hca_export *ex,
                                          uint64_t offset, uint64_t length)
{
    if ((offset > ex->size) || (length > ex->size - offset)) {
        return NULL;
    }
    ex->refs++;
    return ex;
}

/* File exports hold a descriptor each: at most a quarter of the
 * process's limit, so that the application's own open() never fails for
 * them. */
static uint32_t hca_export_fd_cap(void)
{
    struct rlimit rl;

    if ((getrlimit(RLIMIT_NOFILE, &rl) != 0) ||
        (rl.rlim_cur == RLIM_INFINITY)) {
        return HCA_MAX_EXPORT / 4;
    }
    return (uint32_t)((rl.rlim_cur / 4 < HCA_MAX_EXPORT) ? rl.rlim_cur / 4 :
                                                          HCA_MAX_EXPORT);
}

/* Publishes e under a new id in a free slot (dev->lock): 0, or -ENOSPC. */
static int hca_export_publish(hca_device_t *dev, hca_export_entry_t *e,
                              uint32_t *id_p)
{
    for (uint32_t n = 0; n < HCA_MAX_EXPORT; ++n) {
        uint32_t id = HCA_DM_EXPORT |
                      ((dev->next_export + n) & ~HCA_DM_EXPORT);
        hca_export_entry_t *slot = &dev->exports[id % HCA_MAX_EXPORT];

        if ((id == HCA_DM_EXPORT) ||
            (atomic_load_explicit(&slot->id, memory_order_relaxed) != 0)) {
            continue;
        }
        /* after the id 0 of its withdrawal: a reader that copies these
         * while we write them sees another id on its second load */
        atomic_thread_fence(memory_order_release);
        slot->kind   = e->kind;
        slot->handle = e->handle;
        slot->dev    = e->dev;
        slot->ino    = e->ino;
        slot->size   = e->size;
        slot->stamp  = e->stamp;
        atomic_store_explicit(&slot->id, id, memory_order_release);
        dev->next_export = (id & ~HCA_DM_EXPORT) + 1;
        *id_p            = id;
        return 0;
    }
    return -ENOSPC;
}

struct hca_export *hca_export_get(hca_device_t *dev, uintptr_t addr,
                                  size_t length, uint64_t *offset_p)
{
    struct hca_export *ex;
    hca_export_entry_t e;
    hca_backing_t b;
    int fd;

    if (!dev->export_on || !dev->fabric_open[HCA_FABRIC_SHM] ||
        (hca_backing_find(addr, length, &b) != 0)) {
        return NULL;
    }
    /* an object exported already: no new descriptor (sysv needs none) */
    e.kind   = b.kind;
    e.handle = b.handle;
    e.dev    = b.dev;
    e.ino    = b.ino;
    e.stamp  = 0;
    pthread_mutex_lock(&dev->lock);
    if ((b.kind == HCA_EXPORT_FILE) &&
        ((ex = hca_export_find(dev, &e)) != NULL)) {
        ex = hca_export_hold(ex, b.offset, length);
        pthread_mutex_unlock(&dev->lock);
        *offset_p = b.offset;
        return ex;
    }
    if ((b.kind == HCA_EXPORT_FILE) && (dev->export_fds >= hca_export_fd_cap())) {
        pthread_mutex_unlock(&dev->lock);
        return NULL; /* the application's descriptors come first */
    }
    pthread_mutex_unlock(&dev->lock);

    if (hca_backing_export(&b, length, &e, &fd) != 0) {
        return NULL;
    }
    pthread_mutex_lock(&dev->lock);
    ex = hca_export_find(dev, &e);
    if (ex != NULL) {
        ex = hca_export_hold(ex, b.offset, length);
        pthread_mutex_unlock(&dev->lock);
        if (fd >= 0) {
            close(fd); /* another registration exported it meanwhile */
        }
        *offset_p = b.offset;
        return ex;
    }
    ex = calloc(1, sizeof(*ex));
    if ((ex == NULL) || (hca_export_publish(dev, &e, &ex->id) != 0)) {
        pthread_mutex_unlock(&dev->lock);
        free(ex);
        if (fd >= 0) {
            close(fd);
        }
        return NULL;
    }
    ex->refs         = 1;
    ex->kind         = e.kind;
    ex->handle       = e.handle;
    ex->dev          = e.dev;
    ex->ino          = e.ino;
    ex->stamp        = e.stamp;
    ex->size         = e.size;
    ex->fd           = fd;
    dev->export_fds += (fd >= 0);
    ex->next         = dev->export_list;
    dev->export_list = ex;
    pthread_mutex_unlock(&dev->lock);
    *offset_p = b.offset;
    return ex;
}

static void hca_export_withdraw(hca_device_t *dev, struct hca_export *ex)
{
    hca_export_entry_t *slot = &dev->exports[ex->id % HCA_MAX_EXPORT];

    /* peers that mapped it keep their mapping (their accesses are
     * checked against the MPT, whose entries in it are gone); new ones
     * no longer find it */
    atomic_store_explicit(&slot->id, 0, memory_order_release);
    if (ex->fd >= 0) {
        close(ex->fd);
        dev->export_fds--;
    }
    free(ex);
}

void hca_export_put(hca_device_t *dev, struct hca_export *ex)
{
    struct hca_export **pp;

    if (--ex->refs != 0) {
        return;
    }
    for (pp = &dev->export_list; *pp != ex; pp = &(*pp)->next) {
    }
    *pp = ex->next;
    hca_export_withdraw(dev, ex);
}

void hca_exports_destroy(hca_device_t *dev)
{
    pthread_mutex_lock(&dev->lock);
    while (dev->export_list != NULL) {
        struct hca_export *ex = dev->export_list;

        dev->export_list = ex->next;
        hca_export_withdraw(dev, ex);
    }
    pthread_mutex_unlock(&dev->lock);
}
