/* The memfd's layout checked, and the segments it names mapped (intercept_layout.h). */
#define _GNU_SOURCE
#include "intercept_layout.h"
#include "split_copy.h"

#include <errno.h>
#include <fcntl.h>
#include <netcdf.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int why_(char *why, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, len, fmt, ap);
    va_end(ap);
    return -1;
}

static size_t type_size(int t) {
    switch (t) {
    case NC_DOUBLE: case NC_INT64: return 8;
    case NC_FLOAT: case NC_INT: return 4;
    default: return 0;
    }
}

/* Field records and extents: types, sizes, and extents that tile each field in order. */
static int check_fields(enkflow_layout *L, const enkflow_shm_extent *e, char *why, size_t len) {
    const enkflow_shm_header *h = L->hdr;
    for (uint32_t k = 0; k < h->nfields; k++) {
        enkflow_shm_field *f = &L->f[k];
        uint64_t n = 1;
        if (f->ndims < 0 || f->ndims > ENKFLOW_SHM_MAX_DIMS || !type_size(f->nctype))
            return why_(why, len, "field %u of the segment has %d dimensions and type %d", k, f->ndims, f->nctype);
        for (int d = 0; d < f->ndims; d++)
            n *= (uint64_t)f->shape[d];
        L->elements[k] = n;
        L->esize[k] = type_size(f->nctype);
        L->check[k] = f->nctype == NC_DOUBLE ? EKF_CHECK_F64 : f->nctype == NC_FLOAT ? EKF_CHECK_F32 : EKF_CHECK_NONE;
        if (n * L->esize[k] != f->nbytes || f->extent0 > h->nextents || f->nextents > h->nextents - f->extent0)
            return why_(why, len, "field %.64s of the segment: %llu bytes in extents %u + %u of %u do not fit", f->name,
                        (unsigned long long)f->nbytes, f->extent0, f->nextents, h->nextents);
        uint64_t at = 0;
        for (uint32_t i = f->extent0; i < f->extent0 + f->nextents; i++) {
            if (e[i].elem_lo != at || e[i].elem_hi <= e[i].elem_lo || e[i].elem_hi > n ||
                e[i].read_seg >= h->nsegments || e[i].write_seg >= h->nsegments)
                return why_(why, len, "field %.64s of the segment: extent %u ([%llu, %llu) in segments %u, %u) does not "
                            "follow element %llu of %llu in a known segment", f->name, i,
                            (unsigned long long)e[i].elem_lo, (unsigned long long)e[i].elem_hi, e[i].read_seg,
                            e[i].write_seg, (unsigned long long)at, (unsigned long long)n);
            at = e[i].elem_hi;
        }
        if (at != n)
            return why_(why, len, "field %.64s of the segment: its extents end at element %llu of %llu", f->name,
                        (unsigned long long)at, (unsigned long long)n);
    }
    return 0;
}

typedef struct {
    int fd;
    size_t size;
    const char *path;
} opened;

/* Page tables. The segments are new to this process (a model runs per task), and the kernel sets up an entry
 * per 4 KiB page of each mapping. A read-only mapping faults as the model reads it, 16 pages per fault, cheaper
 * than populating it first. A written one would fault page by page, about twice the copy: for 52 MB, populating
 * it takes 3-4 ms. A helper thread populates the written mappings (MADV_POPULATE_WRITE, Linux 5.14) once the
 * model has closed the file it read its state from (enkflow_layout_prefault): while it runs, so that its put
 * finds the entries made. Not while it reads: the populating holds the address space's lock, and the mappings
 * nc_open and nc_close make and drop would wait for it. A put that comes first (the model writes through the
 * handle it read with) populates them itself. Where the kernel lacks the advice, the mapping is populated at
 * once (MAP_POPULATE). The populating changes no byte, so it may run beside the model's copies. */
int enkflow_can_populate(void) {
    static int known = -1;
    if (known < 0) {
        long page = sysconf(_SC_PAGESIZE);
        void *p = mmap(NULL, (size_t)page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        known = p != MAP_FAILED && madvise(p, (size_t)page, MADV_POPULATE_WRITE) == 0;
        if (p != MAP_FAILED)
            munmap(p, (size_t)page);
    }
    return known;
}

static void *prefault_all(void *arg) {
    const enkflow_layout *L = arg;
    for (uint32_t i = 0; i < L->nprefault; i++)
        madvise(L->prefault[i].at, L->prefault[i].bytes, MADV_POPULATE_WRITE);  /* a failure only costs faults */
    return NULL;
}

void enkflow_layout_prefault(enkflow_layout *L, int now) {
    if (!L->nprefault || L->prefaulting)
        return;
    L->prefaulting = 1;
    if (now || !ekf_helpers() || ekf_start_thread(NULL, prefault_all, L) != 0)
        prefault_all(L);
}

/* ``bytes`` at ``off`` of segment ``s``, mapped (its page tables to be set up by the helper, or at once); the
 * memfd (``s`` 0) is mapped already, at ``base``. */
static unsigned char *map_range(enkflow_layout *L, const opened *seg, uint32_t s, unsigned char *base, uint64_t off,
                                uint64_t bytes, int prot, char *why, size_t len) {
    if (off > seg[s].size || bytes > seg[s].size - off || (s == 0 && off < ENKFLOW_SHM_DATA_AT)) {
        why_(why, len, "%llu bytes at %llu are outside segment %u (%s, %zu bytes)", (unsigned long long)bytes,
             (unsigned long long)off, s, s ? seg[s].path : "the memfd", seg[s].size);
        return NULL;
    }
    if (s == 0)
        return base + off;
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), at = off / page * page;
    int later = enkflow_can_populate(), populate = prot & PROT_WRITE && !later ? MAP_POPULATE : 0;
    void *p = mmap(NULL, off + bytes - at, prot, MAP_SHARED | populate, seg[s].fd, (off_t)at);
    if (p == MAP_FAILED) {
        why_(why, len, "cannot map %llu bytes of %s: %s", (unsigned long long)bytes, seg[s].path, strerror(errno));
        return NULL;
    }
    if (later && prot & PROT_WRITE)
        L->prefault[L->nprefault++] = (enkflow_prefault){p, off + bytes - at};
    return (unsigned char *)p + (off - at);
}

/* Opens the table's segments (read-write only those written to) and maps every extent. */
static int map_extents(enkflow_layout *L, unsigned char *base, size_t size, const enkflow_shm_extent *e, char *why,
                       size_t len) {
    const enkflow_shm_header *h = L->hdr;
    const enkflow_shm_segment *table = (const enkflow_shm_segment *)(base + ENKFLOW_SHM_SEGMENTS_AT);
    opened seg[ENKFLOW_SHM_MAX_SEGMENTS];
    for (uint32_t s = 0; s < ENKFLOW_SHM_MAX_SEGMENTS; s++)
        seg[s] = (opened){-1, size, "the memfd"};
    int rc = 0;
    for (uint32_t s = 1; s < h->nsegments && !rc; s++) {
        int writable = 0;
        for (uint32_t i = 0; i < h->nextents; i++)
            writable |= e[i].write_seg == s;
        seg[s].path = table[s].path;
        struct stat st;
        if (!memchr(table[s].path, 0, ENKFLOW_SHM_PATH))
            errno = ENAMETOOLONG;
        else
            seg[s].fd = open(table[s].path, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
        if (seg[s].fd < 0 || fstat(seg[s].fd, &st) != 0)
            rc = why_(why, len, "cannot open segment %u (%.256s) of the server: %s", s, table[s].path, strerror(errno));
        else
            seg[s].size = (size_t)st.st_size;
    }
    for (uint32_t k = 0; k < h->nfields && !rc; k++)
        for (uint32_t i = L->f[k].extent0; i < L->f[k].extent0 + L->f[k].nextents && !rc; i++) {
            uint64_t bytes = (e[i].elem_hi - e[i].elem_lo) * L->esize[k];
            enkflow_place *p = &L->place[i];
            p->lo = e[i].elem_lo;
            p->hi = e[i].elem_hi;
            p->rd = map_range(L, seg, e[i].read_seg, base, e[i].read_off, bytes, PROT_READ, why, len);
            p->wr = p->rd ? map_range(L, seg, e[i].write_seg, base, e[i].write_off, bytes, PROT_READ | PROT_WRITE, why,
                                      len) : NULL;
            rc = p->wr ? 0 : -1;
        }
    for (uint32_t s = 1; s < h->nsegments; s++)
        if (seg[s].fd >= 0)
            close(seg[s].fd);
    return rc;
}

int enkflow_layout_map(int fd, enkflow_layout *L, char *why, size_t len) {
    struct stat st;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size < ENKFLOW_SHM_DATA_AT)
        return why_(why, len, "ENKFLOW_INTERCEPT_FD is not a shared segment from the enkflow wrapper (run the model "
                    "through `python -m enkflow.online.intercept`)");
    size_t size = (size_t)st.st_size;
    /* Populated at once: the wrapper has filled it, and one fault per page would cost more. */
    unsigned char *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (base == MAP_FAILED)
        return why_(why, len, "cannot map the segment of ENKFLOW_INTERCEPT_FD");
    enkflow_shm_header *h = (enkflow_shm_header *)base;
    if (memcmp(h->magic, ENKFLOW_SHM_MAGIC, 8) != 0 || h->version != ENKFLOW_SHM_VERSION)
        return why_(why, len, "the segment of ENKFLOW_INTERCEPT_FD has another layout version: the shim and the "
                    "enkflow wrapper come from different enkflow versions");
    L->hdr = h;
    L->f = (enkflow_shm_field *)(base + ENKFLOW_SHM_FIELDS_AT);
    if (h->nfields == 0 || h->nfields > ENKFLOW_SHM_MAX_FIELDS)
        return why_(why, len, "the segment announces %u fields (1 to %d are supported)", h->nfields,
                    ENKFLOW_SHM_MAX_FIELDS);
    if (h->nsegments == 0 || h->nsegments > ENKFLOW_SHM_MAX_SEGMENTS || h->nextents > ENKFLOW_SHM_MAX_EXTENTS)
        return why_(why, len, "the segment announces %u segments and %u extents (at most %d and %d)", h->nsegments,
                    h->nextents, ENKFLOW_SHM_MAX_SEGMENTS, ENKFLOW_SHM_MAX_EXTENTS);
    const enkflow_shm_extent *e = (const enkflow_shm_extent *)(base + ENKFLOW_SHM_EXTENTS_AT);
    if (check_fields(L, e, why, len) || map_extents(L, base, size, e, why, len))
        return -1;
    return 0;
}

/* The extent of field ``k`` that holds element ``off`` (which the field has). */
static const enkflow_place *find_place(const enkflow_layout *L, uint32_t k, uint64_t off) {
    uint32_t a = L->f[k].extent0, b = a + L->f[k].nextents;  /* the answer is in [a, b) */
    while (b - a > 1) {
        uint32_t m = a + (b - a) / 2;
        if (L->place[m].lo <= off)
            a = m;
        else
            b = m;
    }
    return &L->place[a];
}

void enkflow_layout_get(const enkflow_layout *L, uint32_t k, uint64_t off, uint64_t n, void *mem, int written) {
    unsigned char *to = mem;
    size_t es = L->esize[k];
    for (uint64_t end = off + n; off < end;) {
        const enkflow_place *p = find_place(L, k, off);
        uint64_t m = (p->hi < end ? p->hi : end) - off;
        ekf_split_copy(to, (written ? p->wr : p->rd) + (off - p->lo) * es, m, es, EKF_CHECK_NONE, 1);
        to += m * es;
        off += m;
    }
}

int enkflow_layout_put(const enkflow_layout *L, uint32_t k, uint64_t off, uint64_t n, const void *mem) {
    const unsigned char *from = mem;
    size_t es = L->esize[k];
    int finite = 1;
    for (uint64_t end = off + n; off < end;) {
        const enkflow_place *p = find_place(L, k, off);
        uint64_t m = (p->hi < end ? p->hi : end) - off;
        finite &= ekf_split_copy(p->wr + (off - p->lo) * es, from, m, es, L->check[k], 0);
        from += m * es;
        off += m;
    }
    return finite;
}
