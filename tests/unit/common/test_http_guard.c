/*
 * test_http_guard.c - unit tests for common/http_guard.c, the HTTP server's connection caps:
 * the per-peer and pool caps take the place of the oldest connection still waiting for its
 * head (never one inside a request, never another peer's for the per-peer cap), a head past
 * its deadline is kicked whatever it sent meanwhile, and every refusal is counted; the body
 * budget is kept per tenant (its key), in a bounded table of accounts.
 *
 * Real parts: the guard itself, with a kick function that records the descriptors it is
 * given (the server's shuts the socket down). Times are passed in, not read from a clock.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <string.h>

#include "common/http_guard.h"

#define S 1000000000ull /* ns */

static int kicked[64];
static unsigned n_kicked;

static void record(void *arg, int fd)
{
    (void)arg;
    if (n_kicked < 64)
        kicked[n_kicked] = fd;
    n_kicked++;
}

static kvp_http_peer_t peer(uint8_t last)
{
    kvp_http_peer_t p = {{0}};
    p.addr[10] = p.addr[11] = 0xff;
    p.addr[12] = 127;
    p.addr[15] = last;
    return p;
}

/* The per-peer cap: the peer's oldest unfinished head goes, another peer's never; a peer whose
 * every connection is inside a request is refused. */
static void test_per_peer(void **state)
{
    (void)state;
    n_kicked = 0;
    kvp_http_guard_t *g = kvp_http_guard_create(16, 8, 3, 10 * S, record, NULL);
    assert_non_null(g);
    kvp_http_peer_t a = peer(1), b = peer(2);
    int sb = kvp_http_guard_open(g, &b, 100, 0); /* b's, older than all of a's */
    int s1 = kvp_http_guard_open(g, &a, 1, 1), s2 = kvp_http_guard_open(g, &a, 2, 2);
    int s3 = kvp_http_guard_open(g, &a, 3, 3);
    assert_true(sb >= 0 && s1 >= 0 && s2 >= 0 && s3 >= 0);
    assert_int_equal(n_kicked, 0);
    kvp_http_guard_request(g, s1, true, 4); /* a's first is inside a request: kept */
    int s4 = kvp_http_guard_open(g, &a, 4, 5);
    assert_true(s4 >= 0);
    assert_int_equal(n_kicked, 1);
    assert_int_equal(kicked[0], 2); /* a's oldest unfinished head, not b's older one */
    kvp_http_guard_close(g, s2);
    kvp_http_guard_request(g, s3, true, 6);
    kvp_http_guard_request(g, s4, true, 6);
    assert_int_equal(kvp_http_guard_open(g, &a, 5, 7), -1); /* all of a's in requests */
    assert_int_equal(n_kicked, 1);
    assert_true(kvp_http_guard_open(g, &b, 101, 8) >= 0); /* b is not held back by a */
    kvp_http_guard_stats_t st;
    kvp_http_guard_stats(g, &st);
    assert_int_equal(st.peer, 2);
    assert_int_equal(st.pool, 0);
    assert_int_equal(st.live, 5); /* b 2, a 3 (the kicked one released) */
    kvp_http_guard_destroy(g);
}

/* The pool cap: the oldest unfinished head of anyone goes, so a prober always gets in while
 * a flood of heads fills the pool; kicked connections no longer count, and the slots bound
 * what is held. */
static void test_pool(void **state)
{
    (void)state;
    n_kicked = 0;
    kvp_http_guard_t *g = kvp_http_guard_create(6, 4, 100, 10 * S, record, NULL);
    int s[4];
    for (int i = 0; i < 4; i++) {
        kvp_http_peer_t p = peer((uint8_t)(10 + i));
        s[i] = kvp_http_guard_open(g, &p, 10 + i, (uint64_t)i);
        assert_true(s[i] >= 0);
    }
    kvp_http_guard_request(g, s[0], true, 5); /* inside a request: kept */
    kvp_http_peer_t probe = peer(99);
    assert_true(kvp_http_guard_open(g, &probe, 99, 6) >= 0);
    assert_int_equal(n_kicked, 1);
    assert_int_equal(kicked[0], 11); /* the oldest head, not the older one in a request */
    assert_true(kvp_http_guard_open(g, &probe, 98, 7) >= 0);
    assert_int_equal(kicked[1], 12);
    /* 6 slots: 2 kicked still held, 4 live; the next one kicks but finds no slot */
    assert_int_equal(kvp_http_guard_open(g, &probe, 97, 8), -1);
    kvp_http_guard_close(g, s[1]);
    kvp_http_guard_close(g, s[2]);
    assert_true(kvp_http_guard_open(g, &probe, 96, 9) >= 0);
    kvp_http_guard_stats_t st;
    kvp_http_guard_stats(g, &st);
    assert_true(st.pool >= 3);
    assert_int_equal(st.live, 5); /* 4, the two probes, the last; two released */
    kvp_http_guard_destroy(g);
}

/* The head deadline runs from the accept (the handshake inside it) and from the end of the
 * previous request, and nothing the client sends meanwhile moves it; a connection inside a
 * request is never kicked for it. */
static void test_head_deadline(void **state)
{
    (void)state;
    n_kicked = 0;
    kvp_http_guard_t *g = kvp_http_guard_create(8, 8, 8, 2 * S, record, NULL);
    kvp_http_peer_t p = peer(1);
    int slow = kvp_http_guard_open(g, &p, 1, 0);
    int busy = kvp_http_guard_open(g, &p, 2, 0);
    int keep = kvp_http_guard_open(g, &p, 3, 0);
    kvp_http_guard_request(g, busy, true, 1 * S);
    kvp_http_guard_request(g, keep, true, 1 * S);
    kvp_http_guard_request(g, keep, false, 1 * S + 1); /* its next head from here */
    assert_int_equal(kvp_http_guard_sweep(g, 2 * S), 0);
    assert_int_equal(kvp_http_guard_sweep(g, 2 * S + 1), 1);
    assert_int_equal(kicked[0], 1);
    assert_int_equal(kvp_http_guard_sweep(g, 3 * S + 2), 1); /* keep's next head, late */
    assert_int_equal(kicked[1], 3);
    assert_int_equal(kvp_http_guard_sweep(g, 100 * S), 0); /* busy: inside its request */
    assert_int_equal(kvp_http_guard_sweep(g, 100 * S), 0); /* kicked once only */
    kvp_http_guard_stats_t st;
    kvp_http_guard_stats(g, &st);
    assert_int_equal(st.head_deadline, 2);
    (void)slow;
    kvp_http_guard_destroy(g);
}

#define MIB (1u << 20)

/* Each key has its own budget: one tenant at its cap leaves the others theirs, and gets its
 * own back as it releases. */
static void test_budget_per_tenant(void **state)
{
    (void)state;
    kvp_http_budget_t *b = kvp_http_budget_create(4, 64 * MIB, 0);
    assert_non_null(b);
    int held[4];
    for (int i = 0; i < 4; i++) { /* team-b: four 16 MiB bodies, its whole budget */
        held[i] = -1;
        assert_int_equal(kvp_http_budget_reserve(b, "tteam-b", &held[i], 16 * MIB),
                         KVP_HTTP_BUDGET_OK);
        assert_int_equal(held[i], held[0]); /* one account for the tenant */
    }
    int fifth = -1;
    assert_int_equal(kvp_http_budget_reserve(b, "tteam-b", &fifth, 1), KVP_HTTP_BUDGET_TENANT);
    assert_int_equal(fifth, -1);
    int a = -1; /* team-a: its own account, its whole budget */
    assert_int_equal(kvp_http_budget_reserve(b, "tteam-a", &a, 64 * MIB), KVP_HTTP_BUDGET_OK);
    assert_int_not_equal(a, held[0]);
    int p = -1; /* a principal of the same name as a tenant: another account */
    assert_int_equal(kvp_http_budget_reserve(b, "pteam-b", &p, 16 * MIB), KVP_HTTP_BUDGET_OK);
    assert_int_not_equal(p, held[0]);
    assert_int_equal(kvp_http_budget_bytes(b), (size_t)144 * MIB);
    kvp_http_budget_release(b, held[0], 16 * MIB); /* one of team-b's ends: room for one */
    fifth = -1;
    assert_int_equal(kvp_http_budget_reserve(b, "tteam-b", &fifth, 16 * MIB), KVP_HTTP_BUDGET_OK);
    assert_int_equal(fifth, held[1]);
    kvp_http_budget_destroy(b);
}

/* The table bounds the tenants with bodies at once; an account is free again once its bytes
 * are all released, and a body larger than the budget never fits. */
static void test_budget_accounts(void **state)
{
    (void)state;
    kvp_http_budget_t *b = kvp_http_budget_create(2, MIB, 0);
    assert_non_null(b);
    int x = -1, y = -1, z = -1;
    assert_int_equal(kvp_http_budget_reserve(b, "tx", &x, 10), KVP_HTTP_BUDGET_OK);
    assert_int_equal(kvp_http_budget_reserve(b, "ty", &y, 10), KVP_HTTP_BUDGET_OK);
    assert_int_equal(kvp_http_budget_reserve(b, "tz", &z, 10), KVP_HTTP_BUDGET_ACCOUNTS);
    assert_int_equal(z, -1);
    assert_int_equal(kvp_http_budget_reserve(b, "tx", &x, 10), KVP_HTTP_BUDGET_OK); /* its own */
    kvp_http_budget_release(b, x, 20);
    assert_int_equal(kvp_http_budget_reserve(b, "tz", &z, 10), KVP_HTTP_BUDGET_OK);
    assert_int_equal(z, x);
    int big = -1;
    assert_int_equal(kvp_http_budget_reserve(b, "", &big, MIB + 1), KVP_HTTP_BUDGET_ACCOUNTS);
    kvp_http_budget_release(b, y, 10);
    assert_int_equal(kvp_http_budget_reserve(b, "", &big, MIB + 1), KVP_HTTP_BUDGET_TENANT);
    kvp_http_budget_set(b, 2 * MIB); /* the server's largest body raised it */
    assert_int_equal(kvp_http_budget_reserve(b, "", &big, MIB + 1), KVP_HTTP_BUDGET_OK);
    kvp_http_budget_release(b, big, MIB + 1);
    kvp_http_budget_release(b, z, 10);
    assert_int_equal(kvp_http_budget_bytes(b), 0);
    kvp_http_budget_destroy(b);
}

/* The whole request's deadline: a connection inside a request longer than it (a body
 * trickled in, an answer read slowly) is kicked and counted apart from slow heads; one whose
 * request ended in time is not. */
static void test_request_deadline(void **state)
{
    (void)state;
    n_kicked = 0;
    kvp_http_guard_t *g = kvp_http_guard_create(8, 8, 8, 2 * S, record, NULL);
    kvp_http_guard_request_deadline(g, 10 * S);
    kvp_http_peer_t p = peer(1);
    int trickle = kvp_http_guard_open(g, &p, 1, 0);
    int quick = kvp_http_guard_open(g, &p, 2, 0);
    kvp_http_guard_request(g, trickle, true, 1 * S);
    kvp_http_guard_request(g, quick, true, 1 * S);
    kvp_http_guard_request(g, quick, false, 9 * S); /* its answer sent: a head due by 11 s */
    assert_int_equal(kvp_http_guard_sweep(g, 11 * S), 0);
    assert_int_equal(kvp_http_guard_sweep(g, 11 * S + 1), 2); /* both: the request, the head */
    kvp_http_guard_stats_t st;
    kvp_http_guard_stats(g, &st);
    assert_int_equal(st.request_deadline, 1);
    assert_int_equal(st.head_deadline, 1);
    kvp_http_guard_destroy(g);
}

/* The table's total: past it a body is refused as FULL whatever its tenant holds, and the
 * room comes back as bodies end; one account's budget always fits. */
static void test_budget_total(void **state)
{
    (void)state;
    kvp_http_budget_t *b = kvp_http_budget_create(8, 4 * MIB, 6 * MIB);
    assert_non_null(b);
    int x = -1, y = -1, z = -1;
    assert_int_equal(kvp_http_budget_reserve(b, "tx", &x, 4 * MIB), KVP_HTTP_BUDGET_OK);
    assert_int_equal(kvp_http_budget_reserve(b, "ty", &y, 2 * MIB), KVP_HTTP_BUDGET_OK);
    assert_int_equal(kvp_http_budget_reserve(b, "tz", &z, 1), KVP_HTTP_BUDGET_FULL);
    assert_int_equal(z, -1);
    assert_int_equal(kvp_http_budget_bytes(b), (size_t)6 * MIB);
    kvp_http_budget_release(b, x, 4 * MIB);
    assert_int_equal(kvp_http_budget_reserve(b, "tz", &z, 4 * MIB), KVP_HTTP_BUDGET_OK);
    kvp_http_budget_release(b, y, 2 * MIB);
    kvp_http_budget_release(b, z, 4 * MIB);
    kvp_http_budget_set(b, 8 * MIB); /* a largest body over the total: one always fits */
    int big = -1;
    assert_int_equal(kvp_http_budget_reserve(b, "", &big, 8 * MIB), KVP_HTTP_BUDGET_OK);
    int w = -1;
    assert_int_equal(kvp_http_budget_reserve(b, "tw", &w, 1), KVP_HTTP_BUDGET_FULL);
    kvp_http_budget_release(b, big, 8 * MIB);
    assert_int_equal(kvp_http_budget_bytes(b), 0);
    kvp_http_budget_destroy(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_per_peer),        cmocka_unit_test(test_pool),
        cmocka_unit_test(test_head_deadline),   cmocka_unit_test(test_budget_per_tenant),
        cmocka_unit_test(test_budget_accounts), cmocka_unit_test(test_request_deadline),
        cmocka_unit_test(test_budget_total),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
