/*
 * test_tenant_quotas.c - master/obs/tenant_quotas.c: a PUT's body, read with common/json.h.
 *
 * The forms its own parser took and refused before it read the body through the project's
 * JSON reader are taken and refused alike (the same set: checked against that parser over
 * millions of mutated bodies when it was replaced), with the same sentences for what is
 * JSON but not the body Mooncake's API wants. A body it takes sets the quota: the answer's
 * snapshot holds the value. Everything runs on a zeroed master state with a tenant table,
 * as the loop calls it: serving, an ACL (no tenants without one), no etcd.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/http.h"
#include "master/core/state.h"
#include "master/obs/http_views.h"

static kvp_master_state_t st;
static kvp_acl_t acl; /* an empty one: only whether there is one matters here */

static int setup(void **state)
{
    (void)state;
    return kvp_tenant_table_init(&st.tenants) == KVP_OK ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    kvp_tenant_table_cleanup(&st.tenants);
    return 0;
}

/* PUT ?tenant_id=team-a with body: the reply (its body freed by the caller). */
static kvp_http_reply_t put(const char *body, size_t len)
{
    kvp_master_view_t v = {.serving = true, .acl = &acl};
    kvp_http_reply_t r = {.status = 200};
    bool save = true;
    kvp_tenant_quotas_render(&r, &st, &v, "PUT", "team-a", 6, body, len, "admin", &save);
    assert_false(save); /* no etcd: nothing staged */
    assert_false(r.oom);
    return r;
}

static void test_taken(void **state)
{
    (void)state;
    static const struct {
        const char *body;
        const char *value;
    } ok[] = {
        {"{\"requested_quota_bytes\":1024}", "1024"},
        {" \t\r\n{ \"requested_quota_bytes\" :\n 7 }\n", "7"},
        {"{\"requested_quota_bytes\":9223372036854775807}", "9223372036854775807"},
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        kvp_http_reply_t r = put(ok[i].body, strlen(ok[i].body));
        char want[80];
        snprintf(want, sizeof(want), "\"requested_quota_bytes\":%s,", ok[i].value);
        if (r.status != 200 || strstr(r.body, want) == NULL)
            fail_msg("%s: HTTP %u %s", ok[i].body, r.status, r.body);
        free(r.body);
    }
}

static void test_refused(void **state)
{
    (void)state;
    static const struct {
        const char *body;
        const char *why; /* in error_message */
    } bad[] = {
        /* JSON, but not the body */
        {"{}", "Invalid JSON body: requested_quota_bytes is missing"},
        {"[1]", "Invalid JSON body: not a JSON object"},
        {"7", "Invalid JSON body: not a JSON object"},
        {"{\"requested_quota_bytes\":18446744073709551616}",
         "Invalid JSON body: requested_quota_bytes is out of range"},
        {"{\"requested_quota_bytes\":99999999999999999999999}", "is out of range"},
        {"{\"requested_quota_bytes\":-1}", "needs an unsigned integer"},
        {"{\"requested_quota_bytes\":-0}", "needs an unsigned integer"},
        {"{\"requested_quota_bytes\":1.5}", "needs an unsigned integer"},
        {"{\"requested_quota_bytes\":1.0}", "needs an unsigned integer"},
        {"{\"requested_quota_bytes\":1e3}", "needs an unsigned integer"},
        {"{\"requested_quota_bytes\":\"1024\"}", "needs an unsigned integer"},
        {"{\"requested_quota_bytes\":null}", "needs an unsigned integer"},
        {"{\"requested_quota_bytes\":true}", "needs an unsigned integer"},
        {"{\"requested_quota_bytes\":[1]}", "needs an unsigned integer"},
        {"{\"requested_quota_bytes\":1024,\"extra\":1}", "unknown field \\\"extra\\\""},
        {"{\"extra\":1,\"requested_quota_bytes\":1024}", "unknown field \\\"extra\\\""},
        {"{\"requested\\u005fquota_bytes\":1}", "unknown field"}, /* a name as written */
        {"{\"requested_quota_bytes\":1,\"requested_quota_bytes\":2}", "given twice"},
        /* the first wrong field is named */
        {"{\"requested_quota_bytes\":\"x\",\"extra\":1}", "needs an unsigned integer"},
        /* not JSON */
        {"", "Invalid JSON body"},
        {"requested_quota_bytes=1024", "Invalid JSON body"},
        {"{\"requested_quota_bytes\":1024} x", "Invalid JSON body"},
        {"{\"requested_quota_bytes\":01}", "Invalid JSON body"},
        {"{\"requested_quota_bytes\":1024,}", "Invalid JSON body"},
        {"{\"requested_quota_bytes\" 1024}", "Invalid JSON body"},
        {"{requested_quota_bytes:1024}", "Invalid JSON body"},
        {"{\"requested_quota_bytes\":1024", "Invalid JSON body"},
        {"{\"requested_quota_bytes\":+1}", "Invalid JSON body"},
        {"{\"requested_quota_bytes\":1}{}", "Invalid JSON body"},
        /* taken, and then out of the quota's range */
        {"{\"requested_quota_bytes\":0}", "[1, 2^63 - 1]"},
        {"{\"requested_quota_bytes\":9223372036854775808}", "[1, 2^63 - 1]"},
        {"{\"requested_quota_bytes\":18446744073709551615}", "[1, 2^63 - 1]"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        kvp_http_reply_t r = put(bad[i].body, strlen(bad[i].body));
        if (r.status != 400 || strstr(r.body, "\"error_code\":-600") == NULL ||
            strstr(r.body, bad[i].why) == NULL)
            fail_msg("%s: HTTP %u %s (want 400 saying %s)", bad[i].body, r.status, r.body,
                     bad[i].why);
        free(r.body);
    }
    /* a NUL inside, and a body that is a prefix of a good one: refused by length */
    kvp_http_reply_t r = put("{\"requested_quota_bytes\":1}\0", 28);
    assert_int_equal(r.status, 400);
    free(r.body);
    r = put("{\"requested_quota_bytes\":1}", 20);
    assert_int_equal(r.status, 400);
    free(r.body);
}

/* A tenant_id holding a NUL (`zz-nul%00b`, decoded) or a control character: 400, counted,
 * and no tenant made, neither the whole name nor the part before the NUL. */
static void test_name_with_nul_or_control(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        size_t len;
    } bad[] = {{"zz-nul\0b", 8}, {"zz-nul\0", 7}, {"zz\ttab", 7}, {"zz\x1b[31m", 7}, {"zz\x7f", 3}};
    static const char body[] = "{\"requested_quota_bytes\":1024}";
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        kvp_master_view_t v = {.serving = true, .acl = &acl};
        kvp_http_reply_t r = {.status = 200};
        bool save = true;
        uint32_t tenants = st.tenants.n;
        uint64_t refused = st.stats.refused_name_tenant;
        kvp_tenant_quotas_render(&r, &st, &v, "PUT", bad[i].name, bad[i].len, body,
                                 sizeof(body) - 1, "admin", &save);
        if (r.status != 400 || strstr(r.body, "NUL or control character") == NULL)
            fail_msg("name %zu: HTTP %u %s", i, r.status, r.body);
        assert_int_equal(st.tenants.n, tenants);
        assert_int_equal(st.stats.refused_name_tenant, refused + 1);
        assert_int_equal(kvp_tenant_id(&st.tenants, "zz-nul", 6, false), -1);
        free(r.body);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_taken),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_name_with_nul_or_control),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
