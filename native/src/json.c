/* Just enough JSON for the protocol's metadata frames: a strict reader into a small tree, and a writer
 * of strings with the escapes JSON requires. Metadata only; array data never goes through here. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define MAX_DEPTH 64

typedef struct {
    const char *s;
    size_t i, n;
    char *err;
    size_t errsize;
} reader;

static int fail(reader *r, const char *what) {
    if (r->err && r->errsize && !r->err[0]) snprintf(r->err, r->errsize, "%s at byte %zu", what, r->i);
    return -1;
}

static void skip_ws(reader *r) {
    while (r->i < r->n && (r->s[r->i] == ' ' || r->s[r->i] == '\t' || r->s[r->i] == '\n' || r->s[r->i] == '\r')) r->i++;
}

static int put_utf8(ekf_buf *b, unsigned long cp) {
    char out[4];
    size_t k;
    if (cp < 0x80) { out[0] = (char)cp; k = 1; }
    else if (cp < 0x800) { out[0] = (char)(0xc0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 0x3f)); k = 2; }
    else if (cp < 0x10000) {
        out[0] = (char)(0xe0 | (cp >> 12)); out[1] = (char)(0x80 | ((cp >> 6) & 0x3f)); out[2] = (char)(0x80 | (cp & 0x3f)); k = 3;
    } else {
        out[0] = (char)(0xf0 | (cp >> 18)); out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
        out[2] = (char)(0x80 | ((cp >> 6) & 0x3f)); out[3] = (char)(0x80 | (cp & 0x3f)); k = 4;
    }
    ekf_buf_add(b, out, k);
    return b->oom ? -1 : 0;
}

static int hex4(reader *r, unsigned long *v) {
    if (r->i + 4 > r->n) return fail(r, "truncated \\u escape");
    *v = 0;
    for (int k = 0; k < 4; k++) {
        char c = r->s[r->i++];
        int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
        if (d < 0) return fail(r, "bad \\u escape");
        *v = (*v << 4) | (unsigned long)d;
    }
    return 0;
}

static int parse_string(reader *r, char **out) {
    ekf_buf b = {0};
    r->i++; /* the opening quote */
    while (1) {
        if (r->i >= r->n) { free(b.p); return fail(r, "unterminated string"); }
        unsigned char c = (unsigned char)r->s[r->i++];
        if (c == '"') break;
        if (c < 0x20) { free(b.p); return fail(r, "control character in a string"); }
        if (c != '\\') { ekf_buf_add(&b, (const char *)&c, 1); continue; }
        if (r->i >= r->n) { free(b.p); return fail(r, "unterminated escape"); }
        char e = r->s[r->i++];
        const char *simple = NULL;
        switch (e) {
            case '"': simple = "\""; break;
            case '\\': simple = "\\"; break;
            case '/': simple = "/"; break;
            case 'b': simple = "\b"; break;
            case 'f': simple = "\f"; break;
            case 'n': simple = "\n"; break;
            case 'r': simple = "\r"; break;
            case 't': simple = "\t"; break;
            case 'u': {
                unsigned long cp, lo;
                if (hex4(r, &cp)) { free(b.p); return -1; }
                if (cp >= 0xd800 && cp < 0xdc00 && r->i + 6 <= r->n && r->s[r->i] == '\\' && r->s[r->i + 1] == 'u') {
                    size_t save = r->i;
                    r->i += 2;
                    if (hex4(r, &lo)) { free(b.p); return -1; }
                    if (lo >= 0xdc00 && lo < 0xe000) cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                    else r->i = save;
                }
                if (cp >= 0xd800 && cp < 0xe000) cp = 0xfffd; /* a lone surrogate */
                if (put_utf8(&b, cp)) { free(b.p); return fail(r, "out of memory"); }
                continue;
            }
            default: free(b.p); return fail(r, "bad escape");
        }
        ekf_buf_add(&b, simple, 1);
    }
    ekf_buf_add(&b, "", 1);
    if (b.oom) { free(b.p); return fail(r, "out of memory"); }
    *out = b.p;
    return 0;
}

static int parse_value(reader *r, ekf_json *v, int depth);

static int parse_number(reader *r, ekf_json *v) {
    size_t start = r->i;
    int integral = 1;
    if (r->i < r->n && r->s[r->i] == '-') r->i++;
    if (r->i >= r->n || r->s[r->i] < '0' || r->s[r->i] > '9') return fail(r, "bad number");
    while (r->i < r->n && ((r->s[r->i] >= '0' && r->s[r->i] <= '9') || strchr(".eE+-", r->s[r->i]))) {
        if (strchr(".eE", r->s[r->i])) integral = 0;
        r->i++;
    }
    char tmp[64];
    size_t len = r->i - start;
    if (len >= sizeof tmp) return fail(r, "number too long");
    memcpy(tmp, r->s + start, len);
    tmp[len] = 0;
    char *end;
    v->type = EKF_JNUM;
    v->num = strtod(tmp, &end);
    if (*end) return fail(r, "bad number");
    if (integral) {
        errno = 0;
        if (tmp[0] == '-') {
            v->i64 = strtoll(tmp, &end, 10);
            v->is_int = errno == 0;
            v->u64 = (uint64_t)v->i64;
        } else {
            v->u64 = strtoull(tmp, &end, 10);
            v->is_int = errno == 0;
            v->i64 = (int64_t)v->u64;
        }
    }
    return 0;
}

static int add_item(ekf_json *v, size_t *cap, char *key) {
    if (v->n == *cap) {
        size_t nc = *cap ? 2 * *cap : 4;
        ekf_json *items = realloc(v->items, nc * sizeof *items);
        if (!items) return -1;
        v->items = items;
        if (v->type == EKF_JOBJ) {
            char **keys = realloc(v->keys, nc * sizeof *keys);
            if (!keys) return -1;
            v->keys = keys;
        }
        *cap = nc;
    }
    memset(&v->items[v->n], 0, sizeof v->items[0]);
    if (v->type == EKF_JOBJ) v->keys[v->n] = key;
    v->n++;
    return 0;
}

static int parse_value(reader *r, ekf_json *v, int depth) {
    memset(v, 0, sizeof *v);
    if (depth > MAX_DEPTH) return fail(r, "nested too deeply");
    skip_ws(r);
    if (r->i >= r->n) return fail(r, "unexpected end");
    char c = r->s[r->i];
    if (c == '"') {
        v->type = EKF_JSTR;
        return parse_string(r, &v->str);
    }
    if (c == '{' || c == '[') {
        size_t cap = 0;
        char close = c == '{' ? '}' : ']';
        v->type = c == '{' ? EKF_JOBJ : EKF_JARR;
        r->i++;
        skip_ws(r);
        if (r->i < r->n && r->s[r->i] == close) { r->i++; return 0; }
        while (1) {
            char *key = NULL;
            skip_ws(r);
            if (v->type == EKF_JOBJ) {
                if (r->i >= r->n || r->s[r->i] != '"') return fail(r, "expected a key");
                if (parse_string(r, &key)) return -1;
                skip_ws(r);
                if (r->i >= r->n || r->s[r->i] != ':') { free(key); return fail(r, "expected ':'"); }
                r->i++;
            }
            if (add_item(v, &cap, key)) { free(key); return fail(r, "out of memory"); }
            if (parse_value(r, &v->items[v->n - 1], depth + 1)) return -1;
            skip_ws(r);
            if (r->i < r->n && r->s[r->i] == ',') { r->i++; continue; }
            if (r->i < r->n && r->s[r->i] == close) { r->i++; return 0; }
            return fail(r, "expected ',' or a closing bracket");
        }
    }
    if (c == '-' || (c >= '0' && c <= '9')) return parse_number(r, v);
    static const struct { const char *word; ekf_jtype t; int b; } words[] = {
        {"true", EKF_JBOOL, 1}, {"false", EKF_JBOOL, 0}, {"null", EKF_JNULL, 0}, {"NaN", EKF_JNUM, 0},
        {"Infinity", EKF_JNUM, 1}, {"-Infinity", EKF_JNUM, -1}};
    for (size_t k = 0; k < sizeof words / sizeof words[0]; k++) {
        size_t len = strlen(words[k].word);
        if (r->n - r->i >= len && memcmp(r->s + r->i, words[k].word, len) == 0) {
            r->i += len;
            v->type = words[k].t;
            v->boolean = words[k].b;
            return 0;
        }
    }
    return fail(r, "unexpected character");
}

static void free_tree(ekf_json *v) {
    free(v->str);
    for (size_t k = 0; k < v->n; k++) {
        free_tree(&v->items[k]);
        if (v->keys) free(v->keys[k]);
    }
    free(v->items);
    free(v->keys);
}

ekf_json *ekf_json_parse(const char *text, size_t n, char *err, size_t errsize) {
    reader r = {text, 0, n, err, errsize};
    if (err && errsize) err[0] = 0;
    ekf_json *v = calloc(1, sizeof *v);
    if (!v) { fail(&r, "out of memory"); return NULL; }
    if (parse_value(&r, v, 0) == 0) {
        skip_ws(&r);
        if (r.i == r.n) return v;
        fail(&r, "trailing characters");
    }
    free_tree(v);
    free(v);
    return NULL;
}

void ekf_json_free(ekf_json *j) {
    if (!j) return;
    free_tree(j);
    free(j);
}

const ekf_json *ekf_json_get(const ekf_json *obj, const char *key) {
    if (!obj || obj->type != EKF_JOBJ) return NULL;
    for (size_t k = 0; k < obj->n; k++)
        if (strcmp(obj->keys[k], key) == 0) return &obj->items[k];
    return NULL;
}

void ekf_buf_add(ekf_buf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 64;
        while (nc < b->n + n + 1) nc *= 2;
        char *p = realloc(b->p, nc);
        if (!p) { b->oom = 1; return; }
        b->p = p;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void ekf_buf_printf(ekf_buf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k < 0 || (size_t)k >= sizeof tmp) { b->oom = 1; return; }
    ekf_buf_add(b, tmp, (size_t)k);
}

void ekf_buf_json_string(ekf_buf *b, const char *s) {
    ekf_buf_add(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"') ekf_buf_add(b, "\\\"", 2);
        else if (c == '\\') ekf_buf_add(b, "\\\\", 2);
        else if (c < 0x20) ekf_buf_printf(b, "\\u%04x", c);
        else ekf_buf_add(b, (const char *)&c, 1);
    }
    ekf_buf_add(b, "\"", 1);
}
