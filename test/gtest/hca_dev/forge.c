/*
 * forge.c - see forge.h.  Uses the wire formats (hca_wire.h, hca_ring.h)
 * as any process of the user could, not the library: the context object
 * is named after the address, and its header holds the nonce of the
 * other names.
 */
#define _GNU_SOURCE
#include "forge.h"

#include "hca_ring.h"
#include "hca_wire.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct forge {
    void      *ctx;
    size_t     ctx_len;
    void      *base;
    size_t     len;
    hca_ring_t ring;
};

static void *forge_map(const char *name, size_t *len)
{
    int fd = shm_open(name, O_RDWR, 0);
    struct stat st;
    void *p = MAP_FAILED;

    if (fd < 0) {
        return NULL;
    }
    if (fstat(fd, &st) == 0) {
        *len = (size_t)st.st_size;
        p    = mmap(NULL, *len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    close(fd);
    return (p == MAP_FAILED) ? NULL : p;
}

/* Our start time (field 22 of /proc/self/stat), for the claim mark that
 * any producer stamps into the slots it claims. */
static uint64_t forge_start_time(void)
{
    char buf[1024];
    const char *p;
    int field = 2;
    FILE *f = fopen("/proc/self/stat", "r");
    size_t n;

    if (f == NULL) {
        return 0;
    }
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    p      = strrchr(buf, ')');
    for (; (p != NULL) && *p && (field < 22); ++p) {
        field += (*p == ' ');
    }
    return (p != NULL) ? strtoull(p, NULL, 10) : 0;
}

int forge_open(const hca_port_addr_t *addr, uint32_t qpn, forge_t **f_p)
{
    forge_t *f = calloc(1, sizeof(*f));
    const hca_ctx_hdr_t *hdr;
    const hca_qp_pub_t *pub;
    hca_host_id_t self;
    char name[128];

    if (f == NULL) {
        return -ENOMEM;
    }
    /* the target is on this host: our PID namespace is its */
    if ((hca_host_id_get(&self) != 0) || (hca_host_key(&self) != addr->host)) {
        free(f);
        return -EHOSTUNREACH;
    }
    snprintf(name, sizeof(name), "/hca.%u.%u.%u.ctx0", self.pid_ns,
             addr->pid, addr->ctx_id);
    f->ctx = forge_map(name, &f->ctx_len);
    if (f->ctx == NULL) {
        forge_close(f);
        return -ENOENT;
    }
    hdr = f->ctx;
    pub = (const hca_qp_pub_t*)((const uint8_t*)f->ctx + hdr->qp_offset);
    snprintf(name, sizeof(name), "/hca.%u.%u.%u.%08x.r%u",
             self.pid_ns, addr->pid, addr->ctx_id, hdr->name_nonce,
             pub[qpn & 0xfff].ring_id);
    f->base = forge_map(name, &f->len);
    if (f->base == NULL) {
        forge_close(f);
        return -ENOENT;
    }
    hca_ring_attach(&f->ring, f->base, HCA_RING_SLOTS, HCA_RING_SLOT_SIZE);
    f->ring.claim_mark = hca_claim_mark((uint32_t)getpid(),
                                        forge_start_time());
    *f_p = f;
    return 0;
}

int forge_put(forge_t *f, const forge_msg_t *m, const void *payload,
              size_t n, int timeout_ms)
{
    struct timespec ts = {0, 1000000};
    hca_msg_hdr_t *slot;
    uint64_t idx;
    int wake = 0;

    while (hca_ring_claim(&f->ring, &idx, &wake) != 0) {
        if (timeout_ms-- <= 0) {
            return -ETIMEDOUT;
        }
        nanosleep(&ts, NULL);
    }
    slot           = hca_ring_slot(&f->ring, idx);
    slot->op       = m->op;
    slot->flags    = m->flags;
    slot->num_iov  = m->num_iov;
    slot->data_off = m->data_off;
    slot->src_pid  = m->src_pid;
    slot->src_ctx  = m->src_ctx;
    slot->src_qpn  = m->src_qpn;
    slot->dst_qpn  = m->dst_qpn;
    slot->imm      = m->imm;
    slot->length   = m->length;
    slot->msg_len  = m->msg_len;
    if (n > (size_t)HCA_RING_SLOT_SIZE - m->data_off) {
        n = (size_t)HCA_RING_SLOT_SIZE - m->data_off;
    }
    memcpy((uint8_t*)slot + m->data_off, payload, n);
    hca_ring_publish(&f->ring, idx);
    return 0;
}

int forge_claim(forge_t *f, int timeout_ms)
{
    struct timespec ts = {0, 1000000};
    uint64_t idx;
    int wake = 0;

    while (hca_ring_claim(&f->ring, &idx, &wake) != 0) {
        if (timeout_ms-- <= 0) {
            return -ETIMEDOUT;
        }
        nanosleep(&ts, NULL);
    }
    return 0;
}

int forge_take_head(forge_t *f, uint64_t *idx_p)
{
    _Atomic uint64_t *head = &f->ring.hdr->head;
    uint64_t h = atomic_load(head);

    for (;;) {
        uint64_t idx = h & ~HCA_RING_ARMED;
        if (idx - atomic_load(&f->ring.hdr->tail) > f->ring.mask) {
            return -EAGAIN;
        }
        if (atomic_compare_exchange_weak(head, &h, idx + 1)) {
            *idx_p = idx;
            return 0;
        }
    }
}

int forge_stamp(forge_t *f, uint64_t idx)
{
    return hca_ring_stamp_claim(&f->ring, idx);
}

void forge_close(forge_t *f)
{
    if (f->base != NULL) {
        munmap(f->base, f->len);
    }
    if (f->ctx != NULL) {
        munmap(f->ctx, f->ctx_len);
    }
    free(f);
}
