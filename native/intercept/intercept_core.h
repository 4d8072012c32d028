/* What the shim's netCDF entry points (intercept_calls.c) use of its core (intercept.c): the state of the
 * interception, its handles of the intercepted restart, and its answer to a get or put. */
#ifndef ENKFLOW_INTERCEPT_CORE_H
#define ENKFLOW_INTERCEPT_CORE_H

#include <netcdf.h>
#include <stddef.h>

#include "intercept_layout.h"

enum { GET, PUT };
enum { KIND_VAR, KIND_VAR1, KIND_VARA, KIND_VARS, KIND_VARM };

/* The real libnetcdf's ``name`` (NULL, with the error recorded, when no loaded library has it). */
ENKFLOW_INTERNAL void *enkflow_next_symbol(const char *name);

/* Reports an error (stderr, and the first one for the wrapper); returns ``code``, a netCDF status. */
ENKFLOW_INTERNAL int enkflow_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* 1: ``path`` is the intercepted restart; -1: it is, but the shim could not set up (an error); 0: it is not. */
ENKFLOW_INTERNAL int enkflow_target(const char *path);

/* Whether ENKFLOW_INTERCEPT_TRACE asks for a line per intercepted call. */
ENKFLOW_INTERNAL int enkflow_tracing(void);

/* The intercepted restart opened as ``ncid`` (``mode`` the model's, which asked NC_WRITE or not) or created:
 * its fields checked against the file's variables; a status (on an error the real handle is closed). */
ENKFLOW_INTERNAL int enkflow_opened(int ncid, int mode);
ENKFLOW_INTERNAL int enkflow_created(int ncid);

/* Before the real nc_close of ``ncid``: the handle forgotten; a status (a field written only in part). */
ENKFLOW_INTERNAL int enkflow_closing(int ncid);

/* After the real nc_close of a handle: once the model has read a field, the page tables of where its forecast
 * goes are set up in the background (intercept_layout.c). */
ENKFLOW_INTERNAL void enkflow_closed(void);

/* Before the real nc_abort of ``ncid``: the handle forgotten. */
ENKFLOW_INTERNAL void enkflow_aborting(int ncid);

/* A get/put on ``ncid``/``varid``: handled here (*handled = 1, returns the status) or left to the real call. */
ENKFLOW_INTERNAL int enkflow_intercept(int op, const char *fn, int ncid, int varid, nc_type memtype, int kind,
                                       const size_t *start, const size_t *count, const ptrdiff_t *stride,
                                       const ptrdiff_t *imap, void *mem, int *handled);

#endif
