/* The copies of one box of a field (a hyperslab: a start and a count per dimension, C order) between the
 * model's buffer and where the layout (intercept_layout.h) puts the field's elements, and the bitmap of the
 * elements written so far (bit i of byte i / 8: element i, C order). */
#ifndef ENKFLOW_INTERCEPT_BOX_H
#define ENKFLOW_INTERCEPT_BOX_H

#include <stddef.h>
#include <stdint.h>

#include "intercept_layout.h"

/* The box of field ``k`` to ``mem``: from where its elements are read, except those written: all (``written``)
 * or those set in ``bits`` (NULL: none). */
ENKFLOW_INTERNAL void enkflow_box_get(const enkflow_layout *L, uint32_t k, const size_t *start, const size_t *count,
                                      void *mem, const uint8_t *bits, int written);

/* ``mem`` to where the box's elements are written; they are set in ``bits`` unless it is NULL. 1 when every
 * element copied is finite (or the field holds integers), else 0. */
ENKFLOW_INTERNAL int enkflow_box_put(const enkflow_layout *L, uint32_t k, const size_t *start, const size_t *count,
                                      const void *mem, uint8_t *bits);

/* The first element of the box (C order) set in ``bits``, plus 1; 0 when none is. */
ENKFLOW_INTERNAL uint64_t enkflow_box_overlap(const enkflow_layout *L, uint32_t k, const size_t *start,
                                              const size_t *count, const uint8_t *bits);

/* Huge pages asked for where ``bytes`` at ``mem`` span them (see intercept_box.c). */
ENKFLOW_INTERNAL void enkflow_huge_pages_for(void *mem, size_t bytes);

#endif
