/*
 * test_json.c - unit tests for common/json.c, the project's one JSON reader: what it takes
 * (RFC 8259 values, nested, escaped), what it refuses (malformed, too deep, too many
 * values), 64-bit integers read exactly (unsigned, and signed as etcd's revisions and
 * leases are), keys found in objects of any shape, strings copied whatever their length.
 * Its users' own forms are tested with them: the indexer's bodies in tests/unit/indexer and
 * tests/fuzz, a tenant quota body in tests/unit/master/obs/test_tenant_quotas.c, etcd's
 * answers in test_etcd.c.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"

static kvp_json_rc_t parse(kvp_json_t *j, const char *s)
{
    char why[128];
    return kvp_json_parse(j, s, strlen(s), why, sizeof(why));
}

static void test_accepts(void **state)
{
    (void)state;
    static const char *ok[] = {
        "{}",
        "[]",
        "0",
        "-1.5e+3",
        "\"a\\\"b\\u00e9\"",
        "true",
        " null ",
        "{\"a\":[1,2,{\"b\":[]}],\"c\":{}}",
        "[[[[]]]]",
        "{\"k\" : \"v\" , \"x\":[ ]}",
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        kvp_json_t j;
        if (parse(&j, ok[i]) != KVP_JSON_OK)
            fail_msg("refused %s", ok[i]);
        kvp_json_free(&j);
    }
}

static void test_refuses(void **state)
{
    (void)state;
    static const char *bad[] = {
        "",           "{",
        "}",          "[1,]",
        "{\"a\"}",    "{\"a\":}",
        "{,}",        "[1 2]",
        "01",         "1.",
        "-",          "\"\\x\"",
        "\"a",        "tru",
        "{\"a\":1,}", "[1]]",
        "{} {}",      "\"\x01\"",
        "{1:2}",      "[\"\\u12\"]",
        "nul",        "{\"a\":1 \"b\":2}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        kvp_json_t j;
        if (parse(&j, bad[i]) != KVP_JSON_BAD)
            fail_msg("took %s", bad[i]);
        kvp_json_free(&j);
    }
}

static void test_limits(void **state)
{
    (void)state;
    char deep[200];
    memset(deep, '[', KVP_JSON_DEPTH_MAX + 1);
    memset(deep + KVP_JSON_DEPTH_MAX + 1, ']', KVP_JSON_DEPTH_MAX + 1);
    deep[2 * (KVP_JSON_DEPTH_MAX + 1)] = '\0';
    kvp_json_t j;
    assert_int_equal(parse(&j, deep), KVP_JSON_TOO_BIG);
    kvp_json_free(&j);
    deep[2 * KVP_JSON_DEPTH_MAX + 1] = '\0'; /* one level less: fine */
    memmove(deep, deep + 1, strlen(deep));
    assert_int_equal(parse(&j, deep), KVP_JSON_OK);
    kvp_json_free(&j);
    /* more values than the cap: refused as too big, not as malformed */
    size_t n = KVP_JSON_TOKENS_MAX + 10, len = 2 * n + 2;
    char *big = malloc(len + 1);
    assert_non_null(big);
    big[0] = '[';
    for (size_t i = 0; i < n; i++) {
        big[1 + 2 * i] = '0';
        big[2 + 2 * i] = ',';
    }
    big[2 * n] = ']';
    big[2 * n + 1] = '\0';
    assert_int_equal(parse(&j, big), KVP_JSON_TOO_BIG);
    kvp_json_free(&j);
    free(big);
}

static void test_values(void **state)
{
    (void)state;
    kvp_json_t j;
    const char *s = "{\"h\":[18446744073709551615, 9007199254740993, 0, 1.0, -1, 1e3,"
                    " 18446744073709551616],\"s\":\"a\\n\\u00e9\\ud83d\\ude00\","
                    "\"n\":null,\"o\":{\"h\":7},\"z\":\"\\u0000\"}";
    assert_int_equal(parse(&j, s), KVP_JSON_OK);
    int64_t h = kvp_json_get(&j, 0, "h");
    assert_true(h > 0);
    assert_int_equal(j.t[h].type, KVP_J_ARRAY);
    assert_int_equal(j.t[h].size, 7);
    uint64_t v;
    uint32_t e = (uint32_t)h + 1;
    assert_true(kvp_json_u64(&j, e, &v));
    assert_true(v == UINT64_MAX);
    e = j.t[e].next;
    assert_true(kvp_json_u64(&j, e, &v));
    assert_true(v == 9007199254740993ull); /* a double would say ...992 */
    e = j.t[e].next;
    assert_true(kvp_json_u64(&j, e, &v) && v == 0);
    for (int i = 0; i < 4; i++) { /* 1.0, -1, 1e3, 2^64: not a u64 */
        e = j.t[e].next;
        assert_false(kvp_json_u64(&j, e, &v));
    }
    char out[32];
    assert_true(kvp_json_str(&j, (uint32_t)kvp_json_get(&j, 0, "s"), out, sizeof(out)));
    assert_string_equal(out, "a\n\xc3\xa9\xf0\x9f\x98\x80");
    assert_false(kvp_json_str(&j, (uint32_t)kvp_json_get(&j, 0, "s"), out, 4)); /* too long */
    assert_int_equal(j.t[kvp_json_get(&j, 0, "n")].type, KVP_J_NULL);
    int64_t o = kvp_json_get(&j, 0, "o");
    assert_true(kvp_json_u64(&j, (uint32_t)kvp_json_get(&j, (uint32_t)o, "h"), &v) && v == 7);
    assert_int_equal(kvp_json_get(&j, 0, "absent"), -1);
    assert_int_equal(kvp_json_get(&j, (uint32_t)h, "h"), -1); /* not an object */
    assert_false(kvp_json_str(&j, (uint32_t)kvp_json_get(&j, 0, "z"), out, sizeof(out)));
    kvp_json_free(&j);
}

/* Signed integers: the whole int64 range, exactly, and nothing else. */
static void test_i64(void **state)
{
    (void)state;
    kvp_json_t j;
    const char *s = "[9223372036854775807, -9223372036854775808, -0, 0, -9007199254740993,"
                    " 9223372036854775808, -9223372036854775809, 1.0, -1e3, \"5\", -12]";
    assert_int_equal(parse(&j, s), KVP_JSON_OK);
    int64_t v;
    uint32_t e = 1;
    assert_true(kvp_json_i64(&j, e, &v) && v == INT64_MAX);
    e = j.t[e].next;
    assert_true(kvp_json_i64(&j, e, &v) && v == INT64_MIN);
    e = j.t[e].next;
    assert_true(kvp_json_i64(&j, e, &v) && v == 0);
    e = j.t[e].next;
    assert_true(kvp_json_i64(&j, e, &v) && v == 0);
    e = j.t[e].next;
    assert_true(kvp_json_i64(&j, e, &v) && v == -9007199254740993ll); /* a double: ...992 */
    for (int i = 0; i < 5; i++) { /* past either end, a fraction, an exponent, a string */
        e = j.t[e].next;
        v = 77;
        assert_false(kvp_json_i64(&j, e, &v));
        assert_int_equal(v, 77); /* untouched */
    }
    e = j.t[e].next;
    assert_true(kvp_json_i64(&j, e, &v) && v == -12);
    assert_false(kvp_json_u64(&j, e, (uint64_t *)&v)); /* unsigned: no minus */
    assert_false(kvp_json_i64(&j, 0, &v));             /* the array */
    assert_false(kvp_json_i64(&j, j.n, &v));           /* past the tokens */
    kvp_json_free(&j);
}

/* kvp_json_str_cap: a buffer that size holds the string unescaped, whatever it holds. */
static void test_str_cap(void **state)
{
    (void)state;
    kvp_json_t j;
    const char *s = "[\"\", \"abc\", \"\\n\\t\\\"\\\\\\/\", \"\\u00e9\\u20ac\\ud83d\\ude00\","
                    " \"\\ud83d\", \"\\u0000\", 5]";
    assert_int_equal(parse(&j, s), KVP_JSON_OK);
    static const char *want[] = {"", "abc", "\n\t\"\\/", "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"};
    uint32_t e = 1;
    for (int i = 0; i < 4; i++, e = j.t[e].next) {
        size_t cap = kvp_json_str_cap(&j, e);
        assert_int_equal(cap, j.t[e].end - j.t[e].start + 1);
        char *out = malloc(cap);
        assert_non_null(out);
        assert_true(kvp_json_str(&j, e, out, cap));
        assert_string_equal(out, want[i]);
        free(out);
    }
    char out[16];
    assert_false(kvp_json_str(&j, e, out, sizeof(out))); /* a lone surrogate */
    e = j.t[e].next;
    assert_false(kvp_json_str(&j, e, out, sizeof(out))); /* a NUL */
    e = j.t[e].next;
    assert_int_equal(kvp_json_str_cap(&j, e), 0); /* a number */
    assert_int_equal(kvp_json_str_cap(&j, 0), 0); /* the array */
    assert_int_equal(kvp_json_str_cap(&j, j.n), 0);
    kvp_json_free(&j);
}

/* Numbers in an array are read in a run of their own (json.c number_run): the tokens are
 * what the general loop makes, whatever the spacing, and a run that meets anything else
 * (a string, a nested array, a malformed number) hands back to it. */
static void test_number_runs(void **state)
{
    (void)state;
    kvp_json_t j;
    const char *s = "[7, 8 ,9,\n 10\t,\"x\",11,[12,13],-14, 0]";
    assert_int_equal(parse(&j, s), KVP_JSON_OK);
    assert_int_equal(j.t[0].type, KVP_J_ARRAY);
    assert_int_equal(j.t[0].size, 9); /* 7 8 9 10 "x" 11 [..] -14 0 */
    static const char *want[] = {"7", "8", "9", "10", "\"x\"", "11", "[12,13]", "-14", "0"};
    uint32_t e = 1;
    for (int i = 0; i < 9; i++, e = j.t[e].next) {
        const kvp_json_tok_t *t = &j.t[e];
        size_t n = t->end - t->start;
        const char *at = s + t->start;
        if (t->type == KVP_J_STRING) { /* (a string's bounds leave out its quotes) */
            at--;
            n += 2;
        }
        if (n != strlen(want[i]) || memcmp(at, want[i], n) != 0)
            fail_msg("element %d: %.*s, not %s", i, (int)n, at, want[i]);
    }
    assert_int_equal(e, j.n);
    e = 1;
    for (int i = 0; i < 5; i++) /* the sixth element: 11, after the string */
        e = j.t[e].next;
    int64_t v;
    assert_true(kvp_json_i64(&j, e, &v));
    assert_int_equal(v, 11);
    kvp_json_free(&j);
    static const char *bad[] = {"[1,2,-]", "[1,2,]", "[1,2 3]", "[1,02]", "[1,2.]",
                                "[1,-,2]", "[1,2e]", "[1,2",    "[1,2,",  "[1,,2]"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (parse(&j, bad[i]) != KVP_JSON_BAD)
            fail_msg("took %s", bad[i]);
        kvp_json_free(&j);
    }
    /* the fewest bytes a value can take: as many tokens as the cap allows (len / 2 + 1) */
    static const char *tight[] = {"1", "[1]", "[1,2,3,4,5,6,7,8,9]", "[[[[[[1]]]]]]",
                                  "{\"\":{\"\":[]}}"};
    for (size_t i = 0; i < sizeof(tight) / sizeof(tight[0]); i++) {
        if (parse(&j, tight[i]) != KVP_JSON_OK)
            fail_msg("refused %s", tight[i]);
        kvp_json_free(&j);
    }
    /* 19 digits read without an overflow check, 20 with one; each against its type's max */
    uint64_t u;
    assert_int_equal(parse(&j, "[9999999999999999999,18446744073709551615,18446744073709551616,"
                               "9223372036854775807,9223372036854775808]"),
                     KVP_JSON_OK);
    e = 1;
    assert_true(kvp_json_u64(&j, e, &u));
    assert_true(u == 9999999999999999999ull);
    e = j.t[e].next;
    assert_true(kvp_json_u64(&j, e, &u));
    assert_true(u == UINT64_MAX);
    e = j.t[e].next;
    u = 7;
    assert_false(kvp_json_u64(&j, e, &u));
    assert_true(u == 7); /* untouched when refused */
    e = j.t[e].next;
    assert_true(kvp_json_i64(&j, e, &v));
    assert_true(v == INT64_MAX);
    e = j.t[e].next;
    v = 7;
    assert_false(kvp_json_i64(&j, e, &v));
    assert_int_equal(v, 7);
    kvp_json_free(&j);
}

/* Random bytes and mutations of a valid body: parsed or refused, never read past the end
 * (ASan in CI). */
static void test_random(void **state)
{
    (void)state;
    const char *seed =
        "{\"model\":\"m\",\"token_ids\":[1,2,3],\"x\":{\"y\":[true,null,\"\\u0041\"]}}";
    size_t n = strlen(seed);
    uint64_t r = 88172645463325252ull;
    for (int it = 0; it < 20000; it++) {
        char *b = malloc(n);
        assert_non_null(b);
        memcpy(b, seed, n);
        for (int k = 0; k < 1 + it % 4; k++) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            b[r % n] = (char)(r >> 32);
        }
        size_t len = (r >> 40) % (n + 1);
        kvp_json_t j;
        char why[64];
        (void)kvp_json_parse(&j, b, len, why, sizeof(why));
        kvp_json_free(&j);
        free(b);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accepts), cmocka_unit_test(test_refuses),
        cmocka_unit_test(test_limits),  cmocka_unit_test(test_values),
        cmocka_unit_test(test_i64),     cmocka_unit_test(test_str_cap),
        cmocka_unit_test(test_random),  cmocka_unit_test(test_number_runs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
