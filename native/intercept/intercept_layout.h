/* Where the fields' elements are for one model run: the wrapper's memfd (intercept_shm.h) checked and mapped,
 * and every segment its table names mapped too (read-only where only read), for the shim's copies. */
#ifndef ENKFLOW_INTERCEPT_LAYOUT_H
#define ENKFLOW_INTERCEPT_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "copy_checked.h"
#include "intercept_shm.h"

/* The shim's own functions stay out of the model's symbol scope (the shim is preloaded into it). */
#define ENKFLOW_INTERNAL __attribute__((visibility("hidden")))

/* One extent, mapped: element lo of the field is at rd (to read) and at wr (to write). */
typedef struct {
    uint64_t lo, hi;
    const unsigned char *rd;
    unsigned char *wr;
} enkflow_place;

/* A written mapping whose page tables a helper thread sets up while the model runs (intercept_layout.c). */
typedef struct {
    void *at;
    size_t bytes;
} enkflow_prefault;

typedef struct {
    enkflow_shm_header *hdr;   /* set once the memfd's header checks out (errors can then be recorded in it) */
    enkflow_shm_field *f;
    uint64_t elements[ENKFLOW_SHM_MAX_FIELDS];
    size_t esize[ENKFLOW_SHM_MAX_FIELDS];  /* bytes per element */
    ekf_check check[ENKFLOW_SHM_MAX_FIELDS];  /* what a put checks of the elements it copies */
    enkflow_place place[ENKFLOW_SHM_MAX_EXTENTS];
    enkflow_prefault prefault[ENKFLOW_SHM_MAX_EXTENTS];
    uint32_t nprefault;
    int prefaulting;  /* the helper was started */
} enkflow_layout;

/* Maps the memfd ``fd`` and the segments it names into ``L``. 0 on success; otherwise -1 with the reason in
 * ``why`` (``len`` bytes). */
ENKFLOW_INTERNAL int enkflow_layout_map(int fd, enkflow_layout *L, char *why, size_t len);

/* Whether this kernel populates page tables on request (MADV_POPULATE_WRITE, Linux 5.14). */
ENKFLOW_INTERNAL int enkflow_can_populate(void);

/* Sets up the page tables of the written mappings, once: in a helper thread, or (``now``) before it returns. */
ENKFLOW_INTERNAL void enkflow_layout_prefault(enkflow_layout *L, int now);

/* Copies elements [off, off + n) of field ``k`` to ``mem``: from where they are read, or (``written``) from
 * where they are written. */
ENKFLOW_INTERNAL void enkflow_layout_get(const enkflow_layout *L, uint32_t k, uint64_t off, uint64_t n, void *mem, int written);

/* Copies ``mem`` to where elements [off, off + n) of field ``k`` are written; 1 when every element copied is
 * finite (or the field holds integers), else 0. */
ENKFLOW_INTERNAL int enkflow_layout_put(const enkflow_layout *L, uint32_t k, uint64_t off, uint64_t n, const void *mem);

#endif
