/*
 * hca_status.c - the one place where the device's errors become UCX
 * statuses: completion statuses (hca_wc_status_t) and the -errno answers
 * of device calls.
 */
#include "hca_uct.h"

#include <errno.h>

/*
 * The one place where device errors become UCS statuses
 * (docs/UCT-SEMANTICS.md).  A peer that is gone - its process, or its
 * target QP (the device says RETRY_EXC) - is UCS_ERR_ENDPOINT_TIMEOUT, as
 * UCX's tcp and rc report it and as UCP's failed lanes answer later
 * operations; a target QP that exists but refuses (REM_INV_REQ), and a
 * remote key check that failed (REM_ACCESS: a bad or invalidated rkey, an
 * access out of its range) are UCS_ERR_CONNECTION_RESET, as rc maps them
 * (uct_ib_wc_to_ucs_status) and as UCP's error handling requires of a
 * failed ep (a rendezvous peer's invalidated memory, ucp_ep_set_failed);
 * a local key check that failed is UCS_ERR_INVALID_ADDR.
 */
ucs_status_t uct_hca_status(hca_wc_status_t status)
{
    switch (status) {
    case HCA_WC_SUCCESS:
        return UCS_OK;
    case HCA_WC_WR_FLUSH_ERR:
        return UCS_ERR_CANCELED;
    case HCA_WC_RETRY_EXC_ERR:
    case HCA_WC_RNR_RETRY_EXC_ERR:
        return UCS_ERR_ENDPOINT_TIMEOUT;
    case HCA_WC_REM_ACCESS_ERR:
        return UCS_ERR_CONNECTION_RESET;
    case HCA_WC_LOC_PROT_ERR:
        return UCS_ERR_INVALID_ADDR;
    case HCA_WC_LOC_LEN_ERR:
        return UCS_ERR_MESSAGE_TRUNCATED;
    case HCA_WC_REM_INV_REQ_ERR:
        return UCS_ERR_CONNECTION_RESET;
    default:
        return UCS_ERR_IO_ERROR;
    }
}

ucs_status_t uct_hca_errno_status(int rc)
{
    switch (rc) {
    case 0:
        return UCS_OK;
    case -EAGAIN:       /* the target's ring is full */
    case -ENOMEM:       /* the send queue is full */
        return UCS_ERR_NO_RESOURCE;
    case -ECONNRESET:   /* the peer is gone */
        return UCS_ERR_ENDPOINT_TIMEOUT;
    case -EINVAL:       /* a request the device rejects */
        return UCS_ERR_INVALID_PARAM;
    default:
        return UCS_ERR_IO_ERROR;
    }
}

