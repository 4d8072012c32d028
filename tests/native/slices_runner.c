/* An "MPI" C runner without MPI, for tests/native/test_native_slices.py: NRANKS threads of one process are
 * the ranks of one runner (each its own enkflow_runner handle: no global state in the library), coordinated
 * by enkflow_runner_set_comm callbacks built on a pthread barrier. Rank r holds an uneven slice of the ring
 * field x (40 float64; rank 1 of 3 holds none); rank 0 runs the ring model of
 * tests/online/test_online_bad_input.py on the shared array between exposes.
 *
 *   slices_runner ADDRESS TOKEN NRANKS */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "enkflow_runner.h"

#define N 40
#define MAXR 8

typedef struct shared {
    pthread_barrier_t bar;
    const void *src;
    int vals[MAXR];
    int nranks;
    double x[N];
    int64_t nsteps, cycle;
    const char *address, *token;
    int rc[MAXR];
} shared;

typedef struct rank_ctx {
    shared *s;
    int rank;
} rank_ctx;

static int bcast(void *buf, size_t n, void *ctx) {
    rank_ctx *c = ctx;
    if (c->rank == 0) c->s->src = buf;
    pthread_barrier_wait(&c->s->bar);
    if (c->rank != 0) memcpy(buf, c->s->src, n);
    pthread_barrier_wait(&c->s->bar);
    return 0;
}

static int allmax(int *v, void *ctx) {
    rank_ctx *c = ctx;
    c->s->vals[c->rank] = *v;
    pthread_barrier_wait(&c->s->bar);
    int m = c->s->vals[0];
    for (int k = 1; k < c->s->nranks; k++)
        if (c->s->vals[k] > m) m = c->s->vals[k];
    pthread_barrier_wait(&c->s->bar);
    *v = m;
    return 0;
}

static void model(double *x, int64_t nsteps, int64_t cycle) {
    double y[N];
    for (int64_t s = 0; s < nsteps; s++) {
        for (int i = 0; i < N; i++) y[i] = x[i] + 0.2 * ((x[(i + N - 1) % N] - 2 * x[i]) + x[(i + 1) % N]);
        for (int i = 0; i < N; i++) x[i] = y[i] + 0.01 * (double)cycle;
    }
}

static void *rank_main(void *arg) {
    rank_ctx *c = arg;
    shared *s = c->s;
    /* Uneven slices, one empty when there are 3 ranks or more: [0, 7), [7, 7), then the rest split. */
    int64_t lo, hi;
    if (c->rank == 0) { lo = 0; hi = 7; }
    else if (c->rank == 1 && s->nranks > 2) { lo = 7; hi = 7; }
    else {
        int first = s->nranks > 2 ? 2 : 1, k = c->rank - first, nr = s->nranks - first;
        lo = 7 + (N - 7) * k / nr;
        hi = 7 + (N - 7) * (k + 1) / nr;
    }
    enkflow_runner *r;
    int64_t n = N, nsteps = 0;
    int rc = enkflow_runner_create(&r, s->address, s->token);
    if (!rc) rc = enkflow_runner_set_timeouts(r, 20.0, 5.0);
    if (!rc) rc = enkflow_runner_set_comm(r, c->rank, s->nranks, bcast, allmax, c);
    if (!rc) rc = enkflow_runner_add_field(r, "x", ENKFLOW_FLOAT64, 1, &n, 1);
    if (!rc) rc = enkflow_runner_set_slice(r, "x", lo, hi - lo);
    if (!rc) rc = enkflow_runner_init(r);
    if (!rc) printf("rank %d: shared memory with %d server rank(s)\n", c->rank, enkflow_runner_shm_ranks(r));
    if (!rc) rc = enkflow_runner_bind(r, "x", ENKFLOW_FLOAT64, s->x + lo, hi - lo);
    if (!rc) rc = enkflow_runner_expose(r, &nsteps);
    while (!rc && nsteps > 0) {
        pthread_barrier_wait(&s->bar); /* every slice of the member is in */
        if (c->rank == 0) model(s->x, nsteps, enkflow_runner_cycle(r));
        pthread_barrier_wait(&s->bar);
        rc = enkflow_runner_expose(r, &nsteps);
    }
    if (rc) fprintf(stderr, "rank %d: error %d: %s\n", c->rank, rc, enkflow_runner_errmsg(r));
    s->rc[c->rank] = rc;
    enkflow_runner_finalize(r);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 4) return 2;
    static shared s;
    s.address = argv[1];
    s.token = argv[2];
    s.nranks = atoi(argv[3]);
    if (s.nranks < 1 || s.nranks > MAXR) return 2;
    pthread_barrier_init(&s.bar, NULL, (unsigned)s.nranks);
    pthread_t th[MAXR];
    rank_ctx ctx[MAXR];
    for (int k = 0; k < s.nranks; k++) {
        ctx[k].s = &s;
        ctx[k].rank = k;
        pthread_create(&th[k], NULL, rank_main, &ctx[k]);
    }
    int bad = 0;
    for (int k = 0; k < s.nranks; k++) {
        pthread_join(th[k], NULL);
        bad |= s.rc[k] != 0;
    }
    return bad;
}
