/*
 * test_key.c - unit tests for common/key.c.
 *
 * Key validation is checked against hand-written UTF-8 edge cases (lengths,
 * NUL, every sequence length, overlong forms, surrogates, values past
 * U+10FFFF, sequences cut off by the end of the key).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/key.h"

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_lengths),
        cmocka_unit_test(test_key_nul),
        cmocka_unit_test(test_key_valid_utf8),
        cmocka_unit_test(test_key_overlong),
        cmocka_unit_test(test_key_surrogates_and_range),
        cmocka_unit_test(test_key_bad_sequences),
    };
    return cmocka_run_group_tests_name("key", tests, NULL, NULL);
}
