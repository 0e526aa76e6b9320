/*
 * crc32c.h - CRC32C (Castagnoli), hardware-accelerated where the CPU has it.
 *
 * Chaining: kvp_crc32c(kvp_crc32c(0, a, na), b, nb) == kvp_crc32c(0, a||b, na+nb).
 * The initial value is 0; the ~ pre/post conditioning is done inside, so the
 * value of "123456789" is 0xE3069283 as in RFC 3720.
 *
 * Thread: all functions are thread-safe (CPU feature detection is done once).
 */
#ifndef KVP_COMMON_CRC32C_H
#define KVP_COMMON_CRC32C_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

uint32_t kvp_crc32c(uint32_t crc, const void *buf, size_t len);

/* Portable table-driven implementation (the reference the hw path is tested against). */
uint32_t kvp_crc32c_sw(uint32_t crc, const void *buf, size_t len);

/*
 * Copy `len` bytes from src to dst (non-overlapping) and return the CRC32C of
 * those bytes chained onto `crc`, in a single pass over the data: this is how
 * the shm transport keeps near-memcpy speed with checksums on.
 */
uint32_t kvp_crc32c_copy(uint32_t crc, void *dst, const void *src, size_t len);

/* Copies of at least this many bytes stream their stores past the cache (crc32c.c). */
#define KVP_CRC32C_STREAM_MIN ((size_t)1 << 20)

/*
 * kvp_crc32c_copy of one piece of a larger whole: with `stream` (the whole is at least
 * KVP_CRC32C_STREAM_MIN bytes) the piece is copied with streamed stores however small it
 * is, as the whole would be, so an object scattered into 16 KiB buffers costs what it
 * costs in one buffer.
 */
uint32_t kvp_crc32c_copy_piece(uint32_t crc, void *dst, const void *src, size_t len, bool stream);

/*
 * The CRC32C of A||B from crc_a = kvp_crc32c(0, A, |A|), crc_b = kvp_crc32c(0, B, len_b)
 * and len_b, without the bytes: O(log len_b). Lets pieces that land in any order be
 * checksummed each while it is in cache and the op's CRC be put together afterwards.
 */
uint32_t kvp_crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

/* True when the SSE4.2 crc32 instruction is used. */
bool kvp_crc32c_hw_available(void);

#endif
