/* The exchange of a member's state between a runner rank and the server ranks owning its pieces: by TCP
 * (GET/DATA, PUT: the bytes in the messages) or, with a server rank on this node, through its shared memory
 * (GET_SLOT/SLOT, PUT_SLOT: the runner copies the state from the rank's segment into the bound arrays and
 * the forecast from them into the task's slot; the messages carry only where). */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <stdlib.h>
#include <strings.h>
#include <string.h>

#include "copy_checked.h"
#include "runner_state.h"

#define ERRSIZE EKF_ERRSIZE

static const char *const TRANSPORTS[] = {"auto", "shm", "tcp"}; /* by enkflow_transport */

int enkflow_runner_shm_ranks(const enkflow_runner *r) {
    if (!r) return -1;
    int n = 0;
    for (int s = 0; s < r->ndata; s++) n += r->links[s].shm;
    return n;
}

int ekf_transport_resolve(enkflow_runner *r) {
    if (r->transport >= 0) return ENKFLOW_OK;
    const char *env = getenv("ENKFLOW_TRANSPORT"), *a = env ? env : "";
    r->transport = ENKFLOW_TRANSPORT_AUTO;
    /* As the Python runner reads it: blanks around it ignored, in any case; unset or blank: AUTO. */
    while (isspace((unsigned char)*a)) a++;
    size_t n = strlen(a);
    while (n && isspace((unsigned char)a[n - 1])) n--;
    if (!n) return ENKFLOW_OK;
    for (int t = 0; t < 3; t++)
        if (n == strlen(TRANSPORTS[t]) && strncasecmp(a, TRANSPORTS[t], n) == 0) {
            r->transport = t;
            return ENKFLOW_OK;
        }
    return ekf_rerr(r, ENKFLOW_EINVAL, "ENKFLOW_TRANSPORT='%.64s' is not one of auto, shm, tcp", env);
}

/* --- joining: each rank's transport ------------------------------------------------------------- */

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* The WELCOME's shm entry of rank s ({"segment": PATH, "nonce": HEX32} or null) into its link. */
static int read_offer(enkflow_runner *r, int s, const ekf_json *entry) {
    ekf_link *l = &r->links[s];
    if (!entry || entry->type == EKF_JNULL) return ENKFLOW_OK;
    const ekf_json *seg = entry->type == EKF_JOBJ ? ekf_json_get(entry, "segment") : NULL;
    const ekf_json *nonce = entry->type == EKF_JOBJ ? ekf_json_get(entry, "nonce") : NULL;
    int bad = !seg || seg->type != EKF_JSTR || !*seg->str || !nonce || nonce->type != EKF_JSTR ||
              strlen(nonce->str) != 32;
    for (int k = 0; k < 16 && !bad; k++) {
        int hi = hexval(nonce->str[2 * k]), lo = hexval(nonce->str[2 * k + 1]);
        bad = hi < 0 || lo < 0;
        l->nonce[k] = (unsigned char)(hi * 16 + lo);
    }
    if (bad)
        return ekf_rerr(r, ENKFLOW_EPROTOCOL, "the server's WELCOME lacks the segment or the 32-hex-digit nonce of "
                        "server rank %d's shared memory", s);
    if (!(l->store = strdup(seg->str))) return ekf_rerr(r, ENKFLOW_ENOMEM, "WELCOME");
    return ENKFLOW_OK;
}

/* Shared memory with rank s when the transport allows and its store can be mapped and checked here. */
static int choose(enkflow_runner *r, int s) {
    ekf_link *l = &r->links[s];
    if (r->transport == ENKFLOW_TRANSPORT_TCP) return ENKFLOW_OK;
    if (!l->store) {
        if (r->transport == ENKFLOW_TRANSPORT_AUTO) return ENKFLOW_OK;
        return ekf_rerr(r, ENKFLOW_EINVAL, "transport shm: server rank %d offers no shared memory (its server runs "
                        "with [online] transport = \"tcp\", or could not make its segments)", s);
    }
    const ekf_segment *seg;
    char why[1024];
    if (ekf_seg_map(&r->segs, l->store, EKF_SEG_STORE, l->nonce, &seg, why, sizeof why) != EKF_SEG_MAPPED) {
        if (r->transport == ENKFLOW_TRANSPORT_AUTO) return ENKFLOW_OK; /* another node's, or another user's */
        return ekf_rerr(r, ENKFLOW_EINVAL, "transport shm: the shared memory of server rank %d, %s: %s", s, l->store,
                        why);
    }
    l->shm = 1;
    return ENKFLOW_OK;
}

int ekf_links_open(enkflow_runner *r, const ekf_json *shm) {
    size_t nf = (size_t)(r->nfields ? r->nfields : 1);
    r->links = calloc((size_t)r->ndata, sizeof *r->links);
    int64_t *at = calloc((size_t)r->ndata * nf, sizeof *at);
    if (!r->links || !at) {
        free(at);
        return ekf_rerr(r, ENKFLOW_ENOMEM, "data connections");
    }
    r->links[0].write_at = at; /* the block's owner, freed with rank 0's */
    for (int s = 0; s < r->ndata; s++) r->links[s].write_at = at + nf * (size_t)s;
    if (shm && shm->type != EKF_JNULL && (shm->type != EKF_JARR || (int64_t)shm->n != r->ndata))
        return ekf_rerr(r, ENKFLOW_EPROTOCOL, "the server's WELCOME has no shm entry per server rank");
    int rc = ENKFLOW_OK;
    for (int s = 0; s < r->ndata && !rc; s++) {
        rc = read_offer(r, s, shm && shm->type == EKF_JARR ? &shm->items[s] : NULL);
        if (!rc) rc = choose(r, s);
    }
    return rc;
}

void ekf_links_close(enkflow_runner *r) {
    if (r->links) {
        for (int s = 0; s < r->ndata; s++) free(r->links[s].store);
        free(r->links[0].write_at);
        free(r->links);
        r->links = NULL;
    }
    ekf_seg_clear(&r->segs);
}

/* --- the exchange -------------------------------------------------------------------------------- */

typedef struct {
    int kind;
    uint64_t task;
} want;

/* The reply of that kind to the request about that task, or an ERROR about it. An ERROR about another
 * task is stale: a forecast refused by several server ranks gets one ERROR from each, and put() stops
 * reading at the first; the others must not answer the next task's GET. Task 0: the server could not read
 * the request's header. */
static int accept_want(const ekf_header *h, const void *ctx) {
    const want *w = ctx;
    if (h->kind == EKF_ERROR) return h->task == w->task || h->task == 0;
    return h->kind == w->kind && h->task == w->task;
}

/* The pieces (field, offset, count) of this rank's slices that server rank `rank` owns, into idx
 * (3 int64 per piece, little-endian); returns their number. */
static size_t pieces(enkflow_runner *r, int rank, unsigned char *idx) {
    size_t n = 0;
    for (int k = 0; k < r->nfields; k++) {
        field *f = &r->fields[k];
        int64_t lo = r->own[(rank * r->nfields + k) * 2], hi = r->own[(rank * r->nfields + k) * 2 + 1];
        int64_t a = lo > f->off ? lo : f->off, b = hi < f->off + f->cnt ? hi : f->off + f->cnt;
        if (a < b) {
            ekf_put_i64(idx + 24 * n, k);
            ekf_put_i64(idx + 24 * n + 8, a);
            ekf_put_i64(idx + 24 * n + 16, b - a);
            n++;
        }
    }
    return n;
}

/* Piece p of an index: its field, where it starts in the bound array, its bytes. */
static field *piece(enkflow_runner *r, const unsigned char *idx, size_t p, char **at, size_t *bytes) {
    field *f = &r->fields[ekf_get_i64(idx + 24 * p)];
    int64_t off = ekf_get_i64(idx + 24 * p + 8), cnt = ekf_get_i64(idx + 24 * p + 16);
    *at = (char *)f->data + (size_t)(off - f->off) * ekf_itemsize(f->dtype);
    *bytes = (size_t)cnt * ekf_itemsize(f->dtype);
    return f;
}

/* The header and index of a request of that kind to rank s, then `extra` frames. */
static int send_request(enkflow_runner *r, int s, int kind, const unsigned char *idx, size_t n, const void **frames,
                        size_t *sizes, size_t extra, int copy) {
    ekf_header h;
    unsigned char hb[EKF_HEADER_SIZE];
    ekf_header_for(r, &h, kind, n);
    ekf_header_pack(&h, hb);
    frames[0] = hb;
    sizes[0] = sizeof hb;
    frames[1] = idx;
    sizes[1] = 24 * n;
    char err[ERRSIZE];
    int rc = ekf_conn_send(&r->data[s], frames, sizes, 2 + extra, copy, err, sizeof err);
    return rc ? ekf_rerr(r, rc, "%s", err) : ENKFLOW_OK;
}

static ekf_check check_of(enkflow_dtype dtype) {
    return dtype == ENKFLOW_FLOAT64 ? EKF_CHECK_F64 : dtype == ENKFLOW_FLOAT32 ? EKF_CHECK_F32 : EKF_CHECK_NONE;
}

/* PUT_SLOT: the forecast's pieces copied into the task's slot on rank s first, each checked as it is copied;
 * the finite frame (a byte per piece, 1: every element finite) spares the server a second read of them. A
 * piece holding NaN or Inf is marked 0: the server finds the element and refuses the forecast naming it. */
static int put_slot(enkflow_runner *r, int s, const unsigned char *idx, size_t n, const void **frames, size_t *sizes) {
    ekf_link *l = &r->links[s];
    if (!l->slot)
        return ekf_rerr(r, ENKFLOW_ESTATE, "server rank %d: no slot for the forecast of member %lld (its state came "
                        "by another way)", s, (long long)r->member);
    unsigned char *finite = malloc(n ? n : 1);
    if (!finite) return ekf_rerr(r, ENKFLOW_ENOMEM, "PUT_SLOT");
    for (size_t p = 0; p < n; p++) {
        char *at;
        size_t bytes;
        field *f = piece(r, idx, p, &at, &bytes);
        size_t es = ekf_itemsize(f->dtype);
        finite[p] = (unsigned char)ekf_copy_checked(l->slot->base + l->write_at[p], at, bytes / es, es, check_of(f->dtype));
    }
    frames[2] = finite;
    sizes[2] = n;
    int rc = send_request(r, s, EKF_PUT_SLOT, idx, n, frames, sizes, 1, 1);
    free(finite);
    return rc;
}

/* PUT: the forecast's pieces as frames, sent without a copy (they stay put until the ACK). */
static int put_tcp(enkflow_runner *r, int s, const unsigned char *idx, size_t n, const void **frames, size_t *sizes) {
    for (size_t p = 0; p < n; p++) {
        char *at;
        piece(r, idx, p, &at, &sizes[2 + p]);
        frames[2 + p] = at;
    }
    return send_request(r, s, EKF_PUT, idx, n, frames, sizes, n, 0);
}

int ekf_put_ranks(enkflow_runner *r, int *sent) {
    int rc = ENKFLOW_OK;
    size_t nf = (size_t)r->nfields;
    unsigned char *idx = malloc(24 * nf);
    const void **frames = malloc((2 + nf) * sizeof *frames);
    size_t *sizes = malloc((2 + nf) * sizeof *sizes);
    char err[ERRSIZE];
    if (!idx || !frames || !sizes) {
        rc = ekf_rerr(r, ENKFLOW_ENOMEM, "PUT");
        goto done;
    }
    /* A server that went away while the model ran may have been replaced at the same addresses: the task
     * is the old server's, and its id may be another member's task in the new one. Greet the new one. */
    for (int s = 0; s < r->ndata; s++)
        if ((rc = ekf_conn_check(&r->data[s], err, sizeof err))) {
            rc = ekf_rerr(r, rc, "server rank %d: %s while the model ran", s, err);
            goto done;
        }
    for (int s = 0; s < r->ndata; s++) {
        size_t n = pieces(r, s, idx);
        sent[s] = 0;
        if (!n) continue;
        if ((rc = (r->links[s].shm ? put_slot : put_tcp)(r, s, idx, n, frames, sizes))) goto done;
        sent[s] = 1;
    }
    want w = {EKF_ACK, r->task};
    for (int s = 0; s < r->ndata; s++) {
        if (!sent[s]) continue;
        ekf_msg m;
        if ((rc = ekf_conn_recv(&r->data[s], r->timeout_s, accept_want, &w, &m, err, sizeof err))) {
            rc = ekf_rerr(r, rc, "server rank %d: %s", s, err);
            goto done;
        }
        ekf_msg_free(&m);
    }
done:
    free(idx);
    free(frames);
    free(sizes);
    return rc;
}

/* The reply of rank s echoes the n pieces asked for, with `frames` frames after the header. */
static int echoes(enkflow_runner *r, int s, const ekf_msg *m, const unsigned char *ix, size_t n, size_t frames) {
    if (m->hdr.count != n || m->n != frames || zmq_msg_size(&m->frames[0]) != 24 * n ||
        memcmp(zmq_msg_data(&m->frames[0]), ix, 24 * n) != 0)
        return ekf_rerr(r, ENKFLOW_EPROTOCOL, "server rank %d answered with other pieces than asked for", s);
    return ENKFLOW_OK;
}

/* DATA: the pieces' bytes in its frames. */
static int take_data(enkflow_runner *r, int s, ekf_msg *m, const unsigned char *ix, size_t n) {
    int rc = echoes(r, s, m, ix, n, 1 + n);
    for (size_t p = 0; p < n && !rc; p++) {
        char *at;
        size_t bytes;
        field *f = piece(r, ix, p, &at, &bytes);
        if (zmq_msg_size(&m->frames[1 + p]) != bytes)
            return ekf_rerr(r, ENKFLOW_EPROTOCOL, "server rank %d sent %zu bytes of field '%s', expected %zu", s,
                            zmq_msg_size(&m->frames[1 + p]), f->name, bytes);
        memcpy(at, zmq_msg_data(&m->frames[1 + p]), bytes);
    }
    return rc;
}

/* A SLOT reply's offsets of a piece: two integers. */
static int offset_pair(const ekf_json *pair) {
    return pair->type == EKF_JARR && pair->n == 2 && pair->items[0].type == EKF_JNUM && pair->items[0].is_int &&
           pair->items[1].type == EKF_JNUM && pair->items[1].is_int;
}

/* off, a byte offset the server named, holds `bytes` bytes of data of the segment. */
static int within(const ekf_json *off, size_t bytes, const ekf_segment *seg) {
    return off->i64 >= EKF_SEG_HEADER && (uint64_t)off->i64 <= seg->size && bytes <= seg->size - (size_t)off->i64;
}

/* A segment a SLOT reply of rank s names (`what` the task's state or slot in it), mapped. A slot that is
 * gone was retired by the server: the task went stale (EKF_STALE: forgotten, as a PUT_SLOT refused for
 * want of a slot); a store that is gone was the server's that ended (ENKFLOW_ELOST: greet again). */
static int slot_segment(enkflow_runner *r, int s, const char *what, const char *path, ekf_seg_kind kind,
                        const ekf_segment **out) {
    char why[1024];
    ekf_seg_status st = ekf_seg_map(&r->segs, path, kind, r->links[s].nonce, out, why, sizeof why);
    if (st == EKF_SEG_MAPPED) return ENKFLOW_OK;
    if (st == EKF_SEG_GONE)
        return ekf_rerr(r, kind == EKF_SEG_SLOT ? EKF_STALE : ENKFLOW_ELOST, "server rank %d: %s of task %llu (member "
                        "%lld), %s, is gone: %s", s, what, (unsigned long long)r->task, (long long)r->member, path,
                        kind == EKF_SEG_SLOT ? "the task went stale" : "the server ended");
    return ekf_rerr(r, ENKFLOW_EPROTOCOL, "server rank %d: %s of member %lld, %s: %s", s, what, (long long)r->member,
                    path, why);
}

/* SLOT's where (JSON: read and write segment, per piece their byte offsets): the pieces copied from the
 * read segment, the write offsets kept for the forecast. */
static int take_where(enkflow_runner *r, int s, const ekf_json *w, const unsigned char *ix, size_t n) {
    ekf_link *l = &r->links[s];
    const ekf_json *rd = ekf_json_get(w, "read"), *wr = ekf_json_get(w, "write"), *at = ekf_json_get(w, "at");
    if (!rd || rd->type != EKF_JSTR || !wr || wr->type != EKF_JSTR || !at || at->type != EKF_JARR || at->n != n)
        return ekf_rerr(r, ENKFLOW_EPROTOCOL, "server rank %d: its SLOT reply lacks read, write or an offset pair per "
                        "piece", s);
    const ekf_segment *src, *dst;
    int store = l->store && strcmp(rd->str, l->store) == 0, rc;
    if ((rc = slot_segment(r, s, "the slot", wr->str, EKF_SEG_SLOT, &dst)) ||
        (rc = slot_segment(r, s, "the state", rd->str, store ? EKF_SEG_STORE : EKF_SEG_SLOT, &src)))
        return rc;
    for (size_t p = 0; p < n; p++) {
        const ekf_json *pair = &at->items[p];
        char *to;
        size_t bytes;
        field *f = piece(r, ix, p, &to, &bytes);
        if (!offset_pair(pair))
            return ekf_rerr(r, ENKFLOW_EPROTOCOL, "server rank %d: its SLOT reply's offsets of field '%s' are not a "
                            "pair of integers", s, f->name);
        if (!within(&pair->items[0], bytes, src) || !within(&pair->items[1], bytes, dst))
            return ekf_rerr(r, ENKFLOW_EPROTOCOL, "server rank %d: its SLOT reply places the %zu bytes of field '%s' "
                            "outside the segments (%s, %s)", s, bytes, f->name, rd->str, wr->str);
        memcpy(to, src->base + pair->items[0].i64, bytes);
        l->write_at[p] = pair->items[1].i64;
    }
    l->slot = dst;
    return ENKFLOW_OK;
}

/* SLOT: the index echoed, then where the pieces are (JSON). */
static int take_slot(enkflow_runner *r, int s, ekf_msg *m, const unsigned char *ix, size_t n) {
    int rc = echoes(r, s, m, ix, n, 2);
    if (rc) return rc;
    char jerr[256];
    ekf_json *w = ekf_json_parse(zmq_msg_data(&m->frames[1]), zmq_msg_size(&m->frames[1]), jerr, sizeof jerr);
    if (!w || w->type != EKF_JOBJ) {
        ekf_json_free(w);
        return ekf_rerr(r, ENKFLOW_EPROTOCOL, "server rank %d: its SLOT reply is not a JSON object: %s", s,
                        w ? "another JSON value" : jerr);
    }
    rc = take_where(r, s, w, ix, n);
    ekf_json_free(w);
    return rc;
}

int ekf_get_ranks(enkflow_runner *r) {
    size_t nf = (size_t)r->nfields;
    unsigned char *idx = malloc(24 * nf * (size_t)r->ndata);
    size_t *np = calloc((size_t)r->ndata, sizeof *np);
    int rc = ENKFLOW_OK;
    if (!idx || !np) {
        rc = ekf_rerr(r, ENKFLOW_ENOMEM, "GET");
        goto done;
    }
    /* The slots of the tasks before are spent; those the server retired since are unmapped. */
    for (int s = 0; s < r->ndata; s++) r->links[s].slot = NULL;
    ekf_seg_forget_gone(&r->segs);
    for (int s = 0; s < r->ndata; s++) {
        unsigned char *ix = idx + 24 * nf * (size_t)s;
        const void *frames[2];
        size_t sizes[2];
        if ((np[s] = pieces(r, s, ix)) &&
            (rc = send_request(r, s, r->links[s].shm ? EKF_GET_SLOT : EKF_GET, ix, np[s], frames, sizes, 0, 1)))
            goto done;
    }
    for (int s = 0; s < r->ndata && !rc; s++) {
        if (!np[s]) continue;
        unsigned char *ix = idx + 24 * nf * (size_t)s;
        want w = {r->links[s].shm ? EKF_SLOT : EKF_DATA, r->task};
        ekf_msg m;
        char err[ERRSIZE];
        if ((rc = ekf_conn_recv(&r->data[s], r->timeout_s, accept_want, &w, &m, err, sizeof err))) {
            rc = ekf_rerr(r, rc, "server rank %d: %s", s, err);
            goto done;
        }
        rc = (r->links[s].shm ? take_slot : take_data)(r, s, &m, ix, np[s]);
        ekf_msg_free(&m);
    }
done:
    free(idx);
    free(np);
    return rc;
}
