/*
 * test_task_table.c - unit tests for master/meta/task_table.c: tasks added, found by id,
 * listed by their runner (waiting, then running) and live, ended and trimmed oldest-ended
 * first; many tasks over many runners (the hashes grow, every index agrees with a plain
 * list); tasks ended while their runner's list is walked; ids told from made-up ones;
 * tenants counted apart, a tenant's trim taking its own only, and the trim over all tenants
 * taking from those that keep the most.
 * Freed by kvp_task_table_cleanup whatever their state: the ASan build fails on a leak.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "master/meta/task_table.h"

static kvp_task_t *add_of(kvp_task_table_t *tt, uint64_t conn, uint16_t tenant)
{
    kvp_task_t *t = calloc(1, sizeof(*t));
    assert_non_null(t);
    t->exec_conn = conn;
    t->tenant = tenant;
    assert_true(kvp_task_table_add(tt, t));
    return t;
}

static kvp_task_t *add(kvp_task_table_t *tt, uint64_t conn)
{
    return add_of(tt, conn, 0);
}

static size_t count_list(const kvp_task_t *t)
{
    size_t n = 0;
    for (; t != NULL; t = t->run_next)
        n++;
    return n;
}

static size_t count_live(const kvp_task_table_t *tt)
{
    size_t n = 0;
    for (const kvp_task_t *t = tt->live; t != NULL; t = t->next)
        n++;
    return n;
}

/* add, find, start, release, end: each index says the same of a task as its status. */
static void test_one_task_through_its_life(void **state)
{
    (void)state;
    kvp_task_table_t tt = {0};
    assert_null(kvp_task_table_find(&tt, 1, 2));
    assert_null(kvp_task_table_waiting(&tt, 7));
    kvp_task_t *t = add(&tt, 7);
    assert_int_equal(t->status, KVP_TASK_PENDING);
    assert_true(t->created_ms > 0 && t->updated_ms == t->created_ms);
    assert_ptr_equal(kvp_task_table_find(&tt, t->id_hi, t->id_lo), t);
    assert_null(kvp_task_table_find(&tt, t->id_hi, t->id_lo ^ 1));
    assert_ptr_equal(kvp_task_table_waiting(&tt, 7), t);
    assert_null(kvp_task_table_running(&tt, 7));
    assert_null(kvp_task_table_waiting(&tt, 8));
    assert_ptr_equal(tt.live, t);
    assert_int_equal(tt.n, 1);
    assert_int_equal(tt.n_live, 1);

    kvp_task_table_start(t);
    assert_int_equal(t->status, KVP_TASK_PROCESSING);
    assert_null(kvp_task_table_waiting(&tt, 7));
    assert_ptr_equal(kvp_task_table_running(&tt, 7), t);

    kvp_task_table_release(&tt, t); /* a move waiting for the master only */
    assert_true(t->drop_pending);
    assert_null(kvp_task_table_running(&tt, 7));
    assert_int_equal(tt.n_runners, 0); /* the runner went with its last task */
    assert_ptr_equal(tt.live, t);      /* still live: the timer finishes it */

    kvp_task_table_end(&tt, t, KVP_TASK_SUCCESS);
    assert_int_equal(t->status, KVP_TASK_SUCCESS);
    assert_false(t->drop_pending);
    assert_null(tt.live);
    assert_int_equal(tt.n_live, 0);
    assert_ptr_equal(tt.tenants[0].ended_oldest, t);
    assert_ptr_equal(kvp_task_table_find(&tt, t->id_hi, t->id_lo), t); /* kept for TaskQuery */
    kvp_task_table_trim(&tt, 1);
    assert_int_equal(tt.n, 1);
    kvp_task_table_trim(&tt, 0);
    assert_int_equal(tt.n, 0);
    assert_null(tt.tenants[0].ended_oldest);
    assert_null(tt.tenants[0].ended_newest);
    kvp_task_table_cleanup(&tt);
}

/* A runner's waiting tasks come newest first (the heartbeat offers them so); starting one
 * from the middle keeps the others in order; its running list holds the last started first. */
static void test_runner_lists_keep_their_order(void **state)
{
    (void)state;
    kvp_task_table_t tt = {0};
    kvp_task_t *t[4];
    for (int i = 0; i < 4; i++)
        t[i] = add(&tt, 3);
    kvp_task_t *other = add(&tt, 4);
    const kvp_task_t *w = kvp_task_table_waiting(&tt, 3);
    for (int i = 3; i >= 0; i--, w = w->run_next)
        assert_ptr_equal(w, t[i]);
    assert_null(w);
    kvp_task_table_start(t[2]);
    kvp_task_table_start(t[0]);
    w = kvp_task_table_waiting(&tt, 3);
    assert_ptr_equal(w, t[3]);
    assert_ptr_equal(w->run_next, t[1]);
    assert_null(w->run_next->run_next);
    w = kvp_task_table_running(&tt, 3);
    assert_ptr_equal(w, t[0]);
    assert_ptr_equal(w->run_next, t[2]);
    assert_ptr_equal(kvp_task_table_waiting(&tt, 4), other);
    /* ended from anywhere in a list: the list closes over the gap */
    kvp_task_table_end(&tt, t[3], KVP_TASK_FAILED);
    kvp_task_table_end(&tt, t[2], KVP_TASK_FAILED);
    assert_ptr_equal(kvp_task_table_waiting(&tt, 3), t[1]);
    assert_ptr_equal(kvp_task_table_running(&tt, 3), t[0]);
    assert_null(t[0]->run_next);
    assert_int_equal(count_live(&tt), 3);
    assert_int_equal(tt.n_runners, 2);
    kvp_task_table_cleanup(&tt); /* live tasks too */
}

/* Trimmed in the order they ended, not the order they were made. */
static void test_trim_takes_the_first_ended(void **state)
{
    (void)state;
    kvp_task_table_t tt = {0};
    kvp_task_t *a = add(&tt, 1), *b = add(&tt, 1), *c = add(&tt, 1);
    uint64_t a_hi = a->id_hi, a_lo = a->id_lo, c_hi = c->id_hi, c_lo = c->id_lo;
    kvp_task_table_end(&tt, c, KVP_TASK_FAILED);
    kvp_task_table_end(&tt, a, KVP_TASK_SUCCESS);
    kvp_task_table_trim(&tt, 1); /* c ended first: it goes */
    assert_null(kvp_task_table_find(&tt, c_hi, c_lo));
    assert_ptr_equal(kvp_task_table_find(&tt, a_hi, a_lo), a);
    assert_ptr_equal(kvp_task_table_find(&tt, b->id_hi, b->id_lo), b); /* live: never trimmed */
    assert_int_equal(tt.n, 2);
    kvp_task_table_trim(&tt, 0);
    assert_null(kvp_task_table_find(&tt, a_hi, a_lo));
    assert_int_equal(tt.n, 1);
    assert_int_equal(tt.n_live, 1);
    kvp_task_table_cleanup(&tt);
}

/* 20000 tasks over 300 runners: the hashes grow past their first size, every id is found,
 * each runner lists exactly its own, and ending them all from the runners' lists (the next
 * taken before each end, as a closed connection's tasks are failed) empties every index. */
static void test_many_tasks(void **state)
{
    (void)state;
    enum { N = 20000, RUNNERS = 300 };
    kvp_task_table_t tt = {0};
    kvp_task_t **all = calloc(N, sizeof(*all));
    assert_non_null(all);
    size_t per[RUNNERS] = {0};
    for (int i = 0; i < N; i++) {
        all[i] = add(&tt, 1000 + (uint64_t)(i % RUNNERS));
        per[i % RUNNERS]++;
        if (i % 3 == 0)
            kvp_task_table_start(all[i]);
    }
    assert_int_equal(tt.n, N);
    assert_int_equal(tt.n_runners, RUNNERS);
    assert_true(tt.id_mask + 1 >= N);
    for (int i = 0; i < N; i++)
        assert_ptr_equal(kvp_task_table_find(&tt, all[i]->id_hi, all[i]->id_lo), all[i]);
    for (int r = 0; r < RUNNERS; r++) {
        size_t n = count_list(kvp_task_table_waiting(&tt, 1000 + (uint64_t)r)) +
                   count_list(kvp_task_table_running(&tt, 1000 + (uint64_t)r));
        assert_int_equal(n, per[r]);
        for (const kvp_task_t *t = kvp_task_table_waiting(&tt, 1000 + (uint64_t)r); t != NULL;
             t = t->run_next)
            assert_int_equal(t->exec_conn, 1000 + (uint64_t)r);
    }
    assert_int_equal(count_live(&tt), N);
    for (int r = 0; r < RUNNERS; r++) {
        for (int pass = 0; pass < 2; pass++) {
            kvp_task_t *t = pass == 0 ? kvp_task_table_running(&tt, 1000 + (uint64_t)r)
                                      : kvp_task_table_waiting(&tt, 1000 + (uint64_t)r);
            for (kvp_task_t *nx; t != NULL; t = nx) {
                nx = t->run_next;
                kvp_task_table_end(&tt, t, KVP_TASK_FAILED);
            }
        }
    }
    assert_int_equal(tt.n_runners, 0);
    assert_int_equal(tt.n_live, 0);
    assert_null(tt.live);
    kvp_task_table_trim(&tt, (uint32_t)per[RUNNERS - 1]);
    assert_int_equal(tt.n, per[RUNNERS - 1]);
    /* those kept are the last ended: the last runner's */
    for (const kvp_task_t *t = tt.tenants[0].ended_oldest; t != NULL; t = t->next)
        assert_int_equal(t->exec_conn, 1000 + RUNNERS - 1);
    free(all);
    kvp_task_table_cleanup(&tt);
}

/* Ended while the live list is walked (the timer): the successor, taken first, is intact. */
static void test_end_while_walking_the_live_list(void **state)
{
    (void)state;
    kvp_task_table_t tt = {0};
    for (int i = 0; i < 10; i++)
        add(&tt, (uint64_t)(i % 2));
    size_t seen = 0;
    for (kvp_task_t *t = tt.live, *nx; t != NULL; t = nx) {
        nx = t->next;
        seen++;
        if (seen % 2 == 0)
            kvp_task_table_end(&tt, t, KVP_TASK_FAILED);
    }
    assert_int_equal(seen, 10);
    assert_int_equal(count_live(&tt), 5);
    assert_int_equal(tt.n_live, 5);
    kvp_task_table_cleanup(&tt);
}

/* Ids carry their master's incarnation and a check: an earlier master's is told apart from
 * a made-up one, and this table's own ids are not earlier ones. */
static void test_ids(void **state)
{
    (void)state;
    kvp_task_table_t tt = {0};
    assert_false(kvp_task_id_genuine(1, 2));
    kvp_task_t *t = add(&tt, 1);
    assert_int_equal(t->id_hi >> 16, tt.incarnation);
    assert_true(kvp_task_id_genuine(t->id_hi, t->id_lo));
    assert_false(kvp_task_id_earlier(&tt, t->id_hi, t->id_lo));
    uint64_t inc = tt.incarnation ^ 0x5a5a;
    uint64_t hi = inc << 16 | kvp_task_id_check(inc, t->id_lo);
    assert_true(kvp_task_id_earlier(&tt, hi, t->id_lo));
    assert_false(kvp_task_id_earlier(&tt, hi ^ 1, t->id_lo)); /* its check wrong */
    kvp_task_table_cleanup(&tt);
}

/* Add and end n tasks of tenant, each numbered in source_seg from *seq on (the order they
 * ended). */
static void ended_of(kvp_task_table_t *tt, uint16_t tenant, int n, uint64_t *seq)
{
    for (int i = 0; i < n; i++) {
        kvp_task_t *t = add_of(tt, 1, tenant);
        t->source_seg = (*seq)++;
        kvp_task_table_end(tt, t, KVP_TASK_FAILED);
    }
}

/* The ended tasks tenant keeps are the last `n` it ended (ended_of: numbered up to newest),
 * oldest first. */
static void kept_last(const kvp_task_table_t *tt, uint16_t tenant, uint32_t n, uint64_t newest)
{
    assert_int_equal(kvp_task_table_tenant_ended(tt, tenant), n);
    uint32_t seen = 0;
    for (const kvp_task_t *t = tt->tenants[tenant].ended_oldest; t != NULL; t = t->next) {
        assert_int_equal(t->tenant, tenant);
        assert_int_equal(t->source_seg, newest - n + 1 + seen);
        seen++;
    }
    assert_int_equal(seen, n);
    if (n > 0)
        assert_int_equal(tt->tenants[tenant].ended_newest->source_seg, newest);
}

/* Each tenant's live and ended tasks counted apart (a large id grows the slots); a tenant's
 * trim frees its own oldest ended only. */
static void test_tenants_counted_and_trimmed_apart(void **state)
{
    (void)state;
    kvp_task_table_t tt = {0};
    uint64_t seq = 1;
    ended_of(&tt, 1, 3, &seq); /* the victim's history: 1..3 */
    kvp_task_t *live = add_of(&tt, 2, 4095);
    ended_of(&tt, 2, 100, &seq); /* a flood: 4..103 */
    assert_int_equal(kvp_task_table_tenant_live(&tt, 4095), 1);
    assert_int_equal(kvp_task_table_tenant_live(&tt, 2), 0);
    assert_int_equal(kvp_task_table_tenant_ended(&tt, 2), 100);
    assert_int_equal(kvp_task_table_tenant_live(&tt, 60000), 0); /* never seen */
    assert_int_equal(kvp_task_table_tenant_ended(&tt, 60000), 0);
    kvp_task_table_trim_tenant(&tt, 2, 10);
    kept_last(&tt, 2, 10, 103);
    kept_last(&tt, 1, 3, 3);
    assert_int_equal(tt.n, 3 + 1 + 10);
    kvp_task_table_trim_tenant(&tt, 4095, 0); /* live: never trimmed */
    assert_ptr_equal(kvp_task_table_find(&tt, live->id_hi, live->id_lo), live);
    kvp_task_table_trim_tenant(&tt, 9, 0); /* no such tenant: nothing */
    kvp_task_table_end(&tt, live, KVP_TASK_SUCCESS);
    assert_int_equal(kvp_task_table_tenant_live(&tt, 4095), 0);
    assert_int_equal(kvp_task_table_tenant_ended(&tt, 4095), 1);
    assert_int_equal(tt.n_live, 0);
    kvp_task_table_cleanup(&tt);
}

/* The trim over all tenants takes from those that keep the most, down to one level: a
 * tenant under it keeps every task; ties at the level lose one each for the exact count. */
static void test_trim_takes_from_the_largest(void **state)
{
    (void)state;
    kvp_task_table_t tt = {0};
    uint64_t seq = 1;
    ended_of(&tt, 1, 10, &seq);   /* 1..10 */
    ended_of(&tt, 2, 5000, &seq); /* 11..5010 */
    ended_of(&tt, 3, 100, &seq);  /* 5011..5110 */
    const uint64_t newest[4] = {0, 10, 5010, 5110};
    add_of(&tt, 5, 0); /* live: not counted, never trimmed */
    kvp_task_table_trim(&tt, 4096);
    kept_last(&tt, 1, 10, newest[1]);
    kept_last(&tt, 2, 4096 - 110, newest[2]);
    kept_last(&tt, 3, 100, newest[3]);
    kvp_task_table_trim(&tt, 300); /* level 190 */
    kept_last(&tt, 1, 10, newest[1]);
    kept_last(&tt, 2, 190, newest[2]);
    kept_last(&tt, 3, 100, newest[3]);
    kvp_task_table_trim(&tt, 100); /* level 45 */
    kept_last(&tt, 1, 10, newest[1]);
    kept_last(&tt, 2, 45, newest[2]);
    kept_last(&tt, 3, 45, newest[3]);
    kvp_task_table_trim(&tt, 21); /* level 7 for all */
    for (uint16_t i = 1; i <= 3; i++)
        kept_last(&tt, i, 7, newest[i]);
    kvp_task_table_trim(&tt, 20); /* 7, 7, 7: one loses one more */
    uint32_t sum = 0;
    for (uint16_t i = 1; i <= 3; i++) {
        uint32_t n = kvp_task_table_tenant_ended(&tt, i);
        assert_true(n == 6 || n == 7);
        kept_last(&tt, i, n, newest[i]);
        sum += n;
    }
    assert_int_equal(sum, 20);
    assert_int_equal(tt.n, 20 + 1);
    kvp_task_table_trim(&tt, 0);
    assert_int_equal(tt.n, 1);
    assert_int_equal(tt.n_live, 1);
    kvp_task_table_cleanup(&tt);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_task_through_its_life),
        cmocka_unit_test(test_runner_lists_keep_their_order),
        cmocka_unit_test(test_trim_takes_the_first_ended),
        cmocka_unit_test(test_many_tasks),
        cmocka_unit_test(test_end_while_walking_the_live_list),
        cmocka_unit_test(test_ids),
        cmocka_unit_test(test_tenants_counted_and_trimmed_apart),
        cmocka_unit_test(test_trim_takes_from_the_largest),
    };
    return cmocka_run_group_tests_name("task_table", tests, NULL, NULL);
}
