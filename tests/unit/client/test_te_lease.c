/*
 * test_te_lease.c - the transfer engine's standing lease (client/te/te_lease.c), both sides in
 * this process, the memfds as a peer receives them:
 *   - a peer checks its ranges against what the target published: inside one range GO,
 *     across two or outside ASK (nothing marked); a publish of more ranges than the peer's
 *     copy held is read whole;
 *   - a revoked lease answers REVOKED before any copy, and nothing is left marked;
 *   - a slot revoked while busy stays (its copy may be under way) until unmarked, then is
 *     freed, its counts kept in the totals; a freed slot is taken again;
 *   - an unregister's wait returns at once for a mark under the new ranges, and waits for
 *     one under the ones before;
 *   - memfds of the wrong size or without seals are no lease (KVP_ERR_PROTOCOL).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "client/include/kvpool_te.h"
#include "client/te/te_lease.h"
#include "tests/harness.h"
#include "client/transport/wire.h"

/* what a peer gets: its own descriptors of the two memfds */
static kvp_te_lease_t *peer_map(const int fds[2])
{
    kvp_te_lease_t *l;
    assert_int_equal(kvp_te_lease_map(dup(fds[0]), dup(fds[1]), &l), KVP_OK);
    return l;
}

static uint64_t publish(kvp_te_lease_host_t *h, const uint64_t (*r)[2], size_t n)
{
    size_t cap;
    uint64_t *out = kvp_te_lease_host_begin(h, &cap);
    assert_true(n <= cap);
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = r[i][0];
        out[2 * i + 1] = r[i][1];
    }
    return kvp_te_lease_host_end(h, n);
}

static void test_ranges_checked_against_the_published_ones(void **state)
{
    (void)state;
    kvp_te_lease_host_t *h;
    assert_int_equal(kvp_te_lease_host_create(&h), KVP_OK);
    const uint64_t two[2][2] = {{0x10000, 0x1000}, {0x11000, 0x1000}};
    publish(h, two, 2);
    int fds[2];
    int slot = kvp_te_lease_host_take(h, getpid(), fds);
    assert_true(slot >= 0);
    kvp_te_lease_t *l = peer_map(fds);
    uint64_t rem[2] = {0x10000, 0x11800}, len[2] = {0x1000, 0x800};
    assert_int_equal(kvp_te_lease_begin(l, rem, len, 2), KVP_TE_LEASE_GO);
    kvp_te_lease_end(l, true, KVP_TE_WRITE, 2, 0x1800);
    uint64_t across = 0x10800, alen = 0x1000; /* adjacent ranges are still two */
    assert_int_equal(kvp_te_lease_begin(l, &across, &alen, 1), KVP_TE_LEASE_ASK);
    uint64_t past = 0x11fff, plen = 2;
    assert_int_equal(kvp_te_lease_begin(l, &past, &plen, 1), KVP_TE_LEASE_ASK);
    uint64_t low = 0xffff, llen = 1;
    assert_int_equal(kvp_te_lease_begin(l, &low, &llen, 1), KVP_TE_LEASE_ASK);
    /* many more ranges: the peer's copy grows and holds them all */
    static uint64_t many[3000][2];
    for (size_t i = 0; i < 3000; i++) {
        many[i][0] = 0x100000 + i * 0x2000;
        many[i][1] = 0x1000;
    }
    publish(h, many, 3000);
    uint64_t last = many[2999][0] + 0xfff, one = 1;
    assert_int_equal(kvp_te_lease_begin(l, &last, &one, 1), KVP_TE_LEASE_GO);
    kvp_te_lease_end(l, true, KVP_TE_READ, 1, 1);
    assert_int_equal(kvp_te_lease_begin(l, rem, len, 1), KVP_TE_LEASE_ASK); /* gone */
    uint64_t moved[2], bytes[2], held;
    kvp_te_lease_host_moved(h, moved, bytes, &held);
    assert_int_equal(held, 1);
    assert_int_equal(moved[KVP_TE_WRITE], 2);
    assert_int_equal(bytes[KVP_TE_WRITE], 0x1800);
    assert_int_equal(moved[KVP_TE_READ], 1);
    kvp_te_lease_unmap(l);
    kvp_te_lease_host_destroy(h);
}

typedef struct waiter {
    kvp_te_lease_host_t *h;
    uint64_t g;
    atomic_bool done;
} waiter_t;

static void *wait_main(void *arg)
{
    waiter_t *w = arg;
    kvp_te_lease_host_wait(w->h, w->g);
    atomic_store(&w->done, true);
    return NULL;
}

static void test_revoked_and_busy_slots(void **state)
{
    (void)state;
    kvp_te_lease_host_t *h;
    assert_int_equal(kvp_te_lease_host_create(&h), KVP_OK);
    const uint64_t r[1][2] = {{0x10000, 0x10000}};
    publish(h, r, 1);
    int fds[2];
    int slot = kvp_te_lease_host_take(h, getpid(), fds);
    kvp_te_lease_t *l = peer_map(fds);
    uint64_t rem = 0x10000, len = 0x100;
    /* revoked while idle: the next batch is told before it copies, and the slot is free */
    kvp_te_lease_host_give(h, slot);
    assert_int_equal(kvp_te_lease_begin(l, &rem, &len, 1), KVP_TE_LEASE_REVOKED);
    kvp_te_lease_unmap(l);
    uint64_t moved[2], bytes[2], held;
    kvp_te_lease_host_moved(h, moved, bytes, &held);
    assert_int_equal(held, 0);
    /* a lease whose copy is under way when it is revoked */
    int slot2 = kvp_te_lease_host_take(h, getpid(), fds);
    assert_int_equal(slot2, slot); /* the freed slot, taken again */
    l = peer_map(fds);
    assert_int_equal(kvp_te_lease_begin(l, &rem, &len, 1), KVP_TE_LEASE_GO);
    kvp_te_lease_host_give(h, slot2);
    /* the ranges change: the wait holds for the copy under the old ones */
    waiter_t w = {.h = h, .g = publish(h, r, 1)};
    pthread_t th;
    pthread_create(&th, NULL, wait_main, &w);
    assert_false(kvp_wait_flag(&w.done, 200));
    int other[2];
    int slot3 = kvp_te_lease_host_take(h, getpid(), other);
    assert_true(slot3 >= 0 && slot3 != slot2); /* still held: not handed out again */
    kvp_te_lease_end(l, true, KVP_TE_WRITE, 1, 0x100);
    assert_true(kvp_wait_flag(&w.done, 5000));
    pthread_join(th, NULL);
    kvp_te_lease_host_moved(h, moved, bytes, &held);
    assert_int_equal(held, 1);                /* slot3's */
    assert_int_equal(moved[KVP_TE_WRITE], 1); /* the revoked slot's, freed, kept */
    assert_int_equal(bytes[KVP_TE_WRITE], 0x100);
    kvp_te_lease_unmap(l);
    /* slot3's peer marks under the new ranges: an unregister of now does not wait for it */
    kvp_te_lease_t *l3 = peer_map(other);
    assert_int_equal(kvp_te_lease_begin(l3, &rem, &len, 1), KVP_TE_LEASE_GO);
    waiter_t w2 = {.h = h, .g = publish(h, r, 1) - 2}; /* the generation it checked */
    pthread_create(&th, NULL, wait_main, &w2);
    assert_true(kvp_wait_flag(&w2.done, 5000));
    pthread_join(th, NULL);
    kvp_te_lease_end(l3, false, KVP_TE_WRITE, 1, 0x100);
    kvp_te_lease_unmap(l3);
    kvp_te_lease_host_destroy(h);
}

static void test_not_a_lease(void **state)
{
    (void)state;
    kvp_te_lease_t *l;
    int a = memfd_create("x", MFD_CLOEXEC), b = memfd_create("y", MFD_CLOEXEC);
    assert_int_equal(ftruncate(a, sizeof(kvp_data_te_lease_regions_t)), 0);
    assert_int_equal(ftruncate(b, sizeof(kvp_data_te_lease_slot_t)), 0);
    /* the right sizes, but not sealed: a peer could shrink them under us */
    assert_int_equal(kvp_te_lease_map(a, b, &l), KVP_ERR_PROTOCOL);
    assert_null(l);
    kvp_te_lease_host_t *h;
    assert_int_equal(kvp_te_lease_host_create(&h), KVP_OK);
    int fds[2];
    assert_true(kvp_te_lease_host_take(h, getpid(), fds) >= 0);
    /* sealed, but the memfds swapped: wrong sizes */
    assert_int_equal(kvp_te_lease_map(dup(fds[1]), dup(fds[0]), &l), KVP_ERR_PROTOCOL);
    kvp_te_lease_host_destroy(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ranges_checked_against_the_published_ones),
        cmocka_unit_test(test_revoked_and_busy_slots),
        cmocka_unit_test(test_not_a_lease),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
