/* The launcher's lease (enkflow.jobs.lease, docs/jobs.md) watched by a native runner: a runner that
 * `enkflow run` started finds ENKFLOW_LEASE_DIR, ENKFLOW_LEASE_ID and ENKFLOW_LEASE_TIMEOUT in its
 * environment and stops once the launcher is gone, on any node. A thread reads DIR/lease.json every
 * timeout/8 s: the lease lapses when its counter has not moved for the timeout by this process's
 * monotonic clock (no other node's clock is compared), at once when it names another launcher or says
 * the launcher ended. Then the process gets SIGTERM, and SIGKILL 15 s later if it still runs. A runner
 * started by hand has no lease and starts no thread. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#define LEASE_GRACE_S 15.0

typedef struct lease {
    char path[4096];
    char holder[128];
    double timeout_s;
} lease;

static lease the_lease;
static pthread_once_t lease_once = PTHREAD_ONCE_INIT;

typedef enum { HELD, SILENT, TAKEN, ENDED } verdict;

static void pause_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/* The lease file's holder and counter (0 when it cannot be read now: being replaced, missing). */
static int read_lease(const lease *l, char *holder, size_t hsize, int64_t *counter, int *ended) {
    FILE *f = fopen(l->path, "rb");
    if (!f) return 0;
    char text[4096];
    size_t n = fread(text, 1, sizeof text, f);
    fclose(f);
    char err[128];
    ekf_json *j = ekf_json_parse(text, n, err, sizeof err);
    if (!j) return 0;
    const ekf_json *h = ekf_json_get(j, "holder"), *c = ekf_json_get(j, "counter"), *e = ekf_json_get(j, "ended");
    int ok = h && h->type == EKF_JSTR && c && c->type == EKF_JNUM && c->is_int;
    if (ok) {
        snprintf(holder, hsize, "%s", h->str);
        *counter = c->i64;
        *ended = e && e->type == EKF_JBOOL && e->boolean;
    }
    ekf_json_free(j);
    return ok;
}

static void *lease_main(void *arg) {
    const lease *l = arg;
    int64_t last = -1;
    double moved = ekf_now();
    verdict v = HELD;
    while (v == HELD) {
        pause_s(l->timeout_s / 8.0);
        char holder[128];
        int64_t counter = 0;
        int ended = 0;
        if (read_lease(l, holder, sizeof holder, &counter, &ended)) {
            if (strcmp(holder, l->holder) != 0) v = TAKEN;
            else if (ended) v = ENDED;
            else if (counter != last) last = counter, moved = ekf_now();
        }
        if (v == HELD && ekf_now() - moved > l->timeout_s) v = SILENT;
    }
    const char *why = v == TAKEN ? "a new launcher of the experiment took the lease over"
                    : v == ENDED ? "its launcher ended" : "its launcher did not renew the lease";
    fprintf(stderr, "enkflow runner (pid %ld): %s (%s); stopping\n", (long)getpid(), why, l->path);
    kill(getpid(), SIGTERM);
    pause_s(LEASE_GRACE_S);
    kill(getpid(), SIGKILL);
    return NULL;
}

static void lease_start(void) {
    const char *dir = getenv("ENKFLOW_LEASE_DIR"), *holder = getenv("ENKFLOW_LEASE_ID");
    const char *timeout = getenv("ENKFLOW_LEASE_TIMEOUT");
    if (!dir || !*dir || !holder || !*holder) return;
    lease *l = &the_lease;
    snprintf(l->path, sizeof l->path, "%s/lease.json", dir);
    snprintf(l->holder, sizeof l->holder, "%s", holder);
    l->timeout_s = timeout && atof(timeout) > 0 ? atof(timeout) : 30.0;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    if (pthread_create(&t, &attr, lease_main, l) != 0)
        fprintf(stderr, "enkflow runner: cannot watch the launcher's lease (no thread)\n");
    pthread_attr_destroy(&attr);
}

void ekf_lease_watch(void) { pthread_once(&lease_once, lease_start); }
