/* A plain netCDF model in C that knows nothing of enkflow: the demo model's dynamics
 * (enkflow.models.demo_model), bit for bit.
 *
 *     c_netcdf_model RESTART --forcing FORCING --length HOURS [--cycle N] [--var NAME]
 *
 * It reads the state variable (default soil_moisture, double on the land points) and the grid
 * indices land_i/land_j of RESTART, the forcing pattern `pattern(lat, lon)` of FORCING, advances
 * round(HOURS) steps of one hour starting at hour (N - 1) * HOURS, and writes the state back into
 * RESTART in place (nc_open NC_WRITE + nc_put_var_double). Run through `python -m
 * enkflow.online.intercept` it becomes an online runner with no change (docs/intercept.md).
 *
 * The arithmetic is the Python model's, operation by operation and in its order (compile without
 * FMA contraction: -ffp-contract=off), so both give the same bits.
 */
#include <math.h>
#include <netcdf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ADVECTION 0.2
#define DIFFUSION 0.05
#define FORCING 0.01
#define PERIOD_HOURS 24.0
#define DT_HOURS 1.0

static void check(int status, const char *what, const char *path) {
    if (status != NC_NOERR) {
        fprintf(stderr, "c_netcdf_model: %s (%s): %s\n", what, path, nc_strerror(status));
        exit(1);
    }
}

static size_t dimlen(int ncid, const char *name, const char *path) {
    int dim;
    size_t n;
    check(nc_inq_dimid(ncid, name, &dim), name, path);
    check(nc_inq_dimlen(ncid, dim, &n), name, path);
    return n;
}

static void usage(void) {
    fprintf(stderr, "usage: c_netcdf_model RESTART --forcing FORCING --length HOURS [--cycle N] [--var NAME]\n");
    exit(2);
}

int main(int argc, char **argv) {
    const char *restart = NULL, *forcing = NULL, *var = "soil_moisture";
    double length = -1.0;
    long cycle = 1;
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--forcing") && a + 1 < argc) forcing = argv[++a];
        else if (!strcmp(argv[a], "--length") && a + 1 < argc) length = atof(argv[++a]);
        else if (!strcmp(argv[a], "--cycle") && a + 1 < argc) cycle = atol(argv[++a]);
        else if (!strcmp(argv[a], "--var") && a + 1 < argc) var = argv[++a];
        else if (argv[a][0] != '-' && !restart) restart = argv[a];
        else usage();
    }
    if (!restart || !forcing || !(length > 0.0) || cycle < 1)
        usage();

    int ncid, vid;
    check(nc_open(restart, NC_NOWRITE, &ncid), "nc_open", restart);
    size_t nx = dimlen(ncid, "lon", restart), ny = dimlen(ncid, "lat", restart), np = dimlen(ncid, "land", restart);
    double *x = malloc(np * sizeof *x);
    int *li = malloc(np * sizeof *li), *lj = malloc(np * sizeof *lj);
    double *u = calloc(nx * ny, sizeof *u), *un = calloc(nx * ny, sizeof *un), *pat = malloc(nx * ny * sizeof *pat);
    unsigned char *land = calloc(nx * ny, 1);
    if (!x || !li || !lj || !u || !un || !pat || !land) {
        fprintf(stderr, "c_netcdf_model: out of memory\n");
        return 1;
    }
    check(nc_inq_varid(ncid, var, &vid), var, restart);
    check(nc_get_var_double(ncid, vid, x), var, restart);
    check(nc_inq_varid(ncid, "land_i", &vid), "land_i", restart);
    check(nc_get_var_int(ncid, vid, li), "land_i", restart);
    check(nc_inq_varid(ncid, "land_j", &vid), "land_j", restart);
    check(nc_get_var_int(ncid, vid, lj), "land_j", restart);
    check(nc_close(ncid), "nc_close", restart);

    check(nc_open(forcing, NC_NOWRITE, &ncid), "nc_open", forcing);
    if (dimlen(ncid, "lon", forcing) != nx || dimlen(ncid, "lat", forcing) != ny) {
        fprintf(stderr, "c_netcdf_model: %s is not on the grid of %s\n", forcing, restart);
        return 1;
    }
    check(nc_inq_varid(ncid, "pattern", &vid), "pattern", forcing);
    check(nc_get_var_double(ncid, vid, pat), "pattern", forcing);
    check(nc_close(ncid), "nc_close", forcing);

    for (size_t p = 0; p < np; p++) {
        if (!isfinite(x[p])) {
            fprintf(stderr, "c_netcdf_model: %s: %s holds NaN or Inf\n", restart, var);
            return 1;
        }
        land[(size_t)lj[p] * nx + (size_t)li[p]] = 1;
        u[(size_t)lj[p] * nx + (size_t)li[p]] = x[p];
    }
    long nsteps = (long)nearbyint(length / DT_HOURS);
    if (nsteps < 1)
        nsteps = 1;
    double start_hour = (double)(cycle - 1) * length, dt = DT_HOURS;
    for (long k = 0; k < nsteps; k++) {
        double t = start_hour + (double)k * dt;
        double f = FORCING * sin(2.0 * M_PI * t / PERIOD_HOURS);
        for (size_t j = 0; j < ny; j++)
            for (size_t i = 0; i < nx; i++) {
                size_t c = j * nx + i, w = j * nx + (i + nx - 1) % nx, e = j * nx + (i + 1) % nx;
                if (!land[c]) {
                    un[c] = 0.0;
                    continue;
                }
                double uc = u[c], uw = land[w] ? u[w] : uc;
                double tend = -ADVECTION * (uc - uw);
                /* neighbours in the Python model's order: south (j-1), north (j+1), west, east */
                tend += DIFFUSION * ((j > 0 && land[c - nx]) ? u[c - nx] - uc : 0.0);
                tend += DIFFUSION * ((j + 1 < ny && land[c + nx]) ? u[c + nx] - uc : 0.0);
                tend += DIFFUSION * (land[w] ? u[w] - uc : 0.0);
                tend += DIFFUSION * (land[e] ? u[e] - uc : 0.0);
                tend += f * pat[c];
                un[c] = uc + dt * tend;
            }
        double *s = u;
        u = un;
        un = s;
    }
    for (size_t p = 0; p < np; p++)
        x[p] = u[(size_t)lj[p] * nx + (size_t)li[p]];

    check(nc_open(restart, NC_WRITE, &ncid), "nc_open for writing", restart);
    check(nc_inq_varid(ncid, var, &vid), var, restart);
    check(nc_put_var_double(ncid, vid, x), var, restart);
    check(nc_close(ncid), "nc_close", restart);
    return 0;
}
