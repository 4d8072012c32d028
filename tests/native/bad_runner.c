/* A C runner for tests/native/test_native_bad_input.py: the ring model of tests/online/test_online_bad_input
 * (one float64 field "x" of 40), well behaved or misbehaving:
 *
 *   bad_runner ADDRESS TOKEN MODE [CURVE_SERVER_KEY]
 *
 * MODE good: runs members until the study is over. unknown-field, unicode-field, wrong-dtype, wrong-shape, carried-int:
 * declares fields the server does not expect. bind-checks: binds arrays of the wrong type, size and name.
 * nan: its first forecast holds a NaN (the server rejects it), then it behaves. wait-sigterm: joins, waits
 * for a task until SIGTERM sets its stop flag, then leaves (BYE). retry-after-sigterm: SIGTERM while its first
 * task's state arrives, then it clears the flag and serves on. fork-finalize: a child forked after init
 * calls enkflow_runner_finalize (as an atexit handler would), then the parent serves. slow: good, with
 * forecasts of 1.5 s. Every library error is
 * printed as "rc=CODE NAME: MESSAGE" on stdout; the exit status is 0 when the mode's expectations held
 * on the runner's side (the test checks the messages). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "enkflow_runner.h"

#define N 40

static void model(double *x, int64_t nsteps, int64_t cycle) {
    double y[N];
    for (int64_t s = 0; s < nsteps; s++) {
        for (int i = 0; i < N; i++) y[i] = x[i] + 0.2 * ((x[(i + N - 1) % N] - 2 * x[i]) + x[(i + 1) % N]);
        for (int i = 0; i < N; i++) x[i] = y[i] + 0.01 * (double)cycle;
    }
}

static volatile sig_atomic_t stop = 0;
static void on_term(int sig) { (void)sig; stop = 1; }

static int report(enkflow_runner *r, int rc) {
    printf("rc=%d %s: %s\n", rc, enkflow_strerror(rc), enkflow_runner_errmsg(r));
    fflush(stdout);
    return rc;
}

static double model_s = 0; /* mode slow: each forecast takes this long */

static int serve(enkflow_runner *r, double *x, int spoil) {
    int64_t nsteps;
    int rc = enkflow_runner_expose(r, &nsteps);
    while (rc == ENKFLOW_OK && nsteps > 0) {
        model(x, nsteps, enkflow_runner_cycle(r));
        if (model_s > 0) {
            struct timespec ts = {(time_t)model_s, (long)((model_s - (double)(time_t)model_s) * 1e9)};
            printf("forecast\n");
            fflush(stdout);
            nanosleep(&ts, NULL);
        }
        if (spoil) {
            x[0] = NAN;
            spoil = 0;
            rc = enkflow_runner_expose(r, &nsteps);
            if (rc != ENKFLOW_EREFUSED) return 10;
            report(r, rc);
            rc = enkflow_runner_expose(r, &nsteps); /* the task was dropped: ask for the next */
            continue;
        }
        rc = enkflow_runner_expose(r, &nsteps);
    }
    return rc;
}

int main(int argc, char **argv) {
    if (argc != 4 && argc != 5) return 2;
    const char *mode = argv[3];
    enkflow_runner *r;
    int64_t n = N, n41 = N + 1;
    double x[N] = {0};
    int rc = enkflow_runner_create(&r, argv[1], argv[2]);
    if (rc) return report(r, rc);
    enkflow_runner_set_timeouts(r, 20.0, 5.0);
    enkflow_runner_set_name(r, mode);
    if (argc == 5 && (rc = enkflow_runner_set_curve_key(r, argv[4]))) return report(r, rc);
    if (!strcmp(mode, "fork-finalize")) { /* a child forked after init (no exec) finalizes its copy, then the parent serves */
        rc = enkflow_runner_add_field(r, "x", ENKFLOW_FLOAT64, 1, &n, 1);
        if (!rc) rc = enkflow_runner_init(r);
        if (!rc) rc = enkflow_runner_bind(r, "x", ENKFLOW_FLOAT64, x, N);
        if (rc) return report(r, rc);
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            rc = enkflow_runner_finalize(r);
            printf("child rc=%d\n", rc);
            fflush(stdout);
            _exit(rc == ENKFLOW_ESTATE ? 0 : 20);
        }
        int status = 0;
        if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return 18;
        rc = serve(r, x, 0);
        if (rc) report(r, rc);
        enkflow_runner_finalize(r);
        return rc;
    }
    if (!strcmp(mode, "retry-after-sigterm")) { /* SIGTERM while the state of its task arrives, then expose again */
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_term;
        sigaction(SIGTERM, &sa, NULL);
        enkflow_runner_set_stop_flag(r, &stop);
        int64_t nsteps;
        rc = enkflow_runner_add_field(r, "x", ENKFLOW_FLOAT64, 1, &n, 1);
        if (!rc) rc = enkflow_runner_init(r);
        if (!rc) rc = enkflow_runner_bind(r, "x", ENKFLOW_FLOAT64, x, N);
        if (rc) return report(r, rc);
        printf("waiting\n");
        fflush(stdout);
        rc = enkflow_runner_expose(r, &nsteps);
        report(r, rc);
        if (rc != ENKFLOW_EINTR) return 17;
        stop = 0;
        rc = serve(r, x, 0);
        if (rc) report(r, rc);
        enkflow_runner_finalize(r);
        return rc;
    }
    if (!strcmp(mode, "wait-sigterm")) { /* waits for a task that does not come; SIGTERM ends the wait */
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_term;
        sigaction(SIGTERM, &sa, NULL);
        enkflow_runner_set_stop_flag(r, &stop);
        int64_t nsteps;
        rc = enkflow_runner_add_field(r, "x", ENKFLOW_FLOAT64, 1, &n, 1);
        if (!rc) rc = enkflow_runner_init(r);
        if (!rc) rc = enkflow_runner_bind(r, "x", ENKFLOW_FLOAT64, x, N);
        if (rc) return report(r, rc);
        printf("waiting\n");
        fflush(stdout);
        rc = enkflow_runner_expose(r, &nsteps);
        report(r, rc);
        enkflow_runner_finalize(r);
        return rc == ENKFLOW_EINTR && stop ? 0 : 16;
    }
    if (!strcmp(mode, "slow")) { /* good, with forecasts of 1.5 s ("forecast" on stdout at the start of each) */
        model_s = 1.5;
        mode = "good";
    }
    if (!strcmp(mode, "good") || !strcmp(mode, "nan") || !strcmp(mode, "bind-checks")) {
        rc = enkflow_runner_add_field(r, "x", ENKFLOW_FLOAT64, 1, &n, 1);
    } else if (!strcmp(mode, "unknown-field")) {
        rc = enkflow_runner_add_field(r, "x", ENKFLOW_FLOAT64, 1, &n, 1);
        if (!rc) rc = enkflow_runner_add_field(r, "salinity", ENKFLOW_FLOAT64, 1, &n, 1);
    } else if (!strcmp(mode, "unicode-field")) { /* UTF-8 out, the server's \u escapes back */
        rc = enkflow_runner_add_field(r, "x", ENKFLOW_FLOAT64, 1, &n, 1);
        if (!rc) rc = enkflow_runner_add_field(r, "temp\xc3\xa9rature \xe2\x84\x83 \xf0\x9f\x8c\x8a", ENKFLOW_FLOAT64, 1, &n, 1);
    } else if (!strcmp(mode, "wrong-dtype")) {
        rc = enkflow_runner_add_field(r, "x", ENKFLOW_FLOAT32, 1, &n, 1);
    } else if (!strcmp(mode, "wrong-shape")) {
        rc = enkflow_runner_add_field(r, "x", ENKFLOW_FLOAT64, 1, &n41, 1);
    } else if (!strcmp(mode, "carried-int")) {
        rc = enkflow_runner_add_field(r, "x", ENKFLOW_INT32, 1, &n, 1); /* assimilated int: refused locally */
        if (rc != ENKFLOW_EINVAL) return 11;
        report(r, rc);
        rc = enkflow_runner_add_field(r, "x", ENKFLOW_INT32, 1, &n, 0);
    } else {
        return 2;
    }
    if (rc) return report(r, rc);
    if (!strcmp(mode, "bind-checks")) {
        float xf[N];
        double small[N - 1];
        int want[3] = {ENKFLOW_ETYPE, ENKFLOW_ESIZE, ENKFLOW_EFIELD};
        int got[3] = {enkflow_runner_bind(r, "x", ENKFLOW_FLOAT32, xf, N), 0, 0};
        report(r, got[0]);
        got[1] = enkflow_runner_bind(r, "x", ENKFLOW_FLOAT64, small, N - 1);
        report(r, got[1]);
        got[2] = enkflow_runner_bind(r, "y", ENKFLOW_FLOAT64, x, N);
        report(r, got[2]);
        int64_t nsteps;
        rc = enkflow_runner_expose(r, &nsteps); /* before init */
        report(r, rc);
        if (rc != ENKFLOW_ESTATE) return 12;
        for (int k = 0; k < 3; k++)
            if (got[k] != want[k]) return 13;
        enkflow_runner_finalize(r);
        return 0;
    }
    rc = enkflow_runner_init(r);
    if (rc) {
        report(r, rc);
        enkflow_runner_finalize(r);
        return rc == ENKFLOW_EREFUSED ? 0 : 14;
    }
    if (strcmp(mode, "good") && strcmp(mode, "nan")) return 15; /* the server took fields it should refuse */
    rc = enkflow_runner_bind(r, "x", ENKFLOW_FLOAT64, x, N);
    if (!rc) rc = serve(r, x, !strcmp(mode, "nan"));
    if (rc) report(r, rc);
    enkflow_runner_finalize(r);
    return rc;
}
