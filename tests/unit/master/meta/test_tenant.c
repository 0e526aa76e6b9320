/*
 * test_tenant.c - unit tests for master/meta/tenant.c: the tenant quota admin API's
 * policies over the ACL's max-dram (apply), and their text in etcd (dump, load): what a
 * new leader reads is what the old one wrote, a text that does not parse changes nothing.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "master/meta/tenant.h"

static int32_t id_of(kvp_tenant_table_t *tt, const char *name)
{
    return kvp_tenant_id(tt, name, strlen(name), true);
}

static void test_apply_over_the_acl(void **state)
{
    (void)state;
    kvp_tenant_table_t tt;
    assert_int_equal(kvp_tenant_table_init(&tt), KVP_OK);
    kvp_tenant_t *t = &tt.t[id_of(&tt, "team-a")];
    t->acl_max_dram = 4096;
    kvp_tenant_policy_apply(t);
    assert_int_equal(t->max_dram, 4096);
    assert_int_equal(t->closed, 0);
    t->policy = KVP_TENANT_POLICY_SET;
    t->policy_dram = 100;
    kvp_tenant_policy_apply(t);
    assert_int_equal(t->max_dram, 100);
    t->acl_max_dram = 8192; /* a reload: the API's figure stays */
    kvp_tenant_policy_apply(t);
    assert_int_equal(t->max_dram, 100);
    t->policy = KVP_TENANT_POLICY_CLOSED;
    kvp_tenant_policy_apply(t);
    assert_int_equal(t->max_dram, 0);
    assert_int_equal(t->closed, 1);
    t->policy = KVP_TENANT_POLICY_ACL;
    kvp_tenant_policy_apply(t);
    assert_int_equal(t->max_dram, 8192);
    assert_int_equal(t->closed, 0);
    kvp_tenant_table_cleanup(&tt);
}

static void test_dump_then_load_elsewhere(void **state)
{
    (void)state;
    kvp_tenant_table_t a, b;
    assert_int_equal(kvp_tenant_table_init(&a), KVP_OK);
    assert_int_equal(kvp_tenant_table_init(&b), KVP_OK);
    kvp_tenant_t *x = &a.t[id_of(&a, "team-a")];
    x->policy = KVP_TENANT_POLICY_SET;
    x->policy_dram = KVP_TENANT_QUOTA_MAX;
    kvp_tenant_policy_apply(x);
    (void)id_of(&a, "team-b"); /* no policy: not written */
    kvp_tenant_t *c = &a.t[id_of(&a, "team.c_1")];
    c->policy = KVP_TENANT_POLICY_CLOSED;
    kvp_tenant_policy_apply(c);
    char *text = kvp_tenant_policy_dump(&a);
    assert_non_null(text);
    assert_string_equal(text, "team-a 9223372036854775807\nteam.c_1 closed\n");

    /* another master: its own ids and an ACL figure; team-z's old policy goes */
    kvp_tenant_t *z = &b.t[id_of(&b, "team-z")];
    z->policy = KVP_TENANT_POLICY_SET;
    z->policy_dram = 5;
    z->acl_max_dram = 77;
    kvp_tenant_policy_apply(z);
    assert_true(kvp_tenant_policy_load(&b, text, strlen(text)));
    int32_t ia = kvp_tenant_id(&b, "team-a", 6, false),
            ic = kvp_tenant_id(&b, "team.c_1", 8, false);
    assert_true(ia > 0 && ic > 0);
    assert_int_equal(b.t[ia].max_dram, KVP_TENANT_QUOTA_MAX);
    assert_int_equal(b.t[ic].closed, 1);
    z = &b.t[kvp_tenant_id(&b, "team-z", 6, false)];
    assert_int_equal(z->policy, KVP_TENANT_POLICY_ACL);
    assert_int_equal(z->max_dram, 77);
    char *again = kvp_tenant_policy_dump(&b);
    assert_string_equal(again, text); /* the same policies, whatever the ids */
    free(again);
    free(text);
    assert_true(kvp_tenant_policy_load(&b, "", 0)); /* an empty key: every ACL figure */
    assert_int_equal(b.t[ia].max_dram, 0);
    assert_int_equal(b.t[ic].closed, 0);
    kvp_tenant_table_cleanup(&a);
    kvp_tenant_table_cleanup(&b);
}

static void test_a_bad_text_changes_nothing(void **state)
{
    (void)state;
    static const char *bad[] = {
        "team-a 0\n",                    /* a quota of 0 */
        "team-a 9223372036854775808\n",  /* 2^63 */
        "team-a 99999999999999999999\n", /* 20 digits */
        "team-a -5\n",                   /* not a number */
        "team-a 12x\n",
        "team-a\n",
        "team-a \n",
        "bad name 5\n",
        "team/a 5\n",
        "team-a 5\nteam-b open\n", /* the first line fine, the second not */
        "team-a closed extra\n",
    };
    kvp_tenant_table_t tt;
    assert_int_equal(kvp_tenant_table_init(&tt), KVP_OK);
    kvp_tenant_t *t = &tt.t[id_of(&tt, "team-a")];
    t->policy = KVP_TENANT_POLICY_SET;
    t->policy_dram = 42;
    kvp_tenant_policy_apply(t);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_false(kvp_tenant_policy_load(&tt, bad[i], strlen(bad[i])));
        t = &tt.t[kvp_tenant_id(&tt, "team-a", 6, false)];
        assert_int_equal(t->max_dram, 42);
        assert_int_equal(kvp_tenant_id(&tt, "team-b", 6, false), -1); /* nothing made */
    }
    /* no trailing newline is fine */
    assert_true(kvp_tenant_policy_load(&tt, "team-a 7", 8));
    assert_int_equal(tt.t[kvp_tenant_id(&tt, "team-a", 6, false)].max_dram, 7);
    kvp_tenant_table_cleanup(&tt);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_apply_over_the_acl),
        cmocka_unit_test(test_dump_then_load_elsewhere),
        cmocka_unit_test(test_a_bad_text_changes_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
