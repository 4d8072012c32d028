/* A model for tests/native/test_intercept.py: reads variable VAR (double or float) of RESTART whole and writes
 * it back plus 1 in two hyperslabs (its first and second half, 1-d or along the first dimension), with
 * element BAD (C order; -1: none) made VALUE (nan, inf or -inf); with REWRITE 1 it then writes the whole
 * variable again, every element finite (a new write generation).
 *     intercept_writes RESTART VAR BAD VALUE REWRITE */
#include <math.h>
#include <netcdf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                  \
    do {                                                                             \
        int st_ = (call);                                                            \
        if (st_) {                                                                   \
            fprintf(stderr, "%s: %s\n", #call, nc_strerror(st_));                   \
            return 1;                                                                \
        }                                                                            \
    } while (0)

int main(int argc, char **argv) {
    if (argc != 6) return 2;
    long bad = atol(argv[3]);
    double value = !strcmp(argv[4], "nan") ? NAN : !strcmp(argv[4], "inf") ? INFINITY : -INFINITY;
    int ncid, varid, ndims, dimids[NC_MAX_VAR_DIMS];
    nc_type type;
    CHECK(nc_open(argv[1], NC_WRITE, &ncid));
    CHECK(nc_inq_varid(ncid, argv[2], &varid));
    CHECK(nc_inq_var(ncid, varid, NULL, &type, &ndims, dimids, NULL));
    size_t shape[NC_MAX_VAR_DIMS], n = 1;
    for (int d = 0; d < ndims; d++) {
        CHECK(nc_inq_dimlen(ncid, dimids[d], &shape[d]));
        n *= shape[d];
    }
    size_t es = type == NC_DOUBLE ? 8 : 4, row = n / shape[0];
    unsigned char *x = malloc(n * es);
    CHECK(type == NC_DOUBLE ? nc_get_var_double(ncid, varid, (double *)x) : nc_get_var_float(ncid, varid, (float *)x));
    for (size_t i = 0; i < n; i++) {
        if (type == NC_DOUBLE) ((double *)x)[i] += 1;
        else ((float *)x)[i] += 1;
    }
    if (bad >= 0) {
        if (type == NC_DOUBLE) ((double *)x)[bad] = value;
        else ((float *)x)[bad] = (float)value;
    }
    size_t start[NC_MAX_VAR_DIMS] = {0}, count[NC_MAX_VAR_DIMS];
    memcpy(count, shape, sizeof count);
    size_t half = shape[0] / 2;
    for (int part = 0; part < 2; part++) {
        start[0] = part ? half : 0;
        count[0] = part ? shape[0] - half : half;
        void *at = x + start[0] * row * es;
        CHECK(type == NC_DOUBLE ? nc_put_vara_double(ncid, varid, start, count, at) : nc_put_vara_float(ncid, varid, start, count, at));
    }
    if (atoi(argv[5])) {
        if (bad >= 0) {
            if (type == NC_DOUBLE) ((double *)x)[bad] = 0;
            else ((float *)x)[bad] = 0;
        }
        CHECK(type == NC_DOUBLE ? nc_put_var_double(ncid, varid, (double *)x) : nc_put_var_float(ncid, varid, (float *)x));
    }
    CHECK(nc_close(ncid));
    free(x);
    return 0;
}
