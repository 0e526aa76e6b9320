/*
 * test_put_holds.c - the client's holds (client/put_holds.c) and the grant sets they keep:
 *   - a PUT_COMMIT answer's holds whose write grants are extents of their descriptors' grant
 *     sets keep a copy of each set (not the answer's bytes, which go with the answer), one
 *     per descriptor however many holds name it, and the extent each names; a hold with
 *     grants of its own keeps those;
 *   - a hold naming an extent past its set, a descriptor the answer does not have, or a set
 *     whose length disagrees with its count is not kept;
 *   - every hold value naming a set holds a reference: taken holds keep theirs, put back
 *     ones get the pool's, and a set is freed when the last hold naming it is released,
 *     expired, dropped with its segment or with the pool (ASan's leak check and
 *     use-after-free detection run this test in CI).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>
#include <unistd.h>

#include "client/put_holds.h"
#include "common/grant.h"

#define SIZE 4096u
#define SEG_A 0xA1u
#define SEG_B 0xB2u

/* An answer: descriptor 1 (SEG_A) with a grant set of `count` extents, descriptor 2 (SEG_B)
 * without; n holds of SIZE, hold i on SEG_A at set extent idx[i] (and, when two, on SEG_B
 * with a grant of its own). */
typedef struct answer {
    uint8_t set[KVP_GRANT_SET_HDR_LEN + 8 * sizeof(kvp_grant_extent_t)];
    uint8_t grant[KVP_GRANT_LEN];
    Kvpool__SegmentDesc desc[2], *descs[2];
    Kvpool__Hold hold[8], *holds[8];
    Kvpool__Replica rep[8][2], *reps[8][2];
} answer_t;

static void answer_make(answer_t *a, uint32_t count, const uint32_t *idx, const uint32_t *setno,
                        size_t n, bool two)
{
    memset(a, 0, sizeof(*a));
    kvp_grant_set_hdr_t h = {.version = KVP_GRANT_SET_VERSION,
                             .op = KVP_GRANT_WRITE,
                             .count = count,
                             .segment_id = SEG_A,
                             .expiry_ms = 1,
                             .nonce = 7};
    memcpy(a->set, &h, sizeof(h));
    for (uint32_t e = 0; e < count; e++) {
        kvp_grant_extent_t x = {.offset = e * SIZE, .length = SIZE, .version = 100 + e};
        memcpy(a->set + KVP_GRANT_SET_HDR_LEN + e * sizeof(x), &x, sizeof(x));
    }
    memset(a->grant, 0x5a, sizeof(a->grant));
    for (int d = 0; d < 2; d++) {
        kvpool__segment_desc__init(&a->desc[d]);
        a->desc[d].id = d == 0 ? SEG_A : SEG_B;
        a->descs[d] = &a->desc[d];
    }
    a->desc[0].grant_set.data = a->set;
    a->desc[0].grant_set.len = kvp_grant_set_len(count);
    for (size_t i = 0; i < n; i++) {
        kvpool__hold__init(&a->hold[i]);
        a->hold[i].id = 1 + i;
        a->hold[i].size = SIZE;
        a->hold[i].n_replicas = two ? 2 : 1;
        a->hold[i].replicas = a->reps[i];
        for (int q = 0; q < 2; q++) {
            kvpool__replica__init(&a->rep[i][q]);
            a->rep[i][q].segment_id = q == 0 ? SEG_A : SEG_B;
            a->rep[i][q].offset = (q == 0 ? idx[i] : i) * SIZE;
            a->rep[i][q].length = SIZE;
            a->reps[i][q] = &a->rep[i][q];
        }
        a->rep[i][0].grant_set = setno != NULL ? setno[i] : 1;
        a->rep[i][0].grant_index = idx[i];
        a->rep[i][1].grant.data = a->grant;
        a->rep[i][1].grant.len = sizeof(a->grant);
        a->holds[i] = &a->hold[i];
    }
}

/* A pool of max holds with a's first n holds added (put timeout timeout_ms). */
static kvp_holds_t *pool_with(answer_t *a, size_t n, uint32_t max, uint32_t timeout_ms)
{
    kvp_holds_t *h = kvp_holds_create(max, 1u << 20);
    assert_non_null(h);
    kvp_holds_add(h, 1, 1, a->holds, n, a->descs, 2, timeout_ms);
    return h;
}

static uint64_t taken_dropped(kvp_holds_t *h, uint64_t *dropped)
{
    uint64_t taken;
    kvp_holds_counts(h, &taken, dropped);
    return taken;
}

static void test_sets_kept_once_and_copied(void **state)
{
    (void)state;
    kvp_holds_t *h = kvp_holds_create(64, 1u << 20);
    answer_t a;
    const uint32_t idx[3] = {2, 0, 1};
    answer_make(&a, 3, idx, NULL, 3, true);
    kvp_holds_add(h, 1, 1, a.holds, 3, a.descs, 2, 10000);
    uint8_t want[sizeof(a.set)];
    memcpy(want, a.set, sizeof(want));
    memset(a.set, 0, sizeof(a.set)); /* the answer's bytes go with it */
    memset(a.grant, 0, sizeof(a.grant));

    const uint64_t szs[3] = {SIZE, SIZE, SIZE};
    kvp_hold_t out[3];
    assert_true(kvp_holds_take(h, 1, 1, szs, 3, out));
    kvp_hold_set_t *set = out[0].reps[0].set;
    assert_non_null(set);
    assert_int_equal(set->count, 3);
    assert_memory_equal(set->data, want, kvp_grant_set_len(3));
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(out[i].id, 1 + i);
        assert_ptr_equal(out[i].reps[0].set, set); /* one copy for the answer's descriptor */
        assert_int_equal(out[i].reps[0].set_index, idx[i]);
        assert_int_equal(out[i].reps[0].grant_len, 0);
        assert_null(out[i].reps[1].set); /* its own grant, copied */
        assert_int_equal(out[i].reps[1].grant_len, KVP_GRANT_LEN);
        assert_int_equal(out[i].reps[1].grant[0], 0x5a);
    }
    assert_int_equal(atomic_load(&set->refs), 3); /* the taken holds' */
    kvp_holds_put_back(h, 1, 1, &out[1], 1);      /* refused: the pool keeps one too */
    assert_int_equal(atomic_load(&set->refs), 4);
    kvp_holds_release(out, 3);
    assert_int_equal(atomic_load(&set->refs), 1);
    assert_null(out[0].reps[0].set);
    kvp_hold_t again;
    assert_true(kvp_holds_take(h, 1, 1, szs, 1, &again));
    assert_int_equal(again.id, 2);
    assert_ptr_equal(again.reps[0].set, set);
    kvp_holds_release(&again, 1); /* the last: freed (ASan: no leak, no use after) */
    kvp_holds_destroy(h);
}

static void test_malformed_holds_not_kept(void **state)
{
    (void)state;
    kvp_holds_t *h = kvp_holds_create(64, 1u << 20);
    answer_t a;
    /* extent 5 of 3; descriptor 3 of 2; descriptor 0 (none); then one good */
    const uint32_t idx[4] = {5, 0, 0, 1}, setno[4] = {1, 3, 0, 1};
    answer_make(&a, 3, idx, setno, 4, false);
    a.rep[2][0].grant_set = 0; /* no set and no grant of its own: kept, without a grant */
    kvp_holds_add(h, 1, 1, a.holds, 4, a.descs, 2, 10000);
    uint64_t dropped;
    const uint64_t szs[2] = {SIZE, SIZE};
    kvp_hold_t out[2];
    assert_true(kvp_holds_take(h, 1, 1, szs, 2, out));
    assert_int_equal(out[0].id, 3);
    assert_null(out[0].reps[0].set);
    assert_int_equal(out[0].reps[0].grant_len, 0);
    assert_int_equal(out[1].id, 4);
    assert_non_null(out[1].reps[0].set);
    assert_int_equal(out[1].reps[0].set_index, 1);
    taken_dropped(h, &dropped);
    assert_int_equal(dropped, 2); /* the extent past the set, the descriptor not there */
    kvp_holds_release(out, 2);
    kvp_holds_destroy(h);

    /* a set whose length disagrees with its count: none of its holds kept */
    h = kvp_holds_create(64, 1u << 20);
    const uint32_t one[1] = {0};
    answer_make(&a, 3, one, NULL, 1, false);
    a.desc[0].grant_set.len -= 1;
    kvp_holds_add(h, 1, 1, a.holds, 1, a.descs, 2, 10000);
    kvp_hold_t x;
    assert_false(kvp_holds_take(h, 1, 1, szs, 1, &x));
    taken_dropped(h, &dropped);
    assert_int_equal(dropped, 1);
    kvp_holds_destroy(h);
}

static void test_sets_freed_with_their_last_hold(void **state)
{
    (void)state;
    const uint32_t idx[4] = {0, 1, 2, 3};
    const uint64_t szs[1] = {SIZE};
    answer_t a;
    uint64_t dropped;

    /* dropped with their segment */
    answer_make(&a, 4, idx, NULL, 4, false);
    kvp_holds_t *h = pool_with(&a, 4, 64, 10000);
    kvp_hold_t t;
    assert_true(kvp_holds_take(h, 1, 1, szs, 1, &t));
    kvp_holds_drop_segment(h, SEG_A);
    assert_int_equal(atomic_load(&t.reps[0].set->refs), 1); /* only the taken one left */
    kvp_holds_release(&t, 1);
    taken_dropped(h, &dropped);
    assert_int_equal(dropped, 3);
    kvp_holds_destroy(h);

    /* expired (usable for half the put timeout: 1 ms here) */
    answer_make(&a, 4, idx, NULL, 4, false);
    h = pool_with(&a, 4, 64, 2);
    usleep(5000);
    assert_false(kvp_holds_take(h, 1, 1, szs, 1, &t));
    taken_dropped(h, &dropped);
    assert_int_equal(dropped, 4);
    kvp_holds_destroy(h);

    /* another placement's holds asked for: the kept ones dropped */
    answer_make(&a, 4, idx, NULL, 4, false);
    h = pool_with(&a, 4, 64, 10000);
    answer_make(&a, 4, idx, NULL, 2, false);
    kvp_holds_add(h, 2, 1, a.holds, 2, a.descs, 2, 10000);
    taken_dropped(h, &dropped);
    assert_int_equal(dropped, 4);
    kvp_holds_give_all(h, 1); /* the rest given back */
    kvp_holds_destroy(h);

    /* kept past the pool's bound: not taken in, nothing referenced */
    answer_make(&a, 4, idx, NULL, 4, false);
    h = pool_with(&a, 4, 2, 10000);
    taken_dropped(h, &dropped);
    assert_int_equal(dropped, 2);
    assert_true(kvp_holds_take(h, 1, 1, szs, 1, &t));
    assert_int_equal(atomic_load(&t.reps[0].set->refs), 2);
    kvp_holds_release(&t, 1);
    kvp_holds_destroy(h); /* the pool's last: freed with it */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sets_kept_once_and_copied),
        cmocka_unit_test(test_malformed_holds_not_kept),
        cmocka_unit_test(test_sets_freed_with_their_last_hold),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
