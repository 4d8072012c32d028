/* The output client: enkflow.output.remote.RemoteOutput in C (see enkflow_output.h, docs/output.md).
 *
 * One DEALER socket to the service's ROUTER; every message is one JSON frame, an add one more frame with
 * the array's bytes. The checks of enkflow.output.client.check_piece run here, against the [output]
 * configuration of the welcome, so that a bad piece is refused before a byte leaves. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include <sodium.h>

#include "enkflow_output.h"
#include "internal.h"

#define ERRSIZE EKF_ERRSIZE
#define POLL_MS 100
#define HWM 8 /* enkflow.output.service.HWM: messages queued on this side before add waits */
#define OPEN_TIMEOUT_S 30.0
#define TIMEOUT_S 600.0

typedef struct ofield {
    char *name;
    int ndim;
    int64_t *shape;
    char **dims;
    int ensemble;
} ofield;

struct enkflow_output {
    char err[ERRSIZE];
    char *address;
    void *zctx;
    ekf_conn conn;
    int have_conn;
    int closed;
    int lost; /* the service is gone: every call but free says so again */
    uint64_t seq;
    int64_t service_pid;
    int same_host;
    double timeout_s;
    ofield *fields;
    int nfields;
    int64_t members;
    int64_t limit; /* the service's buffer_mb in bytes: a larger piece is refused by it */
    enkflow_output_stats st;
    char *service_stats;
    char *dropped;
    pid_t pid; /* the process that opened it: ZeroMQ's context does not survive a fork */
};

static int set_err(enkflow_output *o, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    ekf_vset_err(o->err, fmt, ap);
    va_end(ap);
    return code;
}

static int ok(enkflow_output *o) {
    o->err[0] = 0;
    return ENKFLOW_OK;
}

const char *enkflow_output_errmsg(const enkflow_output *o) {
    if (!o) return "no output handle (enkflow_output_open failed for lack of memory, or was not called)";
    return o->err;
}

int enkflow_output_set_error(enkflow_output *o, int code, const char *message) {
    if (o) snprintf(o->err, sizeof o->err, "%s", message ? message : "");
    return code;
}

/* --- the welcome's configuration --------------------------------------------------------------- */

static void free_fields(enkflow_output *o) {
    for (int k = 0; k < o->nfields; k++) {
        ofield *f = &o->fields[k];
        for (int d = 0; d < f->ndim; d++) free(f->dims[d]);
        free(f->dims);
        free(f->shape);
        free(f->name);
    }
    free(o->fields);
    o->fields = NULL;
    o->nfields = 0;
}

/* The fields, their dims' sizes, members and buffer_mb from config (OutputConfig as JSON). */
static int read_config(enkflow_output *o, const ekf_json *cfg) {
    const ekf_json *fields = ekf_json_get(cfg, "fields"), *dims = ekf_json_get(cfg, "dims");
    const ekf_json *members = ekf_json_get(cfg, "members"), *buf = ekf_json_get(cfg, "buffer_mb");
    if (!fields || fields->type != EKF_JOBJ || !dims || dims->type != EKF_JOBJ || !members ||
        members->type != EKF_JNUM || !members->is_int || !buf || buf->type != EKF_JNUM)
        return set_err(o, ENKFLOW_EPROTOCOL, "the output service at %s sent a welcome without its [output] "
                       "configuration (fields, dims, members, buffer_mb): another enkflow version?", o->address);
    o->members = members->i64;
    o->limit = (int64_t)(buf->num * (double)(1 << 20));
    o->fields = calloc(fields->n ? fields->n : 1, sizeof *o->fields);
    if (!o->fields) return set_err(o, ENKFLOW_ENOMEM, "reading the welcome");
    for (size_t k = 0; k < fields->n; k++) {
        const ekf_json *spec = &fields->items[k];
        const ekf_json *fd = ekf_json_get(spec, "dims"), *ens = ekf_json_get(spec, "ensemble");
        if (!fd || fd->type != EKF_JARR || !ens || ens->type != EKF_JBOOL)
            return set_err(o, ENKFLOW_EPROTOCOL, "the output service's welcome: field %s has no dims or ensemble",
                           fields->keys[k]);
        ofield *f = &o->fields[o->nfields++];
        f->name = strdup(fields->keys[k]);
        f->ensemble = ens->boolean;
        f->shape = calloc(fd->n ? fd->n : 1, sizeof *f->shape);
        f->dims = calloc(fd->n ? fd->n : 1, sizeof *f->dims);
        if (!f->name || !f->shape || !f->dims) return set_err(o, ENKFLOW_ENOMEM, "reading the welcome");
        for (size_t d = 0; d < fd->n; d++) {
            const ekf_json *dn = &fd->items[d];
            const ekf_json *size = dn->type == EKF_JSTR ? ekf_json_get(ekf_json_get(dims, dn->str), "size") : NULL;
            if (!size || size->type != EKF_JNUM || !size->is_int || size->i64 < 1)
                return set_err(o, ENKFLOW_EPROTOCOL, "the output service's welcome: a dimension of field %s has no size",
                               f->name);
            f->dims[d] = strdup(dn->str);
            if (!f->dims[d]) return set_err(o, ENKFLOW_ENOMEM, "reading the welcome");
            f->shape[d] = size->i64;
            f->ndim++;
        }
    }
    return ENKFLOW_OK;
}

static ofield *find_field(enkflow_output *o, const char *name) {
    for (int k = 0; k < o->nfields; k++)
        if (strcmp(o->fields[k].name, name) == 0) return &o->fields[k];
    return NULL;
}

/* --- JSON out ---------------------------------------------------------------------------------- */

/* A double that JSON (and Python's json) reads back as the same float: 17 significant digits, and a
 * decimal point so that it stays a float. */
static void put_double(ekf_buf *b, double v) {
    char tmp[64];
    snprintf(tmp, sizeof tmp, "%.17g", v);
    ekf_buf_add(b, tmp, strlen(tmp));
    if (!strpbrk(tmp, ".eEn")) ekf_buf_add(b, ".0", 2);
}

static void put_tree(ekf_buf *b, const ekf_json *j) {
    switch (j->type) {
        case EKF_JNULL: ekf_buf_add(b, "null", 4); break;
        case EKF_JBOOL: ekf_buf_printf(b, "%s", j->boolean ? "true" : "false"); break;
        case EKF_JSTR: ekf_buf_json_string(b, j->str); break;
        case EKF_JNUM:
            if (j->is_int) ekf_buf_printf(b, "%lld", (long long)j->i64);
            else if (j->num == 0 && j->boolean) ekf_buf_printf(b, "%s", j->boolean > 0 ? "Infinity" : "-Infinity");
            else put_double(b, j->num);
            break;
        case EKF_JARR:
        case EKF_JOBJ:
            ekf_buf_add(b, j->type == EKF_JARR ? "[" : "{", 1);
            for (size_t k = 0; k < j->n; k++) {
                if (k) ekf_buf_add(b, ",", 1);
                if (j->type == EKF_JOBJ) {
                    ekf_buf_json_string(b, j->keys[k]);
                    ekf_buf_add(b, ":", 1);
                }
                put_tree(b, &j->items[k]);
            }
            ekf_buf_add(b, j->type == EKF_JARR ? "]" : "}", 1);
            break;
    }
}

/* --- liveness, sending, replies ------------------------------------------------------------------ */

/* Why the service is gone, or NULL: its connection dropped, or (same host) its pid is gone or a zombie. */
static const char *gone(enkflow_output *o) {
    char tmp[256];
    if (ekf_conn_check(&o->conn, tmp, sizeof tmp) == ENKFLOW_ELOST) return "gone (its connection dropped)";
    if (!o->service_pid || !o->same_host) return NULL;
    if (kill((pid_t)o->service_pid, 0) != 0) return errno == ESRCH ? "gone" : NULL;
    char path[64];
    snprintf(path, sizeof path, "/proc/%lld/stat", (long long)o->service_pid);
    FILE *fh = fopen(path, "r");
    if (!fh) return NULL;
    char stat[512];
    size_t n = fread(stat, 1, sizeof stat - 1, fh);
    fclose(fh);
    stat[n] = 0;
    const char *paren = strrchr(stat, ')');
    if (paren && paren[1] == ' ' && paren[2] == 'Z') return "a zombie (killed?)";
    return NULL;
}

static int lost(enkflow_output *o, const char *why) {
    o->lost = 1;
    return set_err(o, ENKFLOW_ELOST, "the output service at %s (pid %lld) is %s: what this process added since "
                   "its last sync may not be written (%lld add(s) in all)", o->address, (long long)o->service_pid,
                   why, (long long)o->st.adds);
}

/* Send the frames (all of them, in one message), waiting while the service is behind (its queue for this
 * client full: back-pressure, counted in blocked). The messages are consumed whatever the result. */
static int send_msgs(enkflow_output *o, zmq_msg_t *msgs, size_t n, double *blocked) {
    size_t sent = 0;
    double t0 = 0, last = ekf_now();
    int rc = ENKFLOW_OK;
    while (sent < n) {
        int flags = (sent + 1 < n ? ZMQ_SNDMORE : 0) | (sent == 0 ? ZMQ_DONTWAIT : 0);
        if (zmq_msg_send(&msgs[sent], o->conn.sock, flags) >= 0) {
            sent++;
            continue;
        }
        int e = zmq_errno();
        if (e == EINTR) continue;
        if (e != EAGAIN || sent) {
            rc = set_err(o, ENKFLOW_EZMQ, "cannot send to the output service at %s: %s", o->address, zmq_strerror(e));
            break;
        }
        if (t0 == 0) t0 = ekf_now();
        zmq_pollitem_t it = {o->conn.sock, 0, ZMQ_POLLOUT, 0};
        int pr = zmq_poll(&it, 1, POLL_MS);
        if (pr > 0) { last = ekf_now(); continue; }
        if (pr < 0 && zmq_errno() != EINTR) {
            rc = set_err(o, ENKFLOW_EZMQ, "polling %s failed: %s", o->address, zmq_strerror(zmq_errno()));
            break;
        }
        const char *why = gone(o);
        if (why) { rc = lost(o, why); break; }
        if (ekf_now() - last > o->timeout_s) {
            o->lost = 1;
            rc = set_err(o, ENKFLOW_ELOST, "the output service at %s (pid %lld) took no data for %g s (stopped? "
                         "hung?): given up", o->address, (long long)o->service_pid, o->timeout_s);
            break;
        }
    }
    for (size_t k = sent; k < n; k++) zmq_msg_close(&msgs[k]);
    if (t0 != 0 && blocked) *blocked += ekf_now() - t0;
    return rc;
}

static int send_json(enkflow_output *o, const ekf_buf *b) {
    if (b->oom) return set_err(o, ENKFLOW_ENOMEM, "a message to the output service");
    zmq_msg_t m;
    if (zmq_msg_init_size(&m, b->n)) return set_err(o, ENKFLOW_ENOMEM, "a message to the output service");
    memcpy(zmq_msg_data(&m), b->p, b->n);
    return send_msgs(o, &m, 1, NULL);
}

/* One whole message from the socket (its first frame's JSON into *out; further frames dropped). */
static int read_one(enkflow_output *o, ekf_json **out) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    while (zmq_msg_recv(&m, o->conn.sock, ZMQ_DONTWAIT) < 0) {
        if (zmq_errno() == EINTR) continue;
        zmq_msg_close(&m);
        if (zmq_errno() == EAGAIN) { *out = NULL; return ENKFLOW_OK; }
        return set_err(o, ENKFLOW_EZMQ, "receiving from %s failed: %s", o->address, zmq_strerror(zmq_errno()));
    }
    char jerr[256];
    size_t n = zmq_msg_size(&m);
    ekf_json *j = n <= EKF_MAX_JSON ? ekf_json_parse(zmq_msg_data(&m), n, jerr, sizeof jerr) : NULL;
    if (n > EKF_MAX_JSON) snprintf(jerr, sizeof jerr, "%zu bytes, more than %d", n, EKF_MAX_JSON);
    int more = zmq_msg_more(&m);
    zmq_msg_close(&m);
    while (more) {
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, o->conn.sock, 0) < 0 && zmq_errno() == EINTR) { zmq_msg_close(&m); continue; }
        more = zmq_msg_more(&m);
        zmq_msg_close(&m);
    }
    const ekf_json *kind = ekf_json_get(j, "kind");
    if (!j || !kind || kind->type != EKF_JSTR) {
        ekf_json_free(j);
        return set_err(o, ENKFLOW_EPROTOCOL, "the output service at %s sent a malformed message (%s)", o->address,
                       j ? "no kind" : jerr);
    }
    *out = j;
    return ENKFLOW_OK;
}

/* The reply of kind `want` (to request seq; 0: any), within timeout_s; an `error` reply gives
 * ENKFLOW_EREFUSED with the service's text. A reply to an older request is skipped. A reply queued before
 * the service went is still read. */
static int reply(enkflow_output *o, const char *want, uint64_t seq, double timeout_s, ekf_json **out) {
    double deadline = ekf_now() + timeout_s;
    *out = NULL;
    while (1) {
        zmq_pollitem_t it = {o->conn.sock, 0, ZMQ_POLLIN, 0};
        int pr = zmq_poll(&it, 1, POLL_MS);
        if (pr < 0 && zmq_errno() != EINTR)
            return set_err(o, ENKFLOW_EZMQ, "polling %s failed: %s", o->address, zmq_strerror(zmq_errno()));
        if (pr <= 0) {
            const char *why = gone(o);
            if (why) {
                /* What it said before it went comes first (libzmq keeps it after the disconnect). */
                zmq_poll(&it, 1, 0);
                if (!(it.revents & ZMQ_POLLIN)) return lost(o, why);
            } else if (ekf_now() > deadline) {
                o->lost = 1;
                return set_err(o, ENKFLOW_ELOST, "no answer from the output service at %s (pid %lld) within %g s "
                               "(stopped? hung? is it running? see its address file)", o->address,
                               (long long)o->service_pid, timeout_s);
            } else {
                continue;
            }
        }
        ekf_json *j;
        int rc = read_one(o, &j);
        if (rc) return rc;
        if (!j) continue;
        const char *kind = ekf_json_get(j, "kind")->str;
        const ekf_json *s = ekf_json_get(j, "seq");
        if (strcmp(kind, "error") == 0) {
            const ekf_json *e = ekf_json_get(j, "error");
            rc = set_err(o, ENKFLOW_EREFUSED, "%s", e && e->type == EKF_JSTR ? e->str : "the output service refused");
            ekf_json_free(j);
            return rc;
        }
        if (strcmp(kind, want) == 0 && (!seq || (s && s->type == EKF_JNUM && s->is_int && s->u64 == seq))) {
            *out = j;
            return ENKFLOW_OK;
        }
        ekf_json_free(j); /* an answer to an earlier request, abandoned */
    }
}

/* --- opening --------------------------------------------------------------------------------------- */

static int usable(enkflow_output *o, const char *what) {
    if (!o) return ENKFLOW_EINVAL;
    if (o->pid != getpid())
        return set_err(o, ENKFLOW_ESTATE, "%s in a process forked from the one that opened the output (pid %ld)", what,
                       (long)o->pid);
    if (!o->have_conn && !o->closed) return set_err(o, ENKFLOW_ESTATE, "%s: enkflow_output_open failed, see its message", what);
    if (o->lost) return ENKFLOW_ELOST; /* the message of the loss stays */
    if (o->closed) return set_err(o, ENKFLOW_ESTATE, "%s after close", what);
    return ENKFLOW_OK;
}

static int hello(enkflow_output *o, const char *token, double timeout_s) {
    unsigned char cred[crypto_hash_sha256_BYTES];
    char hex[2 * crypto_hash_sha256_BYTES + 1];
    static const char domain[] = "enkflow-output-token"; /* then its NUL: enkflow.tokens.credential */
    crypto_hash_sha256_state st;
    if (sodium_init() < 0) return set_err(o, ENKFLOW_ENOMEM, "libsodium failed to initialise");
    crypto_hash_sha256_init(&st);
    crypto_hash_sha256_update(&st, (const unsigned char *)domain, sizeof domain);
    crypto_hash_sha256_update(&st, (const unsigned char *)token, strlen(token));
    crypto_hash_sha256_final(&st, cred);
    sodium_bin2hex(hex, sizeof hex, cred, sizeof cred);
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    ekf_buf b = {0};
    ekf_buf_printf(&b, "{\"kind\":\"hello\",\"credential\":\"%s\",\"pid\":%ld,\"host\":", hex, (long)getpid());
    ekf_buf_json_string(&b, host);
    ekf_buf_add(&b, "}", 1);
    int rc = send_json(o, &b);
    free(b.p);
    if (rc) return rc;
    ekf_json *w;
    rc = reply(o, "welcome", 0, timeout_s, &w);
    if (rc == ENKFLOW_ELOST) {
        o->lost = 1;
        return set_err(o, ENKFLOW_ELOST, "no answer from the output service at %s within %g s (is it running? see "
                       "its address file)", o->address, timeout_s);
    }
    if (rc == ENKFLOW_EREFUSED) {
        char tmp[ERRSIZE];
        snprintf(tmp, sizeof tmp, "%s", o->err);
        return set_err(o, rc, "%s (at %s)", tmp, o->address);
    }
    if (rc) return rc;
    const ekf_json *pid = ekf_json_get(w, "pid"), *h = ekf_json_get(w, "host");
    o->service_pid = pid && pid->type == EKF_JNUM && pid->is_int ? pid->i64 : 0;
    o->same_host = h && h->type == EKF_JSTR && strcmp(h->str, host) == 0;
    rc = read_config(o, ekf_json_get(w, "config"));
    ekf_json_free(w);
    return rc;
}

static enkflow_output *new_handle(void) {
    enkflow_output *o = calloc(1, sizeof *o);
    if (!o) return NULL;
    o->pid = getpid();
    o->timeout_s = TIMEOUT_S;
    o->service_stats = strdup("{}");
    o->dropped = strdup("");
    if (!o->service_stats || !o->dropped) {
        free(o->service_stats);
        free(o->dropped);
        free(o);
        return NULL;
    }
    return o;
}

int enkflow_output_open(enkflow_output **out, const char *address, const char *token_file, double timeout_s) {
    if (!out) return ENKFLOW_EINVAL;
    enkflow_output *o = new_handle();
    *out = o;
    if (!o) return ENKFLOW_ENOMEM;
    if (!address || !*address) return set_err(o, ENKFLOW_EINVAL, "no output service address (its DIR/address)");
    if (!token_file || !*token_file) return set_err(o, ENKFLOW_EINVAL, "no token file (the output service's DIR/token)");
    o->address = strdup(address);
    if (!o->address) return set_err(o, ENKFLOW_ENOMEM, "opening the output");
    char token[4096], why[1024];
    int rc = enkflow_read_token_file(token_file, token, sizeof token, why, sizeof why);
    if (rc) return set_err(o, rc, "%s", why);
    o->zctx = zmq_ctx_new();
    if (!o->zctx) return set_err(o, ENKFLOW_EZMQ, "zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
    char err[1024];
    rc = ekf_conn_open_hwm(&o->conn, o->zctx, address, NULL, "inproc://enkflow-output-monitor", HWM, err, sizeof err);
    if (rc) {
        sodium_memzero(token, sizeof token);
        return set_err(o, rc, "%s", err);
    }
    o->have_conn = 1;
    rc = hello(o, token, timeout_s > 0 ? timeout_s : OPEN_TIMEOUT_S);
    sodium_memzero(token, sizeof token);
    if (rc) {
        ekf_conn_close(&o->conn, 0);
        o->have_conn = 0;
        return rc;
    }
    return ok(o);
}

int enkflow_output_open_dir(enkflow_output **out, const char *directory, double timeout_s) {
    if (!out) return ENKFLOW_EINVAL;
    if (!directory || !*directory) {
        *out = new_handle();
        return *out ? set_err(*out, ENKFLOW_EINVAL, "no output service directory") : ENKFLOW_ENOMEM;
    }
    size_t n = strlen(directory) + 16;
    char *apath = malloc(n), *tpath = malloc(n);
    char address[1024] = "";
    int rc = ENKFLOW_OK;
    if (!apath || !tpath) {
        free(apath);
        free(tpath);
        *out = NULL;
        return ENKFLOW_ENOMEM;
    }
    snprintf(apath, n, "%s/address", directory);
    snprintf(tpath, n, "%s/token", directory);
    FILE *fh = fopen(apath, "r");
    if (!fh) {
        rc = errno == ENOENT ? ENKFLOW_ELOST : ENKFLOW_EIO;
        snprintf(address, sizeof address, "%s: %s", apath,
                 errno == ENOENT ? "no output service is running there" : strerror(errno));
    } else {
        size_t k = fread(address, 1, sizeof address - 1, fh);
        fclose(fh);
        address[k] = 0;
        while (k && (address[k - 1] == '\n' || address[k - 1] == ' ' || address[k - 1] == '\r')) address[--k] = 0;
    }
    if (rc) {
        *out = new_handle(); /* to carry the message */
        if (*out) set_err(*out, rc, "%s", address);
        else rc = ENKFLOW_ENOMEM;
    } else {
        rc = enkflow_output_open(out, address, tpath, timeout_s);
    }
    free(apath);
    free(tpath);
    return rc;
}

int enkflow_output_set_timeout(enkflow_output *o, double timeout_s) {
    if (!o) return ENKFLOW_EINVAL;
    if (!(timeout_s > 0) || !isfinite(timeout_s))
        return set_err(o, ENKFLOW_EINVAL, "enkflow_output_set_timeout: %g s, expected a positive number", timeout_s);
    o->timeout_s = timeout_s;
    return ok(o);
}

/* --- add ------------------------------------------------------------------------------------------- */

static void shape_text(char *out, size_t n, int ndim, const int64_t *shape) {
    size_t used = (size_t)snprintf(out, n, "(");
    for (int d = 0; d < ndim && used < n; d++)
        used += (size_t)snprintf(out + used, n - used, d ? ", %lld" : "%lld", (long long)shape[d]);
    if (used < n) snprintf(out + used, n - used, ndim == 1 ? ",)" : ")");
}

static void dims_text(char *out, size_t n, const ofield *f) {
    size_t used = (size_t)snprintf(out, n, "[");
    for (int d = 0; d < f->ndim && used < n; d++) used += (size_t)snprintf(out + used, n - used, d ? ", %s" : "%s", f->dims[d]);
    if (used < n) snprintf(out + used, n - used, "]");
}

static void field_list(enkflow_output *o, char *out, size_t n) {
    size_t used = 0;
    out[0] = 0;
    /* sorted, as Python lists them */
    const char *prev = "";
    for (int i = 0; i < o->nfields && used < n; i++) {
        const char *next = NULL;
        for (int k = 0; k < o->nfields; k++)
            if (strcmp(o->fields[k].name, prev) > 0 && (!next || strcmp(o->fields[k].name, next) < 0)) next = o->fields[k].name;
        if (!next) break;
        used += (size_t)snprintf(out + used, n - used, "%s%s", i ? ", " : "", next);
        prev = next;
    }
    if (!o->nfields) snprintf(out, n, "none");
}

static int check_region(enkflow_output *o, const ofield *f, const char *what, int ndim, const int64_t *shape,
                        const int64_t *region) {
    char a[256], b[256], dims[512];
    dims_text(dims, sizeof dims, f);
    if (!region) {
        int same = ndim == f->ndim;
        for (int d = 0; same && d < ndim; d++) same = shape[d] == f->shape[d];
        if (same) return ENKFLOW_OK;
        shape_text(a, sizeof a, ndim, shape);
        shape_text(b, sizeof b, f->ndim, f->shape);
        return set_err(o, ENKFLOW_ESIZE, "%s: the array has shape %s, the field %s (dims %s); pass a region for a part",
                       what, a, b, dims);
    }
    if (ndim != f->ndim)
        return set_err(o, ENKFLOW_ESIZE, "%s: the array (and its region) has %d dimensions, the field %d %s", what, ndim,
                       f->ndim, dims);
    for (int d = 0; d < ndim; d++) {
        int64_t start = region[2 * d], stop = region[2 * d + 1];
        if (!(0 <= start && start < stop && stop <= f->shape[d]))
            return set_err(o, ENKFLOW_ESIZE, "%s: region [%lld, %lld) along %s is outside [0, %lld)", what,
                           (long long)start, (long long)stop, f->dims[d], (long long)f->shape[d]);
        if (stop - start != shape[d])
            return set_err(o, ENKFLOW_ESIZE, "%s: the array has %lld points along %s, the region [%lld, %lld) %lld", what,
                           (long long)shape[d], f->dims[d], (long long)start, (long long)stop, (long long)(stop - start));
    }
    return ENKFLOW_OK;
}

int enkflow_output_add(enkflow_output *o, const char *name, enkflow_dtype dtype, const void *data, int ndim,
                       const int64_t *shape, double time, int64_t member, const int64_t *region) {
    double t0 = ekf_now();
    int rc = usable(o, "enkflow_output_add");
    if (rc) return rc;
    if (!name) return set_err(o, ENKFLOW_EINVAL, "enkflow_output_add: no field name");
    const ofield *f = find_field(o, name);
    if (!f) {
        char list[2048];
        field_list(o, list, sizeof list);
        return set_err(o, ENKFLOW_EFIELD, "unknown output field '%s'; [output.fields] declares %s", name, list);
    }
    char what[512];
    if (member) snprintf(what, sizeof what, "output field %s member %lld time %g", name, (long long)member, time);
    else snprintf(what, sizeof what, "output field %s time %g", name, time);
    if (f->ensemble && !(1 <= member && member <= o->members)) {
        char got[32];
        if (member) snprintf(got, sizeof got, "%lld", (long long)member);
        else snprintf(got, sizeof got, "0 (none)");
        return set_err(o, ENKFLOW_EINVAL, "%s: an ensemble field needs member = 1..%lld, got %s", what,
                       (long long)o->members, got);
    }
    if (!f->ensemble && member)
        return set_err(o, ENKFLOW_EINVAL, "%s: not an ensemble field (ensemble = false): member must be 0 (none)", what);
    if (!isfinite(time)) return set_err(o, ENKFLOW_EINVAL, "%s: time is not finite", what);
    if (dtype != ENKFLOW_FLOAT32 && dtype != ENKFLOW_FLOAT64 && dtype != ENKFLOW_INT32 && dtype != ENKFLOW_INT64)
        return set_err(o, ENKFLOW_ETYPE, "%s: element type %d is not ENKFLOW_FLOAT32/FLOAT64/INT32/INT64", what, (int)dtype);
    if (ndim < 0 || ndim > 32 || (ndim && !shape))
        return set_err(o, ENKFLOW_EINVAL, "%s: ndim %d%s", what, ndim, ndim && !shape ? " with no shape" : " (0..32)");
    int64_t count = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0 || (shape[d] && count > INT64_MAX / 8 / shape[d]))
            return set_err(o, ENKFLOW_ESIZE, "%s: extent %lld along dimension %d", what, (long long)shape[d], d);
        count *= shape[d];
    }
    if ((rc = check_region(o, f, what, ndim, shape, region))) return rc;
    if (count && !data) return set_err(o, ENKFLOW_EINVAL, "%s: NULL data", what);
    size_t out_size = dtype == ENKFLOW_FLOAT32 ? 4 : 8;
    int64_t nbytes = count * (int64_t)out_size;
    if (nbytes > o->limit)
        return set_err(o, ENKFLOW_ESIZE, "%s: the array has %lld bytes, more than output.buffer_mb (%lld bytes); raise "
                       "buffer_mb or add it in regions", what, (long long)nbytes, (long long)o->limit);

    ekf_buf b = {0};
    ekf_buf_printf(&b, "{\"kind\":\"add\",\"seq\":%llu,\"field\":", (unsigned long long)++o->seq);
    ekf_buf_json_string(&b, name);
    ekf_buf_add(&b, ",\"time\":", 8);
    put_double(&b, time);
    if (member) ekf_buf_printf(&b, ",\"member\":%lld", (long long)member);
    else ekf_buf_add(&b, ",\"member\":null", 14);
    if (region) {
        ekf_buf_add(&b, ",\"region\":[", 11);
        for (int d = 0; d < ndim; d++)
            ekf_buf_printf(&b, "%s[%lld,%lld]", d ? "," : "", (long long)region[2 * d], (long long)region[2 * d + 1]);
        ekf_buf_add(&b, "]", 1);
    } else {
        ekf_buf_add(&b, ",\"region\":null", 14);
    }
    const uint16_t probe = 1; /* the data frame holds the machine's bytes: say which order they are in */
    const char order = *(const unsigned char *)&probe ? '<' : '>';
    ekf_buf_printf(&b, ",\"dtype\":\"%c%s\",\"shape\":[", order, dtype == ENKFLOW_FLOAT32 ? "f4" : "f8");
    for (int d = 0; d < ndim; d++) ekf_buf_printf(&b, d ? ",%lld" : "%lld", (long long)shape[d]);
    ekf_buf_add(&b, "]}", 2);
    zmq_msg_t m[2];
    if (b.oom || zmq_msg_init_size(&m[0], b.n)) {
        free(b.p);
        return set_err(o, ENKFLOW_ENOMEM, "%s: the message", what);
    }
    memcpy(zmq_msg_data(&m[0]), b.p, b.n);
    free(b.p);
    if (zmq_msg_init_size(&m[1], (size_t)nbytes)) {
        zmq_msg_close(&m[0]);
        return set_err(o, ENKFLOW_ENOMEM, "%s: a copy of %lld bytes", what, (long long)nbytes);
    }
    /* The copy the service receives (the caller may change its array once add returns). */
    unsigned char *dst = zmq_msg_data(&m[1]);
    if (dtype == ENKFLOW_FLOAT32 || dtype == ENKFLOW_FLOAT64) {
        if (nbytes) memcpy(dst, data, (size_t)nbytes);
    } else {
        for (int64_t k = 0; k < count; k++) {
            double v = dtype == ENKFLOW_INT32 ? (double)((const int32_t *)data)[k] : (double)((const int64_t *)data)[k];
            memcpy(dst + 8 * k, &v, 8);
        }
    }
    if ((rc = send_msgs(o, m, 2, &o->st.blocked_s))) return rc;
    o->st.adds++;
    o->st.bytes += nbytes;
    o->st.add_s += ekf_now() - t0;
    return ok(o);
}

/* --- sync, discard, close --------------------------------------------------------------------------- */

/* A request (kind, with extra JSON members) and its reply (want); the reply's stats are kept, its error
 * gives ENKFLOW_EOUTPUT. */
static int call(enkflow_output *o, const char *kind, const char *extra, const char *want, ekf_json **out) {
    ekf_buf b = {0};
    uint64_t seq = ++o->seq;
    ekf_buf_printf(&b, "{\"kind\":\"%s\",\"seq\":%llu%s}", kind, (unsigned long long)seq, extra);
    int rc = send_json(o, &b);
    free(b.p);
    if (rc) return rc;
    ekf_json *j;
    if ((rc = reply(o, want, seq, o->timeout_s, &j))) return rc;
    const ekf_json *stats = ekf_json_get(j, "stats");
    if (stats) {
        ekf_buf s = {0};
        put_tree(&s, stats);
        if (!s.oom) {
            free(o->service_stats);
            o->service_stats = s.p;
        } else {
            free(s.p);
        }
    }
    const ekf_json *e = ekf_json_get(j, "error");
    if (e && e->type == EKF_JSTR) {
        rc = set_err(o, ENKFLOW_EOUTPUT, "output service: %s", e->str);
    } else {
        rc = ok(o);
    }
    if (out) *out = j;
    else ekf_json_free(j);
    return rc;
}

int enkflow_output_sync(enkflow_output *o) {
    int rc = usable(o, "enkflow_output_sync");
    return rc ? rc : call(o, "sync", "", "synced", NULL);
}

int enkflow_output_discard(enkflow_output *o, double time, int64_t *ndropped) {
    if (ndropped) *ndropped = 0;
    int rc = usable(o, "enkflow_output_discard");
    if (rc) return rc;
    if (!isfinite(time)) return set_err(o, ENKFLOW_EINVAL, "enkflow_output_discard: time is not finite");
    ekf_buf x = {0};
    ekf_buf_add(&x, ",\"time\":", 8);
    put_double(&x, time);
    if (x.oom) { free(x.p); return set_err(o, ENKFLOW_ENOMEM, "discard"); }
    ekf_json *j = NULL;
    rc = call(o, "discard", x.p, "discarded", &j);
    free(x.p);
    if (!j) return rc;
    const ekf_json *d = ekf_json_get(j, "dropped");
    ekf_buf names = {0};
    ekf_buf_add(&names, "", 0);
    int64_t n = 0;
    for (size_t k = 0; d && d->type == EKF_JARR && k < d->n; k++)
        if (d->items[k].type == EKF_JSTR) {
            ekf_buf_printf(&names, "%s%s", n ? "," : "", d->items[k].str);
            n++;
        }
    ekf_json_free(j);
    if (!names.oom && names.p) {
        free(o->dropped);
        o->dropped = names.p;
    } else {
        free(names.p);
    }
    if (ndropped) *ndropped = n;
    return rc;
}

const char *enkflow_output_dropped(const enkflow_output *o) { return o && o->dropped ? o->dropped : ""; }

static void shutdown_conn(enkflow_output *o) {
    if (o->have_conn) ekf_conn_close(&o->conn, 0);
    o->have_conn = 0;
    if (o->zctx) zmq_ctx_term(o->zctx);
    o->zctx = NULL;
}

int enkflow_output_close(enkflow_output *o, int wait) {
    if (!o) return ENKFLOW_EINVAL;
    if (o->closed && !o->lost) return ok(o);
    int rc = usable(o, "enkflow_output_close");
    if (rc == ENKFLOW_OK && wait) rc = call(o, "sync", "", "synced", NULL);
    if (rc == ENKFLOW_OK) rc = call(o, "bye", "", "bye", NULL);
    o->closed = 1;
    if (o->pid == getpid()) shutdown_conn(o);
    return rc;
}

void enkflow_output_free(enkflow_output *o) {
    if (!o) return;
    if (o->pid == getpid()) shutdown_conn(o);
    free_fields(o);
    free(o->address);
    free(o->service_stats);
    free(o->dropped);
    free(o);
}

int enkflow_output_get_stats(const enkflow_output *o, enkflow_output_stats *stats) {
    if (!o || !stats) return ENKFLOW_EINVAL;
    *stats = o->st;
    return ENKFLOW_OK;
}

const char *enkflow_output_service_stats(const enkflow_output *o) { return o && o->service_stats ? o->service_stats : "{}"; }
int64_t enkflow_output_members(const enkflow_output *o) { return o ? o->members : 0; }
int64_t enkflow_output_service_pid(const enkflow_output *o) { return o ? o->service_pid : 0; }
