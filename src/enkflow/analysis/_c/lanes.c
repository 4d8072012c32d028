/*
 * Local ensemble transform analysis, eight domains in lockstep (SIMD lanes).
 *
 * Exact LETKF/LESTKF analysis per domain (same result as the per-domain
 * LAPACK reference up to rounding) with less work and no eigenvectors:
 *   - p local observations, p < N: observation space, K = S S^T (p x p);
 *     otherwise ensemble space, G = S^T S (N x N). S = sqrt(w/r) Y'.
 *   - Householder tridiagonalization M = Q T Q^T, implicit QL on T recording
 *     Givens rotations (T = Z diag(l) Z^T), and f(M) v = Q Z f(l) Z^T Q^T v
 *     applied to the innovation and to one vector per state row.
 *   - Eight neighbouring domains run together with the lane index innermost
 *     in every array, so each statement is one vector instruction. Lanes with
 *     fewer observations are padded with zero rows (exact). In a QL sweep, a
 *     lane that has converged or has not reached its split point applies
 *     identity rotations.
 * No reduction is reassociated: each lane adds its terms in the same order
 * as a scalar loop would, so results do not depend on batching.
 * A lane whose QL fails to converge is reported; the caller redoes that
 * domain with LAPACK.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define L 8
#define MAX_SWEEPS 60
#define LANES for (int ln = 0; ln < L; ++ln)
#define VEC _Pragma("omp simd") LANES

typedef double lane_t[L];

/* Index helpers: lane arrays are [rows][cols][L] with row stride cols*L. */
#define AT(a, i, j, ncol) ((a) + ((size_t)(i) * (ncol) + (j)) * L)

static void tridiagonalize(int n, int ld, double *restrict A, double *restrict V,
                           double *restrict tau, double *restrict d, double *restrict e,
                           double *restrict W)
{
    /* A, V: [ld][ld][L]; tau, d, e: [ld][L]; W: [ld][L] scratch (p, then w). */
    for (int k = 0; k < n - 2; ++k) {
        const int m = k + 1;
        lane_t acc, t, pv;
        VEC acc[ln] = 0.0;
        for (int i = m + 1; i < n; ++i) {
            const double *restrict a = AT(A, i, k, ld);
            VEC acc[ln] += a[ln] * a[ln];
        }
        double *restrict vk = AT(V, k, 0, ld);
        {
            const double *restrict a = AT(A, m, k, ld);
            const double *restrict akk = AT(A, k, k, ld);
            VEC {
                double x0 = a[ln], tail = acc[ln];
                double alpha = sqrt(tail + x0 * x0);
                double beta = x0 >= 0.0 ? -alpha : alpha;
                double v0 = x0 - beta;
                int ok = tail > 0.0; /* else already reduced: H = I */
                t[ln] = ok ? 2.0 / (v0 * v0 + tail) : 0.0;
                e[k * L + ln] = ok ? beta : x0;
                d[k * L + ln] = akk[ln];
                vk[m * L + ln] = v0;
            }
        }
        for (int i = m + 1; i < n; ++i) {
            const double *restrict a = AT(A, i, k, ld);
            VEC vk[i * L + ln] = a[ln];
        }
        VEC { tau[k * L + ln] = t[ln]; pv[ln] = 0.0; }
        /* p = t B v, B = A[m:, m:] */
        for (int i = m; i < n; ++i) {
            VEC acc[ln] = 0.0;
            const double *restrict ai = AT(A, i, 0, ld);
            for (int j = m; j < n; ++j) {
                VEC acc[ln] += ai[j * L + ln] * vk[j * L + ln];
            }
            VEC {
                double pi = t[ln] * acc[ln];
                W[i * L + ln] = pi;
                pv[ln] += pi * vk[i * L + ln];
            }
        }
        VEC pv[ln] *= 0.5 * t[ln];
        for (int i = m; i < n; ++i) {
            VEC W[i * L + ln] -= pv[ln] * vk[i * L + ln];
        }
        /* B -= v w^T + w v^T (full square: the matvec reads whole rows) */
        for (int i = m; i < n; ++i) {
            double *restrict ai = AT(A, i, 0, ld);
            const double *restrict vi = vk + i * L, *restrict wi = W + i * L;
            for (int j = m; j < n; ++j) {
                VEC ai[j * L + ln] -= vi[ln] * W[j * L + ln] + wi[ln] * vk[j * L + ln];
            }
        }
    }
    LANES {
        if (n >= 2) {
            d[(n - 2) * L + ln] = AT(A, n - 2, n - 2, ld)[ln];
            e[(n - 2) * L + ln] = AT(A, n - 1, n - 2, ld)[ln];
        }
        d[(n - 1) * L + ln] = AT(A, n - 1, n - 1, ld)[ln];
        e[(n - 1) * L + ln] = 0.0;
    }
}

/* Implicit QL (EISPACK tql1 logic) on every lane; returns rotation count. */
static int ql(int n, double *restrict d, double *restrict e, int *restrict rot_i,
              double *restrict rot_c, double *restrict rot_s, int cap, int *restrict failed)
{
    const double eps = 2.220446049250313e-16;
    int nrot = 0;
    int ml[L];
    lane_t s, c, p, g;
    for (int l = 0; l < n; ++l) {
        int sweeps = 0;
        for (;;) {
            int mmax = l;
            LANES {
                int m = l;
                while (m < n - 1) {
                    if (fabs(e[m * L + ln]) <= eps * (fabs(d[m * L + ln]) + fabs(d[(m + 1) * L + ln])))
                        break;
                    ++m;
                }
                if (failed[ln]) m = l;
                ml[ln] = m;
                if (m > mmax) mmax = m;
            }
            if (mmax == l) break;
            if (++sweeps > MAX_SWEEPS || nrot + (mmax - l) > cap) {
                LANES if (ml[ln] > l) { failed[ln] = 1; }
                continue;
            }
            VEC {
                int m = ml[ln];
                double el = m > l ? e[l * L + ln] : 1.0;
                double g0 = (d[(l + 1) * L + ln] - d[l * L + ln]) / (2.0 * el);
                double r = sqrt(g0 * g0 + 1.0);
                g[ln] = d[m * L + ln] - d[l * L + ln] + el / (g0 + (g0 >= 0.0 ? r : -r));
                s[ln] = 1.0; c[ln] = 1.0; p[ln] = 0.0;
            }
            for (int i = mmax - 1; i >= l; --i) {
                double *restrict rc = rot_c + (size_t)nrot * L, *restrict rs = rot_s + (size_t)nrot * L;
                double *restrict ei = e + i * L, *restrict ei1 = e + (i + 1) * L;
                double *restrict di = d + i * L, *restrict di1 = d + (i + 1) * L;
                VEC {
                    int act = i < ml[ln];
                    double f = s[ln] * ei[ln], b = c[ln] * ei[ln], gg = g[ln];
                    double r = sqrt(f * f + gg * gg);
                    double rr = r != 0.0 ? 1.0 / r : 0.0;
                    double sn = f * rr, cn = gg * rr;
                    double g2 = di1[ln] - p[ln];
                    double r2 = (di[ln] - g2) * sn + 2.0 * cn * b;
                    double pn = sn * r2;
                    if (act && r == 0.0) failed[ln] = 1;
                    ei1[ln] = act ? r : ei1[ln];
                    di1[ln] = act ? g2 + pn : di1[ln];
                    g[ln] = act ? cn * r2 - b : gg;
                    s[ln] = act ? sn : s[ln];
                    c[ln] = act ? cn : c[ln];
                    p[ln] = act ? pn : p[ln];
                    rc[ln] = act ? cn : 1.0;
                    rs[ln] = act ? sn : 0.0;
                }
                rot_i[nrot++] = i;
            }
            LANES {
                int m = ml[ln];
                if (m > l) {
                    d[l * L + ln] -= p[ln];
                    e[l * L + ln] = g[ln];
                    e[m * L + ln] = 0.0;
                }
            }
        }
    }
    return nrot;
}

/* B[:n][:nv] <- Q^T B (transpose) or Q B; B is [ld][nvmax][L]. */
static void apply_householder(int n, int ld, const double *restrict V, const double *restrict tau,
                              double *restrict B, int nvmax, int nv, int transpose)
{
    for (int kk = 0; kk < n - 2; ++kk) {
        const int k = transpose ? kk : n - 3 - kk;
        const double *restrict vk = V + (size_t)k * ld * L;
        for (int col = 0; col < nv; ++col) {
            lane_t acc;
            VEC acc[ln] = 0.0;
            for (int i = k + 1; i < n; ++i) {
                const double *restrict b = AT(B, i, col, nvmax);
                VEC acc[ln] += vk[i * L + ln] * b[ln];
            }
            VEC acc[ln] *= tau[k * L + ln];
            for (int i = k + 1; i < n; ++i) {
                double *restrict b = AT(B, i, col, nvmax);
                VEC b[ln] -= acc[ln] * vk[i * L + ln];
            }
        }
    }
}

/* B <- Z^T B (transpose: recorded order, each transposed) or Z B. */
static void apply_rotations(int nrot, const int *restrict rot_i, const double *restrict rot_c,
                            const double *restrict rot_s, double *restrict B, int nvmax, int nv,
                            int transpose)
{
    const double sg = transpose ? -1.0 : 1.0;
    for (int qq = 0; qq < nrot; ++qq) {
        const int q = transpose ? qq : nrot - 1 - qq;
        const int i = rot_i[q];
        const double *restrict c = rot_c + (size_t)q * L, *restrict s = rot_s + (size_t)q * L;
        for (int col = 0; col < nv; ++col) {
            double *restrict b0 = AT(B, i, col, nvmax), *restrict b1 = AT(B, i + 1, col, nvmax);
            VEC {
                double a = b0[ln], b = b1[ln], sn = sg * s[ln];
                b0[ln] = c[ln] * a + sn * b;
                b1[ln] = c[ln] * b - sn * a;
            }
        }
    }
}

static void finish_row(double *restrict X, int64_t ldx, int N, int64_t row, double mean,
                       const double *restrict Xa, const double *restrict Xd, int ln,
                       double post, double rtpp, double rtps)
{
    /* Xa, Xd: lane-strided member vectors [N][L]. */
    double a[512];
    double *buf = N <= 512 ? a : malloc(sizeof(double) * N);
    for (int j = 0; j < N; ++j) buf[j] = Xa[j * L + ln];
    if (rtpp != 0.0)
        for (int j = 0; j < N; ++j) buf[j] = (1.0 - rtpp) * buf[j] + rtpp * Xd[j * L + ln];
    if (rtps != 0.0) {
        double sf = 0.0, sa = 0.0;
        for (int j = 0; j < N; ++j) {
            sf += Xd[j * L + ln] * Xd[j * L + ln];
            sa += buf[j] * buf[j];
        }
        if (sa > 0.0) {
            double fac = 1.0 + rtps * (sqrt(sf) - sqrt(sa)) / sqrt(sa);
            for (int j = 0; j < N; ++j) buf[j] *= fac;
        }
    }
    for (int j = 0; j < N; ++j) X[row + (int64_t)j * ldx] = mean + post * buf[j];
    if (buf != a) free(buf);
}

/*
 * X: (n_rows, N) Fortran order, updated in place (ldx = n_rows).
 * Domain k owns rows dom_rows[dom_off[k]:dom_off[k+1]] and observations
 * ob_idx/ob_sw[ob_off[k]:ob_off[k+1]] (sw = sqrt(taper weight / error var)).
 * Yp: (n_obs, N) C order; dy: (n_obs,). stage: 3 full, 1 build only, 2 + eigen.
 * gamma = rho (N-1) for every domain, or gamma_dom[k] for domain k when gamma_dom
 * is not NULL (a per-domain prior inflation, e.g. adaptive); the same value gives
 * the same bits either way.
 * failed_out receives indices of domains to redo with LAPACK; returns their count,
 * or -1 if memory could not be allocated.
 */
int64_t enk_local_analysis(double *restrict X, int64_t ldx, int N,
                           int64_t n_dom, const int64_t *restrict dom_off, const int64_t *restrict dom_rows,
                           const int64_t *restrict ob_off, const int64_t *restrict ob_idx,
                           const double *restrict ob_sw, const double *restrict Yp,
                           const double *restrict dy, double gamma, const double *restrict gamma_dom,
                           double post, double rtpp, double rtps, int stage, int64_t *restrict failed_out)
{
    int64_t pmax = 1, rmax = 1;
    for (int64_t k = 0; k < n_dom; ++k) {
        int64_t p = ob_off[k + 1] - ob_off[k], r = dom_off[k + 1] - dom_off[k];
        if (p > pmax) pmax = p;
        if (r > rmax) rmax = r;
    }
    const int nmax = (int)(pmax < N ? (pmax > 2 ? pmax : 2) : N);
    const int nvmax = (int)rmax + 1;
    const int cap = 8 * nmax * nmax + 64;
    size_t sz = 0;
    sz += (size_t)pmax * N * L;                 /* S */
    sz += 2 * (size_t)nmax * nmax * L;          /* A, V */
    sz += 4 * (size_t)nmax * L;                 /* tau, d, e, W */
    sz += 2 * (size_t)cap * L;                  /* rot_c, rot_s */
    sz += (size_t)nmax * nvmax * L;             /* B */
    sz += (size_t)rmax * N * L + (size_t)rmax * L; /* Xd, xbar */
    sz += 2 * (size_t)N * L;                    /* wv, Xa */
    double *mem = aligned_alloc(64, ((sz * sizeof(double) + 63) / 64) * 64);
    int *rot_i = malloc(sizeof(int) * cap);
    if (!mem || !rot_i) { free(mem); free(rot_i); return -1; }
    memset(mem, 0, sz * sizeof(double));
    double *S = mem, *A = S + (size_t)pmax * N * L, *V = A + (size_t)nmax * nmax * L;
    double *tau = V + (size_t)nmax * nmax * L, *d = tau + nmax * L, *e = d + nmax * L, *W = e + nmax * L;
    double *rot_c = W + nmax * L, *rot_s = rot_c + (size_t)cap * L;
    double *B = rot_s + (size_t)cap * L, *Xd = B + (size_t)nmax * nvmax * L;
    double *xbar = Xd + (size_t)rmax * N * L, *wv = xbar + rmax * L, *Xa = wv + (size_t)N * L;
    const double sq_nm1 = sqrt(N - 1.0);
    lane_t gam, g_isq, sqg;
    int64_t nfail = 0;
    int pl[L], rl[L], failed[L];

    for (int64_t k0 = 0; k0 < n_dom; k0 += L) {
        const int nl = (int)(n_dom - k0 < L ? n_dom - k0 : L);
        int pm = 0, rm = 0;
        LANES {
            pl[ln] = ln < nl ? (int)(ob_off[k0 + ln + 1] - ob_off[k0 + ln]) : 0;
            rl[ln] = ln < nl ? (int)(dom_off[k0 + ln + 1] - dom_off[k0 + ln]) : 0;
            if (pl[ln] > pm) pm = pl[ln];
            if (rl[ln] > rm) rm = rl[ln];
            failed[ln] = 0;
            gam[ln] = gamma_dom != NULL && ln < nl ? gamma_dom[k0 + ln] : gamma;
            g_isq[ln] = 1.0 / sqrt(gam[ln]);
            sqg[ln] = sqrt(gam[ln]);
        }
        const int obs_space = pm < N;
        const int n = obs_space ? pm : N;
        const int nv = rm + 1;
        /* Gather the rows' anomalies (Xd[c][j][ln]) and S[q][j][ln]; zero padding. */
        for (int c = 0; c < rm; ++c) {
            double *restrict xd = Xd + (size_t)c * N * L;
            LANES {
                if (c < rl[ln]) {
                    const int64_t row = dom_rows[dom_off[k0 + ln] + c];
                    double sum = 0.0;
                    for (int j = 0; j < N; ++j) {
                        double v = X[row + (int64_t)j * ldx];
                        xd[j * L + ln] = v;
                        sum += v;
                    }
                    double mu = sum / N;
                    xbar[c * L + ln] = mu;
                    for (int j = 0; j < N; ++j) xd[j * L + ln] -= mu;
                } else {
                    xbar[c * L + ln] = 0.0;
                    for (int j = 0; j < N; ++j) xd[j * L + ln] = 0.0;
                }
            }
        }
        for (int q = 0; q < pm; ++q) {
            double *restrict sq = S + (size_t)q * N * L;
            LANES {
                if (q < pl[ln]) {
                    const int64_t o = ob_off[k0 + ln] + q;
                    const double sw = ob_sw[o];
                    const double *restrict y = Yp + ob_idx[o] * (int64_t)N;
                    for (int j = 0; j < N; ++j) sq[j * L + ln] = sw * y[j];
                } else {
                    for (int j = 0; j < N; ++j) sq[j * L + ln] = 0.0;
                }
            }
        }
        if (obs_space) {
            for (int a = 0; a < n; ++a) {
                const double *restrict sa = S + (size_t)a * N * L;
                for (int b = 0; b <= a; ++b) {
                    const double *restrict sb = S + (size_t)b * N * L;
                    lane_t acc;
                    VEC acc[ln] = 0.0;
                    for (int j = 0; j < N; ++j) { VEC acc[ln] += sa[j * L + ln] * sb[j * L + ln]; }
                    double *restrict ab = AT(A, a, b, nmax), *restrict ba = AT(A, b, a, nmax);
                    VEC { ab[ln] = acc[ln]; ba[ln] = acc[ln]; }
                }
            }
        } else {
            /* G = S^T S as rank-4 updates over blocks of observations: S streams
             * once, G (N x N x L) stays in cache. Terms are added in q order. */
            for (int a = 0; a < N; ++a)
                for (int b = 0; b <= a; ++b) { double *restrict ab = AT(A, a, b, nmax); VEC ab[ln] = 0.0; }
            int q = 0;
            for (; q + 4 <= pm; q += 4) {
                const double *restrict s0 = S + (size_t)q * N * L, *restrict s1 = s0 + (size_t)N * L;
                const double *restrict s2 = s1 + (size_t)N * L, *restrict s3 = s2 + (size_t)N * L;
                for (int a = 0; a < N; ++a) {
                    const double *restrict a0 = s0 + a * L, *restrict a1 = s1 + a * L;
                    const double *restrict a2 = s2 + a * L, *restrict a3 = s3 + a * L;
                    for (int b = 0; b <= a; ++b) {
                        double *restrict ab = AT(A, a, b, nmax);
                        VEC {
                            double t = ab[ln];
                            t += a0[ln] * s0[b * L + ln];
                            t += a1[ln] * s1[b * L + ln];
                            t += a2[ln] * s2[b * L + ln];
                            t += a3[ln] * s3[b * L + ln];
                            ab[ln] = t;
                        }
                    }
                }
            }
            for (; q < pm; ++q) {
                const double *restrict sq = S + (size_t)q * N * L;
                for (int a = 0; a < N; ++a)
                    for (int b = 0; b <= a; ++b) {
                        double *restrict ab = AT(A, a, b, nmax);
                        VEC ab[ln] += sq[a * L + ln] * sq[b * L + ln];
                    }
            }
            for (int a = 0; a < N; ++a)
                for (int b = 0; b < a; ++b) {
                    double *restrict ab = AT(A, a, b, nmax), *restrict ba = AT(A, b, a, nmax);
                    VEC ba[ln] = ab[ln];
                }
        }
        if (stage == 1) continue;
        /* Right-hand sides: column 0 the innovation, 1.. one per row. */
        memset(B, 0, sizeof(double) * (size_t)n * nvmax * L);
        if (obs_space) {
            for (int q = 0; q < pm; ++q) {
                double *restrict b0 = AT(B, q, 0, nvmax);
                LANES if (q < pl[ln]) {
                    const int64_t o = ob_off[k0 + ln] + q;
                    b0[ln] = ob_sw[o] * dy[ob_idx[o]];
                }
                const double *restrict sq = S + (size_t)q * N * L;
                for (int c = 0; c < rm; ++c) {
                    const double *restrict xd = Xd + (size_t)c * N * L;
                    lane_t acc;
                    VEC acc[ln] = 0.0;
                    for (int j = 0; j < N; ++j) { VEC acc[ln] += sq[j * L + ln] * xd[j * L + ln]; }
                    double *restrict bc = AT(B, q, 1 + c, nvmax);
                    VEC bc[ln] = acc[ln];
                }
            }
        } else {
            for (int q = 0; q < pm; ++q) {
                const double *restrict sq = S + (size_t)q * N * L;
                lane_t dq;
                LANES {
                    dq[ln] = 0.0;
                    if (q < pl[ln]) {
                        const int64_t o = ob_off[k0 + ln] + q;
                        dq[ln] = ob_sw[o] * dy[ob_idx[o]];
                    }
                }
                for (int j = 0; j < N; ++j) {
                    double *restrict bj = AT(B, j, 0, nvmax);
                    VEC bj[ln] += sq[j * L + ln] * dq[ln];
                }
            }
            for (int c = 0; c < rm; ++c) {
                const double *restrict xd = Xd + (size_t)c * N * L;
                for (int j = 0; j < N; ++j) {
                    double *restrict bj = AT(B, j, 1 + c, nvmax);
                    VEC bj[ln] = xd[j * L + ln];
                }
            }
        }
        int nrot = 0;
        if (n == 1) {
            LANES d[ln] = A[ln];
        } else if (n > 1) {
            tridiagonalize(n, nmax, A, V, tau, d, e, W);
            nrot = ql(n, d, e, rot_i, rot_c, rot_s, cap, failed);
            apply_householder(n, nmax, V, tau, B, nvmax, nv, 1);
            apply_rotations(nrot, rot_i, rot_c, rot_s, B, nvmax, nv, 1);
        }
        if (stage == 2) continue;
        for (int a = 0; a < n; ++a) {
            lane_t h;
            double *restrict b0 = AT(B, a, 0, nvmax);
            VEC {
                double lam = d[a * L + ln] > 0.0 ? d[a * L + ln] : 0.0; /* Gram: < 0 only by rounding */
                double sgl = sqrt(gam[ln] + lam);
                b0[ln] /= gam[ln] + lam;
                h[ln] = obs_space ? -1.0 / (sgl * sqg[ln] * (sgl + sqg[ln])) : 1.0 / sgl;
            }
            for (int col = 1; col < nv; ++col) {
                double *restrict bc = AT(B, a, col, nvmax);
                VEC bc[ln] *= h[ln];
            }
        }
        if (n > 1) {
            apply_rotations(nrot, rot_i, rot_c, rot_s, B, nvmax, nv, 0);
            apply_householder(n, nmax, V, tau, B, nvmax, nv, 0);
        }
        /* Mean weights in ensemble space. */
        if (obs_space) {
            for (int j = 0; j < N; ++j) { VEC wv[j * L + ln] = 0.0; }
            for (int q = 0; q < pm; ++q) {
                const double *restrict sq = S + (size_t)q * N * L, *restrict b0 = AT(B, q, 0, nvmax);
                for (int j = 0; j < N; ++j) { VEC wv[j * L + ln] += sq[j * L + ln] * b0[ln]; }
            }
        } else {
            for (int j = 0; j < N; ++j) {
                const double *restrict bj = AT(B, j, 0, nvmax);
                VEC wv[j * L + ln] = bj[ln];
            }
        }
        for (int c = 0; c < rm; ++c) {
            const double *restrict xd = Xd + (size_t)c * N * L;
            lane_t incr;
            VEC incr[ln] = 0.0;
            for (int j = 0; j < N; ++j) { VEC incr[ln] += xd[j * L + ln] * wv[j * L + ln]; }
            if (obs_space) {
                for (int j = 0; j < N; ++j) { VEC Xa[j * L + ln] = g_isq[ln] * xd[j * L + ln]; }
                for (int q = 0; q < pm; ++q) {
                    const double *restrict sq = S + (size_t)q * N * L, *restrict bq = AT(B, q, 1 + c, nvmax);
                    for (int j = 0; j < N; ++j) { VEC Xa[j * L + ln] += sq[j * L + ln] * bq[ln]; }
                }
                for (int j = 0; j < N; ++j) { VEC Xa[j * L + ln] *= sq_nm1; }
            } else {
                for (int j = 0; j < N; ++j) {
                    const double *restrict bj = AT(B, j, 1 + c, nvmax);
                    VEC Xa[j * L + ln] = sq_nm1 * bj[ln];
                }
            }
            for (int ln = 0; ln < nl; ++ln) {
                if (c >= rl[ln] || failed[ln]) continue;
                finish_row(X, ldx, N, dom_rows[dom_off[k0 + ln] + c], xbar[c * L + ln] + incr[ln],
                           Xa, xd, ln, post, rtpp, rtps);
            }
        }
        for (int ln = 0; ln < nl; ++ln)
            if (failed[ln]) failed_out[nfail++] = k0 + ln;
    }
    free(mem);
    free(rot_i);
    return nfail;
}

/* Importable as a module too (the library is loaded with ctypes). */
#include <Python.h>
static struct PyModuleDef lanes_module = {PyModuleDef_HEAD_INIT, "_lanes", "enkflow local analysis kernel (C, loaded with ctypes)", -1, NULL};
PyMODINIT_FUNC PyInit__lanes(void) { return PyModule_Create(&lanes_module); }
