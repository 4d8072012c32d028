/* A C client of the output service for tests/native/test_native_output.py, built there with
 * `pkg-config enkflow_runner`. Usage: output_client MODE SERVICE_DIR [TOKEN_FILE]
 *
 *   fields    the data set of test_native_output.py (fields t, q, p; members 1..3; times 0 and 6; regions),
 *             then close(wait); prints "stats ADDS BYTES BLOCKED_S" and "service JSON"
 *   bad       one bad call per line: "NAME RC MESSAGE" (unknown field, shapes, regions, members, time, type,
 *             calls after close); every call must be refused before sending
 *   token     open with the token file TOKEN_FILE (a wrong one): "token RC MESSAGE"
 *   nan       a NaN in field t (nan = "error"), then sync: "sync RC MESSAGE"
 *   wait      open, add one piece, print "OPEN", read a line from stdin, then sync: "sync RC MESSAGE";
 *             with a third argument, set_timeout(that many seconds) first
 *   twice     t at time 24 for members 1..3, member 1 again (the same values), sync: "same RC MESSAGE";
 *             then member 2 again with other values, sync: "other RC MESSAGE"; then discard time 24
 *             ("discard RC NDROPPED [NAMES]") and add members 1..3 again (other values), sync: "rerun RC"
 *   flood N   open, print "OPEN", read a line from stdin, then add N pieces of 1 MiB (field big, times 0..N-1),
 *             "stats ADDS BYTES BLOCKED_S", close(wait): "close RC MESSAGE"
 * The exit status is the last call's code. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <enkflow_output.h>

#define NY 4
#define NX 5
#define NZ 3

static double t_value(int m, int ti, int i, int j) { return (double)(1000 * m + 100 * ti + 10 * i + j) / 3.0; }
static float q_value(int m, int ti, int k, int i, int j) { return (float)(m * 7 + k * 5 + i * 3 + j + ti) / 7.0f; }

static int report(const char *what, int rc, enkflow_output *o) {
    printf("%s %d %s\n", what, rc, rc ? enkflow_output_errmsg(o) : "");
    fflush(stdout);
    return rc;
}

static int fields(enkflow_output *o) {
    int rc = 0;
    const double times[2] = {0.0, 6.0};
    for (int ti = 0; ti < 2 && !rc; ti++) {
        for (int m = 1; m <= 3 && !rc; m++) {
            /* t (y, x), float64, in two row blocks */
            double t[NY][NX];
            for (int i = 0; i < NY; i++)
                for (int j = 0; j < NX; j++) t[i][j] = t_value(m, ti, i, j);
            int64_t half[2] = {2, NX};
            int64_t top[4] = {0, 2, 0, NX}, bottom[4] = {2, 4, 0, NX};
            rc = enkflow_output_add(o, "t", ENKFLOW_FLOAT64, &t[2][0], 2, half, times[ti], m, bottom);
            if (!rc) rc = enkflow_output_add(o, "t", ENKFLOW_FLOAT64, &t[0][0], 2, half, times[ti], m, top);
            /* q (z, y, x), float32, whole */
            float q[NZ][NY][NX];
            for (int k = 0; k < NZ; k++)
                for (int i = 0; i < NY; i++)
                    for (int j = 0; j < NX; j++) q[k][i][j] = q_value(m, ti, k, i, j);
            int64_t qs[3] = {NZ, NY, NX};
            if (!rc) rc = enkflow_output_add(o, "q", ENKFLOW_FLOAT32, q, 3, qs, times[ti], m, NULL);
        }
        /* p (x), not an ensemble field: float64 at time 0, int32 (sent as float64) at time 6; two pieces */
        double pd[NX];
        int32_t pi[NX];
        for (int j = 0; j < NX; j++) {
            pd[j] = (double)(10 * ti + j) / 3.0;
            pi[j] = 10 * ti + j;
        }
        int64_t a[1] = {3}, b[1] = {2}, ra[2] = {0, 3}, rb[2] = {3, 5};
        if (ti == 0) {
            if (!rc) rc = enkflow_output_add(o, "p", ENKFLOW_FLOAT64, pd, 1, a, times[ti], 0, ra);
            if (!rc) rc = enkflow_output_add(o, "p", ENKFLOW_FLOAT64, pd + 3, 1, b, times[ti], 0, rb);
        } else {
            if (!rc) rc = enkflow_output_add(o, "p", ENKFLOW_INT32, pi, 1, a, times[ti], 0, ra);
            if (!rc) rc = enkflow_output_add(o, "p", ENKFLOW_INT32, pi + 3, 1, b, times[ti], 0, rb);
        }
    }
    if (rc) return report("add", rc, o);
    rc = enkflow_output_close(o, 1);
    if (rc) return report("close", rc, o);
    enkflow_output_stats s;
    enkflow_output_get_stats(o, &s);
    printf("stats %lld %lld %.6f\n", (long long)s.adds, (long long)s.bytes, s.blocked_s);
    printf("service %s\n", enkflow_output_service_stats(o));
    return 0;
}

static int bad(enkflow_output *o) {
    double x[NY * NX] = {0};
    int64_t whole[2] = {NY, NX}, rows[2] = {2, NX}, flat[1] = {NY * NX};
    int64_t outside[4] = {3, 5, 0, NX}, wrong[4] = {0, 3, 0, NX}, neg[4] = {-1, 1, 0, NX};
    report("unknown_field", enkflow_output_add(o, "salinity", ENKFLOW_FLOAT64, x, 2, whole, 0.0, 1, NULL), o);
    report("wrong_shape", enkflow_output_add(o, "t", ENKFLOW_FLOAT64, x, 2, rows, 0.0, 1, NULL), o);
    report("wrong_ndim", enkflow_output_add(o, "t", ENKFLOW_FLOAT64, x, 1, flat, 0.0, 1, NULL), o);
    report("region_outside", enkflow_output_add(o, "t", ENKFLOW_FLOAT64, x, 2, rows, 0.0, 1, outside), o);
    report("region_negative", enkflow_output_add(o, "t", ENKFLOW_FLOAT64, x, 2, rows, 0.0, 1, neg), o);
    report("region_mismatch", enkflow_output_add(o, "t", ENKFLOW_FLOAT64, x, 2, rows, 6.0, 2, wrong), o);
    report("member_high", enkflow_output_add(o, "t", ENKFLOW_FLOAT64, x, 2, whole, 6.0, 4, NULL), o);
    report("member_none", enkflow_output_add(o, "t", ENKFLOW_FLOAT64, x, 2, whole, 6.0, 0, NULL), o);
    int64_t px[1] = {NX};
    report("member_not_ensemble", enkflow_output_add(o, "p", ENKFLOW_FLOAT64, x, 1, px, 6.0, 2, NULL), o);
    report("time_nan", enkflow_output_add(o, "t", ENKFLOW_FLOAT64, x, 2, whole, NAN, 1, NULL), o);
    report("dtype", enkflow_output_add(o, "t", (enkflow_dtype)9, x, 2, whole, 0.0, 1, NULL), o);
    /* Nothing was sent: the service has nothing to write and no error for this client. */
    report("sync", enkflow_output_sync(o), o);
    enkflow_output_stats s;
    enkflow_output_get_stats(o, &s);
    printf("adds %lld\n", (long long)s.adds);
    report("close", enkflow_output_close(o, 1), o);
    report("add_after_close", enkflow_output_add(o, "t", ENKFLOW_FLOAT64, x, 2, whole, 0.0, 1, NULL), o);
    report("sync_after_close", enkflow_output_sync(o), o);
    report("close_again", enkflow_output_close(o, 1), o);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODE SERVICE_DIR [TOKEN_FILE|TIMEOUT]\n", argv[0]);
        return 2;
    }
    const char *mode = argv[1], *dir = argv[2];
    enkflow_output *o = NULL;
    int rc;
    if (strcmp(mode, "token") == 0) {
        char address[1024] = "", path[1024];
        snprintf(path, sizeof path, "%s/address", dir);
        FILE *fh = fopen(path, "r");
        if (fh) {
            if (!fgets(address, sizeof address, fh)) address[0] = 0;
            fclose(fh);
        }
        address[strcspn(address, "\n")] = 0;
        rc = enkflow_output_open(&o, address, argv[3], 10.0);
        report("token", rc, o);
        enkflow_output_free(o);
        return rc;
    }
    rc = enkflow_output_open_dir(&o, dir, 10.0);
    if (rc) {
        report("open", rc, o);
        enkflow_output_free(o);
        return rc;
    }
    if (strcmp(mode, "fields") == 0) {
        rc = fields(o);
    } else if (strcmp(mode, "bad") == 0) {
        rc = bad(o);
    } else if (strcmp(mode, "nan") == 0) {
        double t[NY][NX] = {{0}};
        t[1][2] = NAN;
        int64_t whole[2] = {NY, NX};
        rc = report("add", enkflow_output_add(o, "t", ENKFLOW_FLOAT64, t, 2, whole, 12.0, 1, NULL), o);
        for (int m = 2; m <= 3 && !rc; m++) rc = enkflow_output_add(o, "t", ENKFLOW_FLOAT64, t, 2, whole, 12.0, m, NULL);
        if (!rc) rc = report("sync", enkflow_output_sync(o), o);
        int rc2 = report("close", enkflow_output_close(o, 1), o);
        if (!rc) rc = rc2;
    } else if (strcmp(mode, "wait") == 0) {
        if (argc > 3) report("timeout", enkflow_output_set_timeout(o, atof(argv[3])), o);
        double p[NX] = {1, 2, 3, 4, 5};
        int64_t px[1] = {NX};
        rc = report("add", enkflow_output_add(o, "p", ENKFLOW_FLOAT64, p, 1, px, 18.0, 0, NULL), o);
        printf("OPEN\n");
        fflush(stdout);
        char line[64];
        if (!fgets(line, sizeof line, stdin)) line[0] = 0;
        rc = report("sync", enkflow_output_sync(o), o);
        report("close", enkflow_output_close(o, 1), o);
    } else if (strcmp(mode, "twice") == 0) {
        double t[NY][NX];
        int64_t whole[2] = {NY, NX};
        for (int m = 1; m <= 3 && !rc; m++) {
            for (int i = 0; i < NY; i++)
                for (int j = 0; j < NX; j++) t[i][j] = t_value(m, 4, i, j);
            rc = enkflow_output_add(o, "t", ENKFLOW_FLOAT64, t, 2, whole, 24.0, m, NULL);
        }
        for (int i = 0; i < NY; i++)
            for (int j = 0; j < NX; j++) t[i][j] = t_value(1, 4, i, j);
        if (!rc) rc = enkflow_output_add(o, "t", ENKFLOW_FLOAT64, t, 2, whole, 24.0, 1, NULL);
        report("same", rc ? rc : enkflow_output_sync(o), o);
        t[0][0] += 1.0;
        rc = enkflow_output_add(o, "t", ENKFLOW_FLOAT64, t, 2, whole, 24.0, 2, NULL);
        rc = report("other", rc ? rc : enkflow_output_sync(o), o);
        /* A rerun of time 24: discard it, add every member again (other values), written anew. */
        int64_t ndropped = -1;
        int rc2 = enkflow_output_discard(o, 24.0, &ndropped);
        printf("discard %d %lld [%s] %s\n", rc2, (long long)ndropped, enkflow_output_dropped(o), enkflow_output_errmsg(o));
        for (int m = 1; m <= 3 && !rc2; m++) {
            for (int i = 0; i < NY; i++)
                for (int j = 0; j < NX; j++) t[i][j] = t_value(m, 5, i, j);
            rc2 = enkflow_output_add(o, "t", ENKFLOW_FLOAT64, t, 2, whole, 24.0, m, NULL);
        }
        report("rerun", rc2 ? rc2 : enkflow_output_sync(o), o);
        report("close", enkflow_output_close(o, 1), o);
    } else if (strcmp(mode, "flood") == 0 && argc > 3) {
        enum { BY = 512, BX = 256 };
        static double big[BY * BX];
        int64_t shape[2] = {BY, BX};
        printf("OPEN\n");
        fflush(stdout);
        char line[64];
        if (!fgets(line, sizeof line, stdin)) line[0] = 0;
        int n = atoi(argv[3]);
        for (int k = 0; k < n && !rc; k++) {
            for (int e = 0; e < BY * BX; e++) big[e] = k + e / 8.0;
            rc = enkflow_output_add(o, "big", ENKFLOW_FLOAT64, big, 2, shape, (double)k, 0, NULL);
        }
        if (rc) report("add", rc, o);
        enkflow_output_stats s;
        enkflow_output_get_stats(o, &s);
        printf("stats %lld %lld %.6f\n", (long long)s.adds, (long long)s.bytes, s.blocked_s);
        int rc2 = report("close", enkflow_output_close(o, 1), o);
        if (!rc) rc = rc2;
    } else {
        fprintf(stderr, "unknown mode %s\n", mode);
        rc = 2;
    }
    enkflow_output_free(o);
    return rc;
}
