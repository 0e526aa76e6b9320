/*
 * test_log.c - common/log.c: the rate limit of per-operation log lines.
 *
 * The limiter is driven with explicit times (no sleeps); the macro is checked
 * end to end with stderr sent to a file: a burst from one call site writes
 * one line, two call sites are limited apart, and a level that is off writes
 * nothing and counts nothing.
 *
 * Thread: cmocka's.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"

static void test_limit_take(void **state)
{
    (void)state;
    kvp_log_limit_t l = {0};
    uint64_t held = 99;
    assert_true(kvp_log_limit_take(&l, 5000, 1000, &held)); /* the first line goes out */
    assert_int_equal(held, 0);
    for (int i = 0; i < 10; i++)
        assert_false(kvp_log_limit_take(&l, 5000 + (uint64_t)i * 99, 1000, &held));
    assert_false(kvp_log_limit_take(&l, 5999, 1000, &held)); /* 1 ms before the second */
    assert_true(kvp_log_limit_take(&l, 6000, 1000, &held));
    assert_int_equal(held, 11); /* the ones held back, said with the next line */
    assert_true(kvp_log_limit_take(&l, 9000, 1000, &held));
    assert_int_equal(held, 0); /* the count restarted */
}

/* stderr into a temporary file for the body of a test; its lines back. */
static int stderr_to_file(FILE **f_p)
{
    FILE *f = tmpfile();
    assert_non_null(f);
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    assert_true(saved >= 0);
    assert_true(dup2(fileno(f), STDERR_FILENO) >= 0);
    *f_p = f;
    return saved;
}

static int count_lines(FILE *f, int saved, const char *needle)
{
    fflush(stderr);
    assert_true(dup2(saved, STDERR_FILENO) >= 0);
    close(saved);
    rewind(f);
    char line[2048];
    int n = 0;
    while (fgets(line, sizeof(line), f) != NULL)
        n += strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

static void burst(int n, int id)
{
    for (int i = 0; i < n; i++)
        KVP_LOG_WARN_LIMITED("test burst site one, op %d of %d", i, id);
}

static void burst_other(int n)
{
    for (int i = 0; i < n; i++)
        KVP_LOG_WARN_LIMITED("test burst site two, op %d", i);
}

static void test_macro_burst(void **state)
{
    (void)state;
    kvp_log_set_level(KVP_LOG_WARN);
    FILE *f;
    int saved = stderr_to_file(&f);
    burst(10000, 1); /* well within a second: one line */
    assert_int_equal(count_lines(f, saved, "test burst site one"), 1);
    saved = stderr_to_file(&f);
    burst_other(10000); /* another call site has a limit of its own: its first line goes out */
    burst(5, 2);        /* site one, still within its second: held back */
    assert_int_equal(count_lines(f, saved, "test burst site two"), 1);
    saved = stderr_to_file(&f);
    burst(5, 3);
    assert_int_equal(count_lines(f, saved, "test burst site one"), 0);
}

static void test_macro_level_off(void **state)
{
    (void)state;
    kvp_log_set_level(KVP_LOG_ERROR); /* warnings off */
    FILE *f;
    int saved = stderr_to_file(&f);
    for (int i = 0; i < 100; i++)
        KVP_LOG_WARN_LIMITED("test level off %d", i);
    assert_int_equal(count_lines(f, saved, "test level off"), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_limit_take),
        cmocka_unit_test(test_macro_burst),
        cmocka_unit_test(test_macro_level_off),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
