/*
 * hca_opcode.c - what each work request opcode is, and the names of every
 * enum of the public API (and the text of its network address).
 */
#include "hca_util.h"
#include "hca_base.h"

#include <arpa/inet.h>
#include <stdio.h>

#define HCA_ATOMIC_POST  (HCA_OPF_ATOMIC)
#define HCA_ATOMIC_FETCH (HCA_OPF_ATOMIC | HCA_OPF_FETCH)

const hca_opcode_info_t hca_opcode[HCA_WR_OPCODE_LAST] = {
    [HCA_WR_SEND]                = {"SEND", HCA_OPF_SEND | HCA_OPF_WRITE,
                                    0, HCA_WC_SEND},
    [HCA_WR_SEND_WITH_IMM]       = {"SEND_WITH_IMM",
                                    HCA_OPF_SEND | HCA_OPF_WRITE |
                                    HCA_OPF_IMM, 0, HCA_WC_SEND},
    [HCA_WR_RDMA_WRITE]          = {"RDMA_WRITE", HCA_OPF_WRITE,
                                    HCA_ACCESS_REMOTE_WRITE,
                                    HCA_WC_RDMA_WRITE},
    [HCA_WR_RDMA_WRITE_WITH_IMM] = {"RDMA_WRITE_WITH_IMM",
                                    HCA_OPF_WRITE | HCA_OPF_IMM |
                                    HCA_OPF_SEND,
                                    HCA_ACCESS_REMOTE_WRITE,
                                    HCA_WC_RDMA_WRITE},
    [HCA_WR_RDMA_READ]           = {"RDMA_READ", HCA_OPF_READ,
                                    HCA_ACCESS_REMOTE_READ,
                                    HCA_WC_RDMA_READ},
    [HCA_WR_ATOMIC_FETCH_ADD]    = {"ATOMIC_FETCH_ADD", HCA_ATOMIC_FETCH,
                                    HCA_ACCESS_REMOTE_ATOMIC,
                                    HCA_WC_ATOMIC},
    [HCA_WR_ATOMIC_CMP_SWP]      = {"ATOMIC_CMP_SWP", HCA_ATOMIC_FETCH,
                                    HCA_ACCESS_REMOTE_ATOMIC,
                                    HCA_WC_ATOMIC},
    [HCA_WR_ATOMIC_SWAP]         = {"ATOMIC_SWAP", HCA_ATOMIC_FETCH,
                                    HCA_ACCESS_REMOTE_ATOMIC,
                                    HCA_WC_ATOMIC},
    [HCA_WR_ATOMIC_FETCH_AND]    = {"ATOMIC_FETCH_AND", HCA_ATOMIC_FETCH,
                                    HCA_ACCESS_REMOTE_ATOMIC,
                                    HCA_WC_ATOMIC},
    [HCA_WR_ATOMIC_FETCH_OR]     = {"ATOMIC_FETCH_OR", HCA_ATOMIC_FETCH,
                                    HCA_ACCESS_REMOTE_ATOMIC,
                                    HCA_WC_ATOMIC},
    [HCA_WR_ATOMIC_FETCH_XOR]    = {"ATOMIC_FETCH_XOR", HCA_ATOMIC_FETCH,
                                    HCA_ACCESS_REMOTE_ATOMIC,
                                    HCA_WC_ATOMIC},
    [HCA_WR_ATOMIC_ADD]          = {"ATOMIC_ADD", HCA_ATOMIC_POST,
                                    HCA_ACCESS_REMOTE_ATOMIC,
                                    HCA_WC_ATOMIC},
    [HCA_WR_ATOMIC_AND]          = {"ATOMIC_AND", HCA_ATOMIC_POST,
                                    HCA_ACCESS_REMOTE_ATOMIC,
                                    HCA_WC_ATOMIC},
    [HCA_WR_ATOMIC_OR]           = {"ATOMIC_OR", HCA_ATOMIC_POST,
                                    HCA_ACCESS_REMOTE_ATOMIC,
                                    HCA_WC_ATOMIC},
    [HCA_WR_ATOMIC_XOR]          = {"ATOMIC_XOR", HCA_ATOMIC_POST,
                                    HCA_ACCESS_REMOTE_ATOMIC,
                                    HCA_WC_ATOMIC},
};

static const char *hca_wc_status_names[HCA_WC_STATUS_LAST] = {
    [HCA_WC_SUCCESS]           = "success",
    [HCA_WC_LOC_LEN_ERR]       = "local length error",
    [HCA_WC_LOC_QP_OP_ERR]     = "local QP operation error",
    [HCA_WC_LOC_PROT_ERR]      = "local protection error",
    [HCA_WC_WR_FLUSH_ERR]      = "WR flushed",
    [HCA_WC_REM_INV_REQ_ERR]   = "remote invalid request",
    [HCA_WC_REM_ACCESS_ERR]    = "remote access error",
    [HCA_WC_REM_OP_ERR]        = "remote operation error",
    [HCA_WC_RETRY_EXC_ERR]     = "transport retry exceeded (peer gone)",
    [HCA_WC_RNR_RETRY_EXC_ERR] = "RNR retry exceeded",
    [HCA_WC_GENERAL_ERR]       = "general error",
};

static const char *hca_qp_state_names[HCA_QPS_LAST] = {
    [HCA_QPS_RESET] = "RESET",
    [HCA_QPS_INIT]  = "INIT",
    [HCA_QPS_RTR]   = "RTR",
    [HCA_QPS_RTS]   = "RTS",
    [HCA_QPS_ERR]   = "ERR",
};

_Static_assert(HCA_ARRAY_LEN(hca_opcode) == HCA_WR_OPCODE_LAST,
               "opcode table");
_Static_assert(HCA_ARRAY_LEN(hca_wc_status_names) == HCA_WC_STATUS_LAST,
               "status names");
_Static_assert(HCA_ARRAY_LEN(hca_qp_state_names) == HCA_QPS_LAST,
               "state names");

const char *hca_wc_status_str(hca_wc_status_t status)
{
    return ((unsigned)status < HCA_WC_STATUS_LAST) ?
           hca_wc_status_names[status] : "unknown status";
}

const char *hca_wr_opcode_str(hca_wr_opcode_t opcode)
{
    return ((unsigned)opcode < HCA_WR_OPCODE_LAST) ?
           hca_opcode[opcode].name : "unknown opcode";
}

const char *hca_qp_state_str(hca_qp_state_t state)
{
    return ((unsigned)state < HCA_QPS_LAST) ? hca_qp_state_names[state] :
                                              "unknown state";
}

const char *hca_fabric_type_str(hca_fabric_type_t fabric)
{
    switch (fabric) {
    case HCA_FABRIC_SHM:
        return "shm";
    case HCA_FABRIC_TCP:
        return "tcp";
    case HCA_FABRIC_LAST:
        break;
    }
    return "unknown";
}

const char *hca_port_state_str(hca_port_state_t state)
{
    switch (state) {
    case HCA_PORT_DOWN:
        return "PORT_DOWN";
    case HCA_PORT_INIT:
        return "PORT_INIT";
    case HCA_PORT_ACTIVE:
        return "PORT_ACTIVE";
    }
    return "unknown port state";
}

void hca_net_addr_str(const hca_net_addr_t *addr, char *buf, size_t len)
{
    char ip[INET6_ADDRSTRLEN];

    if (addr->family == HCA_NET_IPV4) {
        inet_ntop(AF_INET, addr->addr, ip, sizeof(ip));
        snprintf(buf, len, "%s:%u", ip, addr->port);
    } else if (addr->family == HCA_NET_IPV6) {
        inet_ntop(AF_INET6, addr->addr, ip, sizeof(ip));
        snprintf(buf, len, "[%s]:%u", ip, addr->port);
    } else {
        snprintf(buf, len, "-");
    }
}
