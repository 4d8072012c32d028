/* The copies of one box of a field (intercept_box.h). */
#define _GNU_SOURCE
#include "intercept_box.h"

#include <sys/mman.h>

/* Calls ``fn(offset, n, arg)`` for each contiguous run (C order) of the box start/count of field ``f``. */
static void runs(const enkflow_shm_field *f, const size_t *start, const size_t *count,
                 void (*fn)(uint64_t off, uint64_t n, void *arg), void *arg) {
    int nd = f->ndims;
    if (nd == 0) {
        fn(0, 1, arg);
        return;
    }
    for (int d = 0; d < nd; d++)
        if (count[d] == 0)
            return;
    size_t idx[ENKFLOW_SHM_MAX_DIMS] = {0};
    uint64_t stride[ENKFLOW_SHM_MAX_DIMS];
    stride[nd - 1] = 1;
    for (int d = nd - 2; d >= 0; d--)
        stride[d] = stride[d + 1] * (uint64_t)f->shape[d + 1];
    for (;;) {
        uint64_t off = 0;
        for (int d = 0; d < nd; d++)
            off += (start[d] + (d < nd - 1 ? idx[d] : 0)) * stride[d];
        fn(off, count[nd - 1], arg);
        int d = nd - 2;
        while (d >= 0 && ++idx[d] == count[d])
            idx[d--] = 0;
        if (d < 0)
            return;
    }
}

typedef struct {
    const enkflow_layout *L;
    uint32_t k;           /* the field */
    unsigned char *mem;   /* the model's buffer, advanced run by run */
    size_t es;
    uint8_t *bits;        /* get: the elements written so far, NULL when all or none were */
    int written;          /* get without bits: every element was written (read it where it was written) */
    uint64_t overlap;     /* first element written twice + 1, 0 if none */
    int finite;           /* put: every element copied so far is finite */
} run_arg;

#define BIT(bits, i) ((bits)[(i) >> 3] >> ((i) & 7) & 1)

static void copy_get(uint64_t off, uint64_t n, void *a) {
    run_arg *r = a;
    if (!r->bits) {
        enkflow_layout_get(r->L, r->k, off, n, r->mem, r->written);
    } else {  /* part written (this generation, the first): each stretch from where it is now */
        for (uint64_t i = off, j; i < off + n; i = j) {
            int bit = BIT(r->bits, i);
            for (j = i + 1; j < off + n && BIT(r->bits, j) == bit; j++)
                ;
            enkflow_layout_get(r->L, r->k, i, j - i, r->mem + (i - off) * r->es, bit);
        }
    }
    r->mem += n * r->es;
}

static void copy_put(uint64_t off, uint64_t n, void *a) {
    run_arg *r = a;
    r->finite &= enkflow_layout_put(r->L, r->k, off, n, r->mem);
    r->mem += n * r->es;
    if (r->bits)
        for (uint64_t i = off; i < off + n; i++)
            r->bits[i >> 3] |= (uint8_t)(1u << (i & 7));
}

static void check_bits(uint64_t off, uint64_t n, void *a) {
    run_arg *r = a;
    for (uint64_t i = off; i < off + n && !r->overlap; i++)
        if (BIT(r->bits, i))
            r->overlap = i + 1;
}

/* A large get fills the model's buffer: the first touch of each 4 KiB page of fresh memory (a buffer just
 * allocated, as a model that reads its restart at start has) is a page fault, which costs several times the
 * copy of the page. Asking for huge pages where the buffer spans them makes that one fault per 2 MiB. Only a
 * hint: memory the kernel cannot back so (not anonymous, or huge pages off) is left as it is. (The kernel
 * still clears each page it makes: enkflow_layout_get shares that with a helper thread.) */
void enkflow_huge_pages_for(void *mem, size_t bytes) {
    const uintptr_t huge = (uintptr_t)2 << 20;
    uintptr_t lo = ((uintptr_t)mem + huge - 1) & ~(huge - 1), hi = ((uintptr_t)mem + bytes) & ~(huge - 1);
    if (hi > lo)
        madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
}

void enkflow_box_get(const enkflow_layout *L, uint32_t k, const size_t *start, const size_t *count, void *mem,
                     const uint8_t *bits, int written) {
    run_arg r = {L, k, mem, L->esize[k], (uint8_t *)bits, written, 0, 1};
    runs(&L->f[k], start, count, copy_get, &r);
}

int enkflow_box_put(const enkflow_layout *L, uint32_t k, const size_t *start, const size_t *count, const void *mem,
                    uint8_t *bits) {
    run_arg r = {L, k, (unsigned char *)mem, L->esize[k], bits, 0, 0, 1};
    runs(&L->f[k], start, count, copy_put, &r);
    return r.finite;
}

uint64_t enkflow_box_overlap(const enkflow_layout *L, uint32_t k, const size_t *start, const size_t *count,
                             const uint8_t *bits) {
    run_arg r = {L, k, NULL, L->esize[k], (uint8_t *)bits, 0, 0, 1};
    runs(&L->f[k], start, count, check_bits, &r);
    return r.overlap;
}
