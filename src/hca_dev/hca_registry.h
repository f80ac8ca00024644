/*
 * hca_registry.h - the fabric registry (hca_fabric.c, layer 2): opens the
 * fabrics of a device context and chooses a QP's fabric. What it offers the
 * layers above; the fabrics themselves implement hca_fabric.h.
 * Private to libhcadev (not installed).
 */
#ifndef HCA_REGISTRY_H
#define HCA_REGISTRY_H

#include "hca_fabric.h"
#include "hca_obj.h"

/* The registry (hca_fabric.c). */
/* Opens every fabric on a new device context (their defaults filled in
 * dev->fabric_ops); closes them in reverse. */
int  hca_fabric_open(hca_device_t *dev);
void hca_fabric_close(hca_device_t *dev);
/* Every open fabric lets go of the QP (destroy, reset): none of their
 * threads is inside it after this. */
void hca_fabric_quiesce_all(hca_qp_t *qp);
/* A user thread's poll of the fabrics that asked for it (dev->fabric_polls). */
void hca_fabric_poll(hca_device_t *dev);
/* A CQ was armed: the fabrics that asked for polls take their work back. */
void hca_fabric_armed(hca_device_t *dev);
/* The owner's poll found requests in its service ring: the fabric that
 * serves them does, in this thread; and a CQ was armed. */
int  hca_fabric_serve(hca_device_t *dev);
void hca_fabric_owner_armed(hca_device_t *dev);
/* The fabric that reaches addr from dev, or NULL (unreachable). */
const hca_fabric_ops_t *hca_fabric_for_addr(hca_device_t *dev,
                                            const hca_port_addr_t *addr);
/* The fabric that placed a message in one of our receive rings: the tcp
 * fabric's receiver marks what it places (HCA_MSG_VIA_TCP), every other
 * message was written by a shm producer.  Inline: ingress asks it for
 * every message it reads in place. */
HCA_INLINE const hca_fabric_ops_t *hca_fabric_of_msg(hca_device_t *dev,
                                                     const hca_msg_hdr_t *hdr)
{
    return ((hdr->flags & HCA_MSG_VIA_TCP) &&
            dev->fabric_open[HCA_FABRIC_TCP]) ?
           &dev->fabric_ops[HCA_FABRIC_TCP] : &dev->fabric_ops[HCA_FABRIC_SHM];
}
/* A fabric that is not connected: every op fails or is unsupported
 * (a QP before RTR, or a receive-only target). */
extern const hca_fabric_ops_t hca_fabric_none;

#endif
