/* The serial EnSRF/EAKF's observation loop (enkflow.analysis.serial_filter; loaded with ctypes).
 *
 * One call assimilates a chunk of consecutive observations, one after the other, into this rank's
 * state rows and into the priors H(x) of the later observations, by regression on each
 * observation's prior anomalies (the module's docstring has the equations). Every rank runs it over
 * every observation: the observation part is replicated, the rows are the rank's own.
 *
 * A row's result must not depend on where it sits in the arrays (so not on the rank count): each
 * row's sum runs member by member in one scalar loop (no reassociation: the build has no
 * -ffast-math), and no multiply-add is fused, so that the vectorized update of a row and its
 * scalar remainder round alike whatever the row's alignment.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#pragma GCC optimize("fp-contract=off")

/* mean[i] += beta dm, anom[i, :] += beta ds for the entries idx[off[k]:off[k+1]] with weights w,
 * beta = w z'.y / yy. Arrays: mean (n,), anom (n, N) row-major. */
static void regress(int64_t k, const int64_t *restrict off, const int64_t *restrict idx, const double *restrict w,
                    int64_t N, const double *restrict y, const double *restrict ds, double yy, double dm,
                    double *restrict mean, double *restrict anom)
{
    for (int64_t p = off[k]; p < off[k + 1]; p++) {
        double *restrict z = anom + idx[p] * N;
        double dot = 0.0;
        for (int64_t i = 0; i < N; i++)
            dot += z[i] * y[i];
        const double beta = w[p] * (dot / yy);
        mean[idx[p]] += beta * dm;
        for (int64_t i = 0; i < N; i++)
            z[i] += beta * ds[i];
    }
}

/* Observations start .. start + n - 1 of the set: values yo, error variances r (n_obs,). Rows of
 * observation k (of the chunk): rows_idx[rows_off[k]:rows_off[k+1]] with weights rows_w; later
 * observations: obs_idx[obs_off[k]:obs_off[k+1]] with weights obs_w. xmean (n_rows,), xanom
 * (n_rows, N), ymean (n_obs,), yanom (n_obs, N), updated in place. Returns the number of
 * observations without spread (skipped), or -1 when the work buffer cannot be had. */
int64_t enk_serial_update(int64_t n, int64_t start, int64_t N, const int64_t *restrict rows_off,
                          const int64_t *restrict rows_idx, const double *restrict rows_w,
                          const int64_t *restrict obs_off, const int64_t *restrict obs_idx,
                          const double *restrict obs_w, const double *restrict yo, const double *restrict r,
                          double *restrict xmean, double *restrict xanom, double *restrict ymean,
                          double *restrict yanom)
{
    double *buf = malloc(2 * (size_t)N * sizeof(double));
    if (buf == NULL)
        return -1;
    double *y = buf, *ds = buf + N;
    int64_t skipped = 0;
    for (int64_t k = 0; k < n; k++) {
        const int64_t j = start + k;
        double *restrict yj = yanom + j * N;
        memcpy(y, yj, (size_t)N * sizeof(double));
        double yy = 0.0;
        for (int64_t i = 0; i < N; i++)
            yy += y[i] * y[i];
        if (yy == 0.0) { /* no spread: nothing regresses on this observation */
            skipped++;
            continue;
        }
        const double v = yy / (double)(N - 1), rj = r[j];
        const double dm = v / (v + rj) * (yo[j] - ymean[j]);
        const double s1 = sqrt(rj / (v + rj)) - 1.0;
        for (int64_t i = 0; i < N; i++)
            ds[i] = s1 * y[i];
        regress(k, rows_off, rows_idx, rows_w, N, y, ds, yy, dm, xmean, xanom);
        regress(k, obs_off, obs_idx, obs_w, N, y, ds, yy, dm, ymean, yanom);
        ymean[j] += dm;
        for (int64_t i = 0; i < N; i++)
            yj[i] += ds[i];
    }
    free(buf);
    return skipped;
}
