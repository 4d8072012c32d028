/* The benchmark's plain netCDF model (benchmarks/native_restart_io.py): reads the double variable x of
 * RESTART, adds 1 to every element, writes it back in place; appends its timings as one JSON line to
 * $IO_TIMINGS: read_s (nc_open + nc_get_var_double + nc_close), write_s (nc_open NC_WRITE +
 * nc_put_var_double + nc_close), fsync_s (open + fsync of the file after the write, with --fsync).
 * It knows nothing of enkflow: run under the interception shim, its reads and writes of x are served
 * from memory. */
#include <fcntl.h>
#include <netcdf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void check(int st, const char *what) {
    if (st != NC_NOERR) {
        fprintf(stderr, "io_model: %s: %s\n", what, nc_strerror(st));
        exit(1);
    }
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: io_model RESTART [--fsync]\n");
        return 2;
    }
    int do_fsync = argc > 2 && strcmp(argv[2], "--fsync") == 0;
    int ncid, vid, dim;
    size_t n;
    double t0 = now();
    check(nc_open(argv[1], NC_NOWRITE, &ncid), "nc_open");
    check(nc_inq_varid(ncid, "x", &vid), "x");
    check(nc_inq_vardimid(ncid, vid, &dim), "x");
    check(nc_inq_dimlen(ncid, dim, &n), "x");
    double *x = malloc(n * sizeof *x);
    if (!x)
        return 1;
    check(nc_get_var_double(ncid, vid, x), "nc_get_var_double");
    check(nc_close(ncid), "nc_close");
    double t1 = now();
    for (size_t i = 0; i < n; i++)
        x[i] += 1.0;
    double t2 = now();
    check(nc_open(argv[1], NC_WRITE, &ncid), "nc_open NC_WRITE");
    check(nc_inq_varid(ncid, "x", &vid), "x");
    check(nc_put_var_double(ncid, vid, x), "nc_put_var_double");
    check(nc_close(ncid), "nc_close");
    double t3 = now(), t4 = t3;
    if (do_fsync) {
        int fd = open(argv[1], O_RDONLY);
        if (fd < 0 || fsync(fd) != 0) {
            perror("io_model: fsync");
            return 1;
        }
        close(fd);
        t4 = now();
    }
    const char *out = getenv("IO_TIMINGS");
    if (out) {
        FILE *fh = fopen(out, "a");
        if (!fh)
            return 1;
        fprintf(fh, "{\"read_s\": %.9f, \"compute_s\": %.9f, \"write_s\": %.9f, \"fsync_s\": %.9f}\n", t1 - t0, t2 - t1,
                t3 - t2, t4 - t3);
        fclose(fh);
    }
    free(x);
    return 0;
}
