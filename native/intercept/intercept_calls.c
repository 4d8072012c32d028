/* The netCDF entry points of libenkflow_intercept.so (intercept.c says what each does for the intercepted
 * restart): each asks the core whether the call is the shim's, and passes it to the real libnetcdf if not. */
#define _GNU_SOURCE
#include <netcdf.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "intercept_core.h"

/* A model whose wrapper is gone (killed) is killed with it: its forecast could go nowhere. A process the
 * wrapper started is tied to it; it then names itself the parent for its own children, so that a model
 * behind a shell script dies with the shell, which died with the wrapper. A process whose parent is not
 * the one named (started by a program without the shim) is left alone. */
__attribute__((constructor)) static void die_with_wrapper(void) {
    const char *parent = getenv("ENKFLOW_INTERCEPT_PARENT");
    if (parent && getenv("ENKFLOW_INTERCEPT_FD") && (pid_t)atol(parent) == getppid()) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        char self[32];
        snprintf(self, sizeof self, "%ld", (long)getpid());
        setenv("ENKFLOW_INTERCEPT_PARENT", self, 1);
    }
}

/* -- opening and closing -------------------------------------------------------------------------- */

int nc_open(const char *path, int mode, int *ncidp) {
    static __typeof__(&nc_open) real;
    if (!real && !(real = (__typeof__(real))enkflow_next_symbol("nc_open")))
        return NC_ENOTNC;
    int t = enkflow_target(path);
    if (t < 0)
        return enkflow_fail(NC_EINVAL, "nc_open of %s: the interception is not set up (see the line above)", path);
    if (!t)
        return real(path, mode, ncidp);
    int st = real(path, mode & ~NC_WRITE, ncidp);
    if (enkflow_tracing())
        fprintf(stderr, "enkflow intercept: nc_open %s (mode %#x) -> %d\n", path, mode, st);
    return st ? st : enkflow_opened(*ncidp, mode);
}

int nc__open(const char *path, int mode, size_t *chunksizehintp, int *ncidp) {
    static __typeof__(&nc__open) real;
    if (!real && !(real = (__typeof__(real))enkflow_next_symbol("nc__open")))
        return NC_ENOTNC;
    int t = enkflow_target(path);
    if (t < 0)
        return enkflow_fail(NC_EINVAL, "nc__open of %s: the interception is not set up (see the line above)", path);
    if (!t)
        return real(path, mode, chunksizehintp, ncidp);
    int st = real(path, mode & ~NC_WRITE, chunksizehintp, ncidp);
    return st ? st : enkflow_opened(*ncidp, mode);
}

int nc_create(const char *path, int cmode, int *ncidp) {
    static __typeof__(&nc_create) real;
    if (!real && !(real = (__typeof__(real))enkflow_next_symbol("nc_create")))
        return NC_ENOTNC;
    int t = enkflow_target(path);
    if (t < 0)
        return enkflow_fail(NC_EINVAL, "nc_create of %s: the interception is not set up (see the line above)", path);
    if (!t)
        return real(path, cmode, ncidp);
    int st = real(path, (cmode | NC_DISKLESS) & ~(NC_PERSIST | NC_NOCLOBBER), ncidp);
    if (enkflow_tracing())
        fprintf(stderr, "enkflow intercept: nc_create %s (mode %#x, diskless) -> %d\n", path, cmode, st);
    return st ? st : enkflow_created(*ncidp);
}

int nc__create(const char *path, int cmode, size_t initialsz, size_t *chunksizehintp, int *ncidp) {
    static __typeof__(&nc__create) real;
    if (!real && !(real = (__typeof__(real))enkflow_next_symbol("nc__create")))
        return NC_ENOTNC;
    int t = enkflow_target(path);
    if (t < 0)
        return enkflow_fail(NC_EINVAL, "nc__create of %s: the interception is not set up (see the line above)", path);
    if (!t)
        return real(path, cmode, initialsz, chunksizehintp, ncidp);
    int st = real(path, (cmode | NC_DISKLESS) & ~(NC_PERSIST | NC_NOCLOBBER), initialsz, chunksizehintp, ncidp);
    return st ? st : enkflow_created(*ncidp);
}

int nc_close(int ncid) {
    static __typeof__(&nc_close) real;
    if (!real && !(real = (__typeof__(real))enkflow_next_symbol("nc_close")))
        return NC_ENOTNC;
    int bad = enkflow_closing(ncid);
    int st = real(ncid);
    enkflow_closed();
    return bad ? bad : st;
}

int nc_abort(int ncid) {
    static __typeof__(&nc_abort) real;
    if (!real && !(real = (__typeof__(real))enkflow_next_symbol("nc_abort")))
        return NC_ENOTNC;
    enkflow_aborting(ncid);
    return real(ncid);
}

/* -- the data calls -------------------------------------------------------------------------------- */

#define PASS(name, ...)                                                                      \
    static __typeof__(&name) real;                                                           \
    if (!real && !(real = (__typeof__(real))enkflow_next_symbol(#name)))                             \
        return NC_ENOTNC;                                                                    \
    return real(__VA_ARGS__)

#define WRAP_TYPE(sfx, T, PT, MT)                                                                                          \
    int nc_get_var##sfx(int ncid, int varid, T *ip) {                                                               \
        int done, st = enkflow_intercept(GET, "nc_get_var" #sfx, ncid, varid, MT, KIND_VAR, NULL, NULL, NULL, NULL, ip, &done); \
        if (done) return st;                                                                                          \
        PASS(nc_get_var##sfx, ncid, varid, ip);                                                                       \
    }                                                                                                                 \
    int nc_put_var##sfx(int ncid, int varid, PT *op) {                                                         \
        int done, st = enkflow_intercept(PUT, "nc_put_var" #sfx, ncid, varid, MT, KIND_VAR, NULL, NULL, NULL, NULL, (void *)op, &done); \
        if (done) return st;                                                                                          \
        PASS(nc_put_var##sfx, ncid, varid, op);                                                                       \
    }                                                                                                                 \
    int nc_get_var1##sfx(int ncid, int varid, const size_t *ix, T *ip) {                                            \
        int done, st = enkflow_intercept(GET, "nc_get_var1" #sfx, ncid, varid, MT, KIND_VAR1, ix, NULL, NULL, NULL, ip, &done); \
        if (done) return st;                                                                                          \
        PASS(nc_get_var1##sfx, ncid, varid, ix, ip);                                                                  \
    }                                                                                                                 \
    int nc_put_var1##sfx(int ncid, int varid, const size_t *ix, PT *op) {                                      \
        int done, st = enkflow_intercept(PUT, "nc_put_var1" #sfx, ncid, varid, MT, KIND_VAR1, ix, NULL, NULL, NULL, (void *)op, &done); \
        if (done) return st;                                                                                          \
        PASS(nc_put_var1##sfx, ncid, varid, ix, op);                                                                  \
    }                                                                                                                 \
    int nc_get_vara##sfx(int ncid, int varid, const size_t *s, const size_t *c, T *ip) {                            \
        int done, st = enkflow_intercept(GET, "nc_get_vara" #sfx, ncid, varid, MT, KIND_VARA, s, c, NULL, NULL, ip, &done);  \
        if (done) return st;                                                                                          \
        PASS(nc_get_vara##sfx, ncid, varid, s, c, ip);                                                                \
    }                                                                                                                 \
    int nc_put_vara##sfx(int ncid, int varid, const size_t *s, const size_t *c, PT *op) {                      \
        int done, st = enkflow_intercept(PUT, "nc_put_vara" #sfx, ncid, varid, MT, KIND_VARA, s, c, NULL, NULL, (void *)op, &done); \
        if (done) return st;                                                                                          \
        PASS(nc_put_vara##sfx, ncid, varid, s, c, op);                                                                \
    }                                                                                                                 \
    int nc_get_vars##sfx(int ncid, int varid, const size_t *s, const size_t *c, const ptrdiff_t *d, T *ip) {        \
        int done, st = enkflow_intercept(GET, "nc_get_vars" #sfx, ncid, varid, MT, KIND_VARS, s, c, d, NULL, ip, &done);     \
        if (done) return st;                                                                                          \
        PASS(nc_get_vars##sfx, ncid, varid, s, c, d, ip);                                                             \
    }                                                                                                                 \
    int nc_put_vars##sfx(int ncid, int varid, const size_t *s, const size_t *c, const ptrdiff_t *d, PT *op) {  \
        int done, st = enkflow_intercept(PUT, "nc_put_vars" #sfx, ncid, varid, MT, KIND_VARS, s, c, d, NULL, (void *)op, &done); \
        if (done) return st;                                                                                          \
        PASS(nc_put_vars##sfx, ncid, varid, s, c, d, op);                                                             \
    }                                                                                                                 \
    int nc_get_varm##sfx(int ncid, int varid, const size_t *s, const size_t *c, const ptrdiff_t *d,                 \
                         const ptrdiff_t *m, T *ip) {                                                                 \
        int done, st = enkflow_intercept(GET, "nc_get_varm" #sfx, ncid, varid, MT, KIND_VARM, s, c, d, m, ip, &done);        \
        if (done) return st;                                                                                          \
        PASS(nc_get_varm##sfx, ncid, varid, s, c, d, m, ip);                                                          \
    }                                                                                                                 \
    int nc_put_varm##sfx(int ncid, int varid, const size_t *s, const size_t *c, const ptrdiff_t *d,                 \
                         const ptrdiff_t *m, PT *op) {                                                           \
        int done, st = enkflow_intercept(PUT, "nc_put_varm" #sfx, ncid, varid, MT, KIND_VARM, s, c, d, m, (void *)op, &done); \
        if (done) return st;                                                                                          \
        PASS(nc_put_varm##sfx, ncid, varid, s, c, d, m, op);                                                          \
    }

#define NC_LONG_TYPE (sizeof(long) == sizeof(int) ? NC_INT : NC_INT64)

WRAP_TYPE(_text, char, const char, NC_CHAR)
WRAP_TYPE(_schar, signed char, const signed char, NC_BYTE)
WRAP_TYPE(_uchar, unsigned char, const unsigned char, NC_UBYTE)
WRAP_TYPE(_ubyte, unsigned char, const unsigned char, NC_UBYTE)
WRAP_TYPE(_short, short, const short, NC_SHORT)
WRAP_TYPE(_ushort, unsigned short, const unsigned short, NC_USHORT)
WRAP_TYPE(_int, int, const int, NC_INT)
WRAP_TYPE(_uint, unsigned int, const unsigned int, NC_UINT)
WRAP_TYPE(_long, long, const long, NC_LONG_TYPE)
WRAP_TYPE(_float, float, const float, NC_FLOAT)
WRAP_TYPE(_double, double, const double, NC_DOUBLE)
WRAP_TYPE(_longlong, long long, const long long, NC_INT64)
WRAP_TYPE(_ulonglong, unsigned long long, const unsigned long long, NC_UINT64)
WRAP_TYPE(_string, char *, const char *, NC_STRING)
WRAP_TYPE(, void, const void, NC_NAT)
