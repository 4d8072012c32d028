/* libenkflow_intercept.so: an LD_PRELOAD shim that serves a model's netCDF reads and writes of its
 * restart's state variables from memory, so an unmodified netCDF model runs as an online runner.
 *
 * Started by `python -m enkflow.online.intercept` (see docs/intercept.md), which holds the runner's
 * connection to the server and hands the shim, per task, a shared memory segment (intercept_shm.h)
 * that says where the member's state is read from and where its forecast goes (in that segment, or
 * in place, in the server's own segments), and the path of the member's restart file
 * (ENKFLOW_INTERCEPT_FD, ENKFLOW_INTERCEPT_PATH). Without those variables the shim passes everything
 * through.
 *
 * For the intercepted path only:
 *   nc_open / nc__open      the real file is opened read-only (its other variables, dimensions and
 *                           attributes are read from it); the fields must be in it with their types
 *                           and shapes;
 *   nc_create / nc__create  the file is created diskless (in memory, never written): the model's
 *                           other variables vanish, the real restart stays as it is;
 *   nc_get_var* / nc_put_var*  (var, var1, vara, vars with unit strides; typed and untyped) on a
 *                           field: copied from where the state is (elements this run wrote: from
 *                           where they were written) / to where the forecast goes, in the field's
 *                           own type only; a write must tile the variable (each element once)
 *                           before nc_close;
 *   nc_put_var* on another variable of a file opened for writing: discarded, with a warning;
 *   nc_close                checks that every field written through the handle is complete.
 * Every other call, file and variable goes to the real libnetcdf (found with dlsym(RTLD_NEXT)).
 * Errors are netCDF status codes (nc_strerror gives their text), a line on stderr that starts with
 * "enkflow intercept:", and the first one is recorded for the wrapper, which fails the task with it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <limits.h>
#include <netcdf.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "intercept_box.h"
#include "intercept_core.h"

#define MAX_FIELDS ENKFLOW_SHM_MAX_FIELDS
#define MAX_HANDLES 64
#define MAX_WARNED 64

enum { INERT = 1, ACTIVE = 2, BROKEN = 3 };

typedef struct {
    int ncid;
    int created;      /* nc_create'd (diskless): fields are found by name on first use */
    int writable;     /* the model asked for NC_WRITE (or created the file) */
    int varid[MAX_FIELDS];  /* -1 unknown yet (created files), -2 not in the file */
    uint64_t touched;       /* fields written through this handle */
} handle;

static struct {
    int state;
    int trace;
    char path[PATH_MAX];
    enkflow_layout L;
    enkflow_shm_header *hdr;      /* of L, once it checks out */
    enkflow_shm_field *f;
    const uint64_t *elements;
    uint8_t *bitmap[MAX_FIELDS];  /* written elements of a partial write generation */
    handle h[MAX_HANDLES];
    int nh;
    char warned[MAX_WARNED][NC_MAX_NAME + 1];
    int nwarned;
} S;

static void record(const char *msg);

/* A loaded libnetcdf that is not in the global scope: one a Python extension (netCDF4's wheel) or a
 * plugin loaded with RTLD_LOCAL brings along, which dlsym(RTLD_NEXT) does not search. */
static int find_netcdf(struct dl_phdr_info *info, size_t size, void *out) {
    (void)size;
    const char *base = info->dlpi_name ? strrchr(info->dlpi_name, '/') : NULL;
    base = base ? base + 1 : info->dlpi_name;
    if (base && strncmp(base, "libnetcdf", 9) == 0 && base[9] != 'f' && !strstr(base, "intercept")) {
        *(void **)out = dlopen(info->dlpi_name, RTLD_LAZY | RTLD_NOLOAD);
        return *(void **)out != NULL;
    }
    return 0;
}

void *enkflow_next_symbol(const char *name) {
    void *p = dlsym(RTLD_NEXT, name);
    if (!p) {
        static void *local;
        if (!local)
            dl_iterate_phdr(find_netcdf, &local);
        if (local)
            p = dlsym(local, name);
    }
    if (!p) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s not found in any loaded netCDF library", name);
        record(msg);
    }
    return p;
}

#define REAL(name) ((__typeof__(&name))real_##name())
#define DEFINE_REAL(name) \
    static void *real_##name(void) { static void *p; if (!p) p = enkflow_next_symbol(#name); return p; }

DEFINE_REAL(nc_inq_varid)
DEFINE_REAL(nc_inq_varname)
DEFINE_REAL(nc_inq_vartype)
DEFINE_REAL(nc_inq_varndims)
DEFINE_REAL(nc_inq_vardimid)
DEFINE_REAL(nc_inq_dimlen)
DEFINE_REAL(nc_inq_unlimdims)

static void record(const char *msg) {
    fprintf(stderr, "enkflow intercept: %s\n", msg);
    fflush(stderr);
    if (S.hdr && !S.hdr->error_set) {
        snprintf(S.hdr->error, sizeof S.hdr->error, "%s", msg);
        S.hdr->error_set = 1;
    }
}

int enkflow_fail(int code, const char *fmt, ...) {
    char msg[ENKFLOW_SHM_ERROR];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* The real nc_strerror: a libnetcdf outside the global scope leaves the direct symbol unresolved. */
    static const char *(*strerror_fn)(int);
    if (!strerror_fn)
        strerror_fn = (const char *(*)(int))enkflow_next_symbol("nc_strerror");
    if (n >= 0 && (size_t)n < sizeof msg - 40 && strerror_fn)
        snprintf(msg + n, sizeof msg - (size_t)n, " (%s)", strerror_fn(code));
    record(msg);
    return code;
}

static const char *type_name(int t) {
    switch (t) {
    case NC_BYTE: return "schar"; case NC_CHAR: return "text"; case NC_SHORT: return "short";
    case NC_INT: return "int"; case NC_FLOAT: return "float"; case NC_DOUBLE: return "double";
    case NC_UBYTE: return "uchar"; case NC_USHORT: return "ushort"; case NC_UINT: return "uint";
    case NC_INT64: return "longlong"; case NC_UINT64: return "ulonglong"; case NC_STRING: return "string";
    default: return "?";
    }
}

static void init(void) {
    if (S.state)
        return;
    S.state = INERT;
    const char *fd_s = getenv("ENKFLOW_INTERCEPT_FD"), *path = getenv("ENKFLOW_INTERCEPT_PATH");
    if (!fd_s || !path || !*fd_s)
        return;
    S.trace = getenv("ENKFLOW_INTERCEPT_TRACE") && atoi(getenv("ENKFLOW_INTERCEPT_TRACE")) > 0;
    S.state = BROKEN;  /* until the segment checks out: the restart must then not be read from its file */
    snprintf(S.path, sizeof S.path, "%s", path);
    char why[ENKFLOW_SHM_ERROR];
    int bad = enkflow_layout_map(atoi(fd_s), &S.L, why, sizeof why);
    S.hdr = S.L.hdr;  /* errors are recorded from here on */
    if (bad) {
        record(why);
        return;
    }
    S.f = S.L.f;
    S.elements = S.L.elements;
    S.state = ACTIVE;
}

/* The absolute, symlink-free form of ``path``; for a file that does not exist yet, that of its directory. */
static int canonical(const char *path, char *out) {
    if (realpath(path, out))
        return 1;
    char dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (slash) {
        size_t n = (size_t)(slash - path);
        if (n >= sizeof dir)
            return 0;
        memcpy(dir, path, n);
        dir[n] = '\0';
        if (n == 0)
            strcpy(dir, "/");
    } else {
        strcpy(dir, ".");
    }
    char rdir[PATH_MAX];
    if (!realpath(dir, rdir) || strlen(rdir) + 1 + strlen(base) >= PATH_MAX)
        return 0;
    size_t nd = strcmp(rdir, "/") ? strlen(rdir) : 0;
    memcpy(out, rdir, nd);
    out[nd] = '/';
    strcpy(out + nd + 1, base);
    return 1;
}

int enkflow_target(const char *path) {
    init();
    if (S.state == INERT || !path)
        return 0;
    char c[PATH_MAX];
    if (!canonical(path, c) || strcmp(c, S.path) != 0)
        return 0;
    return S.state == ACTIVE ? 1 : -1;
}

static handle *find(int ncid) {
    for (int i = 0; i < S.nh; i++)
        if (S.h[i].ncid == ncid)
            return &S.h[i];
    return NULL;
}

static void forget(int ncid) {
    for (int i = 0; i < S.nh; i++)
        if (S.h[i].ncid == ncid) {
            S.h[i] = S.h[--S.nh];
            return;
        }
}

/* The field's type and shape against the variable ``varid`` of ``ncid``. */
static int check_var(int ncid, int varid, uint32_t k, const char *where) {
    enkflow_shm_field *f = &S.f[k];
    nc_type t;
    int nd, dims[NC_MAX_VAR_DIMS], st;
    if ((st = REAL(nc_inq_vartype)(ncid, varid, &t)) || (st = REAL(nc_inq_varndims)(ncid, varid, &nd)))
        return st;
    if (t != f->nctype)
        return enkflow_fail(NC_EBADTYPE, "variable %s of %s is %s in the file, the online field is %s", f->name, where,
                    type_name(t), type_name(f->nctype));
    if (nd != f->ndims)
        return enkflow_fail(NC_EINVAL, "variable %s of %s has %d dimensions, the online field %d", f->name, where, nd, f->ndims);
    if ((st = REAL(nc_inq_vardimid)(ncid, varid, dims)))
        return st;
    int nunlim = 0, unlim[NC_MAX_DIMS];
    if (REAL(nc_inq_unlimdims)(ncid, &nunlim, unlim))
        nunlim = 0;
    for (int d = 0; d < nd; d++) {
        size_t len;
        if ((st = REAL(nc_inq_dimlen)(ncid, dims[d], &len)))
            return st;
        int is_unlim = 0;
        for (int u = 0; u < nunlim; u++)
            is_unlim |= unlim[u] == dims[d];
        if (len != (size_t)f->shape[d] && !(is_unlim && len == 0))
            return enkflow_fail(NC_EINVAL, "variable %s of %s: dimension %d has %zu elements, the online field %lld", f->name,
                        where, d, len, (long long)f->shape[d]);
    }
    return NC_NOERR;
}

static int add_handle(int ncid, int created, int writable) {
    if (S.nh == MAX_HANDLES)
        return enkflow_fail(NC_ENFILE, "more than %d handles of %s open at once", MAX_HANDLES, S.path);
    handle *h = &S.h[S.nh++];
    memset(h, 0, sizeof *h);
    h->ncid = ncid;
    h->created = created;
    h->writable = writable;
    for (uint32_t k = 0; k < S.hdr->nfields; k++)
        h->varid[k] = -1;
    if (created)
        return NC_NOERR;
    for (uint32_t k = 0; k < S.hdr->nfields; k++) {
        int st = REAL(nc_inq_varid)(ncid, S.f[k].name, &h->varid[k]);
        if (st == NC_ENOTVAR)
            return enkflow_fail(NC_ENOTVAR, "the online field %s is not a variable of %s", S.f[k].name, S.path);
        if (st || (st = check_var(ncid, h->varid[k], k, S.path)))
            return st;
    }
    return NC_NOERR;
}

/* The field that ``varid`` of ``ncid`` is, or -1 (not intercepted); an error sets *status. */
static int field_of(handle *h, int varid, int *status) {
    *status = NC_NOERR;
    for (uint32_t k = 0; k < S.hdr->nfields; k++)
        if (h->varid[k] == varid)
            return (int)k;
    if (!h->created)
        return -1;
    char name[NC_MAX_NAME + 1];
    if (REAL(nc_inq_varname)(h->ncid, varid, name))
        return -1;
    for (uint32_t k = 0; k < S.hdr->nfields; k++)
        if (h->varid[k] == -1 && strcmp(name, S.f[k].name) == 0) {
            if ((*status = check_var(h->ncid, varid, k, S.path)))
                return -1;
            h->varid[k] = varid;
            return (int)k;
        }
    return -1;
}

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* One get or put on a field. ``memtype`` NC_NAT for the untyped calls; ``start``/``count`` NULL for the
 * whole variable; ``one`` for var1 (``start`` is the index). */
static int access_field(int op, const char *fn, handle *h, int k, nc_type memtype, const size_t *start,
                        const size_t *count, int one, const ptrdiff_t *stride, const ptrdiff_t *imap, void *mem) {
    enkflow_shm_field *f = &S.f[k];
    uint64_t t0 = now_ns();
    if (memtype != NC_NAT && memtype != f->nctype)
        return enkflow_fail(NC_EBADTYPE, "%s on variable %s of %s: the variable is %s, read and written only as such when "
                    "intercepted (no conversion)", fn, f->name, S.path, type_name(f->nctype));
    if (imap)
        return enkflow_fail(NC_EINVAL, "%s on variable %s of %s: mapped access (varm) is not intercepted", fn, f->name, S.path);
    int nd = f->ndims;
    if (stride)
        for (int d = 0; d < nd; d++)
            if (stride[d] != 1)
                return enkflow_fail(NC_EINVAL, "%s on variable %s of %s: strided access (stride %td in dimension %d) is not "
                            "intercepted", fn, f->name, S.path, stride[d], d);
    size_t st0[ENKFLOW_SHM_MAX_DIMS], ct[ENKFLOW_SHM_MAX_DIMS];
    uint64_t n = 1;
    for (int d = 0; d < nd; d++) {
        st0[d] = start ? start[d] : 0;
        ct[d] = one ? 1 : count ? count[d] : (size_t)f->shape[d];
        if (st0[d] > (size_t)f->shape[d] || (one && st0[d] == (size_t)f->shape[d]))
            return enkflow_fail(NC_EINVALCOORDS, "%s on variable %s of %s: start %zu in dimension %d of %lld", fn, f->name,
                        S.path, st0[d], d, (long long)f->shape[d]);
        if (ct[d] > (size_t)f->shape[d] - st0[d])  /* not st0 + ct, which a huge count wraps around */
            return enkflow_fail(NC_EEDGE, "%s on variable %s of %s: start %zu + count %zu in dimension %d of %lld", fn,
                        f->name, S.path, st0[d], ct[d], d, (long long)f->shape[d]);
        n *= ct[d];
    }
    if (S.trace)
        fprintf(stderr, "enkflow intercept: %s %s (%llu elements)\n", fn, f->name, (unsigned long long)n);
    if (op == GET) {
        enkflow_huge_pages_for(mem, n * S.L.esize[k]);
        int written = f->generations > 0;  /* else the first write may be under way: its bitmap says */
        enkflow_box_get(&S.L, (uint32_t)k, st0, ct, mem, written || !f->elements_written ? NULL : S.bitmap[k], written);
        f->elements_read += n;
        S.hdr->get_ns += now_ns() - t0;
        return NC_NOERR;
    }
    if (!h->writable)
        return enkflow_fail(NC_EPERM, "%s on variable %s: %s was opened read-only", fn, f->name, S.path);
    if (n == 0) {  /* an empty hyperslab writes nothing, and starts no new write of the variable */
        S.hdr->put_ns += now_ns() - t0;
        return NC_NOERR;
    }
    enkflow_layout_prefault(&S.L, 1);  /* unless under way since the model closed what it read */
    if (f->complete) {  /* a new write of the variable (a model that rewrites its restart) */
        f->complete = 0;
        f->nonfinite = 0;
        f->elements_written = 0;
        if (S.bitmap[k])
            memset(S.bitmap[k], 0, (S.elements[k] + 7) / 8);
    }
    int finite;
    if (n == S.elements[k] && f->elements_written == 0) {
        finite = enkflow_box_put(&S.L, (uint32_t)k, st0, ct, mem, NULL);  /* the whole variable at once: no bookkeeping */
    } else {
        if (!S.bitmap[k] && !(S.bitmap[k] = calloc((S.elements[k] + 7) / 8, 1)))
            return enkflow_fail(NC_ENOMEM, "%s on variable %s: no memory for the write map", fn, f->name);
        uint64_t overlap = enkflow_box_overlap(&S.L, (uint32_t)k, st0, ct, S.bitmap[k]);
        if (overlap)
            return enkflow_fail(NC_EINVAL, "%s on variable %s of %s: element %llu (C order) is written twice; the "
                                "hyperslabs written must tile the variable, each element once", fn, f->name, S.path,
                                (unsigned long long)(overlap - 1));
        finite = enkflow_box_put(&S.L, (uint32_t)k, st0, ct, mem, S.bitmap[k]);
    }
    if (!finite)
        f->nonfinite = 1;
    f->elements_written += n;
    h->touched |= 1ull << k;
    if (f->elements_written == S.elements[k]) {
        f->complete = 1;
        f->generations++;
    }
    S.hdr->put_ns += now_ns() - t0;
    return NC_NOERR;
}

static int warned(const char *name) {
    for (int i = 0; i < S.nwarned; i++)
        if (strcmp(S.warned[i], name) == 0)
            return 1;
    if (S.nwarned < MAX_WARNED)
        snprintf(S.warned[S.nwarned++], sizeof S.warned[0], "%s", name);
    return 0;
}

int enkflow_intercept(int op, const char *fn, int ncid, int varid, nc_type memtype, int kind, const size_t *start,
                      const size_t *count, const ptrdiff_t *stride, const ptrdiff_t *imap, void *mem, int *handled) {
    *handled = 0;
    if (S.state != ACTIVE || !S.nh)
        return NC_NOERR;
    handle *h = find(ncid);
    if (!h)
        return NC_NOERR;
    int st, k = field_of(h, varid, &st);
    if (st) {
        *handled = 1;
        return st;
    }
    if (k < 0) {
        if (op == PUT && h->writable && !h->created) {
            /* Opened read-only underneath: the restart file is not the place a forecast goes to. */
            char name[NC_MAX_NAME + 1] = "?";
            int bad = REAL(nc_inq_varname)(ncid, varid, name);
            *handled = 1;
            if (bad)  /* no such variable: libnetcdf's status (NC_ENOTVAR), not a discarded write */
                return bad;
            if (!warned(name))
                fprintf(stderr, "enkflow intercept: warning: %s writes variable %s of %s, which is not an online "
                        "field: the write is discarded (list it in [online] carried if the model needs it back)\n",
                        fn, name, S.path);
            *handled = 1;
            return NC_NOERR;
        }
        return NC_NOERR;
    }
    *handled = 1;
    if (kind != KIND_VAR && !start && S.f[k].ndims > 0)  /* libnetcdf's answer: no default start */
        return enkflow_fail(NC_EINVALCOORDS, "%s on variable %s of %s: no start index (NULL)", fn, S.f[k].name, S.path);
    return access_field(op, fn, h, k, memtype, start, count, kind == KIND_VAR1, stride, imap, mem);
}

int enkflow_tracing(void) {
    return S.trace;
}

/* A handle of the intercepted restart: its fields checked; counted among the opens the wrapper checks. */
static int add_opened(int ncid, int created, int writable) {
    S.hdr->opens++;
    int st = add_handle(ncid, created, writable);
    if (st)
        forget(ncid);
    return st;
}

int enkflow_opened(int ncid, int mode) {
    int st = add_opened(ncid, 0, (mode & NC_WRITE) != 0);
    if (st)
        ((__typeof__(&nc_close))enkflow_next_symbol("nc_close"))(ncid);
    return st;
}

int enkflow_created(int ncid) {
    return add_opened(ncid, 1, 1);
}

int enkflow_closing(int ncid) {
    handle *h = S.state == ACTIVE ? find(ncid) : NULL;
    int bad = NC_NOERR;
    if (h) {
        for (uint32_t k = 0; k < S.hdr->nfields; k++)
            if ((h->touched >> k & 1) && !S.f[k].complete && !bad)
                bad = enkflow_fail(NC_EINVAL, "nc_close of %s: variable %s was written only in part (%llu of %llu "
                                   "elements); the hyperslabs written must tile the variable", S.path, S.f[k].name,
                                   (unsigned long long)S.f[k].elements_written, (unsigned long long)S.elements[k]);
        forget(ncid);
    }
    return bad;
}

void enkflow_closed(void) {
    int read = 0;
    for (uint32_t k = 0; S.state == ACTIVE && k < S.hdr->nfields; k++)
        read |= S.f[k].elements_read > 0;
    if (read)  /* the model has its state: where its forecast goes is readied while it runs */
        enkflow_layout_prefault(&S.L, 0);
}

void enkflow_aborting(int ncid) {
    if (S.state == ACTIVE)
        forget(ncid);
}
