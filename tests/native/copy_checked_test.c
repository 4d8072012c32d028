/* native/src/copy_checked.h against the obvious answer: every size up to 80 elements and a large one, every
 * alignment of source and destination, a NaN, an Inf, a -Inf or a signalling NaN at every position (or none),
 * and finite values whose bits come close (the largest double, subnormals, -0). Built twice by
 * tests/native/test_copy_checked.py: with the default streaming threshold and with EKF_STREAM_MIN=0 (the
 * streaming loop for every size). Prints the first mismatch and exits 1, else prints "ok" and exits 0. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "copy_checked.h"

static unsigned char src_buf[1 << 22], dst_buf[1 << 22];

static int expect_finite(const unsigned char *s, size_t n, size_t es) {
    for (size_t i = 0; i < n; i++) {
        if (es == 8) {
            double v;
            memcpy(&v, s + 8 * i, 8);
            if (!isfinite(v)) return 0;
        } else {
            float v;
            memcpy(&v, s + 4 * i, 4);
            if (!isfinite(v)) return 0;
        }
    }
    return 1;
}

static void put(unsigned char *at, size_t es, double v) {
    if (es == 8) memcpy(at, &v, 8);
    else {
        float f = (float)v;
        memcpy(at, &f, 4);
    }
}

static int trial(size_t es, size_t soff, size_t doff, size_t n, long bad, double value) {
    unsigned char *s = src_buf + soff, *d = dst_buf + doff;
    for (size_t i = 0; i < n; i++) put(s + es * i, es, es == 8 ? 1e300 * (i % 3 ? 1 : -1) : 3e38 * (i % 3 ? 1 : -1));
    if (n > 2) put(s + es, es, es == 8 ? 4.9e-324 : 1.4e-45);
    if (n > 3) put(s + 2 * es, es, -0.0);
    if (bad >= 0) put(s + es * (size_t)bad, es, value);
    memset(d, 0xAB, n * es + 16);
    int got = ekf_copy_checked(d, s, n, es, es == 8 ? EKF_CHECK_F64 : EKF_CHECK_F32);
    int want = expect_finite(s, n, es);
    if (got != want || memcmp(d, s, n * es) != 0 || d[n * es] != 0xAB) {
        printf("mismatch: esize %zu src+%zu dst+%zu n %zu bad %ld value %g: got %d want %d, the copy %s\n", es, soff,
               doff, n, bad, value, got, want,
               memcmp(d, s, n * es) ? "differs" : d[n * es] != 0xAB ? "overran" : "is right");
        return 1;
    }
    return 0;
}

int main(void) {
    double snan;
    uint64_t bits = 0x7ff0000000000001u;
    memcpy(&snan, &bits, 8);
    const double values[] = {NAN, INFINITY, -INFINITY, snan};
    for (size_t es = 4; es <= 8; es += 4)
        for (size_t soff = 0; soff < 16; soff += es / 2)
            for (size_t doff = 0; doff < 16; doff += es)
                for (size_t n = 0; n <= 80; n++)
                    for (long bad = -1; bad < (long)n; bad++)
                        for (size_t v = 0; v < (bad < 0 ? 1 : sizeof values / sizeof *values); v++)
                            if (trial(es, soff, doff, n, bad, values[v])) return 1;
    /* A state larger than the streaming threshold, its bad element in the head, the body or the tail. */
    for (size_t es = 4; es <= 8; es += 4) {
        size_t n = ((size_t)3 << 20) / es + 5;
        const long at[] = {-1, 0, 1, 7, 4096, (long)n / 2, (long)n - 3, (long)n - 1};
        for (size_t doff = 0; doff < 16; doff += es)
            for (size_t k = 0; k < sizeof at / sizeof *at; k++)
                for (size_t v = 0; v < (at[k] < 0 ? 1 : sizeof values / sizeof *values); v++)
                    if (trial(es, 3, doff, n, at[k], values[v])) return 1;
    }
    printf("ok\n");
    return 0;
}
