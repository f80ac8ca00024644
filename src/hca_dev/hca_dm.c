/*
 * hca_dm.c - device memory: a shared-memory object of the context, which
 * peers on this host map, so that its MRs give them direct loads, stores
 * and CPU atomics (hca_dev.h "Device memory").
 */
#include "hca_base.h"
#include "hca_obj.h"
#include "hca_state.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

hca_dm_t *hca_dm_find(hca_device_t *dev, uintptr_t addr, size_t length)
{
    for (hca_dm_t *dm = dev->dm_list; dm != NULL; dm = dm->next) {
        uintptr_t base = (uintptr_t)dm->obj.addr;
        if ((addr >= base) && (addr - base <= dm->length) &&
            (length <= dm->length - (addr - base))) {
            return dm;
        }
    }
    return NULL;
}

int hca_dm_alloc(hca_device_t *dev, size_t length, hca_dm_t **dm_p)
{
    char name[HCA_OBJ_NAME_MAX];
    hca_dm_t *dm;
    int rc;

    if ((length == 0) || (length > HCA_MAX_DM_SIZE)) {
        return -EINVAL;
    }
    dm = calloc(1, sizeof(*dm));
    if (dm == NULL) {
        return -ENOMEM;
    }
    pthread_mutex_lock(&dev->lock);
    dm->id = dev->next_dm_id++;   /* never reused: peers cache by id */
    pthread_mutex_unlock(&dev->lock);

    hca_obj_name(name, sizeof(name), dev->pidns, dev->pid, dev->ctx_id,
                 dev->name_nonce, "dm", dm->id);
    rc = hca_memobj_create(&dm->obj, name, length, dev->numa_node);
    if (rc != 0) {
        free(dm);
        return rc;
    }
    dm->dev    = dev;
    dm->length = length;
    pthread_mutex_lock(&dev->lock);
    dm->next     = dev->dm_list;
    dev->dm_list = dm;
    pthread_mutex_unlock(&dev->lock);
    *dm_p = dm;
    return 0;
}

static void hca_dm_unlink_locked(hca_dm_t *dm)
{
    for (hca_dm_t **pp = &dm->dev->dm_list; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == dm) {
            *pp = dm->next;
            break;
        }
    }
}

void hca_dm_destroy(hca_dm_t *dm)
{
    hca_memobj_destroy(&dm->obj);
    free(dm);
}

/*
 * With MRs inside still registered, the memory stays until the last of
 * them is deregistered (hca_mr_dereg), then goes: a registration cache
 * above us (UCP's, for a range inside memory this md allocated) gives its
 * regions back only when the memory is unmapped or the cache closes, so
 * refusing here would keep the memory for the process's life.  Their keys
 * stay valid until then, as for any registered memory its user freed.
 */
int hca_dm_free(hca_dm_t *dm)
{
    hca_device_t *dev = dm->dev;

    pthread_mutex_lock(&dev->lock);
    if (dm->mrs != 0) {
        dm->freed = 1;
        pthread_mutex_unlock(&dev->lock);
        return 0;
    }
    hca_dm_unlink_locked(dm);
    pthread_mutex_unlock(&dev->lock);
    hca_dm_destroy(dm);
    return 0;
}

int hca_dm_last_mr_locked(hca_dm_t *dm)
{
    if ((dm->mrs != 0) || !dm->freed) {
        return 0;
    }
    hca_dm_unlink_locked(dm);
    return 1;
}

void *hca_dm_addr(const hca_dm_t *dm)
{
    return dm->obj.addr;
}

size_t hca_dm_length(const hca_dm_t *dm)
{
    return dm->length;
}

