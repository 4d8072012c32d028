/* The demo model (enkflow.models.demo_model) as a C online runner over libenkflow_runner.
 *
 *   enkflow_demo_c --address ADDR --token-file FILE --grid RESTART --forcing FORCING.nc --length HOURS
 *                  [--curve-key KEY] [--sleep S] [--crash-in-library MARKER] [--abort-in-cycle K --marker MARKER]
 *                  [--crash-in-put K --put-marker MARKER]
 *                  [--output-address ADDR --output-token-file FILE [--output-field NAME]]
 *
 * The same floating-point operations in the same order as DemoModel.advance, on the whole (lat, lon) grid,
 * so a forecast is bitwise the Python model's. The forcing pattern comes from FORCING.nc (written by
 * native/examples/demo_forcing.py; why: see there). The grid (land points) comes from RESTART.
 *
 * Fault injection for the tests, once per MARKER file (the replacement runner then works normally):
 * --crash-in-library binds the state to an invalid address before the first expose, so the library
 * crashes (SIGSEGV) writing the first member it receives; --abort-in-cycle K calls abort() right after
 * receiving a member of cycle K; --crash-in-put K places the state across a page boundary and, after a
 * forecast of cycle K, makes its second half unreadable: the library crashes (SIGSEGV) copying the forecast
 * into the task's slot (or into its PUT message over TCP), half of it written. SIGTERM makes the runner leave cleanly (BYE), from a forecast or from a
 * wait for the server (enkflow_runner_set_stop_flag), with exit status 143 as the Python runner.
 *
 * Model output (enkflow_output.h): with --output-address (the {output_address} of the runner command; empty:
 * none), every forecast's (lat, lon) grid is added to the study's output service as field NAME (default
 * the state variable's name; [output.fields] must declare it with dims ["lat", "lon"]) at its end hour,
 * for its member; the writers write it while the model goes on. An output error stops the runner.
 */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <netcdf.h>

#include "enkflow_output.h"
#include "enkflow_runner.h"

#define DT_HOURS 1.0
#define ADVECTION 0.2
#define DIFFUSION 0.05
#define FORCING 0.01
#define PERIOD_HOURS 24.0
#define PI 3.141592653589793 /* math.pi */

typedef struct grid {
    size_t nx, ny, nland;
    int *li, *lj;       /* land point -> lon, lat index */
    unsigned char *land; /* (ny, nx) */
    double *pattern;     /* (ny, nx) */
} grid;

static volatile sig_atomic_t leave = 0;
static void on_term(int sig) { (void)sig; leave = 1; }

static int nc_fail(int status, const char *what, const char *path) {
    fprintf(stderr, "enkflow_demo_c: %s: %s: %s\n", path, what, nc_strerror(status));
    return 1;
}

static int read_grid(const char *restart, const char *forcing, const char *variable, grid *g, nc_type *xtype) {
    int nc, st, dim, var;
    if ((st = nc_open(restart, NC_NOWRITE, &nc))) return nc_fail(st, "open", restart);
    if ((st = nc_inq_dimid(nc, "lon", &dim)) || (st = nc_inq_dimlen(nc, dim, &g->nx))) return nc_fail(st, "lon", restart);
    if ((st = nc_inq_dimid(nc, "lat", &dim)) || (st = nc_inq_dimlen(nc, dim, &g->ny))) return nc_fail(st, "lat", restart);
    if ((st = nc_inq_dimid(nc, "land", &dim)) || (st = nc_inq_dimlen(nc, dim, &g->nland)))
        return nc_fail(st, "land", restart);
    g->li = malloc(g->nland * sizeof *g->li);
    g->lj = malloc(g->nland * sizeof *g->lj);
    g->land = calloc(g->nx * g->ny, 1);
    g->pattern = malloc(g->nx * g->ny * sizeof *g->pattern);
    if (!g->li || !g->lj || !g->land || !g->pattern) {
        fprintf(stderr, "enkflow_demo_c: out of memory\n");
        return 1;
    }
    if ((st = nc_inq_varid(nc, "land_i", &var)) || (st = nc_get_var_int(nc, var, g->li)))
        return nc_fail(st, "land_i", restart);
    if ((st = nc_inq_varid(nc, "land_j", &var)) || (st = nc_get_var_int(nc, var, g->lj)))
        return nc_fail(st, "land_j", restart);
    if ((st = nc_inq_varid(nc, variable, &var)) || (st = nc_inq_vartype(nc, var, xtype)))
        return nc_fail(st, variable, restart);
    nc_close(nc);
    for (size_t p = 0; p < g->nland; p++) {
        if (g->li[p] < 0 || (size_t)g->li[p] >= g->nx || g->lj[p] < 0 || (size_t)g->lj[p] >= g->ny) {
            fprintf(stderr, "enkflow_demo_c: %s: land point %zu outside the grid\n", restart, p);
            return 1;
        }
        g->land[(size_t)g->lj[p] * g->nx + (size_t)g->li[p]] = 1;
    }
    size_t ny, nx;
    if ((st = nc_open(forcing, NC_NOWRITE, &nc))) return nc_fail(st, "open", forcing);
    if ((st = nc_inq_dimid(nc, "lon", &dim)) || (st = nc_inq_dimlen(nc, dim, &nx)) || (st = nc_inq_dimid(nc, "lat", &dim)) ||
        (st = nc_inq_dimlen(nc, dim, &ny)))
        return nc_fail(st, "lon/lat", forcing);
    if (nx != g->nx || ny != g->ny) {
        fprintf(stderr, "enkflow_demo_c: %s is for a %zux%zu grid, the restart's is %zux%zu\n", forcing, nx, ny, g->nx, g->ny);
        return 1;
    }
    if ((st = nc_inq_varid(nc, "pattern", &var)) || (st = nc_get_var_double(nc, var, g->pattern)))
        return nc_fail(st, "pattern", forcing);
    nc_close(nc);
    return 0;
}

/* DemoModel(length = nsteps h, start_hour).advance on the (ny, nx) grid u, in place; w is scratch. */
static void advance(const grid *g, double *u, double *tend, int64_t nsteps, double start_hour) {
    const size_t nx = g->nx, ny = g->ny;
    const double dt = DT_HOURS / 1.0;
    for (int64_t k = 0; k < nsteps; k++) {
        double t = start_hour + (double)k * dt;
        double c = FORCING * sin(2.0 * PI * t / PERIOD_HOURS);
        for (size_t j = 0; j < ny; j++) {
            for (size_t i = 0; i < nx; i++) {
                size_t at = j * nx + i;
                size_t west = j * nx + (i + nx - 1) % nx, east = j * nx + (i + 1) % nx;
                double uc = u[at];
                double uw = g->land[west] ? u[west] : uc;
                double tt = -ADVECTION * (uc - uw);
                /* The neighbours in DemoModel's order: south (roll +1 along lat), north, west, east. */
                int s_ok = j > 0 && g->land[at - nx] && g->land[at];
                int n_ok = j + 1 < ny && g->land[at + nx] && g->land[at];
                tt += DIFFUSION * (s_ok ? u[at - nx] - uc : 0.0);
                tt += DIFFUSION * (n_ok ? u[at + nx] - uc : 0.0);
                tt += DIFFUSION * ((g->land[west] && g->land[at]) ? u[west] - uc : 0.0);
                tt += DIFFUSION * ((g->land[east] && g->land[at]) ? u[east] - uc : 0.0);
                tt += c * g->pattern[at];
                tend[at] = tt;
            }
        }
        for (size_t at = 0; at < nx * ny; at++) u[at] = g->land[at] ? u[at] + dt * tend[at] : 0.0;
    }
}

static int once(const char *marker) {
    if (!marker) return 0;
    int fd = open(marker, O_CREAT | O_EXCL | O_WRONLY, 0644);
    if (fd < 0) return 0;
    close(fd);
    return 1;
}

/* An array of `bytes` bytes whose second half starts on a page of its own (*tail, *tail_bytes long). */
static void *straddling(size_t bytes, char **tail, size_t *tail_bytes) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE), head = bytes / 2;
    size_t head_pages = (head + page - 1) / page * page;
    *tail_bytes = (bytes - head + page - 1) / page * page;
    void *base;
    if (posix_memalign(&base, page, head_pages + *tail_bytes)) return NULL;
    *tail = (char *)base + head_pages;
    return memset(*tail - head, 0, bytes);
}

static void usage(void) {
    fprintf(stderr, "usage: enkflow_demo_c --address ADDR --token-file FILE --grid RESTART --forcing FORCING.nc "
                    "--length HOURS [--variable NAME] [--curve-key KEY] [--sleep S] [--crash-in-library MARKER] "
                    "[--abort-in-cycle K --marker MARKER] [--crash-in-put K --put-marker MARKER] [--output-address ADDR --output-token-file FILE "
                    "[--output-field NAME]]\n");
}

int main(int argc, char **argv) {
    const char *address = NULL, *token_file = NULL, *restart = NULL, *forcing = NULL, *curve = "", *variable = "soil_moisture";
    const char *crash_marker = NULL, *marker = NULL, *put_marker = NULL;
    const char *out_address = "", *out_token = "", *out_field = NULL;
    double length = 6.0, sleep_s = 0.0;
    long abort_cycle = -1, put_cycle = -1;
    for (int a = 1; a < argc; a++) {
        const char *opt = argv[a], *val = NULL;
        const char *eq = strchr(opt, '=');
        char key[64];
        if (eq && (size_t)(eq - opt) < sizeof key) {
            memcpy(key, opt, (size_t)(eq - opt));
            key[eq - opt] = 0;
            opt = key;
            val = eq + 1;
        } else if (a + 1 < argc) {
            val = argv[++a];
        } else {
            usage();
            return 2;
        }
        if (!strcmp(opt, "--address")) address = val;
        else if (!strcmp(opt, "--token-file")) token_file = val;
        else if (!strcmp(opt, "--grid")) restart = val;
        else if (!strcmp(opt, "--forcing")) forcing = val;
        else if (!strcmp(opt, "--length")) length = strtod(val, NULL);
        else if (!strcmp(opt, "--variable")) variable = val;
        else if (!strcmp(opt, "--curve-key")) curve = val;
        else if (!strcmp(opt, "--sleep")) sleep_s = strtod(val, NULL);
        else if (!strcmp(opt, "--crash-in-library")) crash_marker = val;
        else if (!strcmp(opt, "--abort-in-cycle")) abort_cycle = strtol(val, NULL, 10);
        else if (!strcmp(opt, "--marker")) marker = val;
        else if (!strcmp(opt, "--crash-in-put")) put_cycle = strtol(val, NULL, 10);
        else if (!strcmp(opt, "--put-marker")) put_marker = val;
        else if (!strcmp(opt, "--output-address")) out_address = val;
        else if (!strcmp(opt, "--output-token-file")) out_token = val;
        else if (!strcmp(opt, "--output-field")) out_field = val;
        else {
            usage();
            return 2;
        }
    }
    if (!address || !token_file || !restart || !forcing || !(length > 0) || sleep_s < 0) {
        usage();
        return 2;
    }
    grid g = {0};
    nc_type xtype;
    if (read_grid(restart, forcing, variable, &g, &xtype)) return 1;
    if (xtype != NC_DOUBLE && xtype != NC_FLOAT) {
        fprintf(stderr, "enkflow_demo_c: %s: %s is neither float nor double\n", restart, variable);
        return 1;
    }
    enkflow_dtype dtype = xtype == NC_DOUBLE ? ENKFLOW_FLOAT64 : ENKFLOW_FLOAT32;
    size_t cells = g.nx * g.ny, isz = xtype == NC_DOUBLE ? 8 : 4;
    double *u = malloc(cells * sizeof *u), *tend = malloc(cells * sizeof *tend);
    char *tail = NULL;
    size_t tail_bytes = 0;
    void *x = put_cycle < 0 ? calloc(g.nland ? g.nland : 1, isz) : straddling((g.nland ? g.nland : 1) * isz, &tail, &tail_bytes);
    if (!u || !tend || !x) {
        fprintf(stderr, "enkflow_demo_c: out of memory\n");
        return 1;
    }

    char token[1024], err[1024];
    int rc = enkflow_read_token_file(token_file, token, sizeof token, err, sizeof err);
    if (rc) {
        fprintf(stderr, "enkflow_demo_c: %s\n", err);
        return 1;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, NULL);

    enkflow_output *out = NULL;
    if (*out_address) {
        rc = enkflow_output_open(&out, out_address, out_token, 0);
        if (rc) {
            fprintf(stderr, "enkflow_demo_c: output: error %d: %s\n", rc, enkflow_output_errmsg(out));
            enkflow_output_free(out);
            return 1;
        }
    }
    int64_t grid_shape[2] = {(int64_t)g.ny, (int64_t)g.nx};
    int out_rc = 0;

    enkflow_runner *r = NULL;
    int64_t n = (int64_t)g.nland, nsteps = 0;
    rc = enkflow_runner_create(&r, address, token);
    if (!rc) rc = enkflow_runner_set_curve_key(r, curve);
    if (!rc) rc = enkflow_runner_set_stop_flag(r, &leave); /* SIGTERM also ends a wait for the server */
    if (!rc) rc = enkflow_runner_add_field(r, variable, dtype, 1, &n, 1);
    if (!rc) rc = enkflow_runner_init(r);
    if (!rc) fprintf(stderr, "enkflow_demo_c: shared memory with %d server rank(s)\n", enkflow_runner_shm_ranks(r));
    if (!rc && once(crash_marker)) rc = enkflow_runner_bind(r, variable, dtype, (void *)(uintptr_t)16, n);
    else if (!rc) rc = enkflow_runner_bind(r, variable, dtype, x, n);
    if (!rc) rc = enkflow_runner_expose(r, &nsteps);
    while (!rc && nsteps > 0 && !leave) {
        if (enkflow_runner_cycle(r) == abort_cycle && once(marker)) abort();
        for (size_t at = 0; at < cells; at++) u[at] = 0.0;
        for (size_t p = 0; p < g.nland; p++)
            u[(size_t)g.lj[p] * g.nx + (size_t)g.li[p]] = dtype == ENKFLOW_FLOAT64 ? ((double *)x)[p] : ((float *)x)[p];
        double start_hour = (double)(enkflow_runner_cycle(r) - 1) * length;
        advance(&g, u, tend, nsteps, start_hour);
        if (out) { /* copied before add returns; written by the service while the model goes on */
            out_rc = enkflow_output_add(out, out_field ? out_field : variable, ENKFLOW_FLOAT64, u, 2, grid_shape,
                                        start_hour + (double)nsteps * DT_HOURS, enkflow_runner_member(r), NULL);
            if (out_rc) {
                rc = enkflow_runner_fail(r, enkflow_output_errmsg(out)); /* the member goes to another runner */
                break;
            }
        }
        for (size_t p = 0; p < g.nland; p++) {
            double v = u[(size_t)g.lj[p] * g.nx + (size_t)g.li[p]];
            if (dtype == ENKFLOW_FLOAT64) ((double *)x)[p] = v;
            else ((float *)x)[p] = (float)v;
        }
        if (sleep_s > 0) {
            struct timespec ts = {(time_t)sleep_s, (long)((sleep_s - (double)(time_t)sleep_s) * 1e9)};
            while (nanosleep(&ts, &ts) && !leave) {
            }
        }
        if (leave) break; /* SIGTERM mid-forecast: BYE below gives the member back at once */
        if (enkflow_runner_cycle(r) == put_cycle && once(put_marker)) mprotect(tail, tail_bytes, PROT_NONE);
        rc = enkflow_runner_expose(r, &nsteps);
    }
    if (rc && !(rc == ENKFLOW_EINTR && leave)) fprintf(stderr, "enkflow_demo_c: error %d: %s\n", rc, enkflow_runner_errmsg(r));
    enkflow_runner_finalize(r); /* BYE: a member held (SIGTERM mid-forecast) goes to another runner at once */
    if (out) {
        /* wait = 1: the writers' errors about this runner's fields come back here */
        if (!out_rc) out_rc = enkflow_output_close(out, !leave);
        if (out_rc) fprintf(stderr, "enkflow_demo_c: output: error %d: %s\n", out_rc, enkflow_output_errmsg(out));
        enkflow_output_free(out);
    }
    free(u);
    free(tend);
    if (put_cycle < 0) free(x);
    if (leave) return 128 + SIGTERM;
    return rc || out_rc ? 1 : 0;
}
