/* The launcher's lease (enkflow.jobs.lease, docs/jobs.md) watched by a native runner: a runner that
 * `enkflow run` started finds ENKFLOW_LEASE_DIR, ENKFLOW_LEASE_ID and ENKFLOW_LEASE_TIMEOUT in its
 * environment and stops once the launcher is gone, on any node. A thread reads DIR/lease.json every
 * timeout/8 s: the lease lapses when its counter has not moved for the timeout by this process's
 * monotonic clock (no other node's clock is compared), at once when it names another launcher or says
 * the launcher ended. Then the process gets SIGTERM, and SIGKILL 15 s later if it still runs. A runner
 * started by hand has no lease and starts no thread.
 * Like a Python process (enkflow.jobs.lease_procs) it registers in DIR/procs/HOST-PID.json, removed at
 * its exit, and beats that record at each look (its modification time set to a counter), so that a
 * rerun waits for it and tells it gone once it no longer beats. The looks are spread at random over
 * [1, 1.25] x timeout/8, so that thousands of runners do not read the file at once. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#define LEASE_GRACE_S 15.0
#define LEASE_JITTER 0.25

typedef struct lease {
    char path[4096];
    char record[4096];  /* DIR/procs/HOST-PID.json; empty when it could not be written */
    char holder[128];
    double timeout_s;
    unsigned int seed;  /* of the looks' jitter */
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

/* This process's start as psutil reports it (s since the epoch): the boot time plus the start in
 * clock ticks, so that a rerun tells this process from a later one with the same pid. */
static double start_time(void) {
    long long btime = 0;
    char text[1024];
    FILE *f = fopen("/proc/stat", "r");
    while (f && fgets(text, sizeof text, f))
        if (sscanf(text, "btime %lld", &btime) == 1) break;
    if (f) fclose(f);
    f = fopen("/proc/self/stat", "r");
    size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    if (f) fclose(f);
    text[n] = 0;
    const char *p = strrchr(text, ')'); /* after the name, which may hold spaces: field 3 on */
    for (int field = 2; p && field < 22; field++) {
        p = strchr(p + 1, ' ');
    }
    unsigned long long ticks = p ? strtoull(p + 1, NULL, 10) : 0;
    return (double)btime + (double)ticks / (double)sysconf(_SC_CLK_TCK);
}

static void remove_record(void) {
    if (the_lease.record[0]) unlink(the_lease.record);
}

/* The record a rerun reads (the format of enkflow.jobs.lease_procs.register), renamed into place. */
static void register_record(lease *l, const char *dir) {
    char host[256] = "", tmp[4200];
    gethostname(host, sizeof host - 1);
    snprintf(tmp, sizeof tmp, "%s/procs", dir);
    if (mkdir(tmp, 0777) != 0 && errno != EEXIST) return;
    snprintf(l->record, sizeof l->record, "%s/procs/%s-%ld.json", dir, host, (long)getpid());
    snprintf(tmp, sizeof tmp, "%s.tmp", l->record);
    FILE *f = fopen(tmp, "w");
    int ok = f && fprintf(f, "{\"host\": \"%s\", \"pid\": %ld, \"ctime\": %.6f, \"holder\": \"%s\", "
                             "\"role\": \"native runner\", \"period_s\": %g}\n", host, (long)getpid(), start_time(),
                          l->holder, l->timeout_s / 8.0 * (1.0 + LEASE_JITTER)) > 0;
    ok = f && fclose(f) == 0 && ok && rename(tmp, l->record) == 0;
    if (!ok) {
        fprintf(stderr, "enkflow runner: cannot register under the launcher's lease in %s\n", dir);
        unlink(tmp);
        l->record[0] = 0;
        return;
    }
    atexit(remove_record);
}

static void beat(const lease *l, int64_t *beats) {
    ++*beats;
    struct timespec t[2] = {{(time_t)*beats, 0}, {(time_t)*beats, 0}};
    if (l->record[0]) utimensat(AT_FDCWD, l->record, t, 0); /* a missed beat is harmless */
}

static void *lease_main(void *arg) {
    lease *l = arg;
    int64_t last = -1, beats = 0;
    double moved = ekf_now();
    verdict v = HELD;
    while (v == HELD) {
        beat(l, &beats);
        pause_s(l->timeout_s / 8.0 * (1.0 + LEASE_JITTER * rand_r(&l->seed) / (double)RAND_MAX));
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
    for (double left = LEASE_GRACE_S; left > 0; left -= l->timeout_s / 8.0) { /* beating on while it stops */
        beat(l, &beats);
        pause_s(left < l->timeout_s / 8.0 ? left : l->timeout_s / 8.0);
    }
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
    l->timeout_s = timeout && atof(timeout) > 0 ? atof(timeout) : 120.0; /* enkflow.jobs.lease's default */
    l->seed = (unsigned int)getpid();
    register_record(l, dir);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    if (pthread_create(&t, &attr, lease_main, l) != 0)
        fprintf(stderr, "enkflow runner: cannot watch the launcher's lease (no thread)\n");
    pthread_attr_destroy(&attr);
}

void ekf_lease_watch(void) { pthread_once(&lease_once, lease_start); }
