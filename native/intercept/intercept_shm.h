/* The memory the interception wrapper (enkflow.online.intercept) and the shim share for one task.
 *
 * The wrapper creates an anonymous memory file (memfd), writes this layout into it, fills the data
 * region with the member's state (the runner's GET writes there in place), and starts the model
 * with the file's descriptor in ENKFLOW_INTERCEPT_FD. The shim maps it and serves the model's
 * get/put calls on the state variables from it; after the model exits, the wrapper checks what the
 * shim recorded and sends the data region back to the server (PUT). Nothing touches a file system.
 *
 * Little-endian, fixed offsets; the Python side (enkflow/online/intercept.py, _HEADER and _FIELD)
 * spells the same layout and must change with it (ENKFLOW_SHM_VERSION).
 */
#ifndef ENKFLOW_INTERCEPT_SHM_H
#define ENKFLOW_INTERCEPT_SHM_H

#include <stdint.h>

#define ENKFLOW_SHM_MAGIC "ENKFSHM1"
#define ENKFLOW_SHM_VERSION 1u
#define ENKFLOW_SHM_FIELDS_AT 4096u  /* the first field record */
#define ENKFLOW_SHM_MAX_DIMS 16
#define ENKFLOW_SHM_NAME 256
#define ENKFLOW_SHM_ERROR 4016

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
    uint32_t pad;
    char error[ENKFLOW_SHM_ERROR];
} enkflow_shm_header;

/* One per field, from ENKFLOW_SHM_FIELDS_AT on. 512 bytes. */
typedef struct {
    char name[ENKFLOW_SHM_NAME];
    int32_t nctype;        /* NC_DOUBLE, NC_FLOAT, NC_INT or NC_INT64 */
    int32_t ndims;
    int64_t shape[ENKFLOW_SHM_MAX_DIMS];
    uint64_t offset;       /* of the field's data in the segment (C order), bytes */
    uint64_t nbytes;
    uint64_t elements_read;     /* shim */
    uint64_t elements_written;  /* shim: in the current write generation */
    uint32_t complete;          /* shim: the current generation covers every element once */
    uint32_t generations;       /* shim: complete writes (a rewrite after a complete one starts a new one) */
    uint32_t assimilated;
    uint32_t pad;
    char reserved[512 - ENKFLOW_SHM_NAME - 8 - 8 * ENKFLOW_SHM_MAX_DIMS - 4 * 8 - 4 * 4];
} enkflow_shm_field;

_Static_assert(sizeof(enkflow_shm_header) == 4096, "shm header layout");
_Static_assert(sizeof(enkflow_shm_field) == 512, "shm field layout");

#endif
