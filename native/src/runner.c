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
    return ekf_ok(r);
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
    return ekf_ok(r);
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
    return ekf_ok(r);
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
    return ekf_ok(r);
}

int enkflow_runner_set_transport(enkflow_runner *r, enkflow_transport transport) {
    if (!r) return ENKFLOW_EINVAL;
    int rc = before_init(r, "enkflow_runner_set_transport");
    if (rc) return rc;
    if (transport != ENKFLOW_TRANSPORT_AUTO && transport != ENKFLOW_TRANSPORT_SHM && transport != ENKFLOW_TRANSPORT_TCP)
        return ekf_rerr(r, ENKFLOW_EINVAL, "transport %d is not one of ENKFLOW_TRANSPORT_AUTO, ENKFLOW_TRANSPORT_SHM, "
                        "ENKFLOW_TRANSPORT_TCP", (int)transport);
    r->transport = transport;
    return ekf_ok(r);
}

int enkflow_runner_set_stop_flag(enkflow_runner *r, const volatile sig_atomic_t *flag) {
    if (!r) return ENKFLOW_EINVAL;
    r->stop = flag;
    if (r->have_control) r->control.stop = flag;
    for (int k = 0; k < r->ndata; k++) r->data[k].stop = flag;
    return ekf_ok(r);
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
                       "(declare it carried)", name, ekf_dtype_name(dtype));
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
    return ekf_ok(r);
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
    return ekf_ok(r);
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
    return ekf_ok(r);
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
    rc = ekf_join(r);
    if (rc) return rc;
    r->inited = 1;
    return ekf_ok(r);
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
        return ekf_rerr(r, ENKFLOW_ETYPE, "field '%s' is %s, the array bound to it is %s", name, ekf_dtype_name(f->dtype),
                       ekf_dtype_name(dtype));
    if (count != f->cnt)
        return ekf_rerr(r, ENKFLOW_ESIZE, "field '%s' has %lld elements on this rank, the array bound to it %lld", name,
                       (long long)f->cnt, (long long)count);
    if (!data && count > 0) return ekf_rerr(r, ENKFLOW_EINVAL, "field '%s': NULL array", name);
    f->data = data;
    return ekf_ok(r);
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
    if (rc == ENKFLOW_EREFUSED && strstr(r->err, EKF_NO_SLOT)) rc = ekf_ok(r);
    rc = ekf_collective(r, rc);
    if (rc == ENKFLOW_EINTR) return rc; /* the task stays held: finalize's BYE gives it back */
    ekf_set_task(r, 0, 0, 0, 0);
    if (rc == ENKFLOW_ELOST) return ekf_join(r);
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
    return payload->oom ? ekf_rerr(r, ENKFLOW_ENOMEM, "TASK") : ekf_ok(r);
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
        rc = ekf_from_rank0(r, ready, &payload);
        ekf_header h;
        char err[256];
        if (rc == ENKFLOW_OK && ekf_header_unpack(payload.p, payload.n, &h, err, sizeof err))
            rc = ekf_rerr(r, ENKFLOW_EPROTOCOL, "task broadcast: %s", err);
        free(payload.p);
        if (rc == ENKFLOW_ELOST) {
            ekf_set_task(r, 0, 0, 0, 0);
            if ((rc = ekf_join(r))) return rc;
            continue;
        }
        if (rc) return rc;
        if (h.kind == EKF_STOP) {
            ekf_set_task(r, 0, 0, h.cycle, 0);
            return ekf_ok(r);
        }
        ekf_set_task(r, h.task, h.member, h.cycle, h.nsteps);
        rc = ekf_collective(r, ekf_get_ranks(r));
        if (rc == EKF_STALE) { /* the server gave the task up meanwhile: the next one */
            ekf_set_task(r, 0, 0, 0, 0);
            continue;
        }
        if (rc == ENKFLOW_ELOST) {
            ekf_set_task(r, 0, 0, 0, 0);
            if ((rc = ekf_join(r))) return rc;
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
        return ekf_ok(r);
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
    ekf_set_task(r, 0, 0, 0, 0);
    return rc ? rc : ekf_ok(r);
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
    ekf_heartbeat_stop(r);
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
    ekf_close_data(r);
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
