/* A request/reply connection to one server socket (enkflow.online.connection in C): a DEALER socket and
 * its socket monitor, so a server process that dies fails the pending request at once (ENKFLOW_ELOST)
 * instead of leaving it waiting. ZeroMQ reconnects to the address by itself. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

double ekf_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int ekf_conn_open(ekf_conn *c, void *zctx, const char *address, const char *curve_key, const char *monitor_endpoint,
                  char *err, size_t errsize) {
    return ekf_conn_open_hwm(c, zctx, address, curve_key, monitor_endpoint, 0, err, errsize);
}

int ekf_conn_open_hwm(ekf_conn *c, void *zctx, const char *address, const char *curve_key, const char *monitor_endpoint,
                      int sndhwm, char *err, size_t errsize) {
    memset(c, 0, sizeof *c);
    c->address = strdup(address);
    if (!c->address) { snprintf(err, errsize, "out of memory"); return ENKFLOW_ENOMEM; }
    c->sock = zmq_socket(zctx, ZMQ_DEALER);
    if (!c->sock) goto zfail;
    int zero = 0;
    if (zmq_setsockopt(c->sock, ZMQ_LINGER, &zero, sizeof zero)) goto zfail;
    /* Before the connect: ZeroMQ sizes a connection's queue when it makes it. */
    if (sndhwm > 0 && zmq_setsockopt(c->sock, ZMQ_SNDHWM, &sndhwm, sizeof sndhwm)) goto zfail;
    if (curve_key && curve_key[0]) {
        char pub[41], sec[41];
        if (!zmq_has("curve")) {
            snprintf(err, errsize, "this libzmq has no CURVE support, but the server encrypts ([online] curve)");
            ekf_conn_close(c, 0);
            return ENKFLOW_EZMQ;
        }
        if (zmq_curve_keypair(pub, sec) || zmq_setsockopt(c->sock, ZMQ_CURVE_PUBLICKEY, pub, 40) ||
            zmq_setsockopt(c->sock, ZMQ_CURVE_SECRETKEY, sec, 40) ||
            zmq_setsockopt(c->sock, ZMQ_CURVE_SERVERKEY, curve_key, strlen(curve_key)))
            goto zfail;
    }
    if (zmq_socket_monitor(c->sock, monitor_endpoint, ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED)) goto zfail;
    c->mon = zmq_socket(zctx, ZMQ_PAIR);
    if (!c->mon || zmq_setsockopt(c->mon, ZMQ_LINGER, &zero, sizeof zero) || zmq_connect(c->mon, monitor_endpoint))
        goto zfail;
    if (zmq_connect(c->sock, address)) goto zfail;
    return ENKFLOW_OK;
zfail:
    snprintf(err, errsize, "cannot connect to %s: %s", address, zmq_strerror(zmq_errno()));
    ekf_conn_close(c, 0);
    return ENKFLOW_EZMQ;
}

void ekf_conn_close(ekf_conn *c, int linger_ms) {
    if (c->sock) {
        zmq_socket_monitor(c->sock, NULL, 0);
        zmq_setsockopt(c->sock, ZMQ_LINGER, &linger_ms, sizeof linger_ms);
        zmq_close(c->sock);
    }
    if (c->mon) zmq_close(c->mon);
    free(c->address);
    memset(c, 0, sizeof *c);
}

static void drain_monitor(ekf_conn *c) {
    while (1) {
        zmq_msg_t ev, addr;
        zmq_msg_init(&ev);
        if (zmq_msg_recv(&ev, c->mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&ev);
            return;
        }
        uint16_t event = 0;
        if (zmq_msg_size(&ev) >= 2) memcpy(&event, zmq_msg_data(&ev), 2);
        int more = zmq_msg_more(&ev);
        zmq_msg_close(&ev);
        if (more) { /* the endpoint frame */
            zmq_msg_init(&addr);
            zmq_msg_recv(&addr, c->mon, 0);
            zmq_msg_close(&addr);
        }
        if (event == ZMQ_EVENT_CONNECTED) {
            c->connected = 1;
        } else if (event == ZMQ_EVENT_DISCONNECTED) {
            if (c->connected) c->lost = 1;
            c->connected = 0;
        }
    }
}

int ekf_conn_check(ekf_conn *c, char *err, size_t errsize) {
    drain_monitor(c);
    if (!c->lost) return ENKFLOW_OK;
    snprintf(err, errsize, "the server at %s went away", c->address);
    return ENKFLOW_ELOST;
}

int ekf_conn_send(ekf_conn *c, const void *const *data, const size_t *sizes, size_t nframes, int copy, char *err,
                  size_t errsize) {
    for (size_t k = 0; k < nframes; k++) {
        zmq_msg_t m;
        if (copy || sizes[k] < EKF_COPY_BELOW) {
            /* Headers and metadata may live on the caller's stack: copied. */
            if (zmq_msg_init_size(&m, sizes[k])) goto zfail;
            if (sizes[k]) memcpy(zmq_msg_data(&m), data[k], sizes[k]);
        } else if (zmq_msg_init_data(&m, (void *)data[k], sizes[k], NULL, NULL)) {
            /* Arrays without a copy: the caller keeps them alive until the reply (ACK) that follows. */
            goto zfail;
        }
        while (zmq_msg_send(&m, c->sock, k + 1 < nframes ? ZMQ_SNDMORE : 0) < 0) {
            if (zmq_errno() == EINTR) continue;
            zmq_msg_close(&m);
            goto zfail;
        }
    }
    return ENKFLOW_OK;
zfail:
    snprintf(err, errsize, "cannot send to %s: %s", c->address, zmq_strerror(zmq_errno()));
    return ENKFLOW_EZMQ;
}

void ekf_msg_free(ekf_msg *m) {
    for (size_t k = 0; k < m->n; k++) zmq_msg_close(&m->frames[k]);
    free(m->frames);
    m->frames = NULL;
    m->n = m->cap = 0;
}

/* One whole multipart message into out (frames after the first); 0, or -1 on a ZeroMQ error. */
static int recv_multipart(ekf_conn *c, zmq_msg_t *first, ekf_msg *out) {
    int more = zmq_msg_more(first);
    while (more) {
        if (out->n == out->cap) {
            size_t nc = out->cap ? 2 * out->cap : 8;
            zmq_msg_t *f = realloc(out->frames, nc * sizeof *f);
            if (!f) return -1;
            out->frames = f;
            out->cap = nc;
        }
        zmq_msg_t *m = &out->frames[out->n];
        zmq_msg_init(m);
        while (zmq_msg_recv(m, c->sock, 0) < 0) {
            if (zmq_errno() == EINTR) continue;
            zmq_msg_close(m);
            return -1;
        }
        out->n++;
        more = zmq_msg_more(m);
    }
    return 0;
}

static void error_text(const ekf_msg *m, char *err, size_t errsize) {
    const char *text = "?";
    ekf_json *j = NULL;
    if (m->n >= 1) {
        char jerr[128];
        j = ekf_json_parse(zmq_msg_data(&m->frames[0]), zmq_msg_size(&m->frames[0]), jerr, sizeof jerr);
        const ekf_json *e = ekf_json_get(j, "error");
        if (e && e->type == EKF_JSTR) text = e->str;
    }
    snprintf(err, errsize, "%s", text);
    ekf_json_free(j);
}

int ekf_conn_recv(ekf_conn *c, double timeout_s, ekf_accept_fn accept, const void *actx, ekf_msg *out,
                  char *err, size_t errsize) {
    double deadline = ekf_now() + timeout_s;
    memset(out, 0, sizeof *out);
    while (1) {
        if (c->stop && *c->stop) {
            snprintf(err, errsize, "interrupted: the stop flag was set while waiting for the server at %s", c->address);
            return ENKFLOW_EINTR;
        }
        drain_monitor(c);
        double left = deadline - ekf_now();
        if (!c->lost && left <= 0) {
            snprintf(err, errsize, "no reply from the server at %s within %g s", c->address, timeout_s);
            return ENKFLOW_ELOST;
        }
        zmq_pollitem_t items[2] = {{c->sock, 0, ZMQ_POLLIN, 0}, {c->mon, 0, ZMQ_POLLIN, 0}};
        /* A reply the server sent before it went (the ERROR that stopped the study) is still queued and
           may be read after the disconnect is seen: it comes first, so a lost server only polls. */
        long ms = c->lost ? 0 : (long)((left < 1.0 ? left : 1.0) * 1000.0) + 1;
        int rc = zmq_poll(items, c->lost ? 1 : 2, ms);
        if (c->lost && rc == 0) {
            snprintf(err, errsize, "the server at %s went away", c->address);
            return ENKFLOW_ELOST;
        }
        if (rc < 0) {
            if (zmq_errno() == EINTR) continue;
            snprintf(err, errsize, "polling %s failed: %s", c->address, zmq_strerror(zmq_errno()));
            return ENKFLOW_EZMQ;
        }
        if (!(items[0].revents & ZMQ_POLLIN)) continue;
        zmq_msg_t first;
        zmq_msg_init(&first);
        if (zmq_msg_recv(&first, c->sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&first);
            if (zmq_errno() == EINTR || zmq_errno() == EAGAIN) continue;
            snprintf(err, errsize, "receiving from %s failed: %s", c->address, zmq_strerror(zmq_errno()));
            return ENKFLOW_EZMQ;
        }
        ekf_msg m = {0};
        int bad = ekf_header_unpack(zmq_msg_data(&first), zmq_msg_size(&first), &m.hdr, err, errsize);
        int rr = recv_multipart(c, &first, &m);
        zmq_msg_close(&first);
        if (rr) {
            ekf_msg_free(&m);
            snprintf(err, errsize, "receiving from %s failed: %s", c->address, zmq_strerror(zmq_errno()));
            return ENKFLOW_EZMQ;
        }
        if (bad == 2) {
            char detail[512];
            snprintf(detail, sizeof detail, "%s", err);
            snprintf(err, errsize, "the server at %s runs another enkflow: %s", c->address, detail);
            ekf_msg_free(&m);
            return ENKFLOW_EPROTOCOL;
        }
        if (bad) { /* not an enkflow message: ignored, as the Python runner does */
            err[0] = 0;
            ekf_msg_free(&m);
            continue;
        }
        if (accept(&m.hdr, actx)) {
            if (m.hdr.kind == EKF_ERROR) {
                error_text(&m, err, errsize);
                ekf_msg_free(&m);
                return ENKFLOW_EREFUSED;
            }
            *out = m;
            return ENKFLOW_OK;
        }
        ekf_msg_free(&m); /* a stale reply: also an ERROR about an older request (another task) */
    }
}
