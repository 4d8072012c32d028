/* The runner: enkflow.online.runner.Runner in C (see enkflow_runner.h and docs/native.md). */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "runner_state.h"

#define ERRSIZE EKF_ERRSIZE

static const char *const MESSAGES[] = {
    "success",
    "invalid argument",
    "call out of order",
    "out of memory",
    "no such field",
    "wrong element type",
    "wrong element count",
    "refused by the server",
    "the server went away",
    "protocol error",
    "ZeroMQ error",
    "cannot read the token file",
    "interrupted",
    "the output service reported an error",
};

const char *enkflow_strerror(int code) {
    if (code < 0 || code >= (int)(sizeof MESSAGES / sizeof MESSAGES[0])) return "unknown error code";
    return MESSAGES[code];
}

const char *enkflow_runner_errmsg(const enkflow_runner *r) {
    if (!r) return "no runner (enkflow_runner_create failed for lack of memory, or was not called)";
    return r->err;
}

const char *enkflow_runner_version(void) { return "0.1"; }

int enkflow_runner_set_error(enkflow_runner *r, int code, const char *message) {
    if (r) snprintf(r->err, sizeof r->err, "%s", message ? message : "");
    return code;
}

int ekf_rerr(enkflow_runner *r, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    ekf_vset_err(r->err, fmt, ap);
    va_end(ap);
    return code;
}

/* An error whose detail is already in buf (from a lower layer). */
static int set_err_detail(enkflow_runner *r, int code, const char *detail) {
    char tmp[ERRSIZE];
    snprintf(tmp, sizeof tmp, "%s", detail);
    return ekf_rerr(r, code, "%s", tmp);
}

static int ok(enkflow_runner *r) {
    r->err[0] = 0;
    return ENKFLOW_OK;
}

static const char *dtype_name(int t) {
    switch (t) {
        case ENKFLOW_FLOAT32: return "float32";
        case ENKFLOW_FLOAT64: return "float64";
        case ENKFLOW_INT32: return "int32";
        case ENKFLOW_INT64: return "int64";
        default: return "an unknown type";
    }
}

static field *find_field(enkflow_runner *r, const char *name) {
    for (int k = 0; k < r->nfields; k++)
        if (strcmp(r->fields[k].name, name) == 0) return &r->fields[k];
    return NULL;
}

static void list_fields(enkflow_runner *r, char *out, size_t n) {
    size_t used = 0;
    out[0] = 0;
    for (int k = 0; k < r->nfields && used < n; k++)
        used += (size_t)snprintf(out + used, n - used, "%s'%s'", k ? ", " : "", r->fields[k].name);
    if (!r->nfields) snprintf(out, n, "none");
}

/* --- set-up ---------------------------------------------------------------------------------- */

int enkflow_read_token_file(const char *path, char *buf, size_t size, char *errbuf, size_t errsize) {
    char dummy[8];
    if (!errbuf) { errbuf = dummy; errsize = sizeof dummy; }
    if (!path || !buf || !size) {
        snprintf(errbuf, errsize, "NULL path or buffer");
        return ENKFLOW_EINVAL;
    }
    FILE *fh = fopen(path, "rb");
    if (!fh) {
        snprintf(errbuf, errsize, "cannot read the token file %s: %s", path, strerror(errno));
        return ENKFLOW_EIO;
    }
    size_t n = fread(buf, 1, size, fh);
    int rerr = ferror(fh);
    int more = n == size && fgetc(fh) != EOF;
    fclose(fh);
    if (rerr) {
        snprintf(errbuf, errsize, "cannot read the token file %s", path);
        return ENKFLOW_EIO;
    }
    size_t a = 0, b = n;
    while (a < b && isspace((unsigned char)buf[a])) a++;
    while (b > a && isspace((unsigned char)buf[b - 1])) b--;
    if (more || (b - a) + 1 > size) {
        snprintf(errbuf, errsize, "the token in %s does not fit in %zu bytes", path, size);
        return ENKFLOW_EINVAL;
    }
    if (a == b) {
        snprintf(errbuf, errsize, "the token file %s is empty", path);
        return ENKFLOW_EIO;
    }
    memmove(buf, buf + a, b - a);
    buf[b - a] = 0;
    return ENKFLOW_OK;
}

int enkflow_runner_create(enkflow_runner **out, const char *address, const char *token) {
    if (!out) return ENKFLOW_EINVAL;
    ekf_lease_watch();
    enkflow_runner *r = calloc(1, sizeof *r);
    *out = r;
    if (!r) return ENKFLOW_ENOMEM;
    r->pid = getpid();
    r->timeout_s = 600.0;
    r->reconnect_s = 120.0;
    r->size = 1;
    r->transport = -1;
    pthread_mutex_init(&r->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (!address || !*address) return ekf_rerr(r, ENKFLOW_EINVAL, "no server address (tcp://HOST:PORT)");
    if (!token || !*token) return ekf_rerr(r, ENKFLOW_EINVAL, "no token (the content of EXPDIR/online/token)");
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    char name[320];
    snprintf(name, sizeof name, "%s:%ld", host, (long)getpid());
    r->address = strdup(address);
    r->name = strdup(name);
    if (!r->address || !r->name) return ekf_rerr(r, ENKFLOW_ENOMEM, "creating the runner");
    if (ekf_credential(token, r->cred)) return ekf_rerr(r, ENKFLOW_ENOMEM, "libsodium failed to initialise");
    uint64_t id;
    randombytes_buf(&id, sizeof id);
    r->id = (id & ((UINT64_C(1) << 63) - 1)) ? (id & ((UINT64_C(1) << 63) - 1)) : 1;
    r->zctx = zmq_ctx_new();
    if (!r->zctx) return ekf_rerr(r, ENKFLOW_EZMQ, "zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
    return ok(r);
}

/* A forked child's copy of the handle: its sockets and threads are the parent's (the child has none of
 * ZeroMQ's threads), so it must not talk, close or wait on them. */
static int forked(enkflow_runner *r, const char *what) {
    if (r->pid == getpid()) return 0;
    ekf_rerr(r, ENKFLOW_ESTATE, "%s in a process forked from the one that created the runner (pid %ld): a runner "
            "serves only its own process", what, (long)r->pid);
    return 1;
}

static int before_init(enkflow_runner *r, const char *what) {
    if (!r->zctx) return ekf_rerr(r, ENKFLOW_ESTATE, "%s: enkflow_runner_create failed, see its message", what);
    if (r->inited) return ekf_rerr(r, ENKFLOW_ESTATE, "%s must come before enkflow_runner_init", what);
    return ENKFLOW_OK;
}

int enkflow_runner_set_timeouts(enkflow_runner *r, double timeout_s, double reconnect_s) {
    if (!r) return ENKFLOW_EINVAL;
    int rc = before_init(r, "enkflow_runner_set_timeouts");
    if (rc) return rc;
    if (!(timeout_s > 0) || !(reconnect_s >= 0))
        return ekf_rerr(r, ENKFLOW_EINVAL, "timeouts must be > 0 s (timeout) and >= 0 s (reconnect), got %g and %g",
                       timeout_s, reconnect_s);
    r->timeout_s = timeout_s;
    r->reconnect_s = reconnect_s;
    return ok(r);
}

int enkflow_runner_set_name(enkflow_runner *r, const char *name) {
    if (!r) return ENKFLOW_EINVAL;
    int rc = before_init(r, "enkflow_runner_set_name");
    if (rc) return rc;
    if (!name || !*name) return ekf_rerr(r, ENKFLOW_EINVAL, "empty runner name");
    char *copy = strdup(name);
    if (!copy) return ekf_rerr(r, ENKFLOW_ENOMEM, "runner name");
    free(r->name);
    r->name = copy;
    return ok(r);
}

int enkflow_runner_set_curve_key(enkflow_runner *r, const char *key) {
    if (!r) return ENKFLOW_EINVAL;
    int rc = before_init(r, "enkflow_runner_set_curve_key");
    if (rc) return rc;
    if (key && *key && strlen(key) != 40)
        return ekf_rerr(r, ENKFLOW_EINVAL, "a CURVE public key has 40 Z85 characters, got %zu (EXPDIR/online/curve.pub)",
                       strlen(key));
    free(r->curve);
    r->curve = NULL;
    if (key && *key && !(r->curve = strdup(key))) return ekf_rerr(r, ENKFLOW_ENOMEM, "CURVE key");
    return ok(r);
}

int enkflow_runner_set_transport(enkflow_runner *r, enkflow_transport transport) {
    if (!r) return ENKFLOW_EINVAL;
    int rc = before_init(r, "enkflow_runner_set_transport");
    if (rc) return rc;
    if (transport != ENKFLOW_TRANSPORT_AUTO && transport != ENKFLOW_TRANSPORT_SHM && transport != ENKFLOW_TRANSPORT_TCP)
        return ekf_rerr(r, ENKFLOW_EINVAL, "transport %d is not one of ENKFLOW_TRANSPORT_AUTO, ENKFLOW_TRANSPORT_SHM, "
                        "ENKFLOW_TRANSPORT_TCP", (int)transport);
    r->transport = transport;
    return ok(r);
}

int enkflow_runner_set_stop_flag(enkflow_runner *r, const volatile sig_atomic_t *flag) {
    if (!r) return ENKFLOW_EINVAL;
    r->stop = flag;
    if (r->have_control) r->control.stop = flag;
    for (int k = 0; k < r->ndata; k++) r->data[k].stop = flag;
    return ok(r);
}

int enkflow_runner_add_field(enkflow_runner *r, const char *name, enkflow_dtype dtype, int ndim, const int64_t *shape,
                             int assimilated) {
    if (!r) return ENKFLOW_EINVAL;
    int rc = before_init(r, "enkflow_runner_add_field");
    if (rc) return rc;
    if (!name || !*name || strlen(name) > 256)
        return ekf_rerr(r, ENKFLOW_EINVAL, "a field name must have 1 to 256 characters");
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        if (*p < 0x20 || *p == 0x7f) return ekf_rerr(r, ENKFLOW_EINVAL, "field name '%s' holds a control character", name);
    if (find_field(r, name)) return ekf_rerr(r, ENKFLOW_EFIELD, "field '%s' declared twice", name);
    if (dtype < ENKFLOW_FLOAT32 || dtype > ENKFLOW_INT64)
        return ekf_rerr(r, ENKFLOW_EINVAL, "field '%s': element type %d is not one of ENKFLOW_FLOAT32, ENKFLOW_FLOAT64, "
                       "ENKFLOW_INT32, ENKFLOW_INT64", name, (int)dtype);
    if (assimilated && (dtype == ENKFLOW_INT32 || dtype == ENKFLOW_INT64))
        return ekf_rerr(r, ENKFLOW_EINVAL, "field '%s': an assimilated field must be float32 or float64, not %s "
                       "(declare it carried)", name, dtype_name(dtype));
    if (ndim < 0 || ndim > 32 || (ndim > 0 && !shape))
        return ekf_rerr(r, ENKFLOW_EINVAL, "field '%s': %d dimensions (0 to 32, with their extents)", name, ndim);
    int64_t size = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0) return ekf_rerr(r, ENKFLOW_EINVAL, "field '%s': negative extent %lld in dimension %d", name,
                                         (long long)shape[d], d);
        if (shape[d] && size > INT64_MAX / 16 / shape[d])
            return ekf_rerr(r, ENKFLOW_EINVAL, "field '%s': too many elements", name);
        size *= shape[d];
    }
    field *fs = realloc(r->fields, (size_t)(r->nfields + 1) * sizeof *fs);
    if (!fs) return ekf_rerr(r, ENKFLOW_ENOMEM, "field '%s'", name);
    r->fields = fs;
    field *f = &fs[r->nfields];
    memset(f, 0, sizeof *f);
    f->name = strdup(name);
    f->shape = malloc((size_t)(ndim ? ndim : 1) * sizeof *f->shape);
    if (!f->name || !f->shape) {
        free(f->name);
        free(f->shape);
        return ekf_rerr(r, ENKFLOW_ENOMEM, "field '%s'", name);
    }
    if (ndim) memcpy(f->shape, shape, (size_t)ndim * sizeof *shape);
    f->ndim = ndim;
    f->dtype = dtype;
    f->size = size;
    f->assimilated = assimilated ? 1 : 0;
    f->off = 0;
    f->cnt = size;
    r->nfields++;
    return ok(r);
}

int enkflow_runner_set_slice(enkflow_runner *r, const char *name, int64_t offset, int64_t count) {
    if (!r) return ENKFLOW_EINVAL;
    int rc = before_init(r, "enkflow_runner_set_slice");
    if (rc) return rc;
    field *f = name ? find_field(r, name) : NULL;
    if (!f) {
        char names[1024];
        list_fields(r, names, sizeof names);
        return ekf_rerr(r, ENKFLOW_EFIELD, "slice for field '%s', which was not declared (declared: %s)",
                       name ? name : "(null)", names);
    }
    if (offset < 0 || count < 0 || offset > f->size - count)
        return ekf_rerr(r, ENKFLOW_EINVAL, "field '%s': slice (%lld, %lld) outside its %lld elements", name,
                       (long long)offset, (long long)count, (long long)f->size);
    f->off = offset;
    f->cnt = count;
    f->data = NULL; /* an array bound before was checked against the old count: bind again */
    return ok(r);
}

int enkflow_runner_set_comm(enkflow_runner *r, int rank, int size, enkflow_bcast_fn bcast, enkflow_allmax_fn allmax,
                            void *ctx) {
    if (!r) return ENKFLOW_EINVAL;
    int rc = before_init(r, "enkflow_runner_set_comm");
    if (rc) return rc;
    if (size < 1 || rank < 0 || rank >= size)
        return ekf_rerr(r, ENKFLOW_EINVAL, "rank %d of %d runner processes", rank, size);
    if (size > 1 && (!bcast || !allmax))
        return ekf_rerr(r, ENKFLOW_EINVAL, "%d runner processes need the bcast and allreduce_max callbacks", size);
    r->rank = rank;
    r->size = size;
    r->bcast = bcast;
    r->allmax = allmax;
    r->comm_ctx = ctx;
    return ok(r);
}

/* --- collectives over the runner's ranks ------------------------------------------------------ */

typedef int (*rank0_fn)(enkflow_runner *r, ekf_buf *payload);

/* fn() on rank 0, its result (code, message, payload) on every rank. */
static int from_rank0(enkflow_runner *r, rank0_fn fn, ekf_buf *payload) {
    int code = ENKFLOW_OK;
    if (r->rank == 0) code = fn(r, payload);
    if (r->size == 1) return code;
    int64_t meta[3] = {code, 0, 0};
    if (r->rank == 0) {
        meta[1] = (int64_t)strlen(r->err);
        meta[2] = payload->oom ? 0 : (int64_t)payload->n;
    }
    if (r->bcast(meta, sizeof meta, r->comm_ctx))
        return ekf_rerr(r, ENKFLOW_ESTATE, "the bcast callback failed");
    if (r->rank != 0) {
        if (meta[1] >= ERRSIZE || meta[2] < 0 || meta[2] > EKF_MAX_JSON)
            return ekf_rerr(r, ENKFLOW_EPROTOCOL, "the bcast callback delivered garbage");
        payload->n = 0;
        ekf_buf_add(payload, "", 0);
        char *tmp = calloc(1, (size_t)meta[2] + 1);
        if (!tmp) return ekf_rerr(r, ENKFLOW_ENOMEM, "bcast");
        free(payload->p);
        payload->p = tmp;
        payload->n = (size_t)meta[2];
        payload->cap = (size_t)meta[2] + 1;
    }
    if (meta[1] && r->bcast(r->err, (size_t)meta[1] + 1, r->comm_ctx))
        return ekf_rerr(r, ENKFLOW_ESTATE, "the bcast callback failed");
    if (meta[2] && r->bcast(payload->p, (size_t)meta[2], r->comm_ctx))
        return ekf_rerr(r, ENKFLOW_ESTATE, "the bcast callback failed");
    if (r->rank != 0 && !meta[1]) r->err[0] = 0;
    return (int)meta[0];
}

/* Every rank ran something that returned `code`: an error on any rank (a lost server first gives way
 * to a refusal, as in the Python runner) is returned on every rank. */
static int collective(enkflow_runner *r, int code) {
    if (r->size == 1) return code;
    int v = code == ENKFLOW_OK ? 0 : code == ENKFLOW_ELOST ? 1 : 2;
    if (r->allmax(&v, r->comm_ctx)) return ekf_rerr(r, ENKFLOW_ESTATE, "the allreduce_max callback failed");
    if (v == 2 && (code == ENKFLOW_OK || code == ENKFLOW_ELOST))
        return ekf_rerr(r, ENKFLOW_EREFUSED, "an error on another runner rank (its enkflow_runner_errmsg says which)");
    if (v == 1 && code == ENKFLOW_OK)
        return ekf_rerr(r, ENKFLOW_ELOST, "another runner rank lost the server");
    return code;
}

/* --- heartbeats -------------------------------------------------------------------------------- */

static void *heartbeat_main(void *arg) {
    enkflow_runner *r = arg;
    void *sock = zmq_socket(r->zctx, ZMQ_DEALER);
    if (!sock) return NULL;
    int zero = 0, hwm = 4;
    zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(sock, ZMQ_SNDHWM, &hwm, sizeof hwm);
    if (r->curve) {
        char pub[41], sec[41];
        zmq_curve_keypair(pub, sec);
        zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, pub, 40);
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, sec, 40);
        zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, r->curve, 40);
    }
    zmq_connect(sock, r->address);
    pthread_mutex_lock(&r->mu);
    while (!r->hb_stop) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        double t = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec + r->heartbeat_s;
        ts.tv_sec = (time_t)t;
        ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
        int rc = 0;
        while (!r->hb_stop && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&r->cv, &r->mu, &ts);
        if (r->hb_stop) break;
        ekf_header h = {0};
        h.kind = EKF_HEARTBEAT;
        memcpy(h.credential, r->cred, 32);
        h.runner = r->id;
        h.task = r->hb_task;
        pthread_mutex_unlock(&r->mu);
        unsigned char buf[EKF_HEADER_SIZE];
        ekf_header_pack(&h, buf);
        zmq_send(sock, buf, sizeof buf, ZMQ_DONTWAIT); /* a full queue (server away): skipped, as in Python */
        pthread_mutex_lock(&r->mu);
    }
    pthread_mutex_unlock(&r->mu);
    zmq_close(sock);
    return NULL;
}

static void heartbeat_stop(enkflow_runner *r) {
    if (!r->hb_running) return;
    pthread_mutex_lock(&r->mu);
    r->hb_stop = 1;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
    pthread_join(r->hb, NULL);
    r->hb_running = 0;
}

static void set_task(enkflow_runner *r, uint64_t task, int64_t member, int64_t cycle, int64_t nsteps) {
    r->task = task;
    r->state_in = 0;
    r->member = member;
    r->cycle = cycle;
    r->nsteps = nsteps;
    pthread_mutex_lock(&r->mu);
    r->hb_task = task;
    pthread_mutex_unlock(&r->mu);
}

/* --- joining ----------------------------------------------------------------------------------- */

static int open_conn(enkflow_runner *r, ekf_conn *c, const char *address) {
    char endpoint[128];
    snprintf(endpoint, sizeof endpoint, "inproc://enkflow-monitor-%p-%u", (void *)r, r->monitors++);
    char err[1024];
    int rc = ekf_conn_open(c, r->zctx, address, r->curve, endpoint, err, sizeof err);
    if (rc) return set_err_detail(r, rc, err);
    c->stop = r->stop;
    return ENKFLOW_OK;
}

static int welcome_accept(const ekf_header *h, const void *ctx) {
    (void)ctx;
    return h->kind == EKF_WELCOME || h->kind == EKF_ERROR;
}

static void hello_body(enkflow_runner *r, ekf_buf *b) {
    ekf_buf_add(b, "{\"name\":", 8);
    ekf_buf_json_string(b, r->name);
    ekf_buf_add(b, ",\"fields\":[", 11);
    for (int k = 0; k < r->nfields; k++) {
        field *f = &r->fields[k];
        ekf_buf_add(b, k ? ",{\"name\":" : "{\"name\":", k ? 9 : 8);
        ekf_buf_json_string(b, f->name);
        ekf_buf_printf(b, ",\"dtype\":\"%s\",\"shape\":[", dtype_name(f->dtype));
        for (int d = 0; d < f->ndim; d++) ekf_buf_printf(b, d ? ",%lld" : "%lld", (long long)f->shape[d]);
        ekf_buf_printf(b, "],\"assimilated\":%s}", f->assimilated ? "true" : "false");
    }
    ekf_buf_printf(b, "],\"ranks\":%d}", r->size);
}

/* Rank 0: HELLO until a WELCOME (its JSON into payload) or a refusal, retrying for reconnect_s. */
static int hello(enkflow_runner *r, ekf_buf *payload) {
    double deadline = ekf_now() + r->reconnect_s;
    ekf_buf body = {0};
    hello_body(r, &body);
    if (body.oom) {
        free(body.p);
        return ekf_rerr(r, ENKFLOW_ENOMEM, "HELLO");
    }
    int rc;
    while (1) {
        if (!r->have_control) {
            if ((rc = open_conn(r, &r->control, r->address))) break;
            r->have_control = 1;
        }
        ekf_header h = {0};
        h.kind = EKF_HELLO;
        memcpy(h.credential, r->cred, 32);
        h.runner = r->id;
        unsigned char hb[EKF_HEADER_SIZE];
        ekf_header_pack(&h, hb);
        const void *frames[2] = {hb, body.p};
        size_t sizes[2] = {sizeof hb, body.n};
        char err[ERRSIZE];
        if ((rc = ekf_conn_send(&r->control, frames, sizes, 2, 1, err, sizeof err))) {
            rc = set_err_detail(r, rc, err);
            break;
        }
        double left = deadline - ekf_now();
        ekf_msg m;
        rc = ekf_conn_recv(&r->control, left > 1.0 ? left : 1.0, welcome_accept, NULL, &m, err, sizeof err);
        if (rc == ENKFLOW_OK) {
            payload->n = 0;
            if (m.n >= 1) ekf_buf_add(payload, zmq_msg_data(&m.frames[0]), zmq_msg_size(&m.frames[0]));
            ekf_msg_free(&m);
            if (payload->oom) {
                rc = ekf_rerr(r, ENKFLOW_ENOMEM, "WELCOME");
                break;
            }
            free(body.p);
            return ok(r);
        }
        if (rc != ENKFLOW_ELOST) {
            if (rc == ENKFLOW_EREFUSED) rc = ekf_rerr(r, rc, "the server at %s refused this runner: %s", r->address, err);
            else rc = set_err_detail(r, rc, err);
            break;
        }
        ekf_conn_close(&r->control, 0);
        r->have_control = 0;
        if (r->stop && *r->stop) {
            rc = ekf_rerr(r, ENKFLOW_EINTR, "interrupted: the stop flag was set while greeting the server at %s",
                         r->address);
            break;
        }
        if (ekf_now() > deadline) {
            rc = ekf_rerr(r, ENKFLOW_ELOST, "no enkflow server answered at %s within %g s", r->address, r->reconnect_s);
            break;
        }
        struct timespec ts = {0, 200000000};
        nanosleep(&ts, NULL);
    }
    free(body.p);
    return rc;
}

static void close_data(enkflow_runner *r) {
    for (int k = 0; k < r->ndata; k++) ekf_conn_close(&r->data[k], 0);
    ekf_links_close(r);
    free(r->data);
    free(r->own);
    r->data = NULL;
    r->own = NULL;
    r->ndata = 0;
}

/* RowBlocks(n, P).bounds(rank) of enkflow.parallel */
static void row_block(int64_t n, int64_t p, int64_t rank, int64_t *lo, int64_t *hi) {
    int64_t block = n ? (n + p - 1) / p : 0;
    *lo = rank * block < n ? rank * block : n;
    *hi = (rank + 1) * block < n ? (rank + 1) * block : n;
}

/* enkflow.online.fields.Ownership.range for every rank and field. */
static void ownership(enkflow_runner *r) {
    int64_t n_rows = 0;
    for (int k = 0; k < r->nfields; k++)
        if (r->fields[k].assimilated) n_rows += r->fields[k].size;
    for (int rank = 0; rank < r->ndata; rank++) {
        int64_t off = 0, r0, r1;
        row_block(n_rows, r->ndata, rank, &r0, &r1);
        for (int k = 0; k < r->nfields; k++) {
            field *f = &r->fields[k];
            int64_t lo, hi;
            if (f->assimilated) {
                lo = r0 - off < 0 ? 0 : r0 - off;
                hi = r1 - off < 0 ? 0 : r1 - off;
                if (lo > f->size) lo = f->size;
                if (hi > f->size) hi = f->size;
                off += f->size;
            } else {
                row_block(f->size, r->ndata, rank, &lo, &hi);
            }
            r->own[(rank * r->nfields + k) * 2] = lo;
            r->own[(rank * r->nfields + k) * 2 + 1] = hi;
        }
    }
}

/* HELLO from rank 0; every rank connects to the data sockets the WELCOME names, and maps the shared
 * memory it offers as the transport says. */
static int join(enkflow_runner *r) {
    ekf_shm_sweep(); /* a killed server's segments (this one's replaces it) */
    ekf_buf payload = {0};
    int rc = from_rank0(r, hello, &payload);
    if (rc) {
        free(payload.p);
        return rc;
    }
    char jerr[256];
    ekf_json *w = ekf_json_parse(payload.p ? payload.p : "", payload.n, jerr, sizeof jerr);
    free(payload.p);
    if (!w) return ekf_rerr(r, ENKFLOW_EPROTOCOL, "the server's WELCOME is not valid JSON: %s", jerr);
    const ekf_json *epoch = ekf_json_get(w, "epoch"), *ranks = ekf_json_get(w, "ranks"),
                   *data = ekf_json_get(w, "data"), *hb = ekf_json_get(w, "heartbeat_s");
    if (!epoch || epoch->type != EKF_JNUM || !epoch->is_int || !ranks || ranks->type != EKF_JNUM || !ranks->is_int ||
        ranks->i64 < 1 || ranks->i64 > 1 << 20 || !data || data->type != EKF_JARR || (int64_t)data->n != ranks->i64 ||
        !hb || hb->type != EKF_JNUM || !(hb->num > 0 && hb->num <= 86400)) {
        ekf_json_free(w);
        return ekf_rerr(r, ENKFLOW_EPROTOCOL, "the server's WELCOME lacks epoch, ranks, data or heartbeat_s");
    }
    for (size_t k = 0; k < data->n; k++)
        if (data->items[k].type != EKF_JSTR) {
            ekf_json_free(w);
            return ekf_rerr(r, ENKFLOW_EPROTOCOL, "the server's WELCOME names a data address that is not a string");
        }
    close_data(r);
    r->epoch = epoch->u64;
    pthread_mutex_lock(&r->mu); /* the heartbeat thread reads it */
    r->heartbeat_s = hb->num;
    pthread_mutex_unlock(&r->mu);
    int n = (int)ranks->i64;
    r->data = calloc((size_t)n, sizeof *r->data);
    r->own = calloc((size_t)n * (size_t)(r->nfields ? r->nfields : 1) * 2, sizeof *r->own);
    if (!r->data || !r->own) {
        ekf_json_free(w);
        close_data(r);
        return collective(r, ekf_rerr(r, ENKFLOW_ENOMEM, "data connections"));
    }
    rc = ENKFLOW_OK;
    for (int k = 0; k < n && !rc; k++) {
        rc = open_conn(r, &r->data[k], data->items[k].str);
        if (!rc) r->ndata = k + 1;
    }
    if (!rc) {
        r->ndata = n;
        ownership(r);
        rc = ekf_links_open(r, ekf_json_get(w, "shm"));
    }
    ekf_json_free(w);
    rc = collective(r, rc);
    if (rc) {
        close_data(r);
        return rc;
    }
    if (r->rank == 0 && !r->hb_running) {
        r->hb_stop = 0;
        /* The thread blocks every signal (as ZeroMQ's own threads do): the model's signals go to its own
         * threads, and a SIGTERM interrupts the main thread's wait for the server at once (the stop flag). */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        int err = pthread_create(&r->hb, NULL, heartbeat_main, r);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (err) return ekf_rerr(r, ENKFLOW_ENOMEM, "cannot start the heartbeat thread: %s", strerror(err));
        r->hb_running = 1;
    }
    return ok(r);
}

int enkflow_runner_init(enkflow_runner *r) {
    if (!r) return ENKFLOW_EINVAL;
    if (forked(r, "enkflow_runner_init")) return ENKFLOW_ESTATE;
    int rc = before_init(r, "enkflow_runner_init");
    if (rc) return rc;
    if (!r->nfields) return ekf_rerr(r, ENKFLOW_ESTATE, "a runner needs at least one field (enkflow_runner_add_field)");
    if ((rc = ekf_transport_resolve(r))) return rc;
    if (r->size > 1) {
        uint64_t id = r->id;
        if (r->bcast(&id, sizeof id, r->comm_ctx)) return ekf_rerr(r, ENKFLOW_ESTATE, "the bcast callback failed");
        r->id = id;
    }
    rc = join(r);
    if (rc) return rc;
    r->inited = 1;
    return ok(r);
}

int enkflow_runner_bind(enkflow_runner *r, const char *name, enkflow_dtype dtype, void *data, int64_t count) {
    if (!r) return ENKFLOW_EINVAL;
    field *f = name ? find_field(r, name) : NULL;
    if (!f) {
        char names[1024];
        list_fields(r, names, sizeof names);
        return ekf_rerr(r, ENKFLOW_EFIELD, "field '%s' was not declared (declared: %s)", name ? name : "(null)", names);
    }
    if (dtype != f->dtype)
        return ekf_rerr(r, ENKFLOW_ETYPE, "field '%s' is %s, the array bound to it is %s", name, dtype_name(f->dtype),
                       dtype_name(dtype));
    if (count != f->cnt)
        return ekf_rerr(r, ENKFLOW_ESIZE, "field '%s' has %lld elements on this rank, the array bound to it %lld", name,
                       (long long)f->cnt, (long long)count);
    if (!data && count > 0) return ekf_rerr(r, ENKFLOW_EINVAL, "field '%s': NULL array", name);
    f->data = data;
    return ok(r);
}

/* --- the exchange ------------------------------------------------------------------------------ */

void ekf_header_for(enkflow_runner *r, ekf_header *h, int kind, size_t count) {
    memset(h, 0, sizeof *h);
    h->kind = (uint16_t)kind;
    memcpy(h->credential, r->cred, 32);
    h->runner = r->id;
    h->task = r->task;
    h->member = r->member;
    h->cycle = r->cycle;
    h->count = count;
    h->epoch = r->epoch;
}

static int put(enkflow_runner *r) {
    int64_t member = r->member, cycle = r->cycle;
    int *sent = calloc((size_t)r->ndata + 1, sizeof *sent);
    int rc = sent ? ekf_put_ranks(r, sent) : ekf_rerr(r, ENKFLOW_ENOMEM, "PUT");
    free(sent);
    /* A stale task (this runner was declared lost, its slot retired): forgotten, as a late PUT's ACK has it. */
    if (rc == ENKFLOW_EREFUSED && strstr(r->err, EKF_NO_SLOT)) rc = ok(r);
    rc = collective(r, rc);
    if (rc == ENKFLOW_EINTR) return rc; /* the task stays held: finalize's BYE gives it back */
    set_task(r, 0, 0, 0, 0);
    if (rc == ENKFLOW_ELOST) return join(r);
    if (rc) {
        char detail[ERRSIZE];
        snprintf(detail, sizeof detail, "%s", r->err);
        return ekf_rerr(r, rc, "the server rejected the forecast of member %lld, cycle %lld (%s)", (long long)member,
                       (long long)cycle, detail);
    }
    return ENKFLOW_OK;
}

static int accept_task(const ekf_header *h, const void *ctx) {
    (void)ctx;
    return h->kind == EKF_TASK || h->kind == EKF_STOP || h->kind == EKF_ERROR;
}

/* Rank 0: READY until a TASK or STOP (its 96 bytes into payload). */
static int ready(enkflow_runner *r, ekf_buf *payload) {
    if (!r->have_control) return ekf_rerr(r, ENKFLOW_ELOST, "not connected to the server at %s", r->address);
    ekf_header h = {0};
    h.kind = EKF_READY;
    memcpy(h.credential, r->cred, 32);
    h.runner = r->id;
    h.nsteps = r->waited_us;
    h.epoch = r->epoch;
    unsigned char hb[EKF_HEADER_SIZE];
    ekf_header_pack(&h, hb);
    const void *frames[1] = {hb};
    size_t sizes[1] = {sizeof hb};
    char err[ERRSIZE];
    int rc = ekf_conn_send(&r->control, frames, sizes, 1, 1, err, sizeof err);
    if (rc) return set_err_detail(r, rc, err);
    double t0 = ekf_now();
    ekf_msg m;
    /* Waiting for a task may take as long as the other members' forecasts and the analysis. */
    rc = ekf_conn_recv(&r->control, 10 * 24 * 3600.0, accept_task, NULL, &m, err, sizeof err);
    if (rc == ENKFLOW_EREFUSED && strstr(err, "unknown runner"))
        return ekf_rerr(r, ENKFLOW_ELOST, "%s", err); /* declared gone (late, or a restarted server): greet again */
    if (rc) return set_err_detail(r, rc, err);
    r->waited_us = (int64_t)((ekf_now() - t0) * 1e6);
    payload->n = 0;
    ekf_header_pack(&m.hdr, hb);
    ekf_buf_add(payload, (const char *)hb, sizeof hb);
    ekf_msg_free(&m);
    return payload->oom ? ekf_rerr(r, ENKFLOW_ENOMEM, "TASK") : ok(r);
}

int enkflow_runner_expose(enkflow_runner *r, int64_t *nsteps) {
    if (!r) return ENKFLOW_EINVAL;
    if (!nsteps) return ekf_rerr(r, ENKFLOW_EINVAL, "enkflow_runner_expose: NULL nsteps");
    *nsteps = 0;
    if (forked(r, "enkflow_runner_expose")) return ENKFLOW_ESTATE;
    if (!r->inited) return ekf_rerr(r, ENKFLOW_ESTATE, "enkflow_runner_expose before a successful enkflow_runner_init");
    for (int k = 0; k < r->nfields; k++)
        if (!r->fields[k].data && r->fields[k].cnt > 0)
            return ekf_rerr(r, ENKFLOW_ESTATE, "field '%s' has no array: call enkflow_runner_bind before expose",
                           r->fields[k].name);
    int rc;
    if (r->task && !r->state_in) {
        /* The wait for its state was interrupted (ENKFLOW_EINTR): the arrays hold no forecast of it. */
        char why[256];
        snprintf(why, sizeof why, "the state of member %lld, cycle %lld did not arrive (the wait for it was "
                 "interrupted): no forecast of it", (long long)r->member, (long long)r->cycle);
        if ((rc = enkflow_runner_fail(r, why))) return rc;
    }
    if (r->task && (rc = put(r))) return rc;
    while (1) {
        ekf_buf payload = {0};
        rc = from_rank0(r, ready, &payload);
        ekf_header h;
        char err[256];
        if (rc == ENKFLOW_OK && ekf_header_unpack(payload.p, payload.n, &h, err, sizeof err))
            rc = ekf_rerr(r, ENKFLOW_EPROTOCOL, "task broadcast: %s", err);
        free(payload.p);
        if (rc == ENKFLOW_ELOST) {
            set_task(r, 0, 0, 0, 0);
            if ((rc = join(r))) return rc;
            continue;
        }
        if (rc) return rc;
        if (h.kind == EKF_STOP) {
            set_task(r, 0, 0, h.cycle, 0);
            return ok(r);
        }
        set_task(r, h.task, h.member, h.cycle, h.nsteps);
        rc = collective(r, ekf_get_ranks(r));
        if (rc == ENKFLOW_ELOST) {
            set_task(r, 0, 0, 0, 0);
            if ((rc = join(r))) return rc;
            continue;
        }
        if (rc == ENKFLOW_EINTR) return rc; /* the task stays held: finalize's BYE gives it back */
        if (rc) {
            /* The state did not arrive: give the member back at once rather than at its due date. */
            char detail[ERRSIZE];
            snprintf(detail, sizeof detail, "%s", r->err);
            enkflow_runner_fail(r, detail);
            return set_err_detail(r, rc, detail);
        }
        r->state_in = 1;
        *nsteps = r->nsteps;
        return ok(r);
    }
}

int64_t enkflow_runner_member(const enkflow_runner *r) { return r ? r->member : 0; }
int64_t enkflow_runner_cycle(const enkflow_runner *r) { return r ? r->cycle : 0; }
int64_t enkflow_runner_nsteps(const enkflow_runner *r) { return r ? r->nsteps : 0; }
uint64_t enkflow_runner_task(const enkflow_runner *r) { return r ? r->task : 0; }

int enkflow_runner_fail(enkflow_runner *r, const char *error) {
    if (!r) return ENKFLOW_EINVAL;
    if (forked(r, "enkflow_runner_fail")) return ENKFLOW_ESTATE;
    int rc = ENKFLOW_OK;
    if (r->rank == 0 && r->task && r->have_control) {
        const char *text = error ? error : "?";
        size_t len = strlen(text);
        if (len > 4000) text += len - 4000;
        /* The server decodes UTF-8 JSON: bytes outside ASCII become '?' so that no text can spoil the report. */
        char *clean = strdup(text);
        ekf_buf body = {0};
        if (clean) {
            for (char *p = clean; *p; p++)
                if ((unsigned char)*p >= 0x80) *p = '?';
            ekf_buf_add(&body, "{\"error\":", 9);
            ekf_buf_json_string(&body, clean);
            ekf_buf_add(&body, "}", 1);
        }
        free(clean);
        if (!clean || body.oom) {
            rc = ekf_rerr(r, ENKFLOW_ENOMEM, "FAIL");
        } else {
            ekf_header h;
            unsigned char hb[EKF_HEADER_SIZE];
            ekf_header_for(r, &h, EKF_FAIL, 0);
            ekf_header_pack(&h, hb);
            const void *frames[2] = {hb, body.p};
            size_t sizes[2] = {sizeof hb, body.n};
            char err[ERRSIZE];
            rc = ekf_conn_send(&r->control, frames, sizes, 2, 1, err, sizeof err);
            if (rc) set_err_detail(r, rc, err);
        }
        free(body.p);
    }
    set_task(r, 0, 0, 0, 0);
    return rc ? rc : ok(r);
}

static void free_memory(enkflow_runner *r) {
    for (int k = 0; k < r->nfields; k++) {
        free(r->fields[k].name);
        free(r->fields[k].shape);
    }
    free(r->fields);
    free(r->address);
    free(r->name);
    free(r->curve);
}

int enkflow_runner_finalize(enkflow_runner *r) {
    if (!r) return ENKFLOW_OK;
    if (getpid() != r->pid) { /* a forked child: its copy's memory only; the sockets and threads are the parent's */
        ekf_links_close(r);
        free(r->data);
        free(r->own);
        free_memory(r);
        free(r);
        return ENKFLOW_ESTATE;
    }
    int rc = ENKFLOW_OK;
    heartbeat_stop(r);
    if (r->rank == 0 && r->have_control) {
        ekf_header h;
        unsigned char hb[EKF_HEADER_SIZE];
        ekf_header_for(r, &h, EKF_BYE, 0);
        h.member = h.cycle = 0;
        ekf_header_pack(&h, hb);
        const void *frames[1] = {hb};
        size_t sizes[1] = {sizeof hb};
        char err[ERRSIZE];
        rc = ekf_conn_send(&r->control, frames, sizes, 1, 1, err, sizeof err);
    }
    close_data(r);
    ekf_shm_sweep();
    /* A short linger lets the BYE leave before the context ends (the Python runner sleeps 50 ms instead);
     * a BYE that cannot leave (the server is gone) costs at most this. */
    if (r->have_control) ekf_conn_close(&r->control, 250);
    if (r->zctx) zmq_ctx_term(r->zctx);
    free_memory(r);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
    return rc;
}
