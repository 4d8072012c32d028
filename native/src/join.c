/* Joining the server (HELLO, WELCOME, the data connections and their transports, the heartbeat thread), and
 * the collectives over an MPI runner's ranks it is made of. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runner_state.h"

/* fn() on rank 0, its result (code, message, payload) on every rank. */
int ekf_from_rank0(enkflow_runner *r, ekf_rank0_fn fn, ekf_buf *payload) {
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
        if (meta[1] >= EKF_ERRSIZE || meta[2] < 0 || meta[2] > EKF_MAX_JSON)
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
 * to a refusal, as in the Python runner, a stale task to a lost server) is returned on every rank. */
int ekf_collective(enkflow_runner *r, int code) {
    if (r->size == 1) return code;
    enum { OK, STALE, LOST, ERROR };
    int mine = code == ENKFLOW_OK ? OK : code == EKF_STALE ? STALE : code == ENKFLOW_ELOST ? LOST : ERROR, v = mine;
    if (r->allmax(&v, r->comm_ctx)) return ekf_rerr(r, ENKFLOW_ESTATE, "the allreduce_max callback failed");
    if (v == mine) return code;
    if (v == ERROR)
        return ekf_rerr(r, ENKFLOW_EREFUSED, "an error on another runner rank (its enkflow_runner_errmsg says which)");
    if (v == LOST) return ekf_rerr(r, ENKFLOW_ELOST, "another runner rank lost the server");
    return ekf_rerr(r, EKF_STALE, "another runner rank found task %llu stale", (unsigned long long)r->task);
}

static int open_conn(enkflow_runner *r, ekf_conn *c, const char *address) {
    char endpoint[128];
    snprintf(endpoint, sizeof endpoint, "inproc://enkflow-monitor-%p-%u", (void *)r, r->monitors++);
    char err[1024];
    int rc = ekf_conn_open(c, r->zctx, address, r->curve, endpoint, err, sizeof err);
    if (rc) return ekf_rerr(r, rc, "%s", err);
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
        ekf_buf_printf(b, ",\"dtype\":\"%s\",\"shape\":[", ekf_dtype_name(f->dtype));
        for (int d = 0; d < f->ndim; d++) ekf_buf_printf(b, d ? ",%lld" : "%lld", (long long)f->shape[d]);
        ekf_buf_printf(b, "],\"assimilated\":%s}", f->assimilated ? "true" : "false");
    }
    ekf_buf_printf(b, "],\"ranks\":%d}", r->size);
}

/* Before the first HELLO: the runner's id, appended to the file ENKFLOW_RUNNER_CONTACT names
 * (enkflow.online.contact), so that `enkflow run` tells a runner that never reached the server (a failed
 * start) from one that greeted a server that did not answer. Only that judgement depends on it. */
static void note_contact(const enkflow_runner *r) {
    const char *path = getenv("ENKFLOW_RUNNER_CONTACT");
    if (!path || !*path) return;
    FILE *f = fopen(path, "a");
    int ok = f != NULL && fprintf(f, "%llu\n", (unsigned long long)r->id) > 0;
    if (f != NULL && fclose(f) != 0) ok = 0;
    if (!ok) fprintf(stderr, "enkflow runner: cannot write %s (ENKFLOW_RUNNER_CONTACT)\n", path);
}

/* Rank 0: HELLO until a WELCOME (its JSON into payload) or a refusal, retrying for reconnect_s. */
static int hello(enkflow_runner *r, ekf_buf *payload) {
    double deadline = ekf_now() + r->reconnect_s;
    if (!r->epoch) note_contact(r);
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
        char err[EKF_ERRSIZE];
        if ((rc = ekf_conn_send(&r->control, frames, sizes, 2, 1, err, sizeof err))) {
            rc = ekf_rerr(r, rc, "%s", err);
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
            return ekf_ok(r);
        }
        if (rc != ENKFLOW_ELOST) {
            if (rc == ENKFLOW_EREFUSED) rc = ekf_rerr(r, rc, "the server at %s refused this runner: %s", r->address, err);
            else rc = ekf_rerr(r, rc, "%s", err);
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

void ekf_close_data(enkflow_runner *r) {
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
int ekf_join(enkflow_runner *r) {
    /* The server this runner joined before (if any) is gone: its store and slots are unmapped before a new
     * one is greeted, lest their pages stay pinned while it makes its own (a full /dev/shm). */
    ekf_close_data(r);
    ekf_shm_sweep(); /* a killed server's segments (this one's replaces it) */
    ekf_buf payload = {0};
    int rc = ekf_from_rank0(r, hello, &payload);
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
    r->epoch = epoch->u64;
    pthread_mutex_lock(&r->mu); /* the heartbeat thread reads it */
    r->heartbeat_s = hb->num;
    pthread_mutex_unlock(&r->mu);
    int n = (int)ranks->i64;
    r->data = calloc((size_t)n, sizeof *r->data);
    r->own = calloc((size_t)n * (size_t)(r->nfields ? r->nfields : 1) * 2, sizeof *r->own);
    if (!r->data || !r->own) {
        ekf_json_free(w);
        ekf_close_data(r);
        return ekf_collective(r, ekf_rerr(r, ENKFLOW_ENOMEM, "data connections"));
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
    rc = ekf_collective(r, rc);
    if (rc) {
        ekf_close_data(r);
        return rc;
    }
    if ((rc = ekf_heartbeat_start(r))) return rc;
    return ekf_ok(r);
}
