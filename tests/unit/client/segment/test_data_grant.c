/*
 * test_data_grant.c - the data servers' table of begun puts (client/segment/data_grant.c,
 * kvp_data_pending_at): a write's note refuses older versions at its extent, the record
 * reaching it forgets it, a later put's note wins and an earlier one does not undo it, a
 * new grant key empties the table; a million puts recorded as they go leave it empty;
 * 200 000 random steps against a plain array (collisions
 * and linear probing's deletions); growth to the cap, then a full table drops a note
 * (counted) until the sweep of notes older than a minute makes room; a request's entries
 * at once (kvp_data_pending_check); a window's extents checked again after its bind
 * (kvp_data_extents_recheck): refused once a later put was noted or recorded there.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "client/segment/data_grant.h"

static int setup(void **state)
{
    kvp_data_pending_t *p = malloc(sizeof(*p));
    assert_non_null(p);
    kvp_data_pending_init(p);
    *state = p;
    return 0;
}

static int teardown(void **state)
{
    kvp_data_pending_cleanup(*state);
    free(*state);
    return 0;
}

static void test_note_refuse_forget(void **state)
{
    kvp_data_pending_t *p = *state;
    assert_int_equal(kvp_data_pending_at(p, 1, 4096, 0, 0, 10), 0); /* a read: nothing */
    assert_int_equal(p->count, 0);                                  /* and nothing noted */
    assert_int_equal(kvp_data_pending_at(p, 1, 4096, 3, 9, 10), 0); /* put v9 writes */
    assert_int_equal(kvp_data_pending_at(p, 1, 4096, 3, 0, 11), 9); /* an old read sees it */
    assert_int_equal(kvp_data_pending_at(p, 1, 4096, 3, 9, 12), 9); /* v9 writes again */
    assert_int_equal(kvp_data_pending_at(p, 1, 4096, 3, 7, 13), 9); /* v7 is not noted */
    assert_int_equal(kvp_data_pending_at(p, 1, 4096, 3, 0, 14), 9);
    assert_int_equal(kvp_data_pending_at(p, 1, 4096, 3, 12, 15), 9); /* v12 after it */
    assert_int_equal(kvp_data_pending_at(p, 1, 4096, 3, 0, 16), 12);
    assert_int_equal(kvp_data_pending_at(p, 1, 8192, 0, 0, 16), 0); /* another extent */
    /* the record has v12 now: the note goes */
    assert_int_equal(kvp_data_pending_at(p, 1, 4096, 12, 0, 17), 0);
    assert_int_equal(p->count, 0);
    /* a new key (gen): the notes of the old one go with their grants */
    assert_int_equal(kvp_data_pending_at(p, 1, 0, 0, 5, 18), 0);
    assert_int_equal(kvp_data_pending_at(p, 1, 0, 0, 0, 18), 5);
    assert_int_equal(kvp_data_pending_at(p, 2, 0, 0, 0, 19), 0);
    assert_int_equal(p->count, 0);
}

/* A request's entries at once (kvp_data_pending_check, one lock): a write notes each in
 * order until one is refused by a later put's note, and says which; a read notes none; the
 * record's versions (recs) end notes as kvp_data_pending_at does. */
static void test_check_many(void **state)
{
    kvp_data_pending_t *p = *state;
    const uint64_t offs[4] = {0, 4096, 4096, 8192}; /* two slices of one extent */
    const uint64_t v_new[4] = {10, 11, 11, 12}, recs0[4] = {0, 0, 0, 0};
    assert_int_equal(kvp_data_pending_check(p, 1, offs, NULL, v_new, recs0, 4, true, 1), 4);
    assert_int_equal(p->count, 3); /* one note per extent */
    /* older grants of those extents: a read is refused at its first entry; a write at the
     * entry whose extent has a later note (the second), after noting the first (v10 >= 9) */
    const uint64_t v_old[4] = {9, 11, 11, 12};
    assert_int_equal(kvp_data_pending_check(p, 1, offs, NULL, v_old, recs0, 4, false, 2), 0);
    const uint64_t v_mix[3] = {10, 5, 12};
    assert_int_equal(kvp_data_pending_check(p, 1, offs + 1, NULL, v_mix + 1, recs0, 2, true, 2), 0);
    assert_int_equal(kvp_data_pending_check(p, 1, offs, NULL, v_mix, recs0, 3, true, 2), 1);
    /* a read of the current versions passes and notes nothing new */
    assert_int_equal(kvp_data_pending_check(p, 1, offs, NULL, v_new, recs0, 4, false, 3), 4);
    assert_int_equal(p->count, 3);
    /* the record holds them all now: every note ends */
    assert_int_equal(kvp_data_pending_check(p, 1, offs, NULL, v_new, v_new, 4, false, 4), 4);
    assert_int_equal(p->count, 0);
    /* a new key empties the table once for the whole request */
    assert_int_equal(kvp_data_pending_check(p, 1, offs, NULL, v_new, recs0, 4, true, 5), 4);
    assert_int_equal(kvp_data_pending_check(p, 2, offs, NULL, v_old, recs0, 4, false, 6), 4);
    assert_int_equal(p->count, 0);
}

/* kvp_data_pending_later: a note with its extent's length answers for any overlap of that
 * extent by an earlier object's; one without (a length of 0) for its offset alone; a note
 * of an earlier or the same version is not later. */
static void test_later_put_over_an_extent(void **state)
{
    kvp_data_pending_t *p = *state;
    assert_false(kvp_data_pending_later(p, 0, 1u << 20, 1)); /* an empty table */
    const uint64_t offs[2] = {65536, 262144}, lens[2] = {16384, 4096};
    const uint64_t vers[2] = {20, 21}, recs[2] = {0, 0};
    assert_int_equal(kvp_data_pending_check(p, 1, offs, lens, vers, recs, 2, true, 1), 2);
    /* an object of version 10 at 0..256 KiB: the v20 put at 64..80 KiB wrote into it */
    assert_true(kvp_data_pending_later(p, 0, 262144, 10));
    assert_true(kvp_data_pending_later(p, 65536 + 16383, 1, 19));     /* its last byte */
    assert_false(kvp_data_pending_later(p, 65536 + 16384, 4096, 10)); /* just past it */
    assert_false(kvp_data_pending_later(p, 0, 65536, 10));            /* just before it */
    assert_false(kvp_data_pending_later(p, 0, 262144, 20));   /* not later than v20 itself */
    assert_true(kvp_data_pending_later(p, 262144, 4096, 20)); /* v21 */
    /* a note without a length covers its offset alone */
    assert_int_equal(kvp_data_pending_at(p, 1, 1u << 20, 0, 30, 2), 0);
    assert_true(kvp_data_pending_later(p, (1u << 20) - 4096, 8192, 29));
    assert_false(kvp_data_pending_later(p, (1u << 20) + 1, 8192, 29));
    /* recorded: gone */
    kvp_data_pending_forget(p, 65536, 20);
    assert_false(kvp_data_pending_later(p, 0, 262144, 10));
}

/* The record's ADD ends a note (kvp_data_pending_forget): the table holds the puts in
 * flight only, however many went through. */
static void test_recorded_puts_leave_the_table(void **state)
{
    kvp_data_pending_t *p = *state;
    for (uint64_t v = 1; v <= 1000000; v++) {
        uint64_t off = (v % 5000) * 4096;
        assert_int_equal(kvp_data_pending_at(p, 1, off, 0, v, 1), 0);
        kvp_data_pending_forget(p, off, v); /* its PutEnd's ADD reached the record */
    }
    assert_int_equal(p->count, 0);
    assert_true(p->cap <= 1024);
    /* a forget of an earlier version leaves a later put's note */
    assert_int_equal(kvp_data_pending_at(p, 1, 0, 0, 7, 1), 0);
    kvp_data_pending_forget(p, 0, 6);
    assert_int_equal(kvp_data_pending_at(p, 1, 0, 0, 0, 1), 7);
    kvp_data_pending_forget(p, 0, 7);
    assert_int_equal(kvp_data_pending_at(p, 1, 0, 0, 0, 1), 0);
    assert_int_equal(p->dropped, 0);
}

#define SLOTS 3000u /* offsets 0, 64, ..., far fewer than the steps: collisions galore */

static void test_random_against_an_array(void **state)
{
    kvp_data_pending_t *p = *state;
    static uint64_t pend[SLOTS], rec[SLOTS];
    memset(pend, 0, sizeof(pend));
    memset(rec, 0, sizeof(rec));
    uint64_t x = 88172645463325252ull, version = 1;
    for (int step = 0; step < 200000; step++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        uint32_t i = (uint32_t)(x % SLOTS);
        uint64_t off = (uint64_t)i * 64;
        switch ((x >> 32) % 4) {
        case 0: /* a new put writes there */
        case 1: {
            uint64_t v = ++version;
            uint64_t want = pend[i] > rec[i] ? pend[i] : 0;
            assert_int_equal(kvp_data_pending_at(p, 1, off, rec[i], v, 1), want);
            pend[i] = v;
            break;
        }
        case 2: { /* the record has the put's object now (or a later one) */
            rec[i] = pend[i] > rec[i] ? pend[i] : rec[i];
            assert_int_equal(kvp_data_pending_at(p, 1, off, rec[i], 0, 1), 0);
            break;
        }
        default: { /* an old read asks */
            uint64_t want = pend[i] > rec[i] ? pend[i] : 0;
            assert_int_equal(kvp_data_pending_at(p, 1, off, rec[i], 0, 1), want);
        }
        }
    }
    /* every offset, once more; then the table holds exactly the notes the array has */
    uint32_t live = 0;
    for (uint32_t i = 0; i < SLOTS; i++) {
        uint64_t want = pend[i] > rec[i] ? pend[i] : 0;
        assert_int_equal(kvp_data_pending_at(p, 1, (uint64_t)i * 64, rec[i], 0, 1), want);
        live += want != 0;
    }
    assert_int_equal(p->count, live);
}

static void test_full_table_drops_then_sweeps(void **state)
{
    kvp_data_pending_t *p = *state;
    uint32_t fill = KVP_DATA_PENDING_MAX / 4 * 3;
    for (uint32_t i = 0; i < fill; i++)
        assert_int_equal(kvp_data_pending_at(p, 1, (uint64_t)i * 4096, 0, i + 1, 1000), 0);
    assert_int_equal(p->cap, KVP_DATA_PENDING_MAX);
    assert_int_equal(p->count, fill);
    /* full, and every note younger than a minute: the next one is let in unnoted */
    uint64_t off = (uint64_t)fill * 4096;
    assert_int_equal(kvp_data_pending_at(p, 1, off, 0, fill + 1, 30000), 0);
    assert_int_equal(p->dropped, 1);
    assert_int_equal(kvp_data_pending_at(p, 1, off, 0, 0, 30000), 0);
    /* the old notes still refuse their old grants meanwhile */
    assert_int_equal(kvp_data_pending_at(p, 1, 4096, 0, 0, 30000), 2);
    /* a minute on, the old notes are swept and the new one is taken */
    assert_int_equal(kvp_data_pending_at(p, 1, off, 0, fill + 2, 62000), 0);
    assert_int_equal(p->count, 1);
    assert_int_equal(kvp_data_pending_at(p, 1, off, 0, 0, 62000), fill + 2);
    assert_int_equal(p->dropped, 1);
}

/* The record of test_recheck: the version at offset 0 and at 4096. */
static uint64_t rec_v[2];

static void rec_versions_at(void *arg, const uint64_t *offsets, uint64_t *versions, size_t n)
{
    (void)arg;
    for (size_t i = 0; i < n; i++)
        versions[i] = rec_v[offsets[i] == 0 ? 0 : 1];
}

/* A read window of v3 at 0 and of v5 at 4096, checked again after its bind: fine until a
 * later put writes (noted) or is recorded at one of them; a write window's own put (its
 * note) does not refuse it; nothing checked (grants off) passes. */
static void test_recheck(void **state)
{
    kvp_data_pending_t *p = *state;
    kvp_data_ended_t ended = {.versions_at = rec_versions_at, .pending = p};
    kvp_data_checked_t c = {.offset = {0, 4096}, .version = {3, 5}, .n = 2};
    rec_v[0] = 3;
    rec_v[1] = 5;
    assert_null(kvp_data_extents_recheck(&ended, 1, &c));
    assert_int_equal(kvp_data_pending_at(p, 1, 4096, 5, 9, 10), 0); /* put v9 writes there */
    assert_non_null(kvp_data_extents_recheck(&ended, 1, &c));
    kvp_data_checked_t w = {.offset = {4096}, .version = {9}, .n = 1}; /* v9's own window */
    assert_null(kvp_data_extents_recheck(&ended, 1, &w));
    rec_v[1] = 9; /* v9 recorded: the old read stays refused; v9's note goes */
    assert_non_null(kvp_data_extents_recheck(&ended, 1, &c));
    assert_null(kvp_data_extents_recheck(&ended, 1, &w));
    assert_int_equal(p->count, 0);
    c.n = 1; /* the extent at 0 alone: still v3 */
    assert_null(kvp_data_extents_recheck(&ended, 1, &c));
    rec_v[0] = 4; /* a later object recorded there */
    assert_non_null(kvp_data_extents_recheck(&ended, 1, &c));
    c.n = 0;
    assert_null(kvp_data_extents_recheck(&ended, 1, &c));
    assert_null(kvp_data_extents_recheck(NULL, 1, &w));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_note_refuse_forget, setup, teardown),
        cmocka_unit_test_setup_teardown(test_check_many, setup, teardown),
        cmocka_unit_test_setup_teardown(test_later_put_over_an_extent, setup, teardown),
        cmocka_unit_test_setup_teardown(test_random_against_an_array, setup, teardown),
        cmocka_unit_test_setup_teardown(test_recorded_puts_leave_the_table, setup, teardown),
        cmocka_unit_test_setup_teardown(test_full_table_drops_then_sweeps, setup, teardown),
        cmocka_unit_test_setup_teardown(test_recheck, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
