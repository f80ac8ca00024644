/*
 * dev_open.c - open the device as a process starting up would, then close.
 *
 * usage: dev_open
 *
 * hca_device_open("hca0"), a PD, four CQs (each binds its wakeup socket),
 * then everything destroyed.  Exits 0, or 1 with one line on stderr:
 * "pid P: STEP: error".
 */
#include "rel_dev.h"

const char *rel_prog = "dev_open";

int main(void)
{
    hca_device_t *dev;
    hca_cq_t *cq[4];
    hca_pd_t *pd;
    int rc, i;

    if ((rc = hca_device_open("hca0", 0, &dev)) != 0) {
        fprintf(stderr, "pid %d: hca_device_open: %s\n", (int)getpid(),
                strerror(-rc));
        return 1;
    }
    if ((rc = hca_pd_alloc(dev, &pd)) != 0) {
        fprintf(stderr, "pid %d: hca_pd_alloc: %s\n", (int)getpid(),
                strerror(-rc));
        return 1;
    }
    for (i = 0; i < 4; ++i) {
        if ((rc = hca_cq_create(dev, 64, &cq[i])) != 0) {
            fprintf(stderr, "pid %d: hca_cq_create #%d: %s\n", (int)getpid(),
                    i, strerror(-rc));
            return 1;
        }
    }
    for (i = 0; i < 4; ++i) {
        hca_cq_destroy(cq[i]);
    }
    hca_pd_dealloc(pd);
    hca_device_close(dev);
    return 0;
}
