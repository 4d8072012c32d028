/* A copy that checks what it copies, for the runner library's PUT_SLOT and the netCDF shim's put into a
 * slot: ekf_copy_checked copies n elements and says whether every one is finite, in one pass at the speed of
 * a large memcpy. The check looks at the values the copy holds in registers, so the source is read once (a
 * memcpy followed by a check reads it twice: about 1.5x the time for a state larger than the caches), and
 * the stores bypass the cache as glibc's memcpy does for copies this large. The server then need not read
 * the forecast again before it acknowledges it (docs/online.md, PUT_SLOT's finite frame).
 *
 * The check tests the exponent bits with integer operations only: a model that traps floating-point
 * exceptions (gfortran -ffpe-trap=invalid) must not trap inside the library on the Inf it hands over. */
#ifndef ENKFLOW_COPY_CHECKED_H
#define ENKFLOW_COPY_CHECKED_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

typedef enum {
    EKF_CHECK_NONE, /* integers: nothing to check */
    EKF_CHECK_F32,
    EKF_CHECK_F64
} ekf_check;

/* Below this many bytes the copy stays in the cache (memcpy), and the check reads it there. */
#ifndef EKF_STREAM_MIN
#define EKF_STREAM_MIN ((size_t)1 << 20)
#endif

/* Whether the n elements at src (not necessarily aligned) are all finite. */
static inline int ekf_all_finite(const void *src, size_t n, ekf_check kind) {
    const unsigned char *p = src;
    unsigned bad = 0;
    if (kind == EKF_CHECK_F64) {
        for (size_t i = 0; i < n; i++) {
            uint64_t u;
            memcpy(&u, p + 8 * i, 8);
            bad |= (u & 0x7ff0000000000000u) == 0x7ff0000000000000u;
        }
    } else if (kind == EKF_CHECK_F32) {
        for (size_t i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, p + 4 * i, 4);
            bad |= (u & 0x7f800000u) == 0x7f800000u;
        }
    }
    return !bad;
}

/* Copy n elements of esize bytes (4 or 8 for the float kinds) from src to dst; 1 when every element is
 * finite (always for EKF_CHECK_NONE), else 0. The areas must not overlap. */
static inline int ekf_copy_checked(void *dst, const void *src, size_t n, size_t esize, ekf_check kind) {
    size_t bytes = n * esize;
    if (kind == EKF_CHECK_NONE) {
        memcpy(dst, src, bytes);
        return 1;
    }
#if defined(__SSE2__)
    const size_t stream_min = EKF_STREAM_MIN; /* a variable: the tests set the macro to 0 */
    if (bytes >= stream_min && (uintptr_t)dst % esize == 0) {
        unsigned char *d = dst;
        const unsigned char *s = src;
        size_t head = (16 - (uintptr_t)d % 16) % 16; /* to the stores' 16-byte alignment: whole elements */
        if (head > bytes) head = bytes;
        int ok = ekf_all_finite(s, head / esize, kind);
        memcpy(d, s, head);
        d += head;
        s += head;
        bytes -= head;
        /* Per 32-bit lane, the exponent mask; a lane is non-finite when its masked bits equal it. For float64
         * only the upper half of each 64-bit element holds the exponent: `upper` keeps those lanes. */
        const __m128i m = kind == EKF_CHECK_F64 ? _mm_set_epi32(0x7ff00000, 0, 0x7ff00000, 0) : _mm_set1_epi32(0x7f800000);
        const __m128i upper = kind == EKF_CHECK_F64 ? _mm_set_epi32(-1, 0, -1, 0) : _mm_set1_epi32(-1);
        __m128i a0 = _mm_setzero_si128(), a1 = a0;
        size_t body = bytes & ~(size_t)63;
        for (size_t i = 0; i < body; i += 64) {
            __m128i x0 = _mm_loadu_si128((const __m128i *)(s + i)), x1 = _mm_loadu_si128((const __m128i *)(s + i + 16));
            __m128i x2 = _mm_loadu_si128((const __m128i *)(s + i + 32)), x3 = _mm_loadu_si128((const __m128i *)(s + i + 48));
            _mm_stream_si128((__m128i *)(d + i), x0);
            _mm_stream_si128((__m128i *)(d + i + 16), x1);
            _mm_stream_si128((__m128i *)(d + i + 32), x2);
            _mm_stream_si128((__m128i *)(d + i + 48), x3);
            a0 = _mm_or_si128(a0, _mm_or_si128(_mm_cmpeq_epi32(_mm_and_si128(x0, m), m),
                                               _mm_cmpeq_epi32(_mm_and_si128(x1, m), m)));
            a1 = _mm_or_si128(a1, _mm_or_si128(_mm_cmpeq_epi32(_mm_and_si128(x2, m), m),
                                               _mm_cmpeq_epi32(_mm_and_si128(x3, m), m)));
        }
        _mm_sfence(); /* the streamed stores are visible before the caller announces them */
        ok &= _mm_movemask_epi8(_mm_and_si128(_mm_or_si128(a0, a1), upper)) == 0;
        ok &= ekf_all_finite(s + body, (bytes - body) / esize, kind);
        memcpy(d + body, s + body, bytes - body);
        return ok;
    }
#endif
    memcpy(dst, src, bytes);
    return ekf_all_finite(src, n, kind);
}

#endif
