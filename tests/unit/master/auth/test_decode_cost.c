/*
 * test_decode_cost.c - unit tests for master/auth/decode_cost.c: the largest requests the
 * library sends fit the budget (a batch of 65 536 keys, PutStart with sizes, an Adopt
 * offer), the amplifying ones are refused (empty keys, empty sub-messages, unknown fields
 * past 1024), a body it cannot read is left to protobuf-c, and a property: for random
 * bodies of every request type (fields of the message, unknown ones, repeated and packed
 * runs), the estimate is never below what protobuf-c's unpack really allocates (counted
 * through an allocator of our own, 16 bytes of overhead each).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvpool.pb-c.h"
#include "master/auth/decode_cost.h"
#include "master/dispatch.h"

static bool within(const ProtobufCMessageDescriptor *d, const uint8_t *b, size_t n,
                   kvp_decode_cost_t *c)
{
    char why[200] = "";
    bool ok = kvp_decode_cost(d, b, n, c, why, sizeof(why));
    if (!ok)
        assert_non_null(strstr(why, "refused before decoding"));
    return ok;
}

static uint8_t *repeat(const uint8_t *unit, size_t ulen, size_t n, size_t *len_p)
{
    uint8_t *b = malloc(ulen * n);
    assert_non_null(b);
    for (size_t i = 0; i < n; i++)
        memcpy(b + i * ulen, unit, ulen);
    *len_p = ulen * n;
    return b;
}

/* ---- what the library sends fits ---- */

static void test_largest_batches_fit(void **state)
{
    (void)state;
    enum { N = 65536 };
    static char names[N][8];
    ProtobufCBinaryData *keys = calloc(N, sizeof(*keys));
    uint64_t *sizes = calloc(N, sizeof(*sizes));
    assert_non_null(keys);
    assert_non_null(sizes);
    for (size_t i = 0; i < N; i++) {
        names[i][0] = (char)('a' + i % 26); /* 1-byte keys: the costliest per wire byte */
        keys[i].data = (uint8_t *)names[i];
        keys[i].len = 1;
        sizes[i] = 1;
    }
    Kvpool__PutStartRequest ps = KVPOOL__PUT_START_REQUEST__INIT;
    ps.n_keys = N;
    ps.keys = keys;
    ps.n_sizes = N;
    ps.sizes = sizes;
    size_t len = kvpool__put_start_request__get_packed_size(&ps);
    uint8_t *b = malloc(len);
    assert_non_null(b);
    kvpool__put_start_request__pack(&ps, b);
    kvp_decode_cost_t c;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_true(within(&kvpool__put_start_request__descriptor, b, len, &c));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    print_message("PutStart of %d 1-byte keys: %zu bytes, estimate %llu, walked in %.2f ms\n", N,
                  len, (unsigned long long)c.bytes,
                  (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
    free(b);

    /* an Adopt offer as record_sync.c sends it: 1024 entries */
    Kvpool__AdoptEntry e[1024], *ep[1024];
    for (size_t i = 0; i < 1024; i++) {
        kvpool__adopt_entry__init(&e[i]);
        e[i].key.data = (uint8_t *)names[i];
        e[i].key.len = 1;
        e[i].version = i + 1;
        e[i].offset = i << 12;
        e[i].size = 4096;
        e[i].crc32c = 0xdeadbeef;
        ep[i] = &e[i];
    }
    Kvpool__AdoptRequest ad = KVPOOL__ADOPT_REQUEST__INIT;
    ad.segment_id = 1;
    ad.n_entries = 1024;
    ad.entries = ep;
    len = kvpool__adopt_request__get_packed_size(&ad);
    b = malloc(len);
    assert_non_null(b);
    kvpool__adopt_request__pack(&ad, b);
    assert_true(within(&kvpool__adopt_request__descriptor, b, len, &c));
    free(b);
    free(keys);
    free(sizes);
}

/* ---- amplifying bodies are refused ---- */

static void test_amplifiers_refused(void **state)
{
    (void)state;
    kvp_decode_cost_t c;
    size_t len;
    const uint8_t empty_key[] = {1 << 3 | 2, 0};
    uint8_t *b = repeat(empty_key, 2, 4u << 20, &len); /* 8 MB of empty keys */
    assert_false(within(&kvpool__keys_request__descriptor, b, len, &c));
    assert_true(c.bytes > KVP_DECODE_BUDGET(len));
    free(b);
    const uint8_t empty_entry[] = {2 << 3 | 2, 0};
    b = repeat(empty_entry, 2, 4u << 20, &len);
    assert_false(within(&kvpool__adopt_request__descriptor, b, len, &c));
    free(b);
    /* unknown fields: 1024 pass, 1025 do not */
    const uint8_t unknown[] = {15 << 3 | 0, 1};
    b = repeat(unknown, 2, 1024, &len);
    assert_true(within(&kvpool__heartbeat_request__descriptor, b, len, &c));
    assert_int_equal(c.unknown, 1024);
    free(b);
    b = repeat(unknown, 2, 1025, &len);
    assert_false(within(&kvpool__heartbeat_request__descriptor, b, len, &c));
    free(b);
    /* inside a sub-message too (PutConfig of PutStart, field 3) */
    uint8_t nested[3 + 2 * 1100];
    nested[0] = 3 << 3 | 2;
    nested[1] = 0x80 | ((2 * 1100) & 0x7f);
    nested[2] = (2 * 1100) >> 7;
    for (size_t i = 0; i < 1100; i++)
        memcpy(nested + 3 + 2 * i, unknown, 2);
    assert_false(within(&kvpool__put_start_request__descriptor, nested, sizeof(nested), &c));
    /* one singular sub-message sent 40 000 times (PutConfig with one avoid_segments each):
     * merged 39 999 times, each copying what the earlier ones held (k^2) */
    const uint8_t config[] = {3 << 3 | 2, 2, 7 << 3 | 0, 1};
    b = repeat(config, sizeof(config), 40000, &len);
    assert_false(within(&kvpool__put_start_request__descriptor, b, len, &c));
    free(b);
    b = repeat(config, sizeof(config), 100, &len);
    assert_true(within(&kvpool__put_start_request__descriptor, b, len, &c));
    free(b);
}

static void test_unreadable_left_to_protobuf(void **state)
{
    (void)state;
    kvp_decode_cost_t c;
    const uint8_t past_end[] = {1 << 3 | 2, 100, 'a'};
    assert_true(within(&kvpool__keys_request__descriptor, past_end, sizeof(past_end), &c));
    const uint8_t group[] = {1 << 3 | 3};
    assert_true(within(&kvpool__keys_request__descriptor, group, sizeof(group), &c));
    const uint8_t bad_varint[] = {0x80, 0x80, 0x80};
    assert_true(within(&kvpool__keys_request__descriptor, bad_varint, sizeof(bad_varint), &c));
    /* an empty body, as a frame without one hands it: NULL (UBSan: no arithmetic on it) */
    assert_true(within(&kvpool__keys_request__descriptor, NULL, 0, &c));
    assert_int_equal(c.fields, 0);
}

/* ---- the estimate is never below protobuf-c's allocations ---- */

static uint64_t allocated;

static void *count_alloc(void *data, size_t size)
{
    (void)data;
    allocated += size + 16;
    return malloc(size);
}

static void count_free(void *data, void *p)
{
    (void)data;
    free(p);
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static size_t put_varint(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    do {
        p[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v != 0);
    return n;
}

/* A random body for d: its own fields (by their wire type, or packed runs for repeated
 * scalars), unknown ones, sub-messages to depth 3. */
static size_t random_body(const ProtobufCMessageDescriptor *d, uint8_t *p, size_t cap,
                          unsigned depth)
{
    size_t n = 0;
    unsigned fields = (unsigned)(rnd() % (depth == 0 && rnd() % 4 == 0 ? 300 : 24));
    for (unsigned i = 0; i < fields && n + 64 < cap; i++) {
        bool unknown = d->n_fields == 0 || rnd() % 5 == 0;
        const ProtobufCFieldDescriptor *f = unknown ? NULL : &d->fields[rnd() % d->n_fields];
        if (f == NULL) {
            unsigned wt = (unsigned[]){0, 1, 2, 5}[rnd() % 4];
            n += put_varint(p + n, (uint64_t)(100 + rnd() % 1000) << 3 | wt);
            if (wt == 0)
                n += put_varint(p + n, rnd() >> (rnd() % 64));
            else if (wt == 1)
                n += 8;
            else if (wt == 5)
                n += 4;
            else {
                size_t l = rnd() % 20;
                n += put_varint(p + n, l);
                n += l;
            }
            continue;
        }
        switch (f->type) {
        case PROTOBUF_C_TYPE_MESSAGE: {
            if (depth >= 3)
                break;
            uint8_t sub[4096];
            size_t sl = random_body(f->descriptor, sub, sizeof(sub), depth + 1);
            if (n + sl + 16 > cap)
                break;
            n += put_varint(p + n, (uint64_t)f->id << 3 | 2);
            n += put_varint(p + n, sl);
            memcpy(p + n, sub, sl);
            n += sl;
            break;
        }
        case PROTOBUF_C_TYPE_STRING:
        case PROTOBUF_C_TYPE_BYTES: {
            size_t l = rnd() % 8;
            n += put_varint(p + n, (uint64_t)f->id << 3 | 2);
            n += put_varint(p + n, l);
            for (size_t k = 0; k < l; k++)
                p[n++] = (uint8_t)('a' + rnd() % 26); /* valid UTF-8 for strings */
            break;
        }
        case PROTOBUF_C_TYPE_FIXED64:
        case PROTOBUF_C_TYPE_SFIXED64:
        case PROTOBUF_C_TYPE_DOUBLE:
        case PROTOBUF_C_TYPE_FIXED32:
        case PROTOBUF_C_TYPE_SFIXED32:
        case PROTOBUF_C_TYPE_FLOAT: {
            bool w64 = f->type == PROTOBUF_C_TYPE_FIXED64 || f->type == PROTOBUF_C_TYPE_SFIXED64 ||
                       f->type == PROTOBUF_C_TYPE_DOUBLE;
            size_t w = w64 ? 8 : 4;
            if (f->label == PROTOBUF_C_LABEL_REPEATED && rnd() % 2) {
                size_t k = rnd() % 6;
                n += put_varint(p + n, (uint64_t)f->id << 3 | 2);
                n += put_varint(p + n, k * w);
                memset(p + n, 0, k * w);
                n += k * w;
            } else {
                n += put_varint(p + n, (uint64_t)f->id << 3 | (w64 ? 1 : 5));
                memset(p + n, 0, w);
                n += w;
            }
            break;
        }
        default: /* varint types */
            if (f->label == PROTOBUF_C_LABEL_REPEATED && rnd() % 2) {
                uint8_t run[64];
                size_t rl = 0, k = rnd() % 6;
                for (size_t j = 0; j < k; j++)
                    rl += put_varint(run + rl, rnd() % 300);
                n += put_varint(p + n, (uint64_t)f->id << 3 | 2);
                n += put_varint(p + n, rl);
                memcpy(p + n, run, rl);
                n += rl;
            } else {
                n += put_varint(p + n, (uint64_t)f->id << 3 | 0);
                n += put_varint(p + n, rnd() % 2);
            }
        }
    }
    return n;
}

static void test_estimate_never_below_unpack(void **state)
{
    (void)state;
    ProtobufCAllocator counting = {.alloc = count_alloc, .free = count_free};
    size_t n_methods;
    const kvp_method_t *m = kvp_dispatch_table(&n_methods);
    static uint8_t body[1 << 16];
    unsigned decoded = 0;
    for (unsigned round = 0; round < 20000; round++) {
        const kvp_method_t *row = &m[rnd() % n_methods];
        if (row->handler == NULL || row->req_desc == NULL)
            continue;
        size_t len = random_body(row->req_desc, body, sizeof(body), 0);
        kvp_decode_cost_t c;
        char why[200];
        if (!kvp_decode_cost(row->req_desc, body, len, &c, why, sizeof(why)))
            continue;
        allocated = 0;
        ProtobufCMessage *msg = protobuf_c_message_unpack(row->req_desc, &counting, len, body);
        if (msg == NULL)
            continue;
        decoded++;
        if (allocated > c.bytes)
            fail_msg("%s of %zu bytes: unpack allocated %llu, estimate %llu", row->name, len,
                     (unsigned long long)allocated, (unsigned long long)c.bytes);
        protobuf_c_message_free_unpacked(msg, &counting);
    }
    print_message("%u random bodies decoded, every estimate at or above the unpack\n", decoded);
    assert_true(decoded > 5000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_largest_batches_fit),
        cmocka_unit_test(test_amplifiers_refused),
        cmocka_unit_test(test_unreadable_left_to_protobuf),
        cmocka_unit_test(test_estimate_never_below_unpack),
    };
    return cmocka_run_group_tests_name("decode_cost", tests, NULL, NULL);
}
