/*
 * hca_fabric_shm.c - the shm fabric: processes of one host, through
 * shared memory and single copy.  Its ops table, the device open and
 * close of its state and thread, connect, and liveness.  The rest of the
 * fabric is in the hca_shm_*.c files (see hca_shm_fabric.h).
 */
#include "hca_shm_fence.h"
#include "hca_shm_target.h"
#include "hca_log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdio.h>

/* ---------------------------------------------------------------- ops */

/* Another user's process: its objects are private to its user (0600)
 * and ours to ours, so neither side could answer the other.  Refused at
 * connect, both ways (root too), with a line that says why. */
static int hca_shm_other_user(uint32_t pid)
{
    char path[32];
    struct stat st;

    snprintf(path, sizeof(path), "/proc/%u", pid);
    if ((stat(path, &st) != 0) || (st.st_uid == geteuid())) {
        return 0; /* ours, or not there yet (looked up again later) */
    }
    hca_log("pid %u belongs to uid %u, and we are uid %u: hca connects "
            "processes of one user only", pid, (unsigned)st.st_uid,
            (unsigned)geteuid());
    return 1;
}

static int hca_shm_reachable(hca_device_t *dev, const hca_port_addr_t *addr)
{
    return dev->host_key == addr->host;
}

static int hca_shm_connect(hca_qp_t *qp)
{
    hca_shm_qp_t *sq = hca_shm_qp(qp);

    if (hca_shm_other_user(qp->dest.pid)) {
        return -EACCES;
    }
    /* resolve now if we can; a peer that is not there yet is looked up
     * again on the first post (and then fails with RETRY_EXC) */
    memset(sq, 0, sizeof(*sq));
    sq->peer = hca_peer_get(qp->dev, &qp->dest);
    return 0;
}

static void hca_shm_disconnect(hca_qp_t *qp)
{
    /* an access begun with direct_ptr and never ended must not hold
     * a deregistration forever */
    hca_direct_close(qp);
    memset(hca_shm_qp(qp), 0, sizeof(hca_shm_qp_t));
}

/* The peer process and its target QP: a QP destroyed under us (its ring
 * discarded with our messages in it) would otherwise be waited for
 * forever; and a peer that could not answer us says so in our QP's
 * published entry (hca_shm_answer.c). */
static hca_wc_status_t hca_shm_peer_status(hca_qp_t *qp)
{
    hca_shm_qp_t *sq = hca_shm_qp(qp);
    uint32_t idx     = HCA_QPN_INDEX(qp->dest_qpn);

    if (HCA_UNLIKELY(atomic_load(&qp->pub->nak_qpn) == qp->qpn)) {
        return HCA_WC_REM_OP_ERR;
    }
    if (sq->peer == NULL) {
        sq->peer = hca_peer_get(qp->dev, &qp->dest);
        if (sq->peer == NULL) {
            return HCA_WC_RETRY_EXC_ERR;
        }
    }
    if (!hca_peer_alive(sq->peer) || (idx == 0) ||
        (idx >= sq->peer->hdr.max_qp) ||
        (atomic_load(&sq->peer->qp_pub[idx].qpn) != qp->dest_qpn)) {
        return HCA_WC_RETRY_EXC_ERR;
    }
    return HCA_WC_SUCCESS;
}

/* The source of a message (a partial SEND) still runs (or is not there
 * at all: a forged one). */
static int hca_shm_source_alive(hca_device_t *dev, uint32_t pid,
                                uint32_t ctx_id)
{
    hca_port_addr_t addr;
    hca_peer_t *peer;

    memset(&addr, 0, sizeof(addr));
    addr.host   = dev->host_key;
    addr.pid    = pid;
    addr.ctx_id = ctx_id;
    peer        = hca_peer_get(dev, &addr);
    return (peer != NULL) && hca_peer_alive(peer);
}

static void hca_shm_mr_fence(hca_device_t *dev, const hca_mpt_entry_t *entry,
                             uint32_t accessors, int unfenced)
{
    (void)entry;
    hca_access_fence_wait(dev, accessors, unfenced);
}

/* ---------------------------------------------------------------- device */

static void hca_shm_dev_free(hca_device_t *dev, hca_shm_dev_t *sd)
{
    free(sd->mapper_views);
    pthread_mutex_destroy(&sd->fence_lock);
    pthread_mutex_destroy(&sd->qobj_lock);
    pthread_mutex_destroy(&sd->svc_lock);
    free(sd);
    dev->fabric_dev[HCA_FABRIC_SHM] = NULL;
}

static int hca_shm_dev_open(hca_device_t *dev)
{
    hca_shm_dev_t *sd = calloc(1, sizeof(*sd));
    int rc;

    if (sd == NULL) {
        return -ENOMEM;
    }
    sd->svc_sock     = -1;
    sd->mapper_views = calloc(HCA_MAX_MAPPERS, hca_mapper_view_size());
    pthread_mutex_init(&sd->fence_lock, NULL);
    pthread_mutex_init(&sd->qobj_lock, NULL);
    pthread_mutex_init(&sd->svc_lock, NULL);
    dev->fabric_dev[HCA_FABRIC_SHM] = sd;
    if (sd->mapper_views == NULL) {
        hca_shm_dev_free(dev, sd);
        return -ENOMEM;
    }
    /* before the context is published: peers read it */
    dev->hdr->direct_fence = (uint32_t)hca_access_fence_init(dev);
    rc = hca_svc_start(dev);
    if (rc != 0) {
        hca_shm_dev_free(dev, sd);
        return rc;
    }
    return 0;
}

static void hca_shm_dev_close(hca_device_t *dev)
{
    hca_svc_stop(dev);
    hca_peers_destroy(dev);
    hca_access_fence_close(dev);
    hca_shm_dev_free(dev, hca_shm_dev(dev));
}

const hca_fabric_ops_t hca_fabric_shm_ops = {
    .name           = "shm",
    .type           = HCA_FABRIC_SHM,
    .dev_open       = hca_shm_dev_open,
    .dev_close      = hca_shm_dev_close,
    .reachable      = hca_shm_reachable,
    .connect        = hca_shm_connect,
    .disconnect     = hca_shm_disconnect,
    .exec           = hca_shm_exec,
    .poll_response  = hca_shm_poll_response,
    .response_ready = hca_shm_response_ready,
    .pull           = hca_shm_pull,
    .answer         = hca_shm_answer,
    .source_alive   = hca_shm_source_alive,
    .msg_from_qp_peer = 0,       /* producers on this host write our rings */
    .mr_fence       = hca_shm_mr_fence,
    .peer_status    = hca_shm_peer_status,
    .check_peers    = hca_shm_check_peers,
    .post_direct    = hca_shm_post_direct,
    .serve          = hca_svc_serve,
    .owner_armed    = hca_svc_owner_armed,
    .fast = {
        .caps          = HCA_FAST_SEND | HCA_FAST_WRITE | HCA_FAST_PTR |
                         HCA_FAST_ATOMIC,
        .send_reserve  = hca_shm_send_reserve,
        .send_commit   = hca_shm_send_commit,
        .send_cancel   = hca_shm_send_cancel,
        .send_short    = hca_shm_send_short,
        .write_direct  = hca_shm_write_direct,
        .direct_ptr    = hca_shm_direct_ptr,
        .direct_done   = hca_shm_direct_done,
        .atomic_direct = hca_shm_atomic_direct,
    },
    .rkey_ptr       = hca_shm_rkey_ptr,
    .dm_view_open   = hca_shm_dm_view_open,
    .dm_view_ptr    = hca_shm_dm_view_ptr,
    .dm_view_close  = hca_shm_dm_view_close,
};
