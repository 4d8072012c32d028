/*
 * enkflow_runner.h: the C runner API of enkflow's online mode (libenkflow_runner).
 *
 * A model process joins an enkflow assimilation server, receives member states into its own arrays,
 * runs the forecast and sends it back, speaking the same wire protocol as the Python Runner
 * (enkflow.online.runner; docs/online.md, docs/native.md):
 *
 *     enkflow_runner *r;
 *     int rc = enkflow_runner_create(&r, "tcp://127.0.0.1:5555", token);
 *     int64_t n = 1000, nsteps;
 *     double x[1000];
 *     rc = enkflow_runner_add_field(r, "x", ENKFLOW_FLOAT64, 1, &n, 1);
 *     rc = enkflow_runner_init(r);                        // HELLO: the server checks the fields
 *     rc = enkflow_runner_bind(r, "x", ENKFLOW_FLOAT64, x, n);
 *     while ((rc = enkflow_runner_expose(r, &nsteps)) == ENKFLOW_OK && nsteps > 0)
 *         advance(x, nsteps, enkflow_runner_member(r), enkflow_runner_cycle(r));
 *     if (rc != ENKFLOW_OK) fprintf(stderr, "%s\n", enkflow_runner_errmsg(r));
 *     enkflow_runner_finalize(r);                          // BYE, frees r
 *
 * Every function returns an error code (ENKFLOW_OK = 0); enkflow_runner_errmsg(r) gives the detail of
 * the last error of that runner (for a refusal: the server's own text). The library never calls exit(),
 * abort() or installs signal handlers, and keeps no global state: several runners may live in one
 * process. One runner handle must be used by one thread at a time; its heartbeat thread is internal.
 */
#ifndef ENKFLOW_RUNNER_H
#define ENKFLOW_RUNNER_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ENKFLOW_RUNNER_VERSION_MAJOR 0
#define ENKFLOW_RUNNER_VERSION_MINOR 1
/* The wire protocol version spoken (enkflow.online.wire.PROTOCOL_VERSION). */
#define ENKFLOW_PROTOCOL_VERSION 2

/* Element types of a field (the numbers are part of the ABI: the Fortran module uses them). */
#if defined(ENKFLOW_BUILDING) && defined(__GNUC__)
#define ENKFLOW_API __attribute__((visibility("default")))
#else
#define ENKFLOW_API
#endif

typedef enum enkflow_dtype {
    ENKFLOW_FLOAT32 = 1,
    ENKFLOW_FLOAT64 = 2,
    ENKFLOW_INT32 = 3,
    ENKFLOW_INT64 = 4
} enkflow_dtype;

/* Error codes. */
enum {
    ENKFLOW_OK = 0,
    ENKFLOW_EINVAL = 1,    /* a bad argument: NULL pointer, bad name, dtype, shape, slice, timeout or transport */
    ENKFLOW_ESTATE = 2,    /* a call out of order (add_field after init, expose before init or bind...) */
    ENKFLOW_ENOMEM = 3,    /* out of memory */
    ENKFLOW_EFIELD = 4,    /* a field name that was not declared (bind), or a duplicate declaration */
    ENKFLOW_ETYPE = 5,     /* an array of another element type than the field's */
    ENKFLOW_ESIZE = 6,     /* an array of another element count than the field's (slice) */
    ENKFLOW_EREFUSED = 7,  /* the server refused (wrong token, fields that do not match, a rejected forecast) */
    ENKFLOW_ELOST = 8,     /* the server went away and did not come back within the reconnect time */
    ENKFLOW_EPROTOCOL = 9, /* a malformed reply, or a server speaking another protocol version */
    ENKFLOW_EZMQ = 10,     /* a ZeroMQ call failed (bad address, no CURVE support...) */
    ENKFLOW_EIO = 11,      /* reading a token file failed */
    ENKFLOW_EINTR = 12,    /* the caller's stop flag was set while the runner waited (enkflow_runner_set_stop_flag) */
    ENKFLOW_EOUTPUT = 13   /* the output service reported a failure of this client's adds (enkflow_output.h) */
};

/* How the member states move between the runner and a server rank (enkflow_runner_set_transport). */
typedef enum enkflow_transport {
    ENKFLOW_TRANSPORT_AUTO = 0, /* shared memory with each server rank on this node that offers it, TCP otherwise */
    ENKFLOW_TRANSPORT_SHM = 1,  /* shared memory with every server rank; one that cannot: init fails naming it */
    ENKFLOW_TRANSPORT_TCP = 2   /* TCP with every server rank */
} enkflow_transport;

typedef struct enkflow_runner enkflow_runner;

/* The generic text of an error code ("unknown error code" for others); never NULL, static storage. */
ENKFLOW_API const char *enkflow_strerror(int code);

/* What went wrong in the last call on r, in full (the field, the sizes, the server's own refusal text...;
 * enkflow_strerror(code) is the generic text of its code); "" when the last call succeeded. Valid until
 * the next call on r. r may be NULL: then a fixed message. */
ENKFLOW_API const char *enkflow_runner_errmsg(const enkflow_runner *r);

/* For language bindings (the Fortran module): record message as the last error of r, so that
 * enkflow_runner_errmsg(r) says it, and return code. r may be NULL (then only code is returned). */
ENKFLOW_API int enkflow_runner_set_error(enkflow_runner *r, int code, const char *message);

/* The library's version "MAJOR.MINOR" and its protocol version. */
ENKFLOW_API const char *enkflow_runner_version(void);

/* Read a token file as the Python runner does (the content, whitespace stripped at both ends) into
 * buf (size bytes, NUL-terminated). Returns ENKFLOW_EIO (unreadable, empty) or ENKFLOW_EINVAL
 * (does not fit). errbuf (errsize bytes, may be NULL) receives the detail. */
ENKFLOW_API int enkflow_read_token_file(const char *path, char *buf, size_t size, char *errbuf, size_t errsize);

/* A new runner for the server's control address ("tcp://HOST:PORT") and the shared token. *out is
 * set whenever memory allows, even on error (then enkflow_runner_errmsg(*out) says why; free it with
 * enkflow_runner_finalize). Nothing is sent before enkflow_runner_init. */
ENKFLOW_API int enkflow_runner_create(enkflow_runner **out, const char *address, const char *token);

/* Options, before init. timeout_s bounds every wait for the server except the wait for a task
 * (default 600 s); reconnect_s is how long to wait for a lost server to come back (default 120 s). */
ENKFLOW_API int enkflow_runner_set_timeouts(enkflow_runner *r, double timeout_s, double reconnect_s);
/* The runner's name in the server's events (default HOST:PID). */
ENKFLOW_API int enkflow_runner_set_name(enkflow_runner *r, const char *name);
/* The server's CURVE public key (40 Z85 characters) when it encrypts ([online] curve = true). */
ENKFLOW_API int enkflow_runner_set_curve_key(enkflow_runner *r, const char *server_key);

/* The transport (before init). Without this call, the environment variable ENKFLOW_TRANSPORT (auto, shm or
 * tcp; enkflow sets it for the runners it starts from [online] transport) decides, else AUTO. Over shared
 * memory the library copies a member's state straight from the server's segment into the bound arrays,
 * and the forecast from them into the task's slot: one memory copy each way. */
ENKFLOW_API int enkflow_runner_set_transport(enkflow_runner *r, enkflow_transport transport);

/* The number of server ranks this runner rank exchanges with through shared memory (after init; the
 * others by TCP), -1 for r NULL. */
ENKFLOW_API int enkflow_runner_shm_ranks(const enkflow_runner *r);

/* A flag the library watches while it waits for the server (at least once a second, and at once when a
 * signal interrupts the wait): once *flag is non-zero, the call in progress returns ENKFLOW_EINTR. Meant
 * for a SIGTERM handler that sets the flag: the model then calls enkflow_runner_finalize, whose BYE gives
 * the member held back to the server at once (reason "left", not counted as a failure). NULL: none.
 * A model that calls enkflow_runner_expose again instead: a task whose state did not arrive whole is
 * failed (FAIL), never sent as a forecast. */
ENKFLOW_API int enkflow_runner_set_stop_flag(enkflow_runner *r, const volatile sig_atomic_t *flag);

/* Declare a field of a member's state, before init, in the server's order: name, element type, the
 * whole field's shape (ndim extents, C order; ndim 0 is a scalar), assimilated (1) or carried (0;
 * restart data the analysis leaves alone). An assimilated field must be float32 or float64. */
ENKFLOW_API int enkflow_runner_add_field(enkflow_runner *r, const char *name, enkflow_dtype dtype, int ndim,
                             const int64_t *shape, int assimilated);

/* MPI models (N-to-M): this process is rank `rank` of `size` runner processes, holding the elements
 * [offset, offset + count) of the flattened field `name` (default: the whole field). The library links
 * no MPI: the ranks are coordinated by the caller's collective callbacks, see
 * enkflow_runner_set_comm. */
ENKFLOW_API int enkflow_runner_set_slice(enkflow_runner *r, const char *name, int64_t offset, int64_t count);

/* The caller's collectives for an MPI runner (before init):
 *   bcast(buf, nbytes, ctx): rank 0's nbytes bytes of buf to every rank (MPI_Bcast of MPI_BYTE, root 0);
 *   allreduce_max(value, ctx): the maximum of value over the ranks (MPI_Allreduce, MPI_MAX).
 * Each returns 0 on success. Only rank 0 talks to the control socket; each rank moves its own slices. */
typedef int (*enkflow_bcast_fn)(void *buf, size_t nbytes, void *ctx);
typedef int (*enkflow_allmax_fn)(int *value, void *ctx);
ENKFLOW_API int enkflow_runner_set_comm(enkflow_runner *r, int rank, int size, enkflow_bcast_fn bcast,
                            enkflow_allmax_fn allreduce_max, void *ctx);

/* Join the server: HELLO with the fields, wait (up to reconnect_s) for its WELCOME, connect to its data
 * ranks, start the heartbeat thread. ENKFLOW_EREFUSED with the server's text when it expects other
 * fields (a field it does not know, another dtype or shape) or another token. */
ENKFLOW_API int enkflow_runner_init(enkflow_runner *r);

/* Tell the runner where field `name` lives: count elements of type dtype at data (this rank's slice,
 * C order). The memory must stay valid, and in place, until the last expose. Checked against the
 * declaration: ENKFLOW_EFIELD (not declared), ENKFLOW_ETYPE, ENKFLOW_ESIZE. Rebinding is allowed. */
ENKFLOW_API int enkflow_runner_bind(enkflow_runner *r, const char *name, enkflow_dtype dtype, void *data, int64_t count);

/* Send the forecast of the task held (none on the first call) from the bound arrays, ask for the next
 * task and write that member's state into the bound arrays in place. *nsteps receives the model steps
 * to run, 0 when the study is over (then stop, and finalize). A server that restarts is greeted again
 * transparently (the task in hand is dropped). On ENKFLOW_EREFUSED (a rejected forecast) the task is
 * dropped and the server requeues the member; the runner may call expose again. */
ENKFLOW_API int enkflow_runner_expose(enkflow_runner *r, int64_t *nsteps);

/* The task in hand: member (1-based; 0 none), cycle, steps, task id (0 none). */
ENKFLOW_API int64_t enkflow_runner_member(const enkflow_runner *r);
ENKFLOW_API int64_t enkflow_runner_cycle(const enkflow_runner *r);
ENKFLOW_API int64_t enkflow_runner_nsteps(const enkflow_runner *r);
ENKFLOW_API uint64_t enkflow_runner_task(const enkflow_runner *r);

/* Report that the model failed on the member held (the server gives it to another runner; after
 * max_failures the study stops naming the member and this error text). No-op without a task. */
ENKFLOW_API int enkflow_runner_fail(enkflow_runner *r, const char *error);

/* Leave the study (BYE: a task still held goes to another runner), stop the heartbeat thread, close the
 * sockets and free r. r may be NULL. r is invalid afterwards, whatever the result.
 * Fork: a runner serves the process that created it. In a forked child (without exec), init, expose and
 * fail return ENKFLOW_ESTATE, and finalize frees the child's copy of r without touching the sockets or
 * threads (the parent's) and returns ENKFLOW_ESTATE. */
ENKFLOW_API int enkflow_runner_finalize(enkflow_runner *r);

#ifdef __cplusplus
}
#endif
#endif /* ENKFLOW_RUNNER_H */
