/* The header of enkflow.online.wire: struct "<4sHH32sQQqqqQQ", 96 bytes, little-endian. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <string.h>

#include <sodium.h>

#include "internal.h"

static void put_u16(unsigned char *p, uint16_t v) {
    p[0] = (unsigned char)(v & 0xff);
    p[1] = (unsigned char)(v >> 8);
}

static void put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static uint16_t get_u16(const unsigned char *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static uint64_t get_u64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

void ekf_put_i64(unsigned char *p, int64_t v) { put_u64(p, (uint64_t)v); }
int64_t ekf_get_i64(const unsigned char *p) { return (int64_t)get_u64(p); }

void ekf_header_pack(const ekf_header *h, unsigned char out[EKF_HEADER_SIZE]) {
    memcpy(out, "ENKF", 4);
    put_u16(out + 4, ENKFLOW_PROTOCOL_VERSION);
    put_u16(out + 6, h->kind);
    memcpy(out + 8, h->credential, 32);
    put_u64(out + 40, h->runner);
    put_u64(out + 48, h->task);
    put_u64(out + 56, (uint64_t)h->member);
    put_u64(out + 64, (uint64_t)h->cycle);
    put_u64(out + 72, (uint64_t)h->nsteps);
    put_u64(out + 80, h->count);
    put_u64(out + 88, h->epoch);
}

int ekf_header_unpack(const void *buf, size_t n, ekf_header *h, char *err, size_t errsize) {
    const unsigned char *p = buf;
    if (n != EKF_HEADER_SIZE) {
        snprintf(err, errsize, "the header frame has %zu bytes, expected %d (not an enkflow message, or a truncated one)",
                 n, EKF_HEADER_SIZE);
        return 1;
    }
    if (memcmp(p, "ENKF", 4) != 0) {
        snprintf(err, errsize, "bad magic: not an enkflow online message");
        return 1;
    }
    h->version = get_u16(p + 4);
    if (h->version != ENKFLOW_PROTOCOL_VERSION) {
        snprintf(err, errsize, "protocol version mismatch: the message speaks version %u, this side version %d; "
                 "install the same enkflow on server and runners", (unsigned)h->version, ENKFLOW_PROTOCOL_VERSION);
        return 2;
    }
    h->kind = get_u16(p + 6);
    if (h->kind < EKF_HELLO || h->kind > EKF_PUT_SLOT) {
        snprintf(err, errsize, "unknown message kind %u", (unsigned)h->kind);
        return 1;
    }
    memcpy(h->credential, p + 8, 32);
    h->runner = get_u64(p + 40);
    h->task = get_u64(p + 48);
    h->member = (int64_t)get_u64(p + 56);
    h->cycle = (int64_t)get_u64(p + 64);
    h->nsteps = (int64_t)get_u64(p + 72);
    h->count = get_u64(p + 80);
    h->epoch = get_u64(p + 88);
    return 0;
}

int ekf_credential(const char *token, unsigned char out[32]) {
    static const char prefix[] = "enkflow-online-token"; /* followed by its NUL, as in wire.credential */
    crypto_hash_sha256_state st;
    if (sodium_init() < 0) return -1;
    crypto_hash_sha256_init(&st);
    crypto_hash_sha256_update(&st, (const unsigned char *)prefix, sizeof prefix);
    crypto_hash_sha256_update(&st, (const unsigned char *)token, strlen(token));
    crypto_hash_sha256_final(&st, out);
    return 0;
}
