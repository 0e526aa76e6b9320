/*
 * test_grant.c - unit tests for common/grant.c: a sealed grant is taken for
 * its extent and any part of it, and refused for everything else: each of
 * its 640 bits flipped, 10^6 random grants, the wrong op, segment, epoch or
 * key, a range past its extent or wrapping past 2^64, an empty range, and
 * once expired (past the clock slack). The keyring and verifier pick up a
 * new key, and drop checks when the key is taken away. A grant set (one MAC over
 * many extents) is refused the same ways, bit by bit and at random.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <string.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "common/grant.h"

static const uint8_t KEY[KVP_GRANT_KEY_LEN] = "0123456789abcdef0123456789abcdef";
static const uint8_t KEY2[KVP_GRANT_KEY_LEN] = "fedcba9876543210fedcba9876543210";

#define SEG 0x1234u
#define EPOCH 0xE90Cu
#define NOW 1000000u

static kvp_grant_t sealed(kvp_grant_mac_t *m, uint8_t op)
{
    kvp_grant_t g = {.version = KVP_GRANT_VERSION,
                     .op = op,
                     .segment_id = SEG,
                     .offset = 4096,
                     .length = 8192,
                     .expiry_ms = NOW + 5000,
                     .epoch = EPOCH,
                     .nonce = 7,
                     .principal = 0xABCDu};
    assert_true(kvp_grant_seal(m, &g));
    return g;
}

static kvp_status_t check(kvp_grant_mac_t *m, const kvp_grant_t *g, uint8_t op, uint64_t off,
                          uint64_t len, uint64_t now, const char **why)
{
    return kvp_grant_check(m, g, op, SEG, off, len, EPOCH, now, why);
}

static void test_grant_taken_for_its_extent(void **state)
{
    (void)state;
    kvp_grant_mac_t *m;
    assert_int_equal(kvp_grant_mac_create(KEY, &m), KVP_OK);
    kvp_grant_t g = sealed(m, KVP_GRANT_READ);
    const char *why = "unset";
    assert_int_equal(check(m, &g, KVP_GRANT_READ, 4096, 8192, NOW, &why), KVP_OK);
    assert_null(why);
    /* any part of it: the first byte, the last byte, a slice in the middle */
    assert_int_equal(check(m, &g, KVP_GRANT_READ, 4096, 1, NOW, NULL), KVP_OK);
    assert_int_equal(check(m, &g, KVP_GRANT_READ, 4096 + 8191, 1, NOW, NULL), KVP_OK);
    assert_int_equal(check(m, &g, KVP_GRANT_READ, 6000, 2000, NOW, NULL), KVP_OK);
    /* up to the expiry plus the slack for clocks */
    assert_int_equal(check(m, &g, KVP_GRANT_READ, 4096, 8192, NOW + 5000 + KVP_GRANT_SKEW_MS, NULL),
                     KVP_OK);
    kvp_grant_mac_destroy(m);
}

static void test_grant_refused_otherwise(void **state)
{
    (void)state;
    kvp_grant_mac_t *m, *m2;
    assert_int_equal(kvp_grant_mac_create(KEY, &m), KVP_OK);
    assert_int_equal(kvp_grant_mac_create(KEY2, &m2), KVP_OK);
    kvp_grant_t r = sealed(m, KVP_GRANT_READ), w = sealed(m, KVP_GRANT_WRITE);
    const char *why = NULL;
    assert_int_equal(check(m, &r, KVP_GRANT_WRITE, 4096, 8192, NOW, &why), KVP_ERR_DENIED);
    assert_string_equal(why, "a read grant used to write");
    assert_int_equal(check(m, &w, KVP_GRANT_READ, 4096, 8192, NOW, &why), KVP_ERR_DENIED);
    assert_int_equal(check(m, &w, KVP_GRANT_WRITE, 4096, 8192, NOW, NULL), KVP_OK);
    /* another segment, another epoch, another key */
    assert_int_equal(kvp_grant_check(m, &r, KVP_GRANT_READ, SEG + 1, 4096, 8192, EPOCH, NOW, &why),
                     KVP_ERR_DENIED);
    assert_string_equal(why, "a grant for another segment");
    assert_int_equal(kvp_grant_check(m, &r, KVP_GRANT_READ, SEG, 4096, 8192, EPOCH + 1, NOW, &why),
                     KVP_ERR_DENIED);
    assert_string_equal(why, "a grant from another epoch of the master");
    assert_int_equal(check(m2, &r, KVP_GRANT_READ, 4096, 8192, NOW, &why), KVP_ERR_DENIED);
    assert_non_null(strstr(why, "MAC"));
    /* outside the extent: before it, past it, wrapping past 2^64, empty */
    assert_int_equal(check(m, &r, KVP_GRANT_READ, 4095, 2, NOW, &why), KVP_ERR_DENIED);
    assert_string_equal(why, "the request reaches outside the grant's extent");
    assert_int_equal(check(m, &r, KVP_GRANT_READ, 4096, 8193, NOW, NULL), KVP_ERR_DENIED);
    assert_int_equal(check(m, &r, KVP_GRANT_READ, 4096 + 8192, 1, NOW, NULL), KVP_ERR_DENIED);
    assert_int_equal(check(m, &r, KVP_GRANT_READ, UINT64_MAX - 10, 4096 + 20, NOW, NULL),
                     KVP_ERR_DENIED);
    assert_int_equal(check(m, &r, KVP_GRANT_READ, 5000, UINT64_MAX, NOW, NULL), KVP_ERR_DENIED);
    assert_int_equal(check(m, &r, KVP_GRANT_READ, 5000, 0, NOW, NULL), KVP_ERR_DENIED);
    /* expired */
    assert_int_equal(
        check(m, &r, KVP_GRANT_READ, 4096, 8192, NOW + 5000 + KVP_GRANT_SKEW_MS + 1, &why),
        KVP_ERR_DENIED);
    assert_string_equal(why, "the grant has expired");
    /* a grant whose extent was widened by its holder: the MAC no longer matches */
    kvp_grant_t wide = r;
    wide.length = UINT64_MAX - wide.offset;
    assert_int_equal(check(m, &wide, KVP_GRANT_READ, 4096, 1 << 20, NOW, &why), KVP_ERR_DENIED);
    assert_non_null(strstr(why, "MAC"));
    kvp_grant_mac_destroy(m);
    kvp_grant_mac_destroy(m2);
}

/* Every single bit of the 80 flipped: none is taken. */
static void test_grant_bit_flips(void **state)
{
    (void)state;
    kvp_grant_mac_t *m;
    assert_int_equal(kvp_grant_mac_create(KEY, &m), KVP_OK);
    kvp_grant_t g = sealed(m, KVP_GRANT_WRITE);
    unsigned taken = 0;
    for (unsigned bit = 0; bit < 8 * sizeof(g); bit++) {
        kvp_grant_t f = g;
        ((uint8_t *)&f)[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        taken += check(m, &f, KVP_GRANT_WRITE, 4096, 8192, NOW, NULL) == KVP_OK;
    }
    assert_int_equal(taken, 0);
    kvp_grant_mac_destroy(m);
}

/* 10^6 random grants (random MACs over fields that otherwise pass): none is taken. */
static void test_grant_random(void **state)
{
    (void)state;
    kvp_grant_mac_t *m;
    assert_int_equal(kvp_grant_mac_create(KEY, &m), KVP_OK);
    kvp_grant_t g = sealed(m, KVP_GRANT_READ);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    unsigned taken = 0;
    for (unsigned i = 0; i < 1000000; i++) {
        kvp_grant_t f = g;
        for (unsigned b = 0; b < KVP_GRANT_MAC_LEN; b += 8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            memcpy(f.mac + b, &x, 8);
        }
        if (i % 2) /* half of them entirely random */
            for (unsigned b = 0; b + 8 <= offsetof(kvp_grant_t, mac); b += 8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                memcpy((uint8_t *)&f + b, &x, 8);
            }
        taken += check(m, &f, KVP_GRANT_READ, f.offset, f.length ? 1 : 0, NOW, NULL) == KVP_OK;
    }
    assert_int_equal(taken, 0);
    kvp_grant_mac_destroy(m);
}

/* Our HMAC (precomputed SHA-256 states) is RFC 2104's: the MAC of a grant and a connection
 * key equal OpenSSL's own HMAC-SHA256 of the same bytes; and sealing allocates nothing. */
static long n_alloc;
static void *count_malloc(size_t n, const char *f, int l)
{
    (void)f, (void)l;
    n_alloc++;
    return malloc(n);
}
static void *count_realloc(void *p, size_t n, const char *f, int l)
{
    (void)f, (void)l;
    n_alloc++;
    return realloc(p, n);
}
static void count_free(void *p, const char *f, int l)
{
    (void)f, (void)l;
    free(p);
}

static void test_grant_is_hmac_sha256(void **state)
{
    (void)state;
    kvp_grant_mac_t *m;
    assert_int_equal(kvp_grant_mac_create(KEY, &m), KVP_OK);
    kvp_grant_t g = sealed(m, KVP_GRANT_WRITE);
    uint8_t want[32];
    size_t n = 0;
    assert_non_null(EVP_Q_mac(NULL, "HMAC", NULL, "SHA256", NULL, KEY, sizeof(KEY), (void *)&g,
                              offsetof(kvp_grant_t, mac), want, sizeof(want), &n));
    assert_memory_equal(g.mac, want, KVP_GRANT_MAC_LEN);
    uint8_t msg[24] = "kvpool conn key", ck[32];
    uint64_t tag = 0x1234567890ABCDEFull;
    memcpy(msg + 16, &tag, sizeof(tag));
    assert_true(kvp_grant_conn_key(m, tag, ck));
    assert_non_null(EVP_Q_mac(NULL, "HMAC", NULL, "SHA256", NULL, KEY, sizeof(KEY), msg,
                              sizeof(msg), want, sizeof(want), &n));
    assert_memory_equal(ck, want, 32);
    long before = n_alloc;
    for (int i = 0; i < 1000; i++) {
        assert_true(kvp_grant_seal(m, &g));
        assert_int_equal(check(m, &g, KVP_GRANT_WRITE, 4096, 1, NOW, NULL), KVP_OK);
    }
    assert_int_equal(n_alloc, before); /* (OpenSSL's allocations are counted; ours are none) */
    kvp_grant_mac_destroy(m);
}

static void test_grant_keyring(void **state)
{
    (void)state;
    kvp_grant_keyring_t kr;
    kvp_grant_keyring_init(&kr);
    kvp_grant_verifier_t v = {0};
    assert_true(kvp_grant_verifier_sync(&v, &kr));
    assert_false(v.on); /* never set: off */
    kvp_grant_keyring_set(&kr, KEY, sizeof(KEY), EPOCH);
    assert_true(kvp_grant_verifier_sync(&v, &kr));
    assert_true(v.on);
    assert_int_equal(v.epoch, EPOCH);
    kvp_grant_mac_t *m;
    assert_int_equal(kvp_grant_mac_create(KEY, &m), KVP_OK);
    kvp_grant_t g = sealed(m, KVP_GRANT_READ);
    assert_int_equal(kvp_grant_check(v.mac, &g, KVP_GRANT_READ, SEG, 4096, 1, v.epoch, NOW, NULL),
                     KVP_OK);
    /* a remount's new key: the old grant no longer passes */
    kvp_grant_keyring_set(&kr, KEY2, sizeof(KEY2), EPOCH);
    assert_true(kvp_grant_verifier_sync(&v, &kr));
    assert_int_equal(kvp_grant_check(v.mac, &g, KVP_GRANT_READ, SEG, 4096, 1, v.epoch, NOW, NULL),
                     KVP_ERR_DENIED);
    /* a key of the wrong size, or none: off */
    kvp_grant_keyring_set(&kr, KEY, 16, EPOCH);
    assert_true(kvp_grant_verifier_sync(&v, &kr));
    assert_false(v.on);
    kvp_grant_mac_destroy(m);
    kvp_grant_verifier_cleanup(&v);
    kvp_grant_keyring_cleanup(&kr);
}

/* A set of 3 extents (a write set: each with its object's version), sealed. */
typedef struct {
    kvp_grant_set_hdr_t h;
    kvp_grant_extent_t e[3];
} set3_t;

static set3_t sealed_set(kvp_grant_mac_t *m, uint8_t op)
{
    set3_t s = {.h = {.version = KVP_GRANT_SET_VERSION,
                      .op = op,
                      .count = 3,
                      .segment_id = SEG,
                      .expiry_ms = NOW + 5000,
                      .epoch = EPOCH,
                      .nonce = 9,
                      .principal = 0xABCDu},
                .e = {{0, 4096, 11}, {8192, 4096, 12}, {65536, 1 << 20, 13}}};
    assert_true(kvp_grant_set_seal(m, &s.h, s.e));
    return s;
}

static kvp_status_t set_check(kvp_grant_mac_t *m, const set3_t *s, uint8_t op, uint64_t now,
                              const char **why)
{
    return kvp_grant_set_check(m, &s->h, s->e, op, SEG, EPOCH, now, why);
}

/* A set is HMAC-SHA256 of its header's first 48 bytes and its extents (OpenSSL's own HMAC
 * agrees), taken for its op, segment, epoch and time, and each extent covers what lies in
 * it; every one of its bits flipped, 10^6 random ones, another key, op, segment, epoch, a
 * count of 0 or past the limit, and after expiry: refused. */
static void test_grant_set(void **state)
{
    (void)state;
    kvp_grant_mac_t *m, *m2;
    assert_int_equal(kvp_grant_mac_create(KEY, &m), KVP_OK);
    assert_int_equal(kvp_grant_mac_create(KEY2, &m2), KVP_OK);
    set3_t s = sealed_set(m, KVP_GRANT_WRITE);
    uint8_t msg[48 + sizeof(s.e)], want[32];
    memcpy(msg, &s.h, 48);
    memcpy(msg + 48, s.e, sizeof(s.e));
    size_t n = 0;
    assert_non_null(EVP_Q_mac(NULL, "HMAC", NULL, "SHA256", NULL, KEY, sizeof(KEY), msg,
                              sizeof(msg), want, sizeof(want), &n));
    assert_memory_equal(s.h.mac, want, KVP_GRANT_MAC_LEN);
    const char *why = "unset";
    assert_int_equal(set_check(m, &s, KVP_GRANT_WRITE, NOW, &why), KVP_OK);
    assert_null(why);
    assert_int_equal(set_check(m, &s, KVP_GRANT_WRITE, NOW + 5000 + KVP_GRANT_SKEW_MS, NULL),
                     KVP_OK);
    /* the extents: inside, at the edges; not past them, not empty, not wrapping */
    assert_true(kvp_grant_extent_covers(&s.e[1], 8192, 4096));
    assert_true(kvp_grant_extent_covers(&s.e[2], 65536 + 100, 200));
    assert_false(kvp_grant_extent_covers(&s.e[1], 8192, 4097));
    assert_false(kvp_grant_extent_covers(&s.e[1], 8191, 2));
    assert_false(kvp_grant_extent_covers(&s.e[1], 8192, 0));
    assert_false(kvp_grant_extent_covers(&s.e[1], UINT64_MAX - 8, 16));
    /* the wrong op, segment, epoch, key, time */
    assert_int_equal(set_check(m, &s, KVP_GRANT_READ, NOW, &why), KVP_ERR_DENIED);
    assert_string_equal(why, "a write grant used to read");
    assert_int_equal(kvp_grant_set_check(m, &s.h, s.e, KVP_GRANT_WRITE, SEG + 1, EPOCH, NOW, &why),
                     KVP_ERR_DENIED);
    assert_string_equal(why, "a grant for another segment");
    assert_int_equal(kvp_grant_set_check(m, &s.h, s.e, KVP_GRANT_WRITE, SEG, EPOCH + 1, NOW, &why),
                     KVP_ERR_DENIED);
    assert_string_equal(why, "a grant from another epoch of the master");
    assert_int_equal(set_check(m2, &s, KVP_GRANT_WRITE, NOW, &why), KVP_ERR_DENIED);
    assert_int_equal(set_check(m, &s, KVP_GRANT_WRITE, NOW + 5001 + KVP_GRANT_SKEW_MS, &why),
                     KVP_ERR_DENIED);
    assert_string_equal(why, "the grant has expired");
    /* a count of 0, or past the limit: refused before anything is hashed */
    set3_t c = s;
    c.h.count = 0;
    assert_int_equal(set_check(m, &c, KVP_GRANT_WRITE, NOW, NULL), KVP_ERR_DENIED);
    c.h.count = KVP_GRANT_SET_MAX + 1;
    assert_int_equal(set_check(m, &c, KVP_GRANT_WRITE, NOW, NULL), KVP_ERR_DENIED);
    /* a single grant's MAC is never a set's: a set of 1 extent under the same fields */
    kvp_grant_t g = sealed(m, KVP_GRANT_WRITE);
    c.h.count = 1;
    memcpy(c.h.mac, g.mac, KVP_GRANT_MAC_LEN);
    assert_int_equal(set_check(m, &c, KVP_GRANT_WRITE, NOW, NULL), KVP_ERR_DENIED);
    /* every bit of the header (the MAC's too) and of the extents */
    unsigned taken = 0;
    for (size_t bit = 0; bit < sizeof(s) * 8; bit++) {
        set3_t f = s;
        ((uint8_t *)&f)[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        if (f.h.count > 3) /* a count past what this test holds: the check reads no further */
            continue;
        taken += set_check(m, &f, KVP_GRANT_WRITE, NOW, NULL) == KVP_OK;
    }
    assert_int_equal(taken, 0);
    /* 10^6 random MACs, half of them with random fields too (the count kept in range) */
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (unsigned i = 0; i < 1000000; i++) {
        set3_t f = s;
        size_t upto = i % 2 ? sizeof(f) : KVP_GRANT_MAC_LEN;
        uint8_t *p = i % 2 ? (uint8_t *)&f : f.h.mac;
        for (size_t b = 0; b + 8 <= upto; b += 8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            memcpy(p + b, &x, 8);
        }
        f.h.count = 1 + (uint32_t)(x % 3);
        taken += set_check(m, &f, f.h.op, NOW, NULL) == KVP_OK;
    }
    assert_int_equal(taken, 0);
    kvp_grant_mac_destroy(m);
    kvp_grant_mac_destroy(m2);
}

/* A mount proof (PROVE) is HMAC-SHA256(secret, "kvpool prove" NUL-padded to 16, nonce, name):
 * the vector computed by Python's hmac, as tests/python/test_mount_proof.py's server does. */
static void test_mount_proof_vector(void **state)
{
    (void)state;
    uint8_t secret[KVP_PROVE_SECRET_LEN], nonce[KVP_PROVE_NONCE_LEN], out[KVP_PROVE_LEN];
    for (unsigned i = 0; i < 32; i++) {
        secret[i] = (uint8_t)i;
        nonce[i] = (uint8_t)(100 + i);
    }
    static const uint8_t want[KVP_PROVE_LEN] = {0x26, 0xcf, 0x8e, 0x4d, 0x07, 0xd7, 0x86, 0x31,
                                                0x0b, 0x82, 0x49, 0x27, 0x98, 0xe3, 0x7c, 0x48,
                                                0xb6, 0x0b, 0x30, 0xaa, 0xc0, 0x6a, 0x7b, 0x0e,
                                                0x34, 0x46, 0x13, 0x3e, 0x73, 0x9e, 0x68, 0xc2};
    assert_true(kvp_grant_mount_proof(secret, nonce, "seg-a", out));
    assert_memory_equal(out, want, sizeof(want));
    assert_true(kvp_grant_equal(out, want, sizeof(want)));
    out[31] ^= 1;
    assert_false(kvp_grant_equal(out, want, sizeof(want)));
    assert_true(kvp_grant_mount_proof(secret, nonce, "seg-b", out)); /* another name */
    assert_false(kvp_grant_equal(out, want, sizeof(want)));
    char long_name[KVP_PROVE_NAME_MAX + 2];
    memset(long_name, 'n', sizeof(long_name) - 1);
    long_name[sizeof(long_name) - 1] = '\0';
    assert_false(kvp_grant_mount_proof(secret, nonce, long_name, out)); /* past 255 bytes */
}

int main(void)
{
    CRYPTO_set_mem_functions(count_malloc, count_realloc, count_free);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grant_is_hmac_sha256),
        cmocka_unit_test(test_grant_taken_for_its_extent),
        cmocka_unit_test(test_grant_refused_otherwise),
        cmocka_unit_test(test_grant_bit_flips),
        cmocka_unit_test(test_grant_random),
        cmocka_unit_test(test_grant_keyring),
        cmocka_unit_test(test_grant_set),
        cmocka_unit_test(test_mount_proof_vector),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
