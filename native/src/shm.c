/* The server ranks' shared memory segments as a runner maps them (enkflow.online.segments in C): a cache of
 * mappings by path, the header check, and the sweep of the names that dead makers left in the segment
 * directory (enkflow.shm_names.remove_dead_segments). */
#define _DEFAULT_SOURCE /* MAP_POPULATE, DT_UNKNOWN */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

/* The header page: magic 8s, version u32, pad u32, nonce 16s, epoch u64 (little-endian). */
#define SEG_VERSION 1
#define SEG_NONCE_AT 16

const char *ekf_shm_dir(void) {
    struct stat st;
    if (stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) && access("/dev/shm", W_OK) == 0) return "/dev/shm";
    const char *tmp = getenv("TMPDIR");
    return tmp && *tmp ? tmp : "/tmp";
}

/* The maker's pid of an enkflow segment name enkflow-(output|output-beat|online)-PID-HEX8, or 0. */
static long maker_pid(const char *name) {
    static const char *const kinds[] = {"enkflow-output-beat-", "enkflow-output-", "enkflow-online-"};
    const char *p = NULL;
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0] && !p; k++)
        if (strncmp(name, kinds[k], strlen(kinds[k])) == 0) p = name + strlen(kinds[k]);
    if (!p || *p < '0' || *p > '9') return 0;
    char *end;
    long pid = strtol(p, &end, 10);
    if (*end != '-' || strlen(end + 1) != 8) return 0;
    for (const char *h = end + 1; *h; h++)
        if (!((*h >= '0' && *h <= '9') || (*h >= 'a' && *h <= 'f'))) return 0;
    return pid;
}

/* path is ekf_shm_dir()/enkflow-online-PID-HEX8, the only names an enkflow server gives its segments: a
 * WELCOME or SLOT reply cannot make a runner map, or write into, any other file. */
static int online_name(const char *path) {
    const char *dir = ekf_shm_dir();
    size_t n = strlen(dir);
    if (strncmp(path, dir, n) != 0 || path[n] != '/') return 0;
    return strncmp(path + n + 1, "enkflow-online-", 15) == 0 && maker_pid(path + n + 1) != 0;
}

static void unmap(ekf_segment *s) {
    if (s->base) munmap(s->base, s->size);
    free(s->path);
    free(s);
}

/* The header of the segment mapped at base (size bytes) is of that kind, this version and that nonce. */
static int check_header(const ekf_segment *s, ekf_seg_kind kind, const unsigned char nonce[16], char *err,
                        size_t errsize) {
    const char *magic = kind == EKF_SEG_STORE ? "ENKFSTOR" : "ENKFSLOT";
    const unsigned char *h = s->base;
    if (s->size < EKF_SEG_HEADER) {
        snprintf(err, errsize, "%zu bytes, less than its %d-byte header", s->size, EKF_SEG_HEADER);
        return 1;
    }
    if (memcmp(h, magic, 8) != 0) {
        snprintf(err, errsize, "not an enkflow %s segment (magic %.8s expected)", kind == EKF_SEG_STORE ? "store" : "slot",
                 magic);
        return 1;
    }
    uint32_t version = (uint32_t)h[8] | (uint32_t)h[9] << 8 | (uint32_t)h[10] << 16 | (uint32_t)h[11] << 24;
    if (version != SEG_VERSION) {
        snprintf(err, errsize, "segment layout version %u, this library reads version %d", (unsigned)version, SEG_VERSION);
        return 1;
    }
    if (memcmp(h + SEG_NONCE_AT, nonce, 16) != 0) {
        snprintf(err, errsize, "its nonce is not the one the server's WELCOME named (another server's segment)");
        return 1;
    }
    return 0;
}

/* Map path afresh: the store read-only, a slot read-write. A slot's pages are mapped at once: the runner
 * writes them, a page a fault otherwise (52.4 MB into a fresh mapping, best of 9 on a 2-core machine: 9.5 ms
 * with MAP_POPULATE, 20.6 ms without, 5.1 ms once mapped). The store's are not: every member's share is in
 * it, and a runner faults in only those it reads, 16 pages a fault (a member's 52.4 MB read from a fresh
 * mapping: 9.8 ms, against 8.9 ms populated beforehand). EKF_SEG_GONE: no such file. */
static ekf_seg_status map_new(const char *path, ekf_seg_kind kind, ekf_segment **out, char *err, size_t errsize) {
    int writable = kind == EKF_SEG_SLOT;
    /* O_NONBLOCK: a FIFO under that name must not hold the runner in open() (refused below) */
    int fd = open(path, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) {
        int gone = errno == ENOENT;
        snprintf(err, errsize, "cannot open it %s: %s%s", writable ? "read-write" : "read-only", strerror(errno),
                 gone && !writable ? " (a server on another node?)" : "");
        return gone ? EKF_SEG_GONE : EKF_SEG_BAD;
    }
    struct stat st;
    ekf_segment *s = calloc(1, sizeof *s);
    if (!s || fstat(fd, &st) != 0 || !(s->path = strdup(path))) {
        snprintf(err, errsize, "%s", s ? strerror(errno) : "out of memory");
        close(fd);
        if (s) unmap(s);
        return EKF_SEG_BAD;
    }
    s->size = S_ISREG(st.st_mode) ? (size_t)st.st_size : 0;
    s->dev = st.st_dev;
    s->ino = st.st_ino;
    s->writable = writable;
    int flags = MAP_SHARED | (writable ? MAP_POPULATE : 0);
    void *p = s->size ? mmap(NULL, s->size, PROT_READ | (writable ? PROT_WRITE : 0), flags, fd, 0) : MAP_FAILED;
    int merr = errno;
    close(fd);
    if (p == MAP_FAILED) {
        snprintf(err, errsize, "cannot map its %zu bytes: %s", s->size,
                 !S_ISREG(st.st_mode) ? "not a regular file" : s->size ? strerror(merr) : "empty file");
        unmap(s);
        return EKF_SEG_BAD;
    }
    s->base = p;
    *out = s;
    return EKF_SEG_MAPPED;
}

ekf_seg_status ekf_seg_map(ekf_segments *c, const char *path, ekf_seg_kind kind, const unsigned char nonce[16],
                           const ekf_segment **out, char *err, size_t errsize) {
    if (!online_name(path)) {
        snprintf(err, errsize, "not a segment of an enkflow server (%s/enkflow-online-PID-HEX8)", ekf_shm_dir());
        return EKF_SEG_BAD;
    }
    for (size_t k = 0; k < c->n; k++) {
        ekf_segment *s = c->items[k];
        if (strcmp(s->path, path) != 0 || (kind == EKF_SEG_SLOT && !s->writable)) continue;
        if (check_header(s, kind, nonce, err, errsize)) return EKF_SEG_BAD;
        *out = s;
        return EKF_SEG_MAPPED;
    }
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 8;
        ekf_segment **items = realloc(c->items, cap * sizeof *items);
        if (!items) {
            snprintf(err, errsize, "out of memory");
            return EKF_SEG_BAD;
        }
        c->items = items;
        c->cap = cap;
    }
    ekf_segment *s;
    ekf_seg_status st = map_new(path, kind, &s, err, errsize);
    if (st != EKF_SEG_MAPPED) return st;
    if (check_header(s, kind, nonce, err, errsize)) {
        unmap(s);
        return EKF_SEG_BAD;
    }
    c->items[c->n++] = s;
    *out = s;
    return EKF_SEG_MAPPED;
}

void ekf_seg_forget_gone(ekf_segments *c) {
    size_t kept = 0;
    for (size_t k = 0; k < c->n; k++) {
        ekf_segment *s = c->items[k];
        struct stat st;
        /* A retired slot: the server unlinked it (a new one may bear another name, never this one). */
        if (stat(s->path, &st) != 0 || st.st_dev != s->dev || st.st_ino != s->ino) unmap(s);
        else c->items[kept++] = s;
    }
    c->n = kept;
}

void ekf_seg_clear(ekf_segments *c) {
    for (size_t k = 0; k < c->n; k++) unmap(c->items[k]);
    free(c->items);
    memset(c, 0, sizeof *c);
}

void ekf_shm_sweep(void) {
    const char *dir = ekf_shm_dir();
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long pid = maker_pid(e->d_name);
        if (!pid) continue;
        char proc[64], path[4096];
        snprintf(proc, sizeof proc, "/proc/%ld", pid);
        if (access(proc, F_OK) == 0) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path); /* removed meanwhile, or another user's: left alone */
    }
    closedir(d);
}
