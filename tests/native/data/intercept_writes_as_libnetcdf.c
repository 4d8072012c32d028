/* Writes to a restart opened with NC_WRITE, one line of output each: "NAME STATUS [VALUES]".
 * tests/native/test_intercept_same_as_libnetcdf.py runs it on a plain file and on an intercepted restart and
 * wants the same lines. Variables: x double (4, 6), s float scalar, n int64 (3), other double (3).
 * The hyperslabs of x tile it out of order; invalid writes come first and write nothing; then x is
 * rewritten in two halves, read back half-way.
 *   intercept_writes_as_libnetcdf PATH */
#include <netcdf.h>
#include <stdint.h>
#include <stdio.h>

static void rep(const char *what, int st) {
    printf("%s %d\n", what, st);
    fflush(stdout);
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    int a, x = -1, s = -1, n = -1, other = -1;
    double buf[24], out[24];
    float f = 2.5f, fo = 0;
    long long ll[3] = {1, -2, 3000000000000LL}, lo[3] = {0, 0, 0};
    size_t st[2], ct[2];
    for (int i = 0; i < 24; i++) buf[i] = -1.5 * i;
    rep("open", nc_open(argv[1], NC_WRITE, &a));
    nc_inq_varid(a, "x", &x);
    nc_inq_varid(a, "s", &s);
    nc_inq_varid(a, "n", &n);
    nc_inq_varid(a, "other", &other);
    rep("put_bad_varid", nc_put_var_double(a, 99, buf));
    st[0] = 3, st[1] = 0, ct[0] = 2, ct[1] = 6;
    rep("put_past_the_edge", nc_put_vara_double(a, x, st, ct, buf));
    st[0] = 0, st[1] = 1, ct[0] = 1, ct[1] = SIZE_MAX;
    rep("put_wrapping_count", nc_put_vara_double(a, x, st, ct, buf));
    rep("put_null_start", nc_put_vara_double(a, x, NULL, ct, buf));
    st[0] = 2, st[1] = 0, ct[0] = 2, ct[1] = 6;
    rep("put_rows_2_3", nc_put_vara_double(a, x, st, ct, buf + 12));
    double right[6] = {buf[3], buf[4], buf[5], buf[9], buf[10], buf[11]};
    double left[6] = {buf[0], buf[1], buf[2], buf[6], buf[7], buf[8]};
    st[0] = 0, st[1] = 3, ct[0] = 2, ct[1] = 3;
    rep("put_rows_0_1_right", nc_put_vara_double(a, x, st, ct, right));
    st[1] = 0;
    rep("put_rows_0_1_left", nc_put_vara_double(a, x, st, ct, left));
    rep("put_scalar_var1_null_index", nc_put_var1_float(a, s, NULL, &f));
    rep("put_int64", nc_put_var_longlong(a, n, ll));
    rep("close", nc_close(a));
    rep("reopen", nc_open(argv[1], NC_NOWRITE, &a));
    rep("get_x", nc_get_var_double(a, x, out));
    for (int i = 0; i < 24; i++) printf("%s%g", i ? " " : "x ", out[i]);
    printf("\n");
    rep("get_s", nc_get_var1_float(a, s, NULL, &fo));
    printf("s %g\n", fo);
    rep("get_n", nc_get_var_longlong(a, n, lo));
    printf("n %lld %lld %lld\n", lo[0], lo[1], lo[2]);
    rep("close_again", nc_close(a));
    /* A rewrite (a new write of x after a complete one), read back half-way and at the end. */
    for (int i = 0; i < 24; i++) buf[i] = 0.25 * i;
    rep("reopen_write", nc_open(argv[1], NC_WRITE, &a));
    st[0] = 2, st[1] = 0, ct[0] = 2, ct[1] = 6;
    rep("rewrite_rows_2_3", nc_put_vara_double(a, x, st, ct, buf + 12));
    rep("get_mid_rewrite", nc_get_var_double(a, x, out));
    for (int i = 0; i < 24; i++) printf("%s%g", i ? " " : "x ", out[i]);
    printf("\n");
    st[0] = 0;
    rep("rewrite_rows_0_1", nc_put_vara_double(a, x, st, ct, buf));
    rep("close_rewrite", nc_close(a));
    rep("reopen_read", nc_open(argv[1], NC_NOWRITE, &a));
    rep("get_rewritten", nc_get_var_double(a, x, out));
    for (int i = 0; i < 24; i++) printf("%s%g", i ? " " : "x ", out[i]);
    printf("\n");
    rep("close_last", nc_close(a));
    return 0;
}
