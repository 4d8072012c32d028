/* netCDF calls on a restart whose variable x is double (4, 6) and holds 1000 .. 1023, one line of output each:
 * "NAME STATUS [VALUES]". tests/native/test_intercept_same_as_libnetcdf.py runs it on a plain file through
 * libnetcdf and on an intercepted restart (x served from the segment) and wants the same lines: valid and
 * invalid reads, two handles of one file, the other variable, define mode, closes.
 *   intercept_same_as_libnetcdf PATH */
#include <netcdf.h>
#include <stdint.h>
#include <stdio.h>

static void rep(const char *what, int st, const double *v, int n) {
    printf("%s %d", what, st);
    for (int i = 0; !st && v && i < n; i++) printf(" %g", v[i]);
    printf("\n");
    fflush(stdout);
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    int a, b, x = -1, other = -1, nd, nv;
    nc_type t;
    double buf[64];
    size_t s[2], c[2];
    ptrdiff_t unit[2] = {1, 1};
    rep("open_a", nc_open(argv[1], NC_NOWRITE, &a), 0, 0);
    rep("open_b", nc_open(argv[1], NC_NOWRITE, &b), 0, 0);
    nc_inq_varid(a, "x", &x);
    nc_inq_varid(a, "other", &other);
    rep("inq_var", nc_inq_var(a, x, NULL, &t, &nd, NULL, NULL), 0, 0);
    printf("type %d ndims %d\n", (int)t, nd);
    rep("inq_nvars", nc_inq_nvars(a, &nv), 0, 0);
    printf("nvars %d\n", nv);
    rep("get_a", nc_get_var_double(a, x, buf), buf, 24);
    rep("get_b", nc_get_var_double(b, x, buf), buf, 24);
    s[0] = 1, s[1] = 2, c[0] = 2, c[1] = 3;
    rep("vara", nc_get_vara_double(a, x, s, c, buf), buf, 6);
    rep("vara_untyped", nc_get_vara(a, x, s, c, buf), buf, 6);
    rep("vars_unit", nc_get_vars_double(a, x, s, c, unit, buf), buf, 6);
    rep("vars_null_stride", nc_get_vars_double(a, x, s, c, NULL, buf), buf, 6);
    rep("var1", nc_get_var1_double(a, x, s, buf), buf, 1);
    s[0] = 4, s[1] = 0, c[0] = 0, c[1] = 6;
    rep("vara_empty_at_end", nc_get_vara_double(a, x, s, c, buf), 0, 0);
    s[0] = 5;
    rep("vara_empty_past_end", nc_get_vara_double(a, x, s, c, buf), 0, 0);
    s[0] = 4;
    rep("var1_at_end", nc_get_var1_double(a, x, s, buf), 0, 0);
    s[0] = 0, s[1] = 0, c[0] = 1, c[1] = SIZE_MAX;
    rep("vara_huge_count", nc_get_vara_double(a, x, s, c, buf), 0, 0);
    s[1] = 1; /* start + count wraps around to 0 */
    rep("vara_wrapping_count", nc_get_vara_double(a, x, s, c, buf), 0, 0);
    c[0] = 2, c[1] = 2;
    rep("vara_null_start", nc_get_vara_double(a, x, NULL, c, buf), buf, 4);
    rep("var1_null_index", nc_get_var1_double(a, x, NULL, buf), buf, 1);
    s[0] = 0, s[1] = 0;
    rep("vara_null_count", nc_get_vara_double(a, x, s, NULL, buf), buf, 24);
    s[0] = 1;
    rep("vara_null_count_from_1", nc_get_vara_double(a, x, s, NULL, buf), buf, 4);
    rep("get_bad_varid", nc_get_var_double(a, 99, buf), 0, 0);
    rep("get_other", nc_get_var_double(a, other, buf), buf, 3);
    rep("put_read_only", nc_put_var_double(a, x, buf), 0, 0);
    rep("redef", nc_redef(a), 0, 0);
    rep("enddef", nc_enddef(a), 0, 0);
    rep("close_a", nc_close(a), 0, 0);
    rep("get_after_close", nc_get_var_double(a, x, buf), 0, 0);
    rep("get_b_after_close_a", nc_get_var_double(b, x, buf), buf, 24);
    rep("close_b", nc_close(b), 0, 0);
    rep("close_b_again", nc_close(b), 0, 0);
    return 0;
}
