/* Large copies between a model's memory and the server's shared memory, split between the calling thread and
 * a helper thread: one thread's copy does not use all of the memory's bandwidth (52 MB into a slot on the
 * 2-core development machine: 6-7 ms on one thread, 3.2-3.8 ms on two). The netCDF shim's gets and puts use
 * it; the runner library's copies, into arrays a runner keeps, showed no gain from it.
 *
 * A copy into fresh memory (a model process that reads its restart) also pays the kernel's clearing of every
 * page it makes, about a copy: there the helper first has the pages of the back two thirds made
 * (MADV_POPULATE_WRITE, which changes no byte already there), then copies the last third, while the calling
 * thread clears and fills the first third and copies the middle one.
 *
 * The helper blocks every signal (the model's handlers run in its own threads) and is joined before the copy
 * returns. It uses a core the model leaves idle while it exchanges its state (its other OpenMP threads, or a
 * free one); on a node where every core computes it only reorders the same work, and ENKFLOW_COPY_HELPERS=0
 * in the environment keeps every copy on the calling thread. */
#ifndef ENKFLOW_SPLIT_COPY_H
#define ENKFLOW_SPLIT_COPY_H

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "copy_checked.h"

#ifndef MADV_POPULATE_WRITE /* headers older than the kernel: the Linux ABI's value (an old kernel refuses it) */
#define MADV_POPULATE_WRITE 23
#endif

#define EKF_SPLIT_BYTES ((size_t)8 << 20)

/* Whether helper threads may be used (unless ENKFLOW_COPY_HELPERS=0). */
static inline int ekf_helpers(void) {
    static int on = -1;
    if (on < 0) {
        const char *v = getenv("ENKFLOW_COPY_HELPERS");
        on = !(v && strcmp(v, "0") == 0);
    }
    return on;
}

/* A new thread running fn(arg) with every signal blocked; detached unless `t` is given (to be joined). 0, or
 * the error of pthread_create (nothing started). */
static inline int ekf_start_thread(pthread_t *t, void *(*fn)(void *), void *arg) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_attr_t attr;
    pthread_t own;
    int rc = pthread_attr_init(&attr);
    if (rc == 0) {
        if (!t) pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        rc = pthread_create(t ? t : &own, &attr, fn, arg);
        pthread_attr_destroy(&attr);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}

typedef struct {
    unsigned char *to;
    const unsigned char *from;
    size_t n, es;        /* elements copied from `from` to `to`, bytes each */
    unsigned char *made; /* the pages of [made, end of `to`) are made first, unless NULL */
    ekf_check check;
    int finite;
} ekf_copy_job;

static inline void *ekf_run_copy(void *arg) {
    ekf_copy_job *j = arg;
    if (j->made) {
        uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
        uintptr_t lo = ((uintptr_t)j->made + page - 1) & ~(page - 1), hi = ((uintptr_t)j->to + j->n * j->es) & ~(page - 1);
        if (hi > lo) madvise((void *)lo, hi - lo, MADV_POPULATE_WRITE); /* a failure leaves the faults to the copy */
    }
    j->finite = ekf_copy_checked(j->to, j->from, j->n, j->es, j->check);
    return NULL;
}

/* ekf_copy_checked of n elements, split with a helper when large; `fresh`: `to` may be memory whose pages are
 * not made yet (a new process's buffer). 1 when every element is finite. */
static inline int ekf_split_copy(void *to, const void *from, size_t n, size_t es, ekf_check check, int fresh) {
    size_t mine = fresh ? 2 * (n / 3) : n / 2; /* the elements the calling thread copies, from the first on */
    unsigned char *t8 = to;
    const unsigned char *f8 = from;
    ekf_copy_job back = {t8 + mine * es, f8 + mine * es, n - mine, es, fresh ? t8 + (n / 3) * es : NULL, check, 1};
    pthread_t t;
    if (n * es < EKF_SPLIT_BYTES || !ekf_helpers() || ekf_start_thread(&t, ekf_run_copy, &back) != 0)
        return ekf_copy_checked(to, from, n, es, check);
    int finite = ekf_copy_checked(to, from, mine, es, check);
    pthread_join(t, NULL);
    return finite & back.finite;
}

#endif
