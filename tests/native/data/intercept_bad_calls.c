/* Bad netCDF calls on an intercepted restart, one per line of output: "NAME STATUS nc_strerror(STATUS)".
 * Run under the interception shim by tests/native/test_intercept.py; the state variable x is double (4, 6). */
#include <netcdf.h>
#include <stdio.h>
#include <string.h>

static void report(const char *what, int st) { printf("%s %d %s\n", what, st, nc_strerror(st)); fflush(stdout); }

int main(int argc, char **argv) {
    const char *path = argv[1];
    int ncid, x, other, st;
    double buf[24] = {0}, one = 0.0;
    float fbuf[24];
    size_t start[2] = {0, 0}, count[2] = {2, 6}, bad[2] = {3, 0};
    ptrdiff_t stride[2] = {2, 1};
    if (argc > 2 && strcmp(argv[2], "missing") == 0) {
        report("open_missing_field", nc_open(path, NC_NOWRITE, &ncid));
        return 0;
    }
    if (argc > 2 && strcmp(argv[2], "create") == 0) {  /* a model that writes its restart anew */
        int dims[2], k;
        report("create", nc_create(path, NC_CLOBBER | NC_NETCDF4, &ncid));
        nc_def_dim(ncid, "y", 4, &dims[0]);
        nc_def_dim(ncid, "x", 6, &dims[1]);
        nc_def_dim(ncid, "k", 3, &k);
        nc_def_var(ncid, "x", NC_DOUBLE, 2, dims, &x);
        nc_def_var(ncid, "other", NC_DOUBLE, 1, &k, &other);
        nc_enddef(ncid);
        for (int i = 0; i < 24; i++) buf[i] = -1.0 - i;
        report("create_put_other", nc_put_var_double(ncid, other, buf));
        report("create_put_x", nc_put_var_double(ncid, x, buf));
        report("create_close", nc_close(ncid));
        return 0;
    }
    report("open", nc_open(path, NC_WRITE, &ncid));
    nc_inq_varid(ncid, "x", &x);
    nc_inq_varid(ncid, "other", &other);
    report("get_whole", nc_get_var_double(ncid, x, buf));
    printf("value %g %g\n", buf[0], buf[23]);
    report("get_wrong_type", nc_get_var_float(ncid, x, fbuf));
    report("get_strided", nc_get_vars_double(ncid, x, start, count, stride, buf));
    report("get_out_of_bounds", nc_get_vara_double(ncid, x, bad, count, buf));
    report("get_var1", nc_get_var1_double(ncid, x, start, &one));
    report("get_other_variable", nc_get_var_double(ncid, other, buf));
    printf("other %g\n", buf[0]);
    report("put_other_variable", nc_put_var_double(ncid, other, buf));
    for (int i = 0; i < 24; i++) buf[i] = 100.0 + i;
    report("put_rows_0_2", nc_put_vara_double(ncid, x, start, count, buf));
    report("get_after_half_write", nc_get_var_double(ncid, x, buf));  /* rows 0-1 written, 2-3 the state */
    printf("mixed %g %g %g %g\n", buf[0], buf[11], buf[12], buf[23]);
    for (int i = 0; i < 24; i++) buf[i] = 100.0 + i;
    start[0] = 1;
    report("put_rows_1_3_overlap", nc_put_vara_double(ncid, x, start, count, buf));
    report("put_wrong_type", nc_put_var_float(ncid, x, fbuf));
    st = nc_close(ncid);
    report("close_after_half_write", st);
    return 0;
}
