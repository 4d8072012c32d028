/* The benchmark's C API runner (benchmarks/native_restart_io.py): the same model as io_model.c (x += 1)
 * through libenkflow_runner; writes the seconds of every expose (one JSON list) to OUT.
 *     capi_model ADDRESS TOKEN_FILE N OUT */
#include <enkflow_runner.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: capi_model ADDRESS TOKEN_FILE N OUT\n");
        return 2;
    }
    char token[256], err[256];
    if (enkflow_read_token_file(argv[2], token, sizeof token, err, sizeof err) != ENKFLOW_OK) {
        fprintf(stderr, "capi_model: %s\n", err);
        return 1;
    }
    int64_t n = atoll(argv[3]), nsteps = 0;
    double *x = calloc((size_t)n, sizeof *x), *times = NULL;
    size_t k = 0;
    enkflow_runner *r = NULL;
    int rc = enkflow_runner_create(&r, argv[1], token);
    if (!rc) rc = enkflow_runner_add_field(r, "x", ENKFLOW_FLOAT64, 1, &n, 1);
    if (!rc) rc = enkflow_runner_init(r);
    if (!rc) rc = enkflow_runner_bind(r, "x", ENKFLOW_FLOAT64, x, n);
    while (!rc) {
        double t0 = now();
        rc = enkflow_runner_expose(r, &nsteps);
        times = realloc(times, (k + 1) * sizeof *times);
        times[k++] = now() - t0;
        if (rc || nsteps == 0)
            break;
        for (int64_t i = 0; i < n; i++)
            x[i] += 1.0;
    }
    if (rc)
        fprintf(stderr, "capi_model: %s\n", enkflow_runner_errmsg(r));
    enkflow_runner_finalize(r);
    FILE *fh = fopen(argv[4], "w");
    if (!fh)
        return 1;
    fprintf(fh, "[");
    for (size_t i = 0; i < k; i++)
        fprintf(fh, "%s%.9f", i ? ", " : "", times[i]);
    fprintf(fh, "]\n");
    fclose(fh);
    return rc ? 1 : 0;
}
