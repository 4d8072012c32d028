/* Local search for consecutive blocks of analysis domains (loaded with ctypes).
 *
 * On a lon-lat grid the domains near the poles each see thousands of
 * observations, and neighbouring domains see almost the same ones. Querying
 * the KD-tree once per domain, or listing every (domain, observation) pair
 * with a dual-tree search and sorting them, costs more than the analysis of
 * those domains. Instead the Python side cuts the domains into blocks of
 * neighbours (enk_domain_blocks), queries the tree once per block for the
 * observations within r + rho_max of the block's first domain (a superset,
 * by the triangle inequality), and this file measures every domain of the
 * block against those candidates. Candidates come in ascending observation
 * order, so each domain's list comes out in ascending order with no sort.
 *
 * Coordinates are the embedded ones of enkflow.analysis.geometry (unit
 * vectors on the sphere, grid units otherwise), row-major (n, ndim). box > 0
 * is the period of a periodic coordinate (the shorter way round counts).
 */
#include <math.h>
#include <stdint.h>

/* Distances are computed as SciPy's KD-tree computes them (the squares summed in
 * dimension order, no fused multiply-add, then sqrt), so a pair has the same
 * distance, bit for bit, whichever search found it (the capped search uses the
 * tree's k-nearest query). */
#pragma GCC optimize("fp-contract=off")

static inline double sq_distance(const double *restrict a, const double *restrict b, int ndim, double box)
{
    double s = 0.0;
    for (int d = 0; d < ndim; d++) {
        double x = fabs(a[d] - b[d]);
        if (box > 0.0 && x > 0.5 * box)
            x = box - x;
        s += x * x;
    }
    return s;
}

/* Cut domains 0..n-1 into consecutive blocks. A block ends before the first
 * domain farther than rho_max from the block's first domain, or after bmax
 * domains. starts[0..nb] receives the block boundaries (starts[nb] = n);
 * returns nb. starts must hold n + 1 entries. */
int64_t enk_domain_blocks(int64_t n, int ndim, const double *restrict pts, double box, double rho_max,
                          int64_t bmax, int64_t *restrict starts)
{
    const double r2 = rho_max * rho_max;
    int64_t nb = 0, first = 0;
    for (int64_t i = 0; i < n; i++) {
        if (i == 0 || i - first >= bmax ||
            sq_distance(pts + i * ndim, pts + first * ndim, ndim, box) > r2) {
            starts[nb++] = i;
            first = i;
        }
    }
    starts[nb] = n;
    return nb;
}

/* Every (domain, observation) pair of the blocks with chordal distance at most r.
 *
 * Block b holds domains starts[b]..starts[b+1]-1 (numbered from starts[0])
 * and candidate observations cand[coff[b]..coff[b+1]), ascending. Domain
 * coordinates pts are indexed by the absolute domain number, observation
 * coordinates obs by observation index. Writes offsets[0..n_dom] (CSR, n_dom
 * = starts[nb] - starts[0]), idx[] and dist[] (the distance in embedded
 * units). Returns the number of pairs, or -1 if it would exceed cap (nothing
 * beyond cap is written). */
int64_t enk_block_pairs(int64_t nb, const int64_t *restrict starts, int ndim, const double *restrict pts,
                        const double *restrict obs, double box, const int64_t *restrict coff,
                        const int64_t *restrict cand, double r, int64_t cap, int64_t *restrict offsets,
                        int64_t *restrict idx, double *restrict dist)
{
    const double r2 = r * r;
    const int64_t d0 = starts[0];
    int64_t np = 0;
    offsets[0] = 0;
    for (int64_t b = 0; b < nb; b++) {
        const int64_t c0 = coff[b], c1 = coff[b + 1];
        for (int64_t i = starts[b]; i < starts[b + 1]; i++) {
            const double *p = pts + i * ndim;
            for (int64_t c = c0; c < c1; c++) {
                const int64_t j = cand[c];
                const double s = sq_distance(p, obs + j * ndim, ndim, box);
                if (s <= r2) {
                    if (np >= cap)
                        return -1;
                    idx[np] = j;
                    dist[np] = sqrt(s);
                    np++;
                }
            }
            offsets[i - d0 + 1] = np;
        }
    }
    return np;
}
