/* The runner handle's state, shared by runner.c (set-up, joining, the task loop) and transport.c (the
 * exchange of a member's state with each server rank, by TCP or through shared memory). */
#ifndef ENKFLOW_RUNNER_STATE_H
#define ENKFLOW_RUNNER_STATE_H

#include <pthread.h>
#include <sys/types.h>

#include "internal.h"

typedef struct field {
    char *name;
    enkflow_dtype dtype;
    int64_t *shape;
    int ndim;
    int64_t size;
    int assimilated;
    int64_t off, cnt; /* this rank's slice of the flattened field */
    void *data;       /* bound array (cnt elements) */
} field;

/* How this runner rank exchanges with one server rank. */
typedef struct ekf_link {
    int shm;                  /* through shared memory (else TCP) */
    char *store;              /* the rank's store segment (WELCOME), NULL: it offers none */
    unsigned char nonce[16];  /* the rank's incarnation, in every header of its segments */
    const ekf_segment *slot;  /* the held task's slot on that rank (from its SLOT), NULL before */
    int64_t *write_at;        /* per piece of the task on that rank: its byte offset in the slot */
} ekf_link;

struct enkflow_runner {
    char err[EKF_ERRSIZE];
    char *address, *name, *curve;
    unsigned char cred[32];
    double timeout_s, reconnect_s;
    void *zctx;
    ekf_conn control;
    int have_control;
    ekf_conn *data;
    ekf_link *links; /* [ndata] */
    int ndata;
    int64_t *own; /* [ndata][nfields][2]: the elements of each field each server rank owns */
    int transport; /* an enkflow_transport, or -1: not chosen by the caller (ENKFLOW_TRANSPORT, else AUTO) */
    ekf_segments segs;
    field *fields;
    int nfields;
    int inited;
    uint64_t id, epoch;
    double heartbeat_s;
    uint64_t task;
    int state_in; /* the task's state arrived whole (its GET completed): the arrays hold a forecast of it */
    int64_t member, cycle, nsteps, waited_us;
    unsigned monitors;
    const volatile sig_atomic_t *stop;
    /* MPI-style ranks, coordinated by the caller's collectives */
    int rank, size;
    enkflow_bcast_fn bcast;
    enkflow_allmax_fn allmax;
    void *comm_ctx;
    /* the heartbeat thread (rank 0) */
    pthread_t hb;
    int hb_running, hb_stop;
    uint64_t hb_task;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pid_t pid; /* the process that created the runner: ZeroMQ's context does not survive a fork */
};

/* An internal code, never returned to the caller: the held task went stale (the server retired its slot);
 * the runner forgets it and asks for the next. */
#define EKF_STALE (-1)

static inline size_t ekf_itemsize(enkflow_dtype t) { return (t == ENKFLOW_FLOAT32 || t == ENKFLOW_INT32) ? 4 : 8; }

static inline const char *ekf_dtype_name(int t) {
    switch (t) {
        case ENKFLOW_FLOAT32: return "float32";
        case ENKFLOW_FLOAT64: return "float64";
        case ENKFLOW_INT32: return "int32";
        case ENKFLOW_INT64: return "int64";
        default: return "an unknown type";
    }
}

/* runner.c: the runner's last error (its message formatted through a copy), returning code. */
int ekf_rerr(enkflow_runner *r, int code, const char *fmt, ...);
/* A header of that kind about the task held. */
void ekf_header_for(enkflow_runner *r, ekf_header *h, int kind, size_t count);

static inline int ekf_ok(enkflow_runner *r) {
    r->err[0] = 0;
    return ENKFLOW_OK;
}

/* join.c */
typedef int (*ekf_rank0_fn)(enkflow_runner *r, ekf_buf *payload);
/* fn() on rank 0, its result (code, message, payload) on every rank. */
int ekf_from_rank0(enkflow_runner *r, ekf_rank0_fn fn, ekf_buf *payload);
/* Every rank ran something that returned `code`: an error on any rank (a lost server first gives way
 * to a refusal, as in the Python runner, a stale task to a lost server) is returned on every rank. */
int ekf_collective(enkflow_runner *r, int code);
/* HELLO from rank 0 (retrying for reconnect_s); every rank connects to the data ranks the WELCOME names
 * and opens its links; the heartbeat thread started. */
int ekf_join(enkflow_runner *r);
void ekf_close_data(enkflow_runner *r);

/* heartbeat.c */
int ekf_heartbeat_start(enkflow_runner *r);
void ekf_heartbeat_stop(enkflow_runner *r);
/* The task in hand (0: none), which the heartbeats name. */
void ekf_set_task(enkflow_runner *r, uint64_t task, int64_t member, int64_t cycle, int64_t nsteps);

/* transport.c */
/* The transport asked for: the caller's, else ENKFLOW_TRANSPORT's (an invalid value: ENKFLOW_EINVAL). */
int ekf_transport_resolve(enkflow_runner *r);
/* After the WELCOME (`shm`, its list of segments per rank, or NULL) and the data connections: each rank's
 * link; the shared memory of every rank that offers it, checked, as the transport says. */
int ekf_links_open(enkflow_runner *r, const ekf_json *shm);
void ekf_links_close(enkflow_runner *r);
/* This rank's pieces of the held task's forecast to every server rank owning some (PUT, or PUT_SLOT);
 * sent[s]: rank s got some. */
int ekf_put_ranks(enkflow_runner *r, int *sent);
/* The held task's member state from every server rank into the bound arrays (GET, or GET_SLOT); EKF_STALE
 * when a slot the server named was retired meanwhile. */
int ekf_get_ranks(enkflow_runner *r);

#endif
