/*
 * hca_shm_copy.c - the shm fabric's copies: between a WQE's SGE list and
 * a buffer (a ring slot, a bounce chunk, a mapping of the target), and
 * single copy (process_vm_readv/writev) to and from another process.
 */
#include "hca_shm_fabric.h"
#include "hca_queue.h"

#include <errno.h>
#include <string.h>
#include <sys/uio.h>

/* ---------------------------------------------------------------- copies */

/* Copies len bytes starting at byte `offset` of the SGE list into dst. */
void hca_sge_gather(const hca_sge_t *sge, uint32_t num_sge, uint64_t offset,
                    void *dst, uint64_t len)
{
    hca_sge_copy(sge, num_sge, offset, dst, len, 0);
}

/* Copies len bytes of src into the SGE list starting at byte `offset`. */
void hca_sge_scatter(const hca_sge_t *sge, uint32_t num_sge, uint64_t offset,
                     const void *src, uint64_t len)
{
    hca_sge_copy(sge, num_sge, offset, (void*)(uintptr_t)src, len, 1);
}

/* Single copy between our SGEs and [raddr, raddr+len) of pid.
 * 0, or the completion status. */
hca_wc_status_t hca_cma_xfer(uint32_t pid, int write, const hca_sge_t *sge,
                             uint32_t num_sge, uint64_t raddr)
{
    for (uint32_t i = 0; i < num_sge; ++i) {
        uint64_t done = 0;
        while (done < sge[i].length) {
            struct iovec local  = {
                .iov_base = (uint8_t*)(uintptr_t)sge[i].addr + done,
                .iov_len  = sge[i].length - done};
            struct iovec remote = {.iov_base = (void*)(uintptr_t)raddr,
                                   .iov_len  = local.iov_len};
            ssize_t n = write ?
                process_vm_writev((pid_t)pid, &local, 1, &remote, 1, 0) :
                process_vm_readv((pid_t)pid, &local, 1, &remote, 1, 0);
            if (n <= 0) {
                return (errno == ESRCH) ? HCA_WC_RETRY_EXC_ERR :
                                          HCA_WC_REM_OP_ERR;
            }
            done  += (uint64_t)n;
            raddr += (uint64_t)n;
        }
    }
    return HCA_WC_SUCCESS;
}


/* ---------------------------------------------------------------- pull */

/* Reads the sender's iovs straight into the receive buffer. */
hca_wc_status_t hca_shm_pull(hca_device_t *dev, const hca_msg_hdr_t *hdr,
                             const hca_wire_iov_t *wiov,
                             const hca_rwqe_t *rwqe)
{
    struct iovec local[HCA_MAX_SGE], remote[HCA_MAX_SGE];
    uint64_t total = 0;
    ssize_t n;

    if (hdr->msg_len > rwqe->length) {
        return HCA_WC_LOC_LEN_ERR;
    }
    for (uint32_t i = 0; i < hdr->num_iov; ++i) {
        if (wiov[i].length > HCA_MAX_MSG) {
            return HCA_WC_REM_INV_REQ_ERR; /* and the sum cannot wrap */
        }
        remote[i].iov_base = (void*)(uintptr_t)wiov[i].addr;
        remote[i].iov_len  = wiov[i].length;
        total             += wiov[i].length;
    }
    if (total != hdr->msg_len) {
        return HCA_WC_REM_INV_REQ_ERR;
    }
    for (uint32_t i = 0; i < rwqe->num_sge; ++i) {
        local[i].iov_base = (void*)(uintptr_t)rwqe->sge[i].addr;
        local[i].iov_len  = rwqe->sge[i].length;
    }
    if ((hdr->src_pid == dev->pid) && (hdr->src_ctx == dev->ctx_id)) {
        /* a QP of ours sent it (the responder checked (hca_resp_pull_is_ours) that the
         * iovs are its WQE's, whose SGEs were checked when posted): copy
         * straight from its buffers */
        uint64_t off = 0;
        for (uint32_t i = 0; i < hdr->num_iov; ++i) {
            hca_rwqe_place(rwqe, off, remote[i].iov_base, remote[i].iov_len);
            off += remote[i].iov_len;
        }
        return HCA_WC_SUCCESS;
    }
    /* another process (or another context of ours: the kernel checks
     * the addresses there, so a forged one fails instead of faulting) */
    while (total > 0) {
        /* process_vm_readv may stop early: move the iovs on and repeat */
        uint64_t skip;
        n = process_vm_readv((pid_t)hdr->src_pid, local, rwqe->num_sge,
                             remote, hdr->num_iov, 0);
        if (n <= 0) {
            return HCA_WC_REM_OP_ERR;
        }
        total -= (uint64_t)n;
        for (skip = (uint64_t)n; skip > 0;) {
            for (uint32_t i = 0; i < rwqe->num_sge && skip > 0; ++i) {
                uint64_t k = (local[i].iov_len < skip) ? local[i].iov_len
                                                       : skip;
                local[i].iov_base = (uint8_t*)local[i].iov_base + k;
                local[i].iov_len -= k;
                skip             -= k;
            }
        }
        for (skip = (uint64_t)n; skip > 0;) {
            for (uint32_t i = 0; i < hdr->num_iov && skip > 0; ++i) {
                uint64_t k = (remote[i].iov_len < skip) ? remote[i].iov_len
                                                        : skip;
                remote[i].iov_base = (uint8_t*)remote[i].iov_base + k;
                remote[i].iov_len -= k;
                skip              -= k;
            }
        }
    }
    return HCA_WC_SUCCESS;
}

