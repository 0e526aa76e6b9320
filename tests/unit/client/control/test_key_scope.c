/*
 * test_key_scope.c - unit tests for client/control/key_scope.c, a client's key namespace
 * without a credential that binds its tenant.
 *
 * Checked: a tenant_id's keys all get its prefix (an empty key, one that already reads as
 * another namespace's, one of 4096 bytes); a client of none sends its keys as given but one
 * that reads as a namespace's (a tenant name, 0x1f) as "default" 0x1f KEY, and one whose
 * prefix is no tenant name as given; so the keys sent for distinct (tenant, key) pairs are
 * distinct; the methods of a segment's owner (MoveStart, a List of stored keys) and a scope
 * that is off leave requests alone; List and RemoveByRegex get the namespace; undo puts
 * every request back as it was.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "client/control/key_scope.h"
#include "client/mem/scratch.h"
#include "common/rpc.h"
#include "kvpool.pb-c.h"

static kvp_key_scope_t scope_of(const char *ns)
{
    kvp_key_scope_t s = {.on = true};
    if (ns != NULL) {
        s.ns_len = strlen(ns);
        memcpy(s.ns, ns, s.ns_len + 1);
    }
    return s;
}

/* The key `key` (len bytes) is sent as, by a client of scope s, in an Exist. */
static size_t sent_as(const kvp_key_scope_t *s, uint16_t method, const char *key, size_t len,
                      char *out, size_t cap)
{
    ProtobufCBinaryData k = {.len = len, .data = (uint8_t *)key};
    Kvpool__KeysRequest req = KVPOOL__KEYS_REQUEST__INIT;
    req.keys = &k;
    req.n_keys = 1;
    size_t mark = kvp_scratch_mark();
    kvp_key_scope_undo_t undo;
    assert_int_equal(kvp_key_scope_apply(s, method, &req.base, &undo), KVP_OK);
    assert_true(req.keys[0].len <= cap);
    memcpy(out, req.keys[0].data, req.keys[0].len);
    size_t n = req.keys[0].len;
    kvp_key_scope_undo(&undo);
    kvp_scratch_release(mark);
    /* put back: the caller's array and key */
    assert_ptr_equal(req.keys, &k);
    assert_ptr_equal(k.data, key);
    assert_int_equal(k.len, len);
    return n;
}

static void expect(const kvp_key_scope_t *s, const char *key, size_t len, const char *want,
                   size_t want_len)
{
    char out[5000];
    size_t n = sent_as(s, KVP_RPC_EXIST, key, len, out, sizeof(out));
    if (n != want_len || memcmp(out, want, n) != 0)
        fail_msg("key '%.*s' sent as '%.*s', want '%.*s'", (int)len, key, (int)n, out,
                 (int)want_len, want);
}

#define EXPECT(s, key, want) expect(s, key, sizeof(key) - 1, want, sizeof(want) - 1)

static void test_a_tenant_ids_keys_get_its_prefix(void **state)
{
    (void)state;
    kvp_key_scope_t x = scope_of("x");
    EXPECT(&x, "k", "x\x1fk");
    EXPECT(&x, "y\x1fk", "x\x1fy\x1fk");
    EXPECT(&x, "default\x1fk",
           "x\x1f"
           "default\x1fk");
    static char big[4096], want[4098];
    memset(big, 'L', sizeof(big));
    memcpy(want, "x\x1f", 2);
    memset(want + 2, 'L', sizeof(big));
    expect(&x, big, sizeof(big), want, sizeof(want));
}

static void test_default_keys_escape_what_reads_as_a_namespace(void **state)
{
    (void)state;
    kvp_key_scope_t d = scope_of(NULL);
    EXPECT(&d, "k", "k");
    EXPECT(&d, "x\x1fk", "default\x1fx\x1fk");
    EXPECT(&d, "default\x1fk",
           "default\x1f"
           "default\x1fk");
    EXPECT(&d, "bad name\x1fk", "bad name\x1fk"); /* no tenant name before the 0x1f */
    EXPECT(&d, "\x1fk", "\x1fk");
}

/* (tenant, key) pairs that would meet without the scope are sent apart (tenant_id
 * "default" never reaches the scope: client.c reads it as none). */
static void test_distinct_pairs_are_sent_apart(void **state)
{
    (void)state;
    static const struct {
        const char *ns, *key;
    } pairs[] = {{"x", "k"},         {NULL, "x\x1fk"},        {"y", "x\x1fk"},
                 {NULL, "k"},        {NULL, "default\x1fk"},  {"x", "default\x1fk"},
                 {"default.x", "k"}, {NULL, "default.x\x1fk"}};
    enum { N = sizeof(pairs) / sizeof(pairs[0]) };
    char sent[N][64];
    size_t len[N];
    for (size_t i = 0; i < N; i++) {
        kvp_key_scope_t s = scope_of(pairs[i].ns);
        len[i] = sent_as(&s, KVP_RPC_PUT_START, pairs[i].key, strlen(pairs[i].key), sent[i],
                         sizeof(sent[i]));
        for (size_t j = 0; j < i; j++)
            if (len[i] == len[j] && memcmp(sent[i], sent[j], len[i]) == 0)
                fail_msg("pairs %zu and %zu are sent alike: '%.*s'", i, j, (int)len[i], sent[i]);
    }
}

static void test_owners_methods_and_scope_off_are_left_alone(void **state)
{
    (void)state;
    kvp_key_scope_t x = scope_of("x");
    char out[64];
    assert_int_equal(sent_as(&x, KVP_RPC_MOVE_START, "k", 1, out, sizeof(out)), 1);
    kvp_key_scope_t off = x;
    off.on = false;
    assert_int_equal(sent_as(&off, KVP_RPC_EXIST, "k", 1, out, sizeof(out)), 1);
    assert_memory_equal(out, "k", 1);
}

static void test_listings_name_the_namespace(void **state)
{
    (void)state;
    kvp_key_scope_t x = scope_of("x"), d = scope_of(NULL);
    Kvpool__ListRequest l = KVPOOL__LIST_REQUEST__INIT;
    kvp_key_scope_undo_t undo;
    char *before = l.key_namespace;
    assert_int_equal(kvp_key_scope_apply(&x, KVP_RPC_LIST, &l.base, &undo), KVP_OK);
    assert_string_equal(l.key_namespace, "x");
    kvp_key_scope_undo(&undo);
    assert_ptr_equal(l.key_namespace, before);
    l.stored_keys = true; /* a drain's: keys as stored */
    assert_int_equal(kvp_key_scope_apply(&x, KVP_RPC_LIST, &l.base, &undo), KVP_OK);
    assert_ptr_equal(l.key_namespace, before);
    Kvpool__RemoveByRegexRequest r = KVPOOL__REMOVE_BY_REGEX_REQUEST__INIT;
    assert_int_equal(kvp_key_scope_apply(&x, KVP_RPC_REMOVE_BY_REGEX, &r.base, &undo), KVP_OK);
    assert_string_equal(r.key_namespace, "x");
    kvp_key_scope_undo(&undo);
    /* no tenant_id: the operator's listing, every key as stored */
    assert_int_equal(kvp_key_scope_apply(&d, KVP_RPC_REMOVE_BY_REGEX, &r.base, &undo), KVP_OK);
    assert_string_equal(r.key_namespace, "");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_tenant_ids_keys_get_its_prefix),
        cmocka_unit_test(test_default_keys_escape_what_reads_as_a_namespace),
        cmocka_unit_test(test_distinct_pairs_are_sent_apart),
        cmocka_unit_test(test_owners_methods_and_scope_off_are_left_alone),
        cmocka_unit_test(test_listings_name_the_namespace),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
