/* Internal declarations of libenkflow_runner: the wire format, a small JSON reader, connections. */
#ifndef ENKFLOW_INTERNAL_H
#define ENKFLOW_INTERNAL_H

#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

#include <zmq.h>

#include "enkflow_runner.h"

/* The handles' error message buffers (enkflow_runner, enkflow_output). */
#define EKF_ERRSIZE 4096

/* Format into a handle's message buffer through a copy: the arguments may point into it. */
static inline void ekf_vset_err(char err[EKF_ERRSIZE], const char *fmt, va_list ap) {
    char detail[EKF_ERRSIZE];
    vsnprintf(detail, sizeof detail, fmt, ap);
    memcpy(err, detail, sizeof detail);
}

/* --- wire.c: the 96-byte little-endian header of enkflow.online.wire ------------------------- */

#define EKF_HEADER_SIZE 96
#define EKF_MAX_JSON (1 << 20)
#define EKF_COPY_BELOW 8192 /* frames smaller than this are copied when sent; larger ones are not */

enum ekf_kind {
    EKF_HELLO = 1, EKF_WELCOME = 2, EKF_READY = 3, EKF_TASK = 4, EKF_STOP = 5, EKF_PUT = 6, EKF_ACK = 7,
    EKF_GET = 8, EKF_DATA = 9, EKF_HEARTBEAT = 10, EKF_FAIL = 11, EKF_BYE = 12, EKF_ERROR = 13,
    EKF_GET_SLOT = 14, EKF_SLOT = 15, EKF_PUT_SLOT = 16
};

/* The refusal of a PUT_SLOT whose task has no slot (enkflow.online.wire.NO_SLOT). */
#define EKF_NO_SLOT "has no slot on server rank"

typedef struct ekf_header {
    uint16_t version;
    uint16_t kind;
    unsigned char credential[32];
    uint64_t runner;
    uint64_t task;
    int64_t member;
    int64_t cycle;
    int64_t nsteps;
    uint64_t count;
    uint64_t epoch;
} ekf_header;

void ekf_header_pack(const ekf_header *h, unsigned char out[EKF_HEADER_SIZE]);
/* 0: parsed; 1: not an enkflow header (wrong size or magic, unknown kind); 2: another protocol version. */
int ekf_header_unpack(const void *buf, size_t n, ekf_header *h, char *err, size_t errsize);
/* SHA-256("enkflow-online-token\0" + token): the credential every message carries. */
int ekf_credential(const char *token, unsigned char out[32]);
void ekf_put_i64(unsigned char *p, int64_t v);
int64_t ekf_get_i64(const unsigned char *p);

/* --- json.c: just enough JSON (RFC 8259) for HELLO, WELCOME and ERROR ------------------------- */

typedef enum { EKF_JNULL, EKF_JBOOL, EKF_JNUM, EKF_JSTR, EKF_JARR, EKF_JOBJ } ekf_jtype;

typedef struct ekf_json {
    ekf_jtype type;
    int boolean;
    double num;
    int is_int;         /* the number was written as an integer that fits */
    int64_t i64;
    uint64_t u64;
    char *str;          /* JSTR: UTF-8, NUL-terminated */
    size_t n;           /* JARR/JOBJ: items */
    struct ekf_json *items;
    char **keys;        /* JOBJ */
} ekf_json;

/* Parse n bytes; NULL on malformed input (err says where) or no memory. */
ekf_json *ekf_json_parse(const char *text, size_t n, char *err, size_t errsize);
void ekf_json_free(ekf_json *j);
const ekf_json *ekf_json_get(const ekf_json *obj, const char *key);

/* A growable string buffer (JSON writing). */
typedef struct ekf_buf {
    char *p;
    size_t n, cap;
    int oom;
} ekf_buf;
void ekf_buf_add(ekf_buf *b, const char *s, size_t n);
void ekf_buf_printf(ekf_buf *b, const char *fmt, ...);
void ekf_buf_json_string(ekf_buf *b, const char *s);

/* --- conn.c: request/reply over a DEALER socket that notices a lost server ---------------------- */

typedef struct ekf_msg {
    ekf_header hdr;
    zmq_msg_t *frames; /* after the header */
    size_t n, cap;
} ekf_msg;

typedef struct ekf_conn {
    void *sock;
    void *mon;
    const volatile sig_atomic_t *stop; /* the caller's stop flag, or NULL */
    int connected;
    int lost;
    char *address;
} ekf_conn;

typedef int (*ekf_accept_fn)(const ekf_header *h, const void *ctx);

/* Connect; monitor_endpoint is a unique inproc:// name. Returns an ENKFLOW_ code. */
int ekf_conn_open(ekf_conn *c, void *zctx, const char *address, const char *curve_key, const char *monitor_endpoint,
                  char *err, size_t errsize);
/* The same with a send high-water mark (messages queued before a send would block; 0: ZeroMQ's default). */
int ekf_conn_open_hwm(ekf_conn *c, void *zctx, const char *address, const char *curve_key,
                      const char *monitor_endpoint, int sndhwm, char *err, size_t errsize);
void ekf_conn_close(ekf_conn *c, int linger_ms);
/* ENKFLOW_ELOST when the peer went away since the connection was opened (ZeroMQ may have connected to
 * a new server at the same address since: a message meant for the old one must not go there). */
int ekf_conn_check(ekf_conn *c, char *err, size_t errsize);
/* Send nframes frames (the first is the packed header); with copy = 0, frames of EKF_COPY_BELOW
 * bytes or more are sent without a copy and must stay valid until the reply. */
int ekf_conn_send(ekf_conn *c, const void *const *data, const size_t *sizes, size_t nframes, int copy, char *err,
                  size_t errsize);
/* The next reply accept() takes, within timeout_s; stale replies are skipped. accept() also decides
 * whether an ERROR answers this request (its task) or an older one (stale: skipped). ENKFLOW_ELOST (server gone,
 * or no reply in time), ENKFLOW_EREFUSED (ERROR, with the server's text), ENKFLOW_EPROTOCOL (another
 * protocol version), ENKFLOW_EINTR (the stop flag was set). The caller frees out with ekf_msg_free. */
int ekf_conn_recv(ekf_conn *c, double timeout_s, ekf_accept_fn accept, const void *actx, ekf_msg *out,
                  char *err, size_t errsize);
void ekf_msg_free(ekf_msg *m);

double ekf_now(void);

/* --- shm.c: the server ranks' shared memory segments, mapped and cached by path ------------------- */

#define EKF_SEG_HEADER 4096 /* the header page before a segment's data */

typedef enum { EKF_SEG_STORE, EKF_SEG_SLOT } ekf_seg_kind;

/* What mapping a segment came to: mapped and checked; refused (the reason in err); no such file (a slot the
 * server retired, or the store of a server that ended). */
typedef enum { EKF_SEG_MAPPED, EKF_SEG_BAD, EKF_SEG_GONE } ekf_seg_status;

typedef struct ekf_segment {
    char *path;
    unsigned char *base; /* the whole file, header page included */
    size_t size;
    int writable;
    dev_t dev; /* the file mapped, to notice that its name went (a retired slot) */
    ino_t ino;
} ekf_segment;

/* The segments a runner rank has mapped (each item stays where it is until forgotten). */
typedef struct ekf_segments {
    ekf_segment **items;
    size_t n, cap;
} ekf_segments;

/* Where segments live: /dev/shm where it is writable, else $TMPDIR or /tmp (enkflow.shm_names.shm_dir). */
const char *ekf_shm_dir(void);
/* The segment at path, mapped (a store read-only, a slot read-write) or from the cache: a regular file
 * named ekf_shm_dir()/enkflow-online-PID-HEX8, opened without following a link, whose header has the
 * kind's magic, the layout version and the nonce. Otherwise the reason in err. */
ekf_seg_status ekf_seg_map(ekf_segments *c, const char *path, ekf_seg_kind kind, const unsigned char nonce[16],
                           const ekf_segment **out, char *err, size_t errsize);
/* Unmap the cached segments whose name is gone (slots the server retired); earlier pointers to them dangle. */
void ekf_seg_forget_gone(ekf_segments *c);
void ekf_seg_clear(ekf_segments *c);
/* Remove the names of this node's enkflow segments whose maker is dead (a killed server's). */
void ekf_shm_sweep(void);

/* --- lease.c: stop once the launcher's lease lapses (only under `enkflow run`; once per process) -- */
void ekf_lease_watch(void);

#endif
