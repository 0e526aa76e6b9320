/*
 * test_quota_store.c - master/ha/quota_store.c against a real etcd (tests/harness.c: a
 * private one on random ports, killed by PID): the tenant quota policies a leader writes
 * land only while the leader key is still the one of the epoch they were changed under.
 * A master whose lease expired (a partition) and that has not yet seen a successor take
 * the key must not overwrite what the successor wrote. Without an etcd binary: exit 77
 * (SKIP), or a failure when CI=true.
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

#include "common/etcd.h"
#include "master/ha/quota_store.h"
#include "tests/harness.h"

static kvp_etcd_proc_t g_etcd;

static int setup(void **state)
{
    (void)state;
    return kvp_start_etcd(&g_etcd) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    kvp_stop_etcd(&g_etcd);
    return 0;
}

/* The leader key of cluster c, created afresh: its create revision (the epoch). */
static int64_t lead(kvp_etcd_t *e, const char *c, const char *who)
{
    char key[128];
    snprintf(key, sizeof(key), "/kvpool/%s/leader", c);
    int64_t rev = 0;
    bool created = false;
    char *val = NULL;
    int64_t old = 0;
    if (kvp_etcd_get(e, key, &val, NULL, &old, NULL, NULL) == KVP_OK) {
        free(val);
        assert_int_equal(kvp_etcd_delete_if(e, key, old), KVP_OK);
    }
    assert_int_equal(kvp_etcd_create_key(e, key, who, strlen(who), 0, &created, &rev), KVP_OK);
    assert_true(created);
    return rev;
}

static char *held(kvp_etcd_t *e, const char *c)
{
    char key[128];
    snprintf(key, sizeof(key), "/kvpool/%s/tenant_quotas", c);
    char *val = NULL;
    assert_int_equal(kvp_etcd_get(e, key, &val, NULL, NULL, NULL, NULL), KVP_OK);
    return val;
}

static void test_a_deposed_leader_cannot_overwrite(void **state)
{
    (void)state;
    const char *c = "quota-fence";
    kvp_etcd_t *e = NULL;
    assert_int_equal(kvp_etcd_create(g_etcd.endpoints, 2000, &e), KVP_OK);
    char err[256] = "";
    kvp_election_params_t p = {
        .endpoints = g_etcd.endpoints, .cluster = c, .err = err, .err_len = sizeof(err)};
    kvp_quota_store_t *a = NULL, *b = NULL;
    assert_int_equal(kvp_quota_store_create(&p, &a), KVP_OK);
    assert_int_equal(kvp_quota_store_create(&p, &b), KVP_OK);

    /* a leads under epoch 1: its change lands */
    int64_t e1 = lead(e, c, "a:1");
    kvp_quota_store_stage(a, strdup("tenant t1 max-dram 1048576\n"), (uint64_t)e1);
    assert_int_equal(kvp_quota_store_save(a, err, sizeof(err)), KVP_OK);
    char *v = held(e, c);
    assert_string_equal(v, "tenant t1 max-dram 1048576\n");
    free(v);

    /* b takes the leader key (a's lease expired) and writes; a, not knowing, changes a
     * policy under its old epoch: refused, b's text stays */
    int64_t e2 = lead(e, c, "b:1");
    assert_true(e2 > e1);
    kvp_quota_store_stage(b, strdup("tenant t1 max-dram 2097152\n"), (uint64_t)e2);
    assert_int_equal(kvp_quota_store_save(b, err, sizeof(err)), KVP_OK);
    kvp_quota_store_stage(a, strdup("tenant t1 max-dram 4096\n"), (uint64_t)e1);
    err[0] = '\0';
    assert_int_equal(kvp_quota_store_save(a, err, sizeof(err)), KVP_ERR_NOT_OWNER);
    assert_non_null(strstr(err, "no longer leads"));
    v = held(e, c);
    assert_string_equal(v, "tenant t1 max-dram 2097152\n");
    free(v);

    /* staged by a master that leads under no epoch: nothing written */
    kvp_quota_store_stage(a, strdup("tenant t1 max-dram 1\n"), 0);
    assert_int_equal(kvp_quota_store_save(a, err, sizeof(err)), KVP_ERR_NOT_OWNER);
    /* the leader key gone (no leader at all): nothing written either */
    char key[128];
    snprintf(key, sizeof(key), "/kvpool/%s/leader", c);
    assert_int_equal(kvp_etcd_delete_if(e, key, e2), KVP_OK);
    kvp_quota_store_stage(b, strdup("tenant t1 max-dram 8192\n"), (uint64_t)e2);
    assert_int_equal(kvp_quota_store_save(b, err, sizeof(err)), KVP_ERR_NOT_OWNER);
    v = held(e, c);
    assert_string_equal(v, "tenant t1 max-dram 2097152\n");
    free(v);

    /* what a new leader loads is the successor's text */
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(kvp_quota_store_load(a, &text, &len, err, sizeof(err)), KVP_OK);
    assert_string_equal(text, "tenant t1 max-dram 2097152\n");
    assert_int_equal(len, strlen(text));
    free(text);

    kvp_quota_store_destroy(a);
    kvp_quota_store_destroy(b);
    kvp_etcd_destroy(e);
}

int main(void)
{
    if (!kvp_etcd_available()) {
        const char *ci = getenv("CI");
        bool required = ci != NULL && strcmp(ci, "true") == 0;
        fprintf(stderr, "test_quota_store: no etcd binary on PATH%s\n",
                required ? "; CI=true makes that a failure" : ": skipping");
        return required ? 1 : 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_deposed_leader_cannot_overwrite),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
