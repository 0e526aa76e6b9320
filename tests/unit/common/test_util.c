/*
 * test_util.c - unit tests for common/util.c.
 *
 * Key validation is checked against hand-written UTF-8 edge cases (lengths,
 * NUL, every sequence length, overlong forms, surrogates, values past
 * U+10FFFF, sequences cut off by the end of the key); size and host:port
 * parsing against accepted and rejected spellings.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "common/util.h"

/* Key given as a byte array literal: length without the literal's NUL. */
#define KEY_OK(lit) assert_true(kvp_key_valid((lit), sizeof(lit) - 1))
#define KEY_BAD(lit) assert_false(kvp_key_valid((lit), sizeof(lit) - 1))

/* ---- kvp_key_valid ---- */

static void test_key_lengths(void **state)
{
    (void)state;
    assert_false(kvp_key_valid("", 0));
    assert_false(kvp_key_valid("abc", 0));
    assert_false(kvp_key_valid(NULL, 3));
    KEY_OK("a");

    char *big = malloc(4097);
    assert_non_null(big);
    memset(big, 'k', 4097);
    assert_true(kvp_key_valid(big, 4096));
    assert_false(kvp_key_valid(big, 4097));
    assert_true(kvp_key_valid(big, 1));

    /* 4096 bytes made of 4-byte characters: still exactly at the limit */
    for (size_t i = 0; i < 4096; i += 4)
        memcpy(big + i, "\xF0\x9F\x98\x80", 4);
    assert_true(kvp_key_valid(big, 4096));
    /* one more continuation-free ASCII byte past the limit */
    big[4096] = 'x';
    assert_false(kvp_key_valid(big, 4097));
    free(big);
}

static void test_key_nul(void **state)
{
    (void)state;
    KEY_BAD("\0");
    KEY_BAD("a\0b");
    KEY_BAD("abc\0");
    KEY_BAD("\0abc");
    /* length says 3 but the third byte is the NUL terminator */
    assert_false(kvp_key_valid("ab", 3));
}

static void test_key_valid_utf8(void **state)
{
    (void)state;
    KEY_OK("plain/ascii-key_0123:~");
    KEY_OK("\x7F");                     /* DEL is ASCII, allowed */
    KEY_OK("\xC2\x80");                 /* U+0080, smallest 2-byte */
    KEY_OK("caf\xC3\xA9");              /* "café", 2-byte at the very end */
    KEY_OK("\xDF\xBF");                 /* U+07FF, largest 2-byte */
    KEY_OK("\xE0\xA0\x80");             /* U+0800, smallest 3-byte */
    KEY_OK("\xE6\x97\xA5\xE6\x9C\xAC"); /* "日本" */
    KEY_OK("\xED\x9F\xBF");             /* U+D7FF, just below the surrogates */
    KEY_OK("\xEE\x80\x80");             /* U+E000, just above the surrogates */
    KEY_OK("\xEF\xBF\xBF");             /* U+FFFF */
    KEY_OK("\xF0\x90\x80\x80");         /* U+10000, smallest 4-byte */
    KEY_OK("x\xF0\x9F\x98\x80y");       /* U+1F600 in the middle */
    KEY_OK("\xF0\x9F\x98\x80");         /* 4-byte at the very end */
    KEY_OK("\xF4\x8F\xBF\xBF");         /* U+10FFFF, the largest code point */
}

static void test_key_overlong(void **state)
{
    (void)state;
    KEY_BAD("\xC0\x80");         /* NUL, overlong 2-byte */
    KEY_BAD("\xC0\xAF");         /* '/', overlong */
    KEY_BAD("\xC1\xBF");         /* U+007F as 2 bytes */
    KEY_BAD("\xE0\x80\x80");     /* NUL as 3 bytes */
    KEY_BAD("\xE0\x9F\xBF");     /* U+07FF as 3 bytes */
    KEY_BAD("\xF0\x80\x80\x80"); /* NUL as 4 bytes */
    KEY_BAD("\xF0\x8F\xBF\xBF"); /* U+FFFF as 4 bytes */
    KEY_BAD("ok\xC0\xAFok");
}

static void test_key_surrogates_and_range(void **state)
{
    (void)state;
    KEY_BAD("\xED\xA0\x80"); /* U+D800 */
    KEY_BAD("\xED\xAD\xBF"); /* U+DB7F */
    KEY_BAD("\xED\xB0\x80"); /* U+DC00 */
    KEY_BAD("\xED\xBF\xBF"); /* U+DFFF */
    KEY_BAD("a\xED\xA0\x80z");
    KEY_BAD("\xF4\x90\x80\x80");     /* U+110000 */
    KEY_BAD("\xF7\xBF\xBF\xBF");     /* U+1FFFFF */
    KEY_BAD("\xF8\x88\x80\x80\x80"); /* 5-byte form */
    KEY_BAD("\xFC\x84\x80\x80\x80\x80");
    KEY_BAD("\xFE");
    KEY_BAD("\xFF");
}

static void test_key_bad_sequences(void **state)
{
    (void)state;
    /* lone continuation bytes */
    KEY_BAD("\x80");
    KEY_BAD("a\xBF");
    /* a lead byte followed by a non-continuation byte */
    KEY_BAD("\xC3(");
    KEY_BAD("\xE6\x97(");
    KEY_BAD("\xF0\x9F\x98(");
    KEY_BAD("\xC3\xC3\xA9");
    /* truncated at the end of the key */
    KEY_BAD("\xC3");
    KEY_BAD("abc\xC3");
    KEY_BAD("\xE6\x97");
    KEY_BAD("abc\xE6");
    KEY_BAD("\xF0\x9F\x98");
    KEY_BAD("abc\xF0\x9F");
    KEY_BAD("abc\xF0");

    /* truncated by len even though valid bytes follow in memory */
    const char *s = "ab\xF0\x9F\x98\x80";
    assert_true(kvp_key_valid(s, 6));
    assert_false(kvp_key_valid(s, 5));
    assert_false(kvp_key_valid(s, 4));
    assert_false(kvp_key_valid(s, 3));
    assert_true(kvp_key_valid(s, 2));
}

/* ---- kvp_parse_size ---- */

static void test_parse_size_ok(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        uint64_t bytes;
    } cases[] = {
        {"0", 0},
        {"4096", 4096},
        {"64MiB", 64ull << 20},
        {"64mib", 64ull << 20},
        {"64M", 64ull << 20},
        {"64MB", 64ull << 20},
        {"1g", 1ull << 30},
        {"1G", 1ull << 30},
        {"1GiB", 1ull << 30},
        {"2k", 2048},
        {"2KiB", 2048},
        {"3t", 3ull << 40},
        {"512b", 512},
        {"512B", 512},
        {"18446744073709551615", UINT64_MAX},
        {"16777215T", 16777215ull << 40},
    };
    for (size_t i = 0; i < KVP_ARRAY_SIZE(cases); i++) {
        uint64_t v = 12345;
        if (!kvp_parse_size(cases[i].text, &v))
            fail_msg("kvp_parse_size(\"%s\") refused", cases[i].text);
        if (v != cases[i].bytes)
            fail_msg("kvp_parse_size(\"%s\") = %llu, want %llu", cases[i].text,
                     (unsigned long long)v, (unsigned long long)cases[i].bytes);
    }
}

static void test_parse_size_bad(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "",
        "garbage",
        "MiB",
        "k",
        "-1",
        "+1",
        " 1",
        "1 ",
        "1 k",
        "1x",
        "1kx",
        "1kibb",
        "1bib",
        "1.5G",
        "0x10",
        "99999999999999999999T",
        "99999999999999999999",
        "18446744073709551616", /* UINT64_MAX + 1 */
        "16777216T",            /* 2^64 exactly */
        "17179869184G",         /* 2^64 */
    };
    for (size_t i = 0; i < KVP_ARRAY_SIZE(bad); i++) {
        uint64_t v = 777;
        if (kvp_parse_size(bad[i], &v))
            fail_msg("kvp_parse_size(\"%s\") accepted it as %llu", bad[i], (unsigned long long)v);
        /* out-parameter untouched on failure */
        assert_int_equal(v, 777);
    }
    uint64_t v = 1;
    assert_false(kvp_parse_size(NULL, &v));
    assert_int_equal(v, 1);
}

/* ---- kvp_parse_hostport ---- */

static void test_hostport_ok(void **state)
{
    (void)state;
    char host[64];
    uint16_t port = 0;

    assert_int_equal(kvp_parse_hostport("127.0.0.1:50051", host, sizeof(host), &port), KVP_OK);
    assert_string_equal(host, "127.0.0.1");
    assert_int_equal(port, 50051);

    assert_int_equal(kvp_parse_hostport("[::1]:80", host, sizeof(host), &port), KVP_OK);
    assert_string_equal(host, "::1");
    assert_int_equal(port, 80);

    assert_int_equal(kvp_parse_hostport("[fe80::1%eth0]:65535", host, sizeof(host), &port), KVP_OK);
    assert_string_equal(host, "fe80::1%eth0");
    assert_int_equal(port, 65535);

    assert_int_equal(kvp_parse_hostport("localhost:0", host, sizeof(host), &port), KVP_OK);
    assert_string_equal(host, "localhost");
    assert_int_equal(port, 0);

    /* exactly fills the buffer: 9 chars + NUL in 10 bytes */
    char small[10];
    assert_int_equal(kvp_parse_hostport("abcdefghi:1", small, sizeof(small), &port), KVP_OK);
    assert_string_equal(small, "abcdefghi");
    assert_int_equal(port, 1);
}

static void test_hostport_bad(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "127.0.0.1",                                              /* missing port */
        "localhost",  "host:",                                    /* empty port */
        ":80",                                                    /* empty host */
        "[]:80",                                                  /* empty v6 host */
        "host:70000",                                             /* port out of range */
        "host:65536", "host:-1", "host:80x", "host:x80", "[::1]", /* bracketed, no port */
        "[::1]80",    "[::1:80",                                  /* no closing bracket */
        "",
    };
    for (size_t i = 0; i < KVP_ARRAY_SIZE(bad); i++) {
        char host[64] = "untouched";
        uint16_t port = 4242;
        kvp_status_t st = kvp_parse_hostport(bad[i], host, sizeof(host), &port);
        if (st != KVP_ERR_INVALID_ARG)
            fail_msg("kvp_parse_hostport(\"%s\") = %d, want KVP_ERR_INVALID_ARG", bad[i], st);
        assert_int_equal(port, 4242);
        assert_string_equal(host, "untouched");
    }

    char host[64];
    uint16_t port;
    assert_int_equal(kvp_parse_hostport(NULL, host, sizeof(host), &port), KVP_ERR_INVALID_ARG);
    assert_int_equal(kvp_parse_hostport("a:1", host, 0, &port), KVP_ERR_INVALID_ARG);
    /* host does not fit: 10 chars need 11 bytes */
    char small[10];
    assert_int_equal(kvp_parse_hostport("abcdefghij:1", small, sizeof(small), &port),
                     KVP_ERR_INVALID_ARG);
}

/*
 * util.h promises KVP_ERR_INVALID_ARG for anything but "host:port" /
 * "[v6]:port": the port is decimal digits only, no sign or blanks.
 */
static void test_hostport_port_digits_only(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "host: 80", /* leading blank */
        "host:+80", /* sign */
        "host:-0",
        "[::1]: 80",
    };
    int accepted = 0;
    for (size_t i = 0; i < KVP_ARRAY_SIZE(bad); i++) {
        char host[64];
        uint16_t port = 4242;
        kvp_status_t st = kvp_parse_hostport(bad[i], host, sizeof(host), &port);
        if (st != KVP_ERR_INVALID_ARG) {
            print_error("kvp_parse_hostport(\"%s\") = %d (host \"%s\", port %u), want "
                        "KVP_ERR_INVALID_ARG\n",
                        bad[i], st, host, port);
            accepted++;
        }
    }
    assert_int_equal(accepted, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_lengths),
        cmocka_unit_test(test_key_nul),
        cmocka_unit_test(test_key_valid_utf8),
        cmocka_unit_test(test_key_overlong),
        cmocka_unit_test(test_key_surrogates_and_range),
        cmocka_unit_test(test_key_bad_sequences),
        cmocka_unit_test(test_parse_size_ok),
        cmocka_unit_test(test_parse_size_bad),
        cmocka_unit_test(test_hostport_ok),
        cmocka_unit_test(test_hostport_bad),
        cmocka_unit_test(test_hostport_port_digits_only),
    };
    return cmocka_run_group_tests_name("util", tests, NULL, NULL);
}
