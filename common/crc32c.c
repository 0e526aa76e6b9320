/*
 * crc32c.c - CRC32C (Castagnoli, reflected polynomial 0x82F63B78).
 *
 * DESIGN
 * Two implementations behind one dispatch:
 *   - software: slicing-by-8 tables (8 x 256 words), the portable reference;
 *   - x86-64 SSE4.2: the crc32 instruction, compiled per function with
 *     __attribute__((target("sse4.2"))) because the build does not pass -msse4.2.
 * crc32q has a latency of 3 cycles and a throughput of 1 per cycle, so one
 * dependent chain runs at a third of the instruction's speed. Large buffers are
 * cut into three adjacent blocks of equal length, each crc'ed as its own chain
 * in the same loop; the three values are then merged with a "shift by N zero
 * bytes" operator: crc(A||B) = shift(crc(A), |B|) ^ crc0(B), where crc0 starts
 * from a zero register. The operator is linear over GF(2), so it is applied
 * with four 256-entry tables (one per byte of the crc), built once per block
 * length (Mark Adler's method; no pclmulqdq needed). Two block lengths are
 * used: LONG (8 KiB, 24 KiB per round) for big objects and SHORT (256 B) for
 * the rest; measured, 4 KiB buffers run at ~80% of the big-buffer speed.
 *
 * kvp_crc32c_copy runs the same three-chain loop but stores every 8-byte word
 * it has just loaded, so the data crosses the memory hierarchy once instead of
 * twice (memcpy, then crc over a destination that may no longer be cached).
 * From 1 MiB up the stores are non-temporal (movnti): measured on Zen 3, out of
 * cache, 13-14 GB/s instead of 9-10 (no read-for-ownership of dst), and equal
 * when the buffers are cached; the destination then is not left in the cache,
 * which is what we want for objects this big. Streamed stores are skipped when
 * dst lies less than 512 bytes above src modulo 4 KiB: later loads alias them
 * in the low 12 address bits and every one waits for a write-combining flush.
 * dst at exactly src's offset modulo 4 KiB (a page-aligned buffer read from a
 * page-aligned extent: numpy/torch buffers aligned by the caller, pinned
 * memory) is a case of its own: each movnti there is followed by loads of the
 * rest of its 64-byte line at the same low address bits, and under memory
 * load (a shared 2-core VM) whole stretches of such copies ran 2-3x slower
 * than the same copy at any other offset. With AVX2 that case copies whole
 * lines instead: the three chains' words are crc'ed from 8-byte loads, then
 * each line is loaded again (from L1) and streamed with two 32-byte stores, so
 * no load follows a streamed store into its own line. Measured, 32 x 1 MiB
 * gets into page-aligned numpy buffers over shm: 8.7-10.9 GB/s (p90/p50
 * 1.06-1.29) instead of 5.0-10.2 (p50 up to 7.4 ms against 2.9, p90/p50 up to
 * 2.6), as at other offsets (10-10.7, unchanged).
 * kvp_crc32c_copy_piece lets a piece of a larger whole stream as the whole would (the
 * SHORT rounds stream as well; only a tail under 768 bytes and the head before the first
 * line take cached stores): an object scattered into 64 layer buffers of 16 KiB was read over
 * shm at 0.68-0.93x the rate into one buffer with cached stores, at 0.94-1.13x streamed
 * (kvpool-bench data --pieces 1,64, alternating runs).
 * The software path copies in 4 KiB chunks right after crc'ing them (from L1).
 *
 * kvp_crc32c over 512 bytes or more, where the CPU has VPCLMULQDQ and AVX-512, folds
 * instead (crc32c_fold): four 512-bit accumulators (sixteen 128-bit lanes) carry the
 * message 256 bytes at a time, each 128-bit lane A folded forward over D bytes as
 * clmul(A.lo, x^(8D+63) mod P) ^ clmul(A.hi, x^(8D-1) mod P) ^ the next data (reflected
 * operands: a carry-less product stands one degree high, hence the -1); the lanes are then
 * folded into one, and the crc32 instruction finishes the last 16 bytes and the tail (no
 * Barrett reduction). The constants are computed at start from the polynomial
 * (crc32c_xpow), none is typed in. Two carry-less multiplies per 64 bytes against three
 * crc32 instructions per 24: about four times the three-chain loop's speed, and the CRC of
 * a tcp slice is a fifth of a core's work at the socket's speed on this machine kind
 * (issue 29). The copy variants keep the three-chain loop (they are bound by the stores).
 *
 * Threads: every function is thread-safe. Tables and the CPU feature check are
 * set up once, on first use, under pthread_once; afterwards they are read-only.
 * Invariant: calls with len == 0 never dereference their pointers.
 */
#include "common/crc32c.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#include <nmmintrin.h>
#define KVP_CRC32C_X86 1
#define KVP_TARGET_SSE42 __attribute__((target("sse4.2")))
#endif

#define KVP_CRC32C_POLY 0x82F63B78u
#define KVP_CRC32C_LONG 8192     /* bytes per chain per round, big buffers */
#define KVP_CRC32C_SHORT 256     /* bytes per chain per round, small buffers */
#define KVP_CRC32C_SW_CHUNK 4096 /* copy granularity of the software copy path */
#define KVP_CRC32C_NT_ALIAS                                                                        \
    512 /* streamed copies: not when dst is less than this above src mod 4 KiB */

static pthread_once_t crc32c_once = PTHREAD_ONCE_INIT;
static uint32_t crc32c_table[8][256];
static bool crc32c_have_hw;
/* x^(2^k) mod P for k = 0..63 (crc32c_combine, the folding constants) */
static pthread_once_t crc32c_x2n_once = PTHREAD_ONCE_INIT;
static uint32_t crc32c_x2n[64];
static uint32_t crc32c_multmodp(uint32_t a, uint32_t b);
static void crc32c_x2n_init(void);

#if defined(KVP_CRC32C_X86)
static uint32_t crc32c_zeros_long[4][256];
static uint32_t crc32c_zeros_short[4][256];
static bool crc32c_have_avx2;
#endif

static uint64_t crc32c_load_le64(const unsigned char *p)
{
    uint64_t w;
    memcpy(&w, p, sizeof(w));
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    w = __builtin_bswap64(w);
#endif
    return w;
}

/* ---- software: slicing-by-8 ------------------------------------------------------------- */

static void crc32c_sw_tables_init(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ KVP_CRC32C_POLY : c >> 1;
        crc32c_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = crc32c_table[0][n];
        for (int k = 1; k < 8; k++) {
            c = (c >> 8) ^ crc32c_table[0][c & 0xff];
            crc32c_table[k][n] = c;
        }
    }
}

/* Raw register in, raw register out (no ~ conditioning). */
static uint32_t crc32c_sw_update(uint32_t crc, const unsigned char *p, size_t len)
{
    while (len > 0 && ((uintptr_t)p & 7) != 0) {
        crc = (crc >> 8) ^ crc32c_table[0][(crc ^ *p++) & 0xff];
        len--;
    }
    while (len >= 8) {
        uint64_t w = crc32c_load_le64(p);
        uint32_t lo = (uint32_t)w ^ crc, hi = (uint32_t)(w >> 32);
        /* a tree of xors, and the `hi` half does not wait for the previous crc */
        uint32_t thi = (crc32c_table[3][hi & 0xff] ^ crc32c_table[2][(hi >> 8) & 0xff]) ^
                       (crc32c_table[1][(hi >> 16) & 0xff] ^ crc32c_table[0][hi >> 24]);
        uint32_t tlo = (crc32c_table[7][lo & 0xff] ^ crc32c_table[6][(lo >> 8) & 0xff]) ^
                       (crc32c_table[5][(lo >> 16) & 0xff] ^ crc32c_table[4][lo >> 24]);
        crc = tlo ^ thi;
        p += 8;
        len -= 8;
    }
    while (len > 0) {
        crc = (crc >> 8) ^ crc32c_table[0][(crc ^ *p++) & 0xff];
        len--;
    }
    return crc;
}

/* ---- x86-64 SSE4.2 ---------------------------------------------------------------------- */

#if defined(KVP_CRC32C_X86)

/* mat is a 32x32 GF(2) matrix stored as 32 columns; returns mat * vec. */
static uint32_t crc32c_gf2_times(const uint32_t *mat, uint32_t vec)
{
    uint32_t sum = 0;
    for (; vec != 0; vec >>= 1, mat++) {
        if (vec & 1)
            sum ^= *mat;
    }
    return sum;
}

static void crc32c_gf2_mul(uint32_t *res, const uint32_t *a, const uint32_t *b)
{
    uint32_t tmp[32];
    for (int n = 0; n < 32; n++)
        tmp[n] = crc32c_gf2_times(a, b[n]);
    memcpy(res, tmp, sizeof(tmp));
}

/* Tables applying "append `len` zero bytes" to a raw crc register. */
static void crc32c_zeros_init(uint32_t zeros[4][256], size_t len)
{
    uint32_t op[32], res[32];

    /* one zero bit: bit 0 feeds back the polynomial, every other bit shifts down */
    op[0] = KVP_CRC32C_POLY;
    for (int n = 1; n < 32; n++)
        op[n] = 1u << (n - 1);
    for (int k = 0; k < 3; k++) /* 2, 4, then 8 bits: one zero byte */
        crc32c_gf2_mul(op, op, op);

    for (int n = 0; n < 32; n++)
        res[n] = 1u << n;
    for (; len != 0; len >>= 1) { /* res = op^len by squaring; powers of op commute */
        if (len & 1)
            crc32c_gf2_mul(res, res, op);
        crc32c_gf2_mul(op, op, op);
    }

    for (uint32_t n = 0; n < 256; n++) {
        for (int k = 0; k < 4; k++)
            zeros[k][n] = crc32c_gf2_times(res, n << (8 * k));
    }
}

static inline uint32_t crc32c_shift(const uint32_t zeros[4][256], uint32_t crc)
{
    return zeros[0][crc & 0xff] ^ zeros[1][(crc >> 8) & 0xff] ^ zeros[2][(crc >> 16) & 0xff] ^
           zeros[3][crc >> 24];
}

/*
 * Rounds of three chains over `block`-byte blocks, optionally storing each word to *dstp
 * (with non-temporal stores when `nt`). Always inlined so that `block`, `copy` and `nt` are
 * constants in each instance.
 */
static inline __attribute__((always_inline)) KVP_TARGET_SSE42 uint32_t
crc32c_hw_rounds(uint32_t crc, const unsigned char **srcp, unsigned char **dstp, size_t *lenp,
                 const size_t block, const uint32_t zeros[4][256], const bool copy, const bool nt)
{
    const unsigned char *p = *srcp;
    unsigned char *q = copy ? *dstp : NULL;
    size_t len = *lenp;

    while (len >= 3 * block) {
        uint64_t c0 = crc, c1 = 0, c2 = 0;
        const unsigned char *end = p + block;
        do {
            uint64_t w0, w1, w2;
            memcpy(&w0, p, 8);
            memcpy(&w1, p + block, 8);
            memcpy(&w2, p + 2 * block, 8);
            c0 = _mm_crc32_u64(c0, w0);
            c1 = _mm_crc32_u64(c1, w1);
            c2 = _mm_crc32_u64(c2, w2);
            if (copy && nt) {
                _mm_stream_si64((long long *)q, (long long)w0);
                _mm_stream_si64((long long *)(q + block), (long long)w1);
                _mm_stream_si64((long long *)(q + 2 * block), (long long)w2);
                q += 8;
            } else if (copy) {
                memcpy(q, &w0, 8);
                memcpy(q + block, &w1, 8);
                memcpy(q + 2 * block, &w2, 8);
                q += 8;
            }
            p += 8;
        } while (p < end);
        crc = crc32c_shift(zeros, (uint32_t)c0) ^ (uint32_t)c1;
        crc = crc32c_shift(zeros, crc) ^ (uint32_t)c2;
        p += 2 * block;
        if (copy)
            q += 2 * block;
        len -= 3 * block;
    }

    *srcp = p;
    if (copy)
        *dstp = q;
    *lenp = len;
    return crc;
}

static inline __attribute__((always_inline)) KVP_TARGET_SSE42 uint32_t
crc32c_hw_impl(uint32_t crc, unsigned char *q, const unsigned char *p, size_t len, const bool copy,
               const bool nt)
{
    crc = ~crc;

    /* align the source so that no load of the main loops crosses a cache line */
    while (len > 0 && ((uintptr_t)p & 7) != 0) {
        if (copy)
            *q++ = *p;
        crc = _mm_crc32_u8(crc, *p++);
        len--;
    }

    crc = crc32c_hw_rounds(crc, &p, &q, &len, KVP_CRC32C_LONG, crc32c_zeros_long, copy, nt);
    crc = crc32c_hw_rounds(crc, &p, &q, &len, KVP_CRC32C_SHORT, crc32c_zeros_short, copy, nt);
    if (nt)
        _mm_sfence(); /* order the streamed stores before anything the caller publishes */

    uint64_t c = crc;
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
        if (copy) {
            memcpy(q, &w, 8);
            q += 8;
        }
        p += 8;
        len -= 8;
    }
    crc = (uint32_t)c;
    while (len > 0) {
        if (copy)
            *q++ = *p;
        crc = _mm_crc32_u8(crc, *p++);
        len--;
    }
    return ~crc;
}

static KVP_TARGET_SSE42 uint32_t crc32c_hw(uint32_t crc, const void *buf, size_t len)
{
    return crc32c_hw_impl(crc, NULL, buf, len, false, false);
}

/*
 * Rounds of three chains over `block`-byte blocks, copied by lines with dst at src's offset
 * modulo 4 KiB: per 64-byte line of each chain, its eight words are loaded and crc'ed, then
 * the line is loaded again (L1) and streamed whole (two 32-byte stores; dst is 64-byte
 * aligned here, as src is). Raw register in and out, as crc32c_hw_rounds.
 */
static inline __attribute__((always_inline, target("sse4.2,avx2"))) uint32_t
crc32c_hw_line_rounds(uint32_t c, const unsigned char **srcp, unsigned char **dstp, size_t *lenp,
                      const size_t block, const uint32_t zeros[4][256])
{
    const unsigned char *p = *srcp;
    unsigned char *q = *dstp;
    size_t len = *lenp;
    while (len >= 3 * block) {
        uint64_t c0 = c, c1 = 0, c2 = 0;
        for (size_t off = 0; off < block; off += 64) {
            const unsigned char *a = p + off;
            for (size_t i = 0; i < 64; i += 8) {
                uint64_t w0, w1, w2;
                memcpy(&w0, a + i, 8);
                memcpy(&w1, a + block + i, 8);
                memcpy(&w2, a + 2 * block + i, 8);
                c0 = _mm_crc32_u64(c0, w0);
                c1 = _mm_crc32_u64(c1, w1);
                c2 = _mm_crc32_u64(c2, w2);
            }
            for (size_t k = 0; k < 3; k++) {
                __m256i x = _mm256_loadu_si256((const __m256i *)(a + k * block));
                __m256i y = _mm256_loadu_si256((const __m256i *)(a + k * block + 32));
                _mm256_stream_si256((__m256i *)(q + off + k * block), x);
                _mm256_stream_si256((__m256i *)(q + off + k * block + 32), y);
            }
        }
        c = crc32c_shift(zeros, (uint32_t)c0) ^ (uint32_t)c1;
        c = crc32c_shift(zeros, c) ^ (uint32_t)c2;
        p += 3 * block;
        q += 3 * block;
        len -= 3 * block;
    }
    *srcp = p;
    *dstp = q;
    *lenp = len;
    return c;
}

/*
 * The streamed copy with dst at src's offset modulo 4 KiB (see DESIGN): the LONG, then the
 * SHORT rounds by lines. The head up to src's first line boundary and the tail after the
 * rounds (under 768 bytes) go through crc32c_hw_impl with cached stores.
 */
__attribute__((target("sse4.2,avx2"))) static uint32_t
crc32c_hw_copy_lines(uint32_t crc, unsigned char *q, const unsigned char *p, size_t len)
{
    size_t head = (size_t)(-(uintptr_t)p) & 63;
    if (head > len)
        head = len;
    crc = crc32c_hw_impl(crc, q, p, head, true, false);
    p += head;
    q += head;
    len -= head;
    uint32_t c = ~crc;
    c = crc32c_hw_line_rounds(c, &p, &q, &len, KVP_CRC32C_LONG, crc32c_zeros_long);
    c = crc32c_hw_line_rounds(c, &p, &q, &len, KVP_CRC32C_SHORT, crc32c_zeros_short);
    _mm_sfence(); /* order the streamed stores before anything the caller publishes */
    return crc32c_hw_impl(~c, q, p, len, true, false);
}

static KVP_TARGET_SSE42 uint32_t crc32c_hw_copy(uint32_t crc, void *dst, const void *src,
                                                size_t len, bool stream)
{
    /*
     * Non-temporal stores skip the read-for-ownership of dst: ~40% faster once the buffers
     * are out of cache. They are avoided when dst sits just above src modulo 4 KiB: loads
     * that alias a pending streamed store in the low 12 address bits stall for the whole
     * write-combining flush (measured: 0.3 GB/s instead of 14).
     */
    uintptr_t dist = ((uintptr_t)dst - (uintptr_t)src) & 4095;
    stream = stream || len >= KVP_CRC32C_STREAM_MIN;
    if (stream && dist == 0 && crc32c_have_avx2)
        return crc32c_hw_copy_lines(crc, dst, src, len);
    if (stream && (dist == 0 || dist >= KVP_CRC32C_NT_ALIAS))
        return crc32c_hw_impl(crc, dst, src, len, true, true);
    return crc32c_hw_impl(crc, dst, src, len, true, false);
}

/* ---- x86-64 VPCLMULQDQ + AVX-512: folding ---------------------------------------------- */

#define KVP_TARGET_FOLD                                                                            \
    __attribute__((target("sse4.2,pclmul,avx512f,avx512vl,avx512bw,avx512dq,vpclmulqdq")))
#define KVP_CRC32C_FOLD_MIN 512 /* shorter buffers take the three-chain loop */

static bool crc32c_have_fold;
/* Per distance D (bytes), the 64-bit operands (x^(8D+63) mod P) << 32 for a lane's low half and
 * (x^(8D-1) mod P) << 32 for its high half, reflected (crc32c_fold_consts). */
enum { FOLD_256, FOLD_192, FOLD_128, FOLD_64, FOLD_48, FOLD_32, FOLD_16, FOLD_N };
static const unsigned crc32c_fold_dist[FOLD_N] = {256, 192, 128, 64, 48, 32, 16};
static uint64_t crc32c_fold_k[FOLD_N][2];

/* x^n mod P, reflected (bit 31 is x^0). */
static uint32_t crc32c_xpow(uint64_t n)
{
    uint32_t xp = 1u << 31;
    for (unsigned k = 0; n != 0; n >>= 1, k++)
        if (n & 1)
            xp = crc32c_multmodp(crc32c_x2n[k], xp);
    return xp;
}

static void crc32c_fold_consts(void)
{
    pthread_once(&crc32c_x2n_once, crc32c_x2n_init);
    for (int i = 0; i < FOLD_N; i++) {
        uint64_t bits = 8ull * crc32c_fold_dist[i];
        crc32c_fold_k[i][0] = (uint64_t)crc32c_xpow(bits + 63) << 32;
        crc32c_fold_k[i][1] = (uint64_t)crc32c_xpow(bits - 1) << 32;
    }
}

static inline __attribute__((always_inline)) KVP_TARGET_FOLD __m512i crc32c_k512(int d)
{
    return _mm512_broadcast_i32x4(
        _mm_set_epi64x((long long)crc32c_fold_k[d][1], (long long)crc32c_fold_k[d][0]));
}

/* Each 128-bit lane of x carried over its distance, xor y. */
static inline __attribute__((always_inline)) KVP_TARGET_FOLD __m512i crc32c_fold512(__m512i x,
                                                                                    __m512i k,
                                                                                    __m512i y)
{
    return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x, k, 0x00),
                                     _mm512_clmulepi64_epi128(x, k, 0x11), y, 0x96);
}

static inline __attribute__((always_inline)) KVP_TARGET_FOLD __m128i crc32c_fold128(__m128i x,
                                                                                    int d,
                                                                                    __m128i y)
{
    __m128i k = _mm_set_epi64x((long long)crc32c_fold_k[d][1], (long long)crc32c_fold_k[d][0]);
    return _mm_ternarylogic_epi64(_mm_clmulepi64_si128(x, k, 0x00),
                                  _mm_clmulepi64_si128(x, k, 0x11), y, 0x96);
}

/* len >= KVP_CRC32C_FOLD_MIN. Conditioned crc in and out, as kvp_crc32c. */
static KVP_TARGET_FOLD uint32_t crc32c_fold(uint32_t crc, const unsigned char *p, size_t len)
{
    __m512i x0 = _mm512_loadu_si512((const void *)p);
    __m512i x1 = _mm512_loadu_si512((const void *)(p + 64));
    __m512i x2 = _mm512_loadu_si512((const void *)(p + 128));
    __m512i x3 = _mm512_loadu_si512((const void *)(p + 192));
    /* the register's start value is the same as xor-ing it into the first four bytes */
    x0 = _mm512_xor_si512(x0, _mm512_zextsi128_si512(_mm_cvtsi32_si128((int)~crc)));
    p += 256;
    len -= 256;
    const __m512i k256 = crc32c_k512(FOLD_256);
    while (len >= 256) {
        x0 = crc32c_fold512(x0, k256, _mm512_loadu_si512((const void *)p));
        x1 = crc32c_fold512(x1, k256, _mm512_loadu_si512((const void *)(p + 64)));
        x2 = crc32c_fold512(x2, k256, _mm512_loadu_si512((const void *)(p + 128)));
        x3 = crc32c_fold512(x3, k256, _mm512_loadu_si512((const void *)(p + 192)));
        p += 256;
        len -= 256;
    }
    /* the four accumulators into the last one's 64 bytes */
    __m512i x = crc32c_fold512(x0, crc32c_k512(FOLD_192), x3);
    x = crc32c_fold512(x1, crc32c_k512(FOLD_128), x);
    x = crc32c_fold512(x2, crc32c_k512(FOLD_64), x);
    const __m512i k64 = crc32c_k512(FOLD_64);
    while (len >= 64) {
        x = crc32c_fold512(x, k64, _mm512_loadu_si512((const void *)p));
        p += 64;
        len -= 64;
    }
    /* the four lanes into the last one's 16 bytes */
    __m128i r = _mm512_extracti32x4_epi32(x, 3);
    r = crc32c_fold128(_mm512_extracti32x4_epi32(x, 0), FOLD_48, r);
    r = crc32c_fold128(_mm512_extracti32x4_epi32(x, 1), FOLD_32, r);
    r = crc32c_fold128(_mm512_extracti32x4_epi32(x, 2), FOLD_16, r);
    while (len >= 16) {
        r = crc32c_fold128(r, FOLD_16, _mm_loadu_si128((const __m128i *)(const void *)p));
        p += 16;
        len -= 16;
    }
    /* what is left is r followed by the tail: the crc32 instruction from a zero register */
    uint64_t c = _mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(r));
    c = _mm_crc32_u64(c, (uint64_t)_mm_extract_epi64(r, 1));
    uint32_t c32 = (uint32_t)c;
    while (len > 0) {
        c32 = _mm_crc32_u8(c32, *p++);
        len--;
    }
    return ~c32;
}

#endif /* KVP_CRC32C_X86 */

/* ---- dispatch --------------------------------------------------------------------------- */

static void crc32c_init(void)
{
    crc32c_sw_tables_init();
#if defined(KVP_CRC32C_X86)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) {
        crc32c_zeros_init(crc32c_zeros_long, KVP_CRC32C_LONG);
        crc32c_zeros_init(crc32c_zeros_short, KVP_CRC32C_SHORT);
        crc32c_have_hw = true;
        crc32c_have_avx2 = __builtin_cpu_supports("avx2");
        if (__builtin_cpu_supports("vpclmulqdq") && __builtin_cpu_supports("avx512f") &&
            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("pclmul") &&
            /* a process-wide test knob, read once (pthread_once) where it acts; documented
             * with the client's environment (client/env.c, docs/options.md) */
            getenv("KVPOOL_CRC32C_NO_FOLD") == NULL) {
            crc32c_fold_consts();
            crc32c_have_fold = true;
        }
    }
#endif
}

uint32_t kvp_crc32c_sw(uint32_t crc, const void *buf, size_t len)
{
    pthread_once(&crc32c_once, crc32c_init);
    return ~crc32c_sw_update(~crc, buf, len);
}

uint32_t kvp_crc32c(uint32_t crc, const void *buf, size_t len)
{
    pthread_once(&crc32c_once, crc32c_init);
#if defined(KVP_CRC32C_X86)
    if (crc32c_have_fold && len >= KVP_CRC32C_FOLD_MIN)
        return crc32c_fold(crc, buf, len);
    if (crc32c_have_hw)
        return crc32c_hw(crc, buf, len);
#endif
    return ~crc32c_sw_update(~crc, buf, len);
}

uint32_t kvp_crc32c_copy(uint32_t crc, void *dst, const void *src, size_t len)
{
    return kvp_crc32c_copy_piece(crc, dst, src, len, false);
}

uint32_t kvp_crc32c_copy_piece(uint32_t crc, void *dst, const void *src, size_t len, bool stream)
{
    pthread_once(&crc32c_once, crc32c_init);
#if defined(KVP_CRC32C_X86)
    if (crc32c_have_hw)
        return crc32c_hw_copy(crc, dst, src, len, stream);
#else
    (void)stream;
#endif
    /* crc a chunk while it is read, then copy it out of L1: still one pass over memory */
    const unsigned char *p = src;
    unsigned char *q = dst;
    crc = ~crc;
    while (len > 0) {
        size_t n = len < KVP_CRC32C_SW_CHUNK ? len : KVP_CRC32C_SW_CHUNK;
        crc = crc32c_sw_update(crc, p, n);
        memcpy(q, p, n);
        p += n;
        q += n;
        len -= n;
    }
    return ~crc;
}

bool kvp_crc32c_hw_available(void)
{
    pthread_once(&crc32c_once, crc32c_init);
    return crc32c_have_hw;
}

/* ---- combine ---------------------------------------------------------------------------- */

/*
 * crc(A||B) from crc(A), crc(B) and |B|: crc(A) times x^(8|B|) modulo the polynomial, xor
 * crc(B) (the pre/post conditioning cancels out, as in zlib's crc32_combine). Polynomials are
 * kept reflected: bit 31 is x^0. x^(2^k) mod P is tabled once for k = 0..63.
 */

static uint32_t crc32c_multmodp(uint32_t a, uint32_t b)
{
    uint32_t m = 1u << 31, p = 0;
    while (m != 0 && a != 0) {
        if (a & m) {
            p ^= b;
            a ^= m;
        }
        m >>= 1;
        b = (b & 1) ? (b >> 1) ^ KVP_CRC32C_POLY : b >> 1;
    }
    return p;
}

static void crc32c_x2n_init(void)
{
    uint32_t p = 1u << 30; /* x^1 */
    crc32c_x2n[0] = p;
    for (int k = 1; k < 64; k++)
        crc32c_x2n[k] = p = crc32c_multmodp(p, p);
}

uint32_t kvp_crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b)
{
    pthread_once(&crc32c_x2n_once, crc32c_x2n_init);
    uint32_t xp = 1u << 31; /* x^0 */
    unsigned k = 3;         /* bytes -> bits: x^(8 len_b) */
    for (uint64_t n = len_b; n != 0; n >>= 1, k++)
        if (n & 1)
            xp = crc32c_multmodp(crc32c_x2n[k & 63], xp);
    return crc32c_multmodp(xp, crc_a) ^ crc_b;
}
