/*
 * test_status.c - unit tests for common/status.c and the status list.
 *
 * kvp_strerror is checked against the list itself (every code, its own text,
 * no gap, "unknown status" outside it). The public header
 * client/include/kvpool_status.h is a checked-in copy of the list's names
 * and numbers: test_public_header_matches_list reads it (path in
 * KVPOOL_STATUS_HEADER, set by tests/meson.build) and fails when it drifts
 * from KVP_STATUS_LIST: a name or number changed, an entry missing or extra
 * on either side, or the order changed.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "common/macros.h"
/* After common/status.h: the enum is defined once; KVP_STATUS_MIN must be spelled the same
 * in both headers or this include is a macro redefinition (an error under -Werror). */
#include "kvpool_status.h"

/* ---- kvp_strerror ---- */

static void test_strerror(void **state)
{
    (void)state;
    static const kvp_status_t all[] = {
#define KVP_TEST_STATUS_(name, value, msg) name,
        KVP_STATUS_LIST(KVP_TEST_STATUS_)
#undef KVP_TEST_STATUS_
    };
    static const char *const texts[] = {
#define KVP_TEST_STATUS_(name, value, msg) msg,
        KVP_STATUS_LIST(KVP_TEST_STATUS_)
#undef KVP_TEST_STATUS_
    };
    /* the list covers 0 .. KVP_STATUS_MIN with no gap */
    assert_int_equal(KVP_ARRAY_SIZE(all), 1 - KVP_STATUS_MIN);
    for (size_t i = 0; i < KVP_ARRAY_SIZE(all); i++) {
        const char *s = kvp_strerror(all[i]);
        assert_non_null(s);
        assert_true(strlen(s) > 0);
        assert_string_equal(s, texts[i]);
        assert_string_not_equal(s, "unknown status");
        /* every code has its own text */
        for (size_t j = 0; j < i; j++)
            assert_string_not_equal(s, kvp_strerror(all[j]));
    }
    for (int v = KVP_STATUS_MIN; v <= 0; v++)
        assert_string_not_equal(kvp_strerror((kvp_status_t)v), "unknown status");
    assert_string_equal(kvp_strerror((kvp_status_t)1), "unknown status");
    assert_string_equal(kvp_strerror((kvp_status_t)(KVP_STATUS_MIN - 1)), "unknown status");
    assert_string_equal(kvp_strerror((kvp_status_t)-1000), "unknown status");
    assert_string_equal(kvp_strerror((kvp_status_t)INT32_MIN), "unknown status");
    assert_string_equal(kvp_strerror((kvp_status_t)INT32_MAX), "unknown status");
}

/* ---- the public header is the list ---- */

typedef struct entry {
    const char *name;
    int value;
} entry_t;

static const entry_t list[] = {
#define KVP_TEST_ENTRY_(name, value, msg) {#name, value},
    KVP_STATUS_LIST(KVP_TEST_ENTRY_)
#undef KVP_TEST_ENTRY_
};

static void test_public_header_matches_list(void **state)
{
    (void)state;
    const char *path = getenv("KVPOOL_STATUS_HEADER");
    if (path == NULL) /* meson sets it: a run without it would check nothing */
        fail_msg("KVPOOL_STATUS_HEADER is not set: run this test through meson");
    FILE *f = fopen(path, "r");
    if (f == NULL)
        fail_msg("cannot open %s: %s", path, strerror(errno));
    char line[512];
    size_t n = 0;
    while (fgets(line, sizeof(line), f) != NULL) {
        char name[128];
        int value;
        char comma;
        /* enumerator lines: "    KVP_NAME = VALUE," */
        if (sscanf(line, " %127[A-Z_] = %d%c", name, &value, &comma) != 3 || comma != ',' ||
            strncmp(name, "KVP_", 4) != 0)
            continue;
        if (n >= KVP_ARRAY_SIZE(list))
            fail_msg("%s has %s = %d, which KVP_STATUS_LIST (common/status_list.h) lacks", path,
                     name, value);
        if (strcmp(name, list[n].name) != 0 || value != list[n].value)
            fail_msg("%s entry %zu is %s = %d; KVP_STATUS_LIST has %s = %d there", path, n, name,
                     value, list[n].name, list[n].value);
        n++;
    }
    fclose(f);
    if (n != KVP_ARRAY_SIZE(list))
        fail_msg("%s has %zu statuses, KVP_STATUS_LIST has %zu (first missing: %s)", path, n,
                 KVP_ARRAY_SIZE(list), list[n].name);
}

/* ---- kvp_status_from_errno ---- */

static void test_from_errno(void **state)
{
    (void)state;
    assert_int_equal(kvp_status_from_errno(0), KVP_OK);
    assert_int_equal(kvp_status_from_errno(ENOMEM), KVP_ERR_NOMEM);
    assert_int_equal(kvp_status_from_errno(ETIMEDOUT), KVP_ERR_TIMEOUT);
    assert_int_equal(kvp_status_from_errno(ECONNREFUSED), KVP_ERR_CONNECT);
    assert_int_equal(kvp_status_from_errno(EPIPE), KVP_ERR_IO);
    assert_int_equal(kvp_status_from_errno(EINVAL), KVP_ERR_INVALID_ARG);
    assert_int_equal(kvp_status_from_errno(EPERM), KVP_ERR_SYSTEM);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_strerror),
        cmocka_unit_test(test_public_header_matches_list),
        cmocka_unit_test(test_from_errno),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
