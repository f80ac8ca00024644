/*
 * hca_shm_dm_view.c - a peer's device memory mapped into this process for
 * direct loads and stores (UCT's rkey_ptr), with the peer's MPT beside it,
 * so that every pointer handed out is checked as any other access is: the
 * key (index and tag), the entry's state, that the MR lies in this device
 * memory, the remote read and write rights, and the range.
 *
 * A pointer handed out stays a valid mapping until the view is closed,
 * whatever the owner does (deregistering the MR, freeing the memory,
 * exiting): its loads and stores never fault.  It carries no right beyond
 * the registration, though: after the owner deregistered the MR, loads
 * and stores through an earlier pointer are the user's race, as with
 * UCX's posix and xpmem rkey_ptr, whose mappings also live with the
 * unpacked rkey and not with the registration.
 */
#include "hca_shm_fabric.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

typedef struct hca_shm_dm_view {
    struct hca_dm_view     base;   /* first: the registry's handle */
    hca_memobj_t           dm;
    hca_memobj_t              ctx;
    const hca_mpt_entry_t *mpt;
    uint32_t               max_mr;
    uint32_t               dm_id;
} hca_shm_dm_view_t;

HCA_INLINE hca_shm_dm_view_t *hca_shm_dm_view(hca_dm_view_t *view)
{
    return (hca_shm_dm_view_t*)(void*)view;
}

int hca_shm_dm_view_open(const hca_port_addr_t *addr, uint32_t dm_id,
                         hca_dm_view_t **view_p)
{
    hca_host_id_t self;
    hca_shm_dm_view_t *view;
    hca_ctx_hdr_t hdr;
    char name[HCA_OBJ_NAME_MAX];
    int rc;

    if ((hca_host_id_get(&self) != 0) || (hca_host_key(&self) != addr->host)) {
        return -EHOSTUNREACH;
    }
    if (dm_id == 0) {
        return -EINVAL;
    }
    view = calloc(1, sizeof(*view));
    if (view == NULL) {
        return -ENOMEM;
    }
    hca_ctx_name(name, sizeof(name), self.pid_ns, addr->pid, addr->ctx_id);
    rc = hca_memobj_map(&view->ctx, name, sizeof(hdr));
    if (rc != 0) {
        goto err;
    }
    memcpy(&hdr, view->ctx.addr, sizeof(hdr)); /* once: the owner's */
    if ((hdr.magic != HCA_WIRE_MAGIC) || (hdr.version != HCA_WIRE_VERSION) ||
        (hdr.pid != addr->pid) || (hdr.ctx_id != addr->ctx_id) ||
        (hdr.max_mr == 0) || (hdr.max_mr > HCA_MAX_MR) ||
        (hdr.mpt_offset > view->ctx.length) ||
        (sizeof(hca_mpt_entry_t) * hdr.max_mr >
         view->ctx.length - hdr.mpt_offset)) {
        rc = -EPROTO;
        goto err;
    }
    hca_obj_name(name, sizeof(name), self.pid_ns, addr->pid,
                 addr->ctx_id, hdr.name_nonce, "dm", dm_id);
    rc = hca_memobj_map(&view->dm, name, 1);
    if (rc != 0) {
        goto err;
    }
    view->mpt    = (const hca_mpt_entry_t*)((uint8_t*)view->ctx.addr +
                                            hdr.mpt_offset);
    view->max_mr = hdr.max_mr;
    view->dm_id  = dm_id;
    *view_p      = &view->base; /* the registry names the fabric */
    return 0;

err:
    hca_memobj_destroy(&view->ctx);
    free(view);
    return rc;
}

int hca_shm_dm_view_ptr(hca_dm_view_t *handle, uint32_t rkey,
                        uint64_t remote_addr, void **ptr_p)
{
    hca_shm_dm_view_t *view = hca_shm_dm_view(handle);
    const unsigned need     = HCA_RKEY_PTR_ACCESS;
    uint32_t index      = hca_key_index(rkey);
    const hca_mpt_entry_t *entry;
    uint64_t addr, length, dm_off;

    if ((index == 0) || (index >= view->max_mr)) {
        return -EACCES;
    }
    entry = &view->mpt[index];
    if ((atomic_load_explicit(&entry->state, memory_order_acquire) !=
         HCA_MPT_VALID) ||
        (atomic_load_explicit(&entry->key, memory_order_acquire) != rkey)) {
        return -EACCES; /* stale, wrong or never registered */
    }
    /* each field read once: the owner may change them under us */
    addr   = entry->addr;
    length = entry->length;
    dm_off = entry->dm_offset;
    if ((entry->dm_id != view->dm_id) || ((entry->access & need) != need) ||
        (remote_addr < addr) || (remote_addr - addr >= length)) {
        return -EACCES;
    }
    if ((dm_off > view->dm.length) || (length > view->dm.length - dm_off)) {
        return -EACCES;
    }
    /* the entry may have changed between our loads: the key again */
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&entry->key, memory_order_relaxed) != rkey) {
        return -EACCES;
    }
    *ptr_p = (uint8_t*)view->dm.addr + dm_off + (remote_addr - addr);
    return 0;
}

void hca_shm_dm_view_close(hca_dm_view_t *handle)
{
    hca_shm_dm_view_t *view = hca_shm_dm_view(handle);

    hca_memobj_destroy(&view->dm);
    hca_memobj_destroy(&view->ctx);
    free(view);
}
