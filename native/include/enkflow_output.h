/*
 * enkflow_output.h: the C client of enkflow's study-wide output service (part of libenkflow_runner).
 *
 * The calls of the Python RemoteOutput (enkflow.output.remote; docs/output.md, "The output service";
 * docs/native.md): a model hands its fields to the service's writer processes, which write CF NetCDF
 * files and the inline ensemble diagnostics while the model goes on.
 *
 *     enkflow_output *o;
 *     int rc = enkflow_output_open(&o, output_address, output_token_file, 0);   // hello, welcome
 *     int64_t shape[2] = {nlat, nlon};
 *     if (!rc) rc = enkflow_output_add(o, "sst", ENKFLOW_FLOAT64, x, 2, shape, 6.0, member, NULL);
 *     if (!rc) rc = enkflow_output_close(o, 1);          // wait until written; this client's errors
 *     if (rc) fprintf(stderr, "%s\n", enkflow_output_errmsg(o));
 *     enkflow_output_free(o);
 *
 * Error codes are the runner's (enkflow_runner.h; enkflow_strerror). add checks everything against the
 * [output] configuration the service sends in its welcome before anything is sent; a failure of the
 * writers caused by this client's adds (NaN under nan = "error", a full disk...) is returned by its next
 * sync, discard or close as ENKFLOW_EOUTPUT. No call waits forever: a service that dies (its pid, on the
 * same host; a dropped connection, anywhere) gives ENKFLOW_ELOST at once, one that stays silent for the
 * timeout (enkflow_output_set_timeout) too; after ENKFLOW_ELOST every call but free returns it again.
 * The library never calls exit() or abort(), never prints and keeps no global state; one handle must be
 * used by one thread at a time.
 */
#ifndef ENKFLOW_OUTPUT_H
#define ENKFLOW_OUTPUT_H

#include <stdint.h>

#include "enkflow_runner.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct enkflow_output enkflow_output;

/* This client's figures (RemoteOutput.stats()). */
typedef struct enkflow_output_stats {
    int64_t adds;     /* pieces added */
    int64_t bytes;    /* their data bytes, as sent (int32/int64 arrays are sent as float64) */
    double add_s;     /* seconds spent in enkflow_output_add (checks, copy, send) */
    double blocked_s; /* of add_s, seconds waiting because the service was behind (back-pressure) */
} enkflow_output_stats;

/* Connect to the service at address (its DIR/address: "ipc://..." or "tcp://HOST:PORT"), with the token
 * read from token_file (DIR/token; whitespace stripped), and wait for its welcome (at most timeout_s;
 * <= 0: 30 s). *out is set whenever memory allows, even on error (enkflow_output_errmsg(*out) says why;
 * free it with enkflow_output_free). ENKFLOW_EIO (token file), ENKFLOW_EREFUSED (wrong token),
 * ENKFLOW_ELOST (no welcome in time), ENKFLOW_EPROTOCOL (a welcome without a usable configuration). */
ENKFLOW_API int enkflow_output_open(enkflow_output **out, const char *address, const char *token_file, double timeout_s);

/* The same from the service's directory (RemoteOutput.from_dir): DIR/address and DIR/token. No
 * DIR/address: ENKFLOW_ELOST ("no output service is running there"). */
ENKFLOW_API int enkflow_output_open_dir(enkflow_output **out, const char *directory, double timeout_s);

/* The longest wait for the service after the welcome (a sync, discard or close, and add while the
 * service is behind) in which it neither answers nor takes data, before ENKFLOW_ELOST (default 600 s). */
ENKFLOW_API int enkflow_output_set_timeout(enkflow_output *o, double timeout_s);

/* Hand the array at data to the service: field name, at time (in the configuration's time_units),
 * member 1..members of an ensemble field (0: none, for a field with ensemble = false).
 * dtype: ENKFLOW_FLOAT32 or ENKFLOW_FLOAT64 (sent as they are), ENKFLOW_INT32 or ENKFLOW_INT64 (sent as
 * float64, as Python does). ndim, shape: the array's extents, C order (ndim 0: a scalar).
 * region: NULL for the whole field (then shape must be the field's), else 2 * ndim numbers
 * {start0, stop0, start1, stop1, ...}, 0-based, stop excluded: where the array sits in the field
 * (stop - start must be the array's extent). The array is copied before add returns.
 * Checked before sending: ENKFLOW_EFIELD (not declared), ENKFLOW_EINVAL (member, time not finite, bad
 * pointer), ENKFLOW_ETYPE (dtype), ENKFLOW_ESIZE (shape, region, more than the service's buffer_mb);
 * ENKFLOW_ESTATE (after close), ENKFLOW_ELOST (the service is gone while add waited for it). */
ENKFLOW_API int enkflow_output_add(enkflow_output *o, const char *name, enkflow_dtype dtype, const void *data, int ndim,
                                   const int64_t *shape, double time, int64_t member, const int64_t *region);

/* Wait until every array added so far (by this process and the other clients) is written. Returns
 * ENKFLOW_EOUTPUT with the service's text when the writers failed on this client's adds. */
ENKFLOW_API int enkflow_output_sync(enkflow_output *o);

/* Forget time (every field) before adding it again (a rerun); *ndropped (may be NULL) receives the
 * number of fields whose open pieces were dropped, enkflow_output_dropped(o) their names. */
ENKFLOW_API int enkflow_output_discard(enkflow_output *o, double time, int64_t *ndropped);
/* The fields the last discard dropped, comma-separated ("" none). Valid until the next call on o. */
ENKFLOW_API const char *enkflow_output_dropped(const enkflow_output *o);

/* Say goodbye. wait != 0: first wait until everything is written (a sync), so that the writers' errors
 * come back here; 0: return once the service has received every add (it writes them later; its owner
 * learns of a failure). The socket is closed whatever the result; o stays valid for errmsg and stats
 * until enkflow_output_free. A second close returns ENKFLOW_OK. */
ENKFLOW_API int enkflow_output_close(enkflow_output *o, int wait);

/* Free o (without a goodbye if close was not called: the service forgets this client once its
 * process is gone). o may be NULL. */
ENKFLOW_API void enkflow_output_free(enkflow_output *o);

/* What went wrong in the last call on o, in full ("" after a success). o may be NULL. */
ENKFLOW_API const char *enkflow_output_errmsg(const enkflow_output *o);
/* For language bindings: record message as o's last error and return code. */
ENKFLOW_API int enkflow_output_set_error(enkflow_output *o, int code, const char *message);

/* This client's figures; the service's own figures (its Output.stats(), all clients together) at the
 * last sync or close as a JSON object ("{}" before). */
ENKFLOW_API int enkflow_output_get_stats(const enkflow_output *o, enkflow_output_stats *stats);
ENKFLOW_API const char *enkflow_output_service_stats(const enkflow_output *o);

/* The ensemble size (the configuration's members) and the service's pid (0 before the welcome). */
ENKFLOW_API int64_t enkflow_output_members(const enkflow_output *o);
ENKFLOW_API int64_t enkflow_output_service_pid(const enkflow_output *o);

#ifdef __cplusplus
}
#endif
#endif /* ENKFLOW_OUTPUT_H */
