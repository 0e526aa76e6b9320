/*
 * test_admin_calls.c - unit tests for master/rpc/admin_calls.c: List (patterns, segment
 * filter, paging by cursor, a long hash chain), RemoveByRegex, and patterns refused
 * (counted by reason) or stopped at their budget of matching work.
 *
 * Drives kvp_dispatch_handle the way the server does (fixture_leases.h).
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
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/rpc.h"
#include "kvpool.pb-c.h"
#include "master/dispatch.h"
#include "master/meta/placement.h"
#include "master/policy/eviction.h"
#include "master/policy/lease.h"
#include "master/core/state.h"
#include "master/match/key_pattern.h"
#include "tests/unit/master/rpc/fixture_leases.h"
#include "tests/unit/master/svc_call.h"

/* ---- list ---- */

#define LIST_N 150

static void test_list(void **state)
{
    kvp_master_state_t *st = *state;
    uint64_t id1 = mount_seg(st, C1, "s1", "h1", 4 * MIB);
    uint64_t id2 = mount_seg(st, C2, "s2", "h2", 4 * MIB);
    char key[32];
    for (int i = 0; i < LIST_N; i++) {
        snprintf(key, sizeof(key), "a/%d", i);
        put_done(st, C3, key, 100 + i, i % 10 == 0 ? 2 : 1, "s1", (uint32_t)i);
        snprintf(key, sizeof(key), "b/%d", i);
        put_done(st, C3, key, 100 + i, 1, "s2", (uint32_t)i);
    }
    assert_int_equal(put_cfg(st, C3, "a/p", 64, 1, "s1", false).status, KVP_OK); /* PENDING */
    st->now_ms = 1000;
    assert_int_equal(grl1(st, "a/5").status, KVP_OK); /* leased until 6000 */
    st->now_ms = 3000;

    bool seen[LIST_N] = {false};
    unsigned n_seen = 0, pages = 0;
    bool seen_pending = false;
    uint64_t cursor = 0;
    do {
        Kvpool__ListResponse *r = list(st, "^a/", 0, cursor, 50);
        assert_int_equal(r->status, KVP_OK);
        assert_true(r->n_entries <= 50 + 8); /* a page may finish its last bucket */
        for (size_t e = 0; e < r->n_entries; e++) {
            Kvpool__ListEntry *en = r->entries[e];
            char k[32];
            assert_true(en->key.len < sizeof(k));
            memcpy(k, en->key.data, en->key.len);
            k[en->key.len] = '\0';
            assert_memory_equal(k, "a/", 2);
            if (strcmp(k, "a/p") == 0) {
                assert_false(seen_pending);
                seen_pending = true;
                assert_int_equal(en->state, KVP_OBJ_PENDING);
                assert_int_equal(en->size, 64);
                assert_int_equal(en->n_replicas, 1);
                assert_int_equal(en->lease_ms, 0);
                continue;
            }
            int i = atoi(k + 2);
            assert_true(i >= 0 && i < LIST_N);
            assert_false(seen[i]);
            seen[i] = true;
            n_seen++;
            assert_int_equal(en->state, KVP_OBJ_COMPLETE);
            assert_int_equal(en->size, 100 + i);
            assert_int_equal(en->crc32c, i);
            assert_int_equal(en->n_replicas, i % 10 == 0 ? 2 : 1);
            assert_int_equal(en->replicas[0]->segment_id, id1);
            for (size_t q = 0; q < en->n_replicas; q++)
                assert_int_equal(en->replicas[q]->length, 100 + i);
            assert_int_equal(en->lease_ms, i == 5 ? 3000 : 0);
        }
        cursor = r->next_cursor;
        svc_msg_free(r);
        pages++;
        assert_true(pages < 100);
    } while (cursor != 0);
    assert_int_equal(n_seen, LIST_N);
    assert_true(seen_pending);
    assert_true(pages >= 3);

    /* only keys with a replica on s2: every b key and the 2-replica a keys */
    unsigned on2 = 0;
    cursor = 0;
    do {
        Kvpool__ListResponse *r = list(st, "", id2, cursor, 0);
        assert_int_equal(r->status, KVP_OK);
        for (size_t e = 0; e < r->n_entries; e++) {
            Kvpool__ListEntry *en = r->entries[e];
            bool here = false;
            for (size_t q = 0; q < en->n_replicas; q++)
                here |= en->replicas[q]->segment_id == id2;
            assert_true(here);
            on2++;
        }
        cursor = r->next_cursor;
        svc_msg_free(r);
    } while (cursor != 0);
    assert_int_equal(on2, LIST_N + LIST_N / 10);
    /* nothing of b is on s1 (paged: a page past PAGE_WORK_MS of a busy machine ends early) */
    Kvpool__ListResponse *r;
    cursor = 0;
    pages = 0;
    do {
        r = list(st, "^b/", id1, cursor, 1000);
        assert_int_equal(r->status, KVP_OK);
        assert_int_equal(r->n_entries, 0);
        assert_true(r->next_cursor == 0 || r->next_cursor > cursor);
        cursor = r->next_cursor;
        svc_msg_free(r);
        assert_true(++pages <= st->index.n_buckets + 1);
    } while (cursor != 0);

    /* refusals */
    r = list(st, "(", 0, 0, 10);
    assert_int_equal(r->status, KVP_ERR_INVALID_ARG);
    assert_true(r->message[0] != '\0');
    assert_int_equal(r->n_entries, 0);
    svc_msg_free(r);
    r = list(st, "", 0, st->index.n_buckets + 1, 10);
    assert_int_equal(r->status, KVP_ERR_INVALID_ARG);
    assert_int_equal(r->n_entries, 0);
    svc_msg_free(r);
    /* the end of the table is an empty last page */
    r = list(st, "", 0, st->index.n_buckets, 10);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_entries, 0);
    assert_int_equal(r->next_cursor, 0);
    svc_msg_free(r);
}

/*
 * One bucket chain longer than a page's slack (limit + 64): the page grows
 * in place while its entries point into arrays being reallocated. Keys are
 * picked so that they all hash into the same bucket.
 */
#define CHAIN_N 150

static void test_list_long_chain(void **state)
{
    kvp_master_state_t *st = *state;
    uint64_t id1 = mount_seg(st, C1, "s1", "h1", 4 * MIB);
    uint64_t id2 = mount_seg(st, C2, "s2", "h2", 4 * MIB);
    uint64_t mask = st->index.n_buckets - 1;
    assert_true(CHAIN_N < st->index.n_buckets); /* the table will not grow */
    uint64_t bucket = kvp_index_hash("c/0", 3) & mask;
    int found[CHAIN_N];
    char key[32];
    int n = 0;
    for (int j = 0; n < CHAIN_N; j++) {
        assert_true(j < 10000000);
        snprintf(key, sizeof(key), "c/%d", j);
        if ((kvp_index_hash(key, strlen(key)) & mask) != bucket)
            continue;
        found[n] = j;
        put_done(st, C3, key, 64 + (uint64_t)n, n % 3 == 0 ? 2 : 1, "s1", (uint32_t)j);
        n++;
    }
    /* limit 1: the first bucket with a match is the whole chain, 150 > 1 + 64 */
    Kvpool__ListResponse *r = list(st, "^c/", 0, 0, 1);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_entries, CHAIN_N);
    assert_int_equal(r->next_cursor, bucket + 1);
    bool seen[CHAIN_N] = {false};
    for (size_t e = 0; e < r->n_entries; e++) {
        Kvpool__ListEntry *en = r->entries[e];
        memcpy(key, en->key.data, en->key.len);
        key[en->key.len] = '\0';
        int j = atoi(key + 2), at = -1;
        for (int q = 0; q < CHAIN_N; q++)
            if (found[q] == j)
                at = q;
        assert_true(at >= 0);
        assert_false(seen[at]);
        seen[at] = true;
        assert_int_equal(en->size, 64 + at);
        assert_int_equal(en->crc32c, j);
        assert_int_equal(en->n_replicas, at % 3 == 0 ? 2 : 1);
        assert_int_equal(en->replicas[0]->segment_id, id1);
        assert_int_equal(en->replicas[0]->length, 64 + at);
        if (en->n_replicas == 2) {
            assert_int_equal(en->replicas[1]->segment_id, id2);
            assert_int_equal(en->replicas[1]->length, 64 + at);
        }
    }
    svc_msg_free(r);
}

/* ---- remove by regex ---- */

static void test_remove_by_regex(void **state)
{
    kvp_master_state_t *st = *state;
    mount_seg(st, C1, "s1", "h1", MIB);
    char key[32];
    for (int i = 0; i < 30; i++) {
        snprintf(key, sizeof(key), "a/%d", i);
        put_done(st, C1, key, 64, 1, NULL, 0);
    }
    for (int i = 0; i < 10; i++) {
        snprintf(key, sizeof(key), "b/%d", i);
        put_done(st, C1, key, 64, 1, NULL, 0);
    }
    assert_int_equal(put1(st, C1, "a/1p", 64).status, KVP_OK); /* PENDING, matches */
    assert_int_equal(grl1(st, "a/12").status, KVP_OK);         /* leased until 5000 */
    assert_int_equal(kvp_master_used(st), 41 * 64);

    /* a/1, a/10..a/19 match: 11 complete, one of them leased */
    Kvpool__RemoveByRegexResponse *r = rbr(st, "^a/1", false, false);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->removed, 10);
    assert_int_equal(r->skipped_leased, 1);
    assert_int_equal(r->skipped_pending, 1);
    svc_msg_free(r);
    for (int i = 0; i < 30; i++) {
        snprintf(key, sizeof(key), "a/%d", i);
        bool gone = (i == 1 || (i >= 10 && i < 20)) && i != 12;
        assert_int_equal(exist1(st, key), gone ? 0 : 1);
    }
    assert_int_equal(kvp_master_used(st), 31 * 64);

    /* force: the leased one goes too, its extent kept until the lease ends */
    r = rbr(st, "^a/1", true, false);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->removed, 1);
    assert_int_equal(r->skipped_leased, 0);
    assert_int_equal(r->skipped_pending, 1);
    svc_msg_free(r);
    assert_int_equal(exist1(st, "a/12"), 0);
    assert_int_equal(grl1(st, "a/12").status, KVP_ERR_NOT_FOUND);
    assert_int_equal(kvp_master_used(st), 31 * 64);
    st->now_ms = 4999;
    assert_int_equal(kvp_lease_expire(st), 0);
    st->now_ms = 5000;
    assert_int_equal(kvp_lease_expire(st), 1);
    assert_int_equal(kvp_master_used(st), 30 * 64);

    /* refusals */
    r = rbr(st, "", false, false);
    assert_int_equal(r->status, KVP_ERR_INVALID_ARG);
    assert_true(r->message[0] != '\0');
    assert_int_equal(r->removed, 0);
    svc_msg_free(r);
    r = rbr(st, "[", false, false);
    assert_int_equal(r->status, KVP_ERR_INVALID_ARG);
    assert_true(r->message[0] != '\0');
    assert_int_equal(r->removed, 0);
    svc_msg_free(r);
    r = rbr(st, "^zzz", false, false);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->removed, 0);
    svc_msg_free(r);
    assert_int_equal(kvp_master_used(st), 30 * 64);

    /* all: everything but the PENDING and the leased */
    assert_int_equal(grl1(st, "b/3").status, KVP_OK); /* leased until 10000 */
    r = rbr(st, "", false, true);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->removed, 28); /* a/0, a/2..9, a/20..29, every b but b/3 */
    assert_int_equal(r->skipped_leased, 1);
    assert_int_equal(r->skipped_pending, 1);
    svc_msg_free(r);
    assert_int_equal(exist1(st, "b/3"), 1);
    assert_int_equal(kvp_master_used(st), 2 * 64);
    stat_snap_t s = stat_get(st);
    assert_int_equal(s.objects, 1);
    assert_int_equal(s.pending, 1);
    assert_int_equal(graveyard_len(st), 0);
}

/* ---- patterns: refused before they compile, bounded while they match ---- */

static void test_patterns_refused_and_counted(void **state)
{
    kvp_master_state_t *st = *state;
    mount_seg(st, C1, "s1", "h1", MIB);
    char key[801];
    memset(key, 'a', 800);
    key[800] = '\0';
    put_done(st, C1, key, 64, 1, NULL, 0);

    /* issue rows 1 and 2: a back-reference, and a compile that would take seconds */
    Kvpool__ListResponse *l = list(st, "(a|aa)*\\1$", 0, 0, 10);
    assert_int_equal(l->status, KVP_ERR_INVALID_ARG);
    assert_non_null(strstr(l->message, "back-reference"));
    assert_int_equal(l->n_entries, 0);
    svc_msg_free(l);
    l = list(st, "((a{1,100}){1,100}){1,100}", 0, 0, 10);
    assert_int_equal(l->status, KVP_ERR_INVALID_ARG);
    assert_non_null(strstr(l->message, "too costly"));
    svc_msg_free(l);
    Kvpool__RemoveByRegexResponse *r = rbr(st, "(a|aa)*\\1$", false, false);
    assert_int_equal(r->status, KVP_ERR_INVALID_ARG);
    assert_non_null(strstr(r->message, "back-reference"));
    assert_int_equal(r->removed, 0);
    svc_msg_free(r);
    r = rbr(st, "(((((((((a)))))))))", false, false);
    assert_int_equal(r->status, KVP_ERR_INVALID_ARG);
    assert_non_null(strstr(r->message, "nested deeper"));
    svc_msg_free(r);
    assert_int_equal(exist1(st, key), 1);
    assert_int_equal(st->stats.refused_pattern[KVP_PATTERN_BACKREF], 2);
    assert_int_equal(st->stats.refused_pattern[KVP_PATTERN_COST], 1);
    assert_int_equal(st->stats.refused_pattern[KVP_PATTERN_NESTING], 1);
    /* a bad regex is counted too */
    l = list(st, "(", 0, 0, 10);
    assert_int_equal(l->status, KVP_ERR_INVALID_ARG);
    svc_msg_free(l);
    assert_int_equal(st->stats.refused_pattern[KVP_PATTERN_SYNTAX], 1);

    /* what users send still works */
    l = list(st, "^a{800}$", 0, 0, 10);
    assert_int_equal(l->status, KVP_ERR_INVALID_ARG); /* a count over 255 */
    svc_msg_free(l);
    l = list(st, "^(a{200}){4}$", 0, 0, 10);
    assert_int_equal(l->status, KVP_OK);
    assert_int_equal(l->n_entries, 1);
    svc_msg_free(l);
    l = list(st, "^a+$", 0, 0, 10);
    assert_int_equal(l->status, KVP_OK);
    assert_int_equal(l->n_entries, 1);
    svc_msg_free(l);
}

/* Long keys and a pattern of the largest size allowed: a List page ends early at its work
 * budget (the cursor goes on; every key is listed once), an unpaged remove over too much
 * refuses and removes nothing, a paged one goes page by page and removes every key. */
#define LONG_KEY 4000
#define LONG_N 600
#define COSTLY "^w/|(abcdefg){200}"

static void long_key(char *key, int i)
{
    memset(key, 'q', LONG_KEY);
    int n = snprintf(key, LONG_KEY, "w/%d/", i);
    key[n] = 'q';
    key[LONG_KEY] = '\0';
}

static void test_pattern_work_budget(void **state)
{
    kvp_master_state_t *st = *state;
    mount_seg(st, C1, "s1", "h1", 4 * MIB);
    static char key[LONG_KEY + 1];
    for (int i = 0; i < LONG_N; i++) {
        long_key(key, i);
        put_done(st, C1, key, 64, 1, NULL, 0);
    }
    bool seen[LONG_N] = {false};
    unsigned n_seen = 0, pages = 0;
    uint64_t cursor = 0;
    do {
        Kvpool__ListResponse *l = list(st, COSTLY, 0, cursor, 1000);
        assert_int_equal(l->status, KVP_OK);
        assert_true(l->n_entries < 100); /* ~8 keys of work, plus a bucket's chain */
        for (size_t e = 0; e < l->n_entries; e++) {
            int i = atoi((const char *)l->entries[e]->key.data + 2);
            assert_true(i >= 0 && i < LONG_N);
            assert_false(seen[i]);
            seen[i] = true;
            n_seen++;
        }
        cursor = l->next_cursor;
        svc_msg_free(l);
        pages++;
        assert_true(pages < 10000);
    } while (cursor != 0);
    assert_int_equal(n_seen, LONG_N);
    assert_true(pages >= LONG_N / 20);

    /* a remove over more work than one request may do: nothing removed */
    Kvpool__RemoveByRegexResponse *r = rbr(st, COSTLY, false, false);
    assert_int_equal(r->status, KVP_ERR_INVALID_ARG);
    assert_non_null(strstr(r->message, "more matching work"));
    assert_int_equal(r->removed, 0);
    svc_msg_free(r);
    assert_int_equal(st->stats.refused_pattern[KVP_PATTERN_WORK], 1);
    stat_snap_t s = stat_get(st);
    assert_int_equal(s.objects, LONG_N);
    /* page by page, the same pattern removes them all, each page a bounded part (the last
     * page or two may hold what is left), every key once */
    uint64_t removed = 0;
    pages = 0;
    cursor = 0;
    do {
        Kvpool__RemoveByRegexRequest req = KVPOOL__REMOVE_BY_REGEX_REQUEST__INIT;
        req.pattern = COSTLY;
        req.paged = true;
        req.cursor = cursor;
        r = svc_call(st, C3, KVP_RPC_REMOVE_BY_REGEX, &req.base,
                     &kvpool__remove_by_regex_response__descriptor);
        assert_int_equal(r->status, KVP_OK);
        assert_true(r->removed < 100);
        assert_true(r->next_cursor == 0 || r->next_cursor > cursor);
        removed += r->removed;
        cursor = r->next_cursor;
        svc_msg_free(r);
        pages++;
        assert_true(pages < 10000);
    } while (cursor != 0);
    assert_int_equal(removed, LONG_N);
    assert_true(pages >= LONG_N / 20);
    assert_int_equal(stat_get(st).objects, 0);
    assert_int_equal(st->stats.refused_pattern[KVP_PATTERN_WORK], 1);

    /* a simple pattern over keys that fit one page: removed unpaged too */
    for (int i = 0; i < 50; i++) {
        long_key(key, i);
        put_done(st, C1, key, 64, 1, NULL, 0);
    }
    r = rbr(st, "^w/", false, false);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->removed, 50);
    assert_int_equal(r->next_cursor, 0);
    svc_msg_free(r);
}

/* A key on which the pattern needs more of the matcher than one key may take: the List and
 * the RemoveByRegex (paged or not) are refused, counted as work, and remove nothing; a
 * simple pattern over the same key still answers. */
#define STEPS_HOG "[^!]{0,255}[^!]{0,255}[^!]{0,255}[^!]{0,250}!"

static void test_pattern_key_steps(void **state)
{
    kvp_master_state_t *st = *state;
    mount_seg(st, C1, "s1", "h1", 4 * MIB);
    static char key[LONG_KEY + 1];
    long_key(key, 1);
    put_done(st, C1, key, 64, 1, NULL, 0);
    Kvpool__ListResponse *l = list(st, STEPS_HOG, 0, 0, 1000);
    assert_int_equal(l->status, KVP_ERR_INVALID_ARG);
    assert_non_null(strstr(l->message, "on one key"));
    assert_int_equal(l->n_entries, 0);
    svc_msg_free(l);
    for (int paged = 0; paged < 2; paged++) {
        Kvpool__RemoveByRegexRequest req = KVPOOL__REMOVE_BY_REGEX_REQUEST__INIT;
        req.pattern = STEPS_HOG;
        req.paged = paged;
        Kvpool__RemoveByRegexResponse *r = svc_call(st, C3, KVP_RPC_REMOVE_BY_REGEX, &req.base,
                                                    &kvpool__remove_by_regex_response__descriptor);
        assert_int_equal(r->status, KVP_ERR_INVALID_ARG);
        assert_non_null(strstr(r->message, "nothing was removed"));
        assert_int_equal(r->removed, 0);
        svc_msg_free(r);
    }
    assert_int_equal(st->stats.refused_pattern[KVP_PATTERN_WORK], 3);
    assert_int_equal(stat_get(st).objects, 1);
    l = list(st, "^w/1/q+$", 0, 0, 1000);
    assert_int_equal(l->status, KVP_OK);
    assert_int_equal(l->n_entries, 1);
    svc_msg_free(l);
}

/*
 * A List page whose time budget is spent before its first bucket (the master preempted
 * between compiling the pattern and scanning: a loaded machine): the page must still go
 * on (scan that bucket, or answer a non-zero cursor), never answer next_cursor 0 from
 * cursor 0 with the key unseen. The clock is interposed: while `clock_jump_ns` is set,
 * every CLOCK_MONOTONIC read is that much later than the one before (and the skew stays
 * after, so the clock never goes back).
 */
static uint64_t clock_jump_ns, clock_skew_ns;
/* The other tests run with CLOCK_MONOTONIC stopped (setup_still): the pages' 10 ms budget
 * (PAGE_WORK_MS) never ends a page early there, however long a loaded machine keeps the
 * test off its CPU, so their one-call answers are what they check. */
static bool clock_still;
static struct timespec still_ts;

int clock_gettime(clockid_t id, struct timespec *ts)
{
    if (id == CLOCK_MONOTONIC && clock_still && still_ts.tv_sec != 0) {
        *ts = still_ts;
        return 0;
    }
    int rc = (int)syscall(SYS_clock_gettime, id, ts);
    if (rc == 0 && id == CLOCK_MONOTONIC && clock_still)
        still_ts = *ts;
    if (rc == 0 && id == CLOCK_MONOTONIC && (clock_jump_ns != 0 || clock_skew_ns != 0)) {
        clock_skew_ns += clock_jump_ns;
        uint64_t ns = (uint64_t)ts->tv_sec * 1000000000ull + (uint64_t)ts->tv_nsec + clock_skew_ns;
        ts->tv_sec = (time_t)(ns / 1000000000ull);
        ts->tv_nsec = (long)(ns % 1000000000ull);
    }
    return rc;
}

static void test_list_preempted_before_first_bucket(void **state)
{
    kvp_master_state_t *st = *state;
    mount_seg(st, C1, "s1", "h1", 4 * MIB);
    put_done(st, C3, "keep-00007", 100, 1, "s1", 7);
    clock_jump_ns = 20ull * 1000 * 1000; /* 20 ms between any two reads: past PAGE_WORK_MS */
    unsigned found = 0, pages = 0;
    uint64_t cursor = 0;
    do {
        Kvpool__ListResponse *r = list(st, "^keep-00007$", 0, cursor, 2);
        assert_int_equal(r->status, KVP_OK);
        assert_true(r->next_cursor == 0 || r->next_cursor > cursor); /* it went on */
        found += (unsigned)r->n_entries;
        cursor = r->next_cursor;
        svc_msg_free(r);
        assert_true(++pages <= st->index.n_buckets + 1);
    } while (cursor != 0 && found < 2);
    clock_jump_ns = 0;
    assert_int_equal(found, 1);
}

/* (a failed assert leaves the loop above: no jumps for the tests after it) */
static int teardown_clock(void **state)
{
    clock_jump_ns = 0;
    return teardown(state);
}

static int setup_still(void **state)
{
    clock_still = true;
    return setup(state);
}

static int teardown_still(void **state)
{
    clock_still = false;
    still_ts = (struct timespec){0};
    return teardown(state);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup_still, teardown_still)
    const struct CMUnitTest tests[] = {
        T(test_list),
        T(test_list_long_chain),
        T(test_remove_by_regex),
        T(test_patterns_refused_and_counted),
        T(test_pattern_work_budget),
        T(test_pattern_key_steps),
        cmocka_unit_test_setup_teardown(test_list_preempted_before_first_bucket, setup,
                                        teardown_clock),
    };
#undef T
    return cmocka_run_group_tests_name("admin_calls", tests, NULL, NULL);
}
