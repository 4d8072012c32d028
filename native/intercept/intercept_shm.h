/* The memory the interception wrapper (enkflow.online.intercept) and the shim share for one task.
 *
 * The wrapper creates an anonymous memory file (memfd), writes this layout into it and starts the
 * model with the file's descriptor in ENKFLOW_INTERCEPT_FD. The layout says, per field, where its
 * elements are: a list of extents, each a range of the field's elements (C order) with the segment and
 * byte offset it is read from and the segment and byte offset it is written to. Segment 0 is the memfd
 * itself; the others are named by path in the segment table (the server's shared memory segments).
 *
 * - Through TCP the memfd holds the member's state after the tables (the runner's GET writes there):
 *   one extent per field, read and written in the memfd's data region; after the model exits, the
 *   wrapper sends that region back to the server (PUT).
 * - In place (a runner on the server's node): the extents name the server's store segment (read, the
 *   member's state) and the task's slot (write, the forecast); the shim maps them itself, so the
 *   model's get/put calls copy straight between its arrays and the server's memory.
 *
 * Little-endian, fixed offsets; the Python side (enkflow/online/intercept.py, _HEADER, _FIELD, _EXTENT)
 * spells the same layout and must change with it (ENKFLOW_SHM_VERSION).
 */
#ifndef ENKFLOW_INTERCEPT_SHM_H
#define ENKFLOW_INTERCEPT_SHM_H

#include <stdint.h>

#define ENKFLOW_SHM_MAGIC "ENKFSHM1"
#define ENKFLOW_SHM_VERSION 3u
#define ENKFLOW_SHM_MAX_DIMS 16
#define ENKFLOW_SHM_NAME 256
#define ENKFLOW_SHM_ERROR 4008
#define ENKFLOW_SHM_MAX_FIELDS 64
#define ENKFLOW_SHM_MAX_SEGMENTS 64
#define ENKFLOW_SHM_MAX_EXTENTS 1024
#define ENKFLOW_SHM_PATH 256
#define ENKFLOW_SHM_FIELDS_AT 4096u                                                 /* the field records */
#define ENKFLOW_SHM_SEGMENTS_AT (ENKFLOW_SHM_FIELDS_AT + 512u * ENKFLOW_SHM_MAX_FIELDS)  /* the segment table */
#define ENKFLOW_SHM_EXTENTS_AT (ENKFLOW_SHM_SEGMENTS_AT + ENKFLOW_SHM_PATH * ENKFLOW_SHM_MAX_SEGMENTS)
#define ENKFLOW_SHM_DATA_AT (ENKFLOW_SHM_EXTENTS_AT + 48u * ENKFLOW_SHM_MAX_EXTENTS)   /* 4096-aligned */

/* Written by the wrapper except where marked "shim". 4096 bytes. */
typedef struct {
    char magic[8];
    uint32_t version;
    uint32_t nfields;
    int64_t member, cycle, nsteps, task;
    uint64_t opens;        /* shim: opens/creates of the intercepted path */
    uint64_t get_ns;       /* shim: nanoseconds spent in intercepted get calls */
    uint64_t put_ns;       /* shim: ... in intercepted put calls */
    uint32_t error_set;    /* shim: 1 once error holds the first error met */
    uint32_t nsegments;    /* entries of the segment table, the memfd (0) included */
    uint32_t nextents;
    uint32_t pad;
    char error[ENKFLOW_SHM_ERROR];
} enkflow_shm_header;

/* One per field, from ENKFLOW_SHM_FIELDS_AT on. 512 bytes. */
typedef struct {
    char name[ENKFLOW_SHM_NAME];
    int32_t nctype;        /* NC_DOUBLE, NC_FLOAT, NC_INT or NC_INT64 */
    int32_t ndims;
    int64_t shape[ENKFLOW_SHM_MAX_DIMS];
    uint32_t extent0;      /* the field's first extent: they follow one another, in element order, and tile it */
    uint32_t nextents;
    uint64_t nbytes;
    uint64_t elements_read;     /* shim */
    uint64_t elements_written;  /* shim: in the current write generation */
    uint32_t complete;          /* shim: the current generation covers every element once */
    uint32_t generations;       /* shim: complete writes (a rewrite after a complete one starts a new one) */
    uint32_t assimilated;
    uint32_t nonfinite;         /* shim: 1 once the current generation wrote a NaN or an Inf (0: the wrapper
                                   tells the server the field's slot holds none, sparing it a read) */
    char reserved[512 - ENKFLOW_SHM_NAME - 8 - 8 * ENKFLOW_SHM_MAX_DIMS - 4 * 8 - 4 * 4];
} enkflow_shm_field;

/* One per entry of the segment table, from ENKFLOW_SHM_SEGMENTS_AT on: a path (entry 0, the memfd, is empty). */
typedef struct {
    char path[ENKFLOW_SHM_PATH];
} enkflow_shm_segment;

/* One per extent, from ENKFLOW_SHM_EXTENTS_AT on. 48 bytes. */
typedef struct {
    uint64_t elem_lo, elem_hi;      /* the field's elements [lo, hi), C order */
    uint32_t read_seg, write_seg;   /* entries of the segment table */
    uint64_t read_off, write_off;   /* bytes: where element lo is in each segment */
    uint64_t reserved;
} enkflow_shm_extent;

_Static_assert(sizeof(enkflow_shm_header) == 4096, "shm header layout");
_Static_assert(sizeof(enkflow_shm_field) == 512, "shm field layout");
_Static_assert(sizeof(enkflow_shm_extent) == 48, "shm extent layout");
_Static_assert(ENKFLOW_SHM_DATA_AT % 4096 == 0, "shm data alignment");

#endif
