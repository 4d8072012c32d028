/* The runner's heartbeat thread (rank 0): a HEARTBEAT with the task held every heartbeat_s seconds, on a
 * socket of its own, so that the server knows the runner alive while its model runs. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <time.h>

#include "runner_state.h"

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

void ekf_heartbeat_stop(enkflow_runner *r) {
    if (!r->hb_running) return;
    pthread_mutex_lock(&r->mu);
    r->hb_stop = 1;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
    pthread_join(r->hb, NULL);
    r->hb_running = 0;
}

void ekf_set_task(enkflow_runner *r, uint64_t task, int64_t member, int64_t cycle, int64_t nsteps) {
    r->task = task;
    r->state_in = 0;
    r->member = member;
    r->cycle = cycle;
    r->nsteps = nsteps;
    pthread_mutex_lock(&r->mu);
    r->hb_task = task;
    pthread_mutex_unlock(&r->mu);
}

int ekf_heartbeat_start(enkflow_runner *r) {
    if (r->rank != 0 || r->hb_running) return ENKFLOW_OK;
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
    return ENKFLOW_OK;
}
