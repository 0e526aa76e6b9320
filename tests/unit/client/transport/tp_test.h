/*
 * tp_test.h - what the transport tests (test_tcp.c, test_shm.c) share: sizes,
 * a byte pattern, ops built the same way, and a batch handed straight to a
 * transport's submit (no engine between the test and the transport).
 */
#ifndef KVP_TESTS_UNIT_CLIENT_TRANSPORT_TP_TEST_H
#define KVP_TESTS_UNIT_CLIENT_TRANSPORT_TP_TEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdlib.h>

#include "client/transfer/engine.h"

#define KIB 1024ull
#define MIB (1024ull * 1024)
/* What an op's crc holds until a transport writes it. */
#define SENTINEL_CRC 0x5a5a5a5au

static inline void fill(uint8_t *p, size_t len, uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = (uint8_t)x;
    }
}

static inline uint8_t *xmalloc(size_t len)
{
    uint8_t *p = malloc(len);
    assert_non_null(p);
    return p;
}

/* An op wanting a CRC, its outputs set to values no transport writes. */
static inline kvp_xfer_op_t op_of(kvp_xfer_kind_t kind, kvp_peer_t *p, void *local, uint64_t off,
                                  uint64_t len)
{
    return (kvp_xfer_op_t){.kind = kind,
                           .local = local,
                           .offset = off,
                           .length = len,
                           .peer = p,
                           .want_crc = true,
                           .crc = SENTINEL_CRC,
                           .status = KVP_ERR_INTERNAL};
}

/* A batch straight to the transport's submit. */
static inline void tp_submit(const kvp_transport_t *tp, kvp_xfer_op_t *ops, size_t n)
{
    kvp_xfer_op_t **ptrs = calloc(n, sizeof(*ptrs));
    assert_non_null(ptrs);
    for (size_t i = 0; i < n; i++)
        ptrs[i] = &ops[i];
    tp->ops->submit(tp->ctx, ptrs, n);
    free(ptrs);
}

#endif
