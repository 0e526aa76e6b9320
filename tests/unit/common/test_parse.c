/*
 * test_parse.c - unit tests for common/parse.c: size and host:port parsing
 * against accepted and rejected spellings.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/macros.h"
#include "common/parse.h"
#include "common/status.h"

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
 * parse.h promises KVP_ERR_INVALID_ARG for anything but "host:port" /
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
        cmocka_unit_test(test_parse_size_ok),
        cmocka_unit_test(test_parse_size_bad),
        cmocka_unit_test(test_hostport_ok),
        cmocka_unit_test(test_hostport_bad),
        cmocka_unit_test(test_hostport_port_digits_only),
    };
    return cmocka_run_group_tests_name("parse", tests, NULL, NULL);
}
