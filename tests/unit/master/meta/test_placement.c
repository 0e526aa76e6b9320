/*
 * test_placement.c - unit tests for master/placement.c.
 *
 * Segments are built by hand into a kvp_segment_table_t exactly as the mount
 * handler builds them (calloc + strdup + a 64-byte-granular allocator). Each
 * property is checked over many draws with a fixed rng seed; extents are
 * freed between draws where a test needs the free space to stay constant.
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

#include "master/dispatch.h"
#include "master/meta/placement.h"
#include "master/policy/eviction.h"
#include "master/policy/lease.h"
#include "master/core/state.h"

#define ALIGN 64

static kvp_segment_t *add_seg(kvp_segment_table_t *t, const char *name, const char *host,
                              uint64_t size)
{
    kvp_segment_t *seg = calloc(1, sizeof(*seg));
    assert_non_null(seg);
    char ep[64];
    snprintf(ep, sizeof(ep), "%s:4000", host);
    seg->name = strdup(name);
    seg->medium = strdup("dram");
    seg->host_id = strdup(host);
    seg->tcp_endpoint = strdup(ep);
    seg->shm_path = strdup("/dev/shm/kvp-test");
    assert_non_null(seg->name);
    assert_non_null(seg->shm_path);
    seg->size = size;
    assert_int_equal(kvp_offset_alloc_create(size, ALIGN, &seg->alloc), KVP_OK);
    assert_int_equal(kvp_segment_table_add(t, seg), KVP_OK);
    return seg;
}

/* Free the extents of one placement result (what kvp_object_release does). */
static void release(kvp_segment_table_t *t, const kvp_replica_t *r, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        kvp_segment_t *seg = kvp_segment_table_get(t, r[i].segment_id);
        assert_non_null(seg);
        kvp_offset_alloc_free(seg->alloc, r[i].handle);
        assert_true(seg->objects > 0);
        seg->objects--;
    }
}

static kvp_status_t place(kvp_segment_table_t *t, uint64_t size, unsigned replicas,
                          const kvp_segment_t *preferred, uint64_t *rng, kvp_replica_t *out,
                          unsigned *n_p)
{
    kvp_placement_req_t req = {.size = size, .replica_num = replicas, .preferred = preferred};
    *n_p = 0;
    return kvp_placement_alloc(t, &req, rng, out, n_p);
}

/* Every replica: a live segment, in bounds, aligned, on a distinct segment. */
static void check_replicas(kvp_segment_table_t *t, uint64_t size, const kvp_replica_t *r,
                           unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        kvp_segment_t *seg = kvp_segment_table_get(t, r[i].segment_id);
        assert_non_null(seg);
        assert_true(r[i].offset + size <= seg->size);
        assert_int_equal(r[i].offset % ALIGN, 0);
        assert_int_not_equal(r[i].handle, KVP_OFFSET_ALLOC_NO_HANDLE);
        for (unsigned j = 0; j < i; j++)
            assert_true(r[i].segment_id != r[j].segment_id);
    }
}

static void test_no_segment(void **state)
{
    (void)state;
    kvp_segment_table_t t;
    kvp_segment_table_init(&t);
    uint64_t rng = 1;
    kvp_replica_t out[KVP_MAX_REPLICAS];
    unsigned n;
    assert_int_equal(place(&t, 64, 1, NULL, &rng, out, &n), KVP_ERR_NO_SEGMENT);

    /* a table whose only segment was removed is empty again */
    kvp_segment_t *seg = add_seg(&t, "a", "h1", 4096);
    kvp_segment_table_remove(&t, seg);
    assert_int_equal(t.count, 0);
    assert_int_equal(place(&t, 64, 1, NULL, &rng, out, &n), KVP_ERR_NO_SEGMENT);
    kvp_segment_table_cleanup(&t);
}

static void test_too_large(void **state)
{
    (void)state;
    kvp_segment_table_t t;
    kvp_segment_table_init(&t);
    add_seg(&t, "a", "h1", 4096);
    add_seg(&t, "b", "h2", 8192);
    uint64_t rng = 7;
    kvp_replica_t out[KVP_MAX_REPLICAS];
    unsigned n;
    /* bigger than every segment, even though smaller than their sum */
    assert_int_equal(place(&t, 8193, 1, NULL, &rng, out, &n), KVP_ERR_TOO_LARGE);
    assert_int_equal(place(&t, 12288, 2, NULL, &rng, out, &n), KVP_ERR_TOO_LARGE);
    assert_int_equal(place(&t, UINT64_MAX, 1, NULL, &rng, out, &n), KVP_ERR_TOO_LARGE);
    for (uint32_t i = 0; i < t.n_slots; i++)
        if (t.slots[i])
            assert_int_equal(kvp_segment_used(t.slots[i]), 0);

    /* exactly the largest segment fits, and only there */
    assert_int_equal(place(&t, 8192, 2, NULL, &rng, out, &n), KVP_OK);
    assert_int_equal(n, 1);
    kvp_segment_t *b = kvp_segment_table_find_name(&t, "b");
    assert_true(out[0].segment_id == b->id);
    assert_int_equal(out[0].offset, 0);
    assert_int_equal(b->objects, 1);

    /* it fits a segment but no free space: POOL_FULL, not TOO_LARGE */
    unsigned n2;
    kvp_replica_t out2[KVP_MAX_REPLICAS];
    assert_int_equal(place(&t, 8192, 1, NULL, &rng, out2, &n2), KVP_ERR_POOL_FULL);
    release(&t, out, n);
    kvp_segment_table_cleanup(&t);
}

static void test_replicas_distinct_segments(void **state)
{
    (void)state;
    kvp_segment_table_t t;
    kvp_segment_table_init(&t);
    /* four segments on one host: distinct segments is all that can be had */
    for (int i = 0; i < 4; i++) {
        char name[16];
        snprintf(name, sizeof(name), "s%d", i);
        add_seg(&t, name, "onehost", 1 << 20);
    }
    uint64_t rng = 0x1234;
    kvp_replica_t out[KVP_MAX_REPLICAS];
    unsigned n;
    for (int trial = 0; trial < 500; trial++) {
        assert_int_equal(place(&t, 1000, 3, NULL, &rng, out, &n), KVP_OK);
        assert_int_equal(n, 3);
        check_replicas(&t, 1000, out, n);
        release(&t, out, n);
    }
    /* more replicas than segments: one per segment, no more */
    for (int trial = 0; trial < 100; trial++) {
        assert_int_equal(place(&t, 64, 8, NULL, &rng, out, &n), KVP_OK);
        assert_int_equal(n, 4);
        check_replicas(&t, 64, out, n);
        release(&t, out, n);
    }
    /* replica_num 0 means one; more than KVP_MAX_REPLICAS is capped */
    assert_int_equal(place(&t, 64, 0, NULL, &rng, out, &n), KVP_OK);
    assert_int_equal(n, 1);
    release(&t, out, n);
    for (uint32_t i = 0; i < t.n_slots; i++)
        if (t.slots[i]) {
            assert_int_equal(kvp_segment_used(t.slots[i]), 0);
            assert_int_equal(t.slots[i]->objects, 0);
        }
    kvp_segment_table_cleanup(&t);
}

static void test_replicas_distinct_hosts(void **state)
{
    (void)state;
    kvp_segment_table_t t;
    kvp_segment_table_init(&t);
    add_seg(&t, "a", "h1", 1 << 20);
    add_seg(&t, "b", "h2", 1 << 20);
    add_seg(&t, "c", "h3", 1 << 20);
    uint64_t rng = 99;
    kvp_replica_t out[KVP_MAX_REPLICAS];
    unsigned n;
    for (int trial = 0; trial < 500; trial++) {
        assert_int_equal(place(&t, 4096, 3, NULL, &rng, out, &n), KVP_OK);
        assert_int_equal(n, 3);
        check_replicas(&t, 4096, out, n);
        for (unsigned i = 0; i < n; i++)
            for (unsigned j = 0; j < i; j++)
                assert_string_not_equal(kvp_segment_table_get(&t, out[i].segment_id)->host_id,
                                        kvp_segment_table_get(&t, out[j].segment_id)->host_id);
        release(&t, out, n);
    }
    kvp_segment_table_cleanup(&t);
}

static void test_hosts_first_then_segments(void **state)
{
    (void)state;
    kvp_segment_table_t t;
    kvp_segment_table_init(&t);
    /* 2 hosts x 2 segments, uneven sizes so the draw has a favourite */
    add_seg(&t, "h1a", "h1", 8 << 20);
    add_seg(&t, "h1b", "h1", 4 << 20);
    add_seg(&t, "h2a", "h2", 1 << 20);
    add_seg(&t, "h2b", "h2", 1 << 20);
    uint64_t rng = 2024;
    kvp_replica_t out[KVP_MAX_REPLICAS];
    unsigned n;
    for (int trial = 0; trial < 1000; trial++) {
        assert_int_equal(place(&t, 512, 3, NULL, &rng, out, &n), KVP_OK);
        assert_int_equal(n, 3);
        check_replicas(&t, 512, out, n);
        /* the first two replicas are on different hosts; both hosts are used */
        const char *h0 = kvp_segment_table_get(&t, out[0].segment_id)->host_id;
        const char *h1 = kvp_segment_table_get(&t, out[1].segment_id)->host_id;
        assert_string_not_equal(h0, h1);
        release(&t, out, n);
    }
    /* replica_num 2 on two hosts: always one per host */
    for (int trial = 0; trial < 1000; trial++) {
        assert_int_equal(place(&t, 512, 2, NULL, &rng, out, &n), KVP_OK);
        assert_int_equal(n, 2);
        assert_string_not_equal(kvp_segment_table_get(&t, out[0].segment_id)->host_id,
                                kvp_segment_table_get(&t, out[1].segment_id)->host_id);
        release(&t, out, n);
    }
    kvp_segment_table_cleanup(&t);
}

static void test_preferred(void **state)
{
    (void)state;
    kvp_segment_table_t t;
    kvp_segment_table_init(&t);
    /* the preferred segment is the smallest: the draw alone would rarely pick it */
    kvp_segment_t *big1 = add_seg(&t, "big1", "h1", 64 << 20);
    kvp_segment_t *pref = add_seg(&t, "pref", "h2", 64 * 1024);
    kvp_segment_t *big2 = add_seg(&t, "big2", "h3", 64 << 20);
    uint64_t rng = 5;
    kvp_replica_t out[KVP_MAX_REPLICAS];
    unsigned n;
    for (int trial = 0; trial < 200; trial++) {
        assert_int_equal(place(&t, 4096, 1, pref, &rng, out, &n), KVP_OK);
        assert_int_equal(n, 1);
        assert_true(out[0].segment_id == pref->id);
        release(&t, out, n);
        assert_int_equal(place(&t, 4096, 2, pref, &rng, out, &n), KVP_OK);
        assert_int_equal(n, 2);
        assert_true(out[0].segment_id == pref->id);
        assert_true(out[1].segment_id == big1->id || out[1].segment_id == big2->id);
        release(&t, out, n);
    }

    /* fill the preferred segment */
    kvp_replica_t held[16];
    unsigned n_held = 0;
    while (n_held < 16) {
        assert_int_equal(place(&t, 4096, 1, pref, &rng, &held[n_held], &n), KVP_OK);
        assert_int_equal(n, 1);
        assert_true(held[n_held].segment_id == pref->id);
        n_held++;
    }
    assert_int_equal(kvp_segment_used(pref), pref->size);
    assert_int_equal(pref->objects, 16);
    /* full: falls back to the others, still the number of replicas asked for */
    for (int trial = 0; trial < 100; trial++) {
        assert_int_equal(place(&t, 4096, 1, pref, &rng, out, &n), KVP_OK);
        assert_int_equal(n, 1);
        assert_true(out[0].segment_id == big1->id || out[0].segment_id == big2->id);
        release(&t, out, n);
        assert_int_equal(place(&t, 4096, 2, pref, &rng, out, &n), KVP_OK);
        assert_int_equal(n, 2);
        check_replicas(&t, 4096, out, n);
        assert_true(out[0].segment_id != pref->id && out[1].segment_id != pref->id);
        release(&t, out, n);
    }
    assert_int_equal(pref->objects, 16);
    release(&t, held, n_held);
    assert_int_equal(kvp_segment_used(pref), 0);
    kvp_segment_table_cleanup(&t);
}

/* A segment per replica (Mooncake's preferred_segments): replica i on the i-th while it has
 * room; a full one, an unknown one (NULL) or the same one twice leaves its replica to the
 * draw, which never doubles a segment. */
static void test_preferred_list(void **state)
{
    (void)state;
    kvp_segment_table_t t;
    kvp_segment_table_init(&t);
    kvp_segment_t *a = add_seg(&t, "a", "h1", 64 << 20);
    kvp_segment_t *b = add_seg(&t, "b", "h2", 64 * 1024);
    kvp_segment_t *c = add_seg(&t, "c", "h3", 64 << 20);
    kvp_segment_t *d = add_seg(&t, "d", "h4", 64 << 20);
    uint64_t rng = 9;
    kvp_replica_t out[KVP_MAX_REPLICAS];
    unsigned n;
    for (int trial = 0; trial < 100; trial++) {
        kvp_placement_req_t req = {.size = 4096, .replica_num = 3, .preferred = a};
        req.preferred_list[0] = c; /* the list replaces preferred */
        req.preferred_list[1] = b;
        req.preferred_list[2] = d;
        req.n_preferred_list = 3;
        assert_int_equal(kvp_placement_alloc(&t, &req, &rng, out, &n), KVP_OK);
        assert_int_equal(n, 3);
        assert_true(out[0].segment_id == c->id && out[1].segment_id == b->id &&
                    out[2].segment_id == d->id);
        release(&t, out, n);
        /* an unknown name and a repeat: their replicas drawn, on other segments */
        req.preferred_list[0] = NULL;
        req.preferred_list[1] = d;
        req.preferred_list[2] = d;
        assert_int_equal(kvp_placement_alloc(&t, &req, &rng, out, &n), KVP_OK);
        assert_int_equal(n, 3);
        assert_true(out[0].segment_id == d->id);
        check_replicas(&t, 4096, out, n);
        release(&t, out, n);
    }
    /* b full: its replica goes elsewhere */
    kvp_replica_t held[16];
    for (unsigned i = 0; i < 16; i++)
        assert_int_equal(place(&t, 4096, 1, b, &rng, &held[i], &n), KVP_OK);
    kvp_placement_req_t req = {.size = 4096, .replica_num = 2};
    req.preferred_list[0] = b;
    req.preferred_list[1] = c;
    req.n_preferred_list = 2;
    assert_int_equal(kvp_placement_alloc(&t, &req, &rng, out, &n), KVP_OK);
    assert_int_equal(n, 2);
    assert_true(out[0].segment_id == c->id);
    assert_true(out[1].segment_id != b->id);
    check_replicas(&t, 4096, out, n);
    release(&t, out, n);
    release(&t, held, 16);
    kvp_segment_table_cleanup(&t);
}

/* Segments the writer asks to avoid (it failed to reach them lately): never used while
 * another has room, preferred or not; used for the replicas nothing else can take. */
static void test_avoided_segments(void **state)
{
    (void)state;
    kvp_segment_table_t t;
    kvp_segment_table_init(&t);
    kvp_segment_t *a = add_seg(&t, "a", "h1", 64 << 20);
    kvp_segment_t *b = add_seg(&t, "b", "h2", 64 * 1024);
    kvp_segment_t *c = add_seg(&t, "c", "h3", 64 << 20);
    uint64_t rng = 7, avoid[2] = {a->id, c->id};
    kvp_replica_t out[KVP_MAX_REPLICAS];
    unsigned n;
    kvp_placement_req_t req = {
        .size = 4096, .replica_num = 1, .preferred = a, .avoid = avoid, .n_avoid = 2};
    for (int trial = 0; trial < 200; trial++) {
        assert_int_equal(kvp_placement_alloc(&t, &req, &rng, out, &n), KVP_OK);
        assert_int_equal(n, 1);
        assert_int_equal(out[0].segment_id, b->id); /* the small one: the only one not avoided */
        release(&t, out, n);
    }
    /* three replicas: b, then the avoided ones rather than fewer replicas */
    req.replica_num = 3;
    assert_int_equal(kvp_placement_alloc(&t, &req, &rng, out, &n), KVP_OK);
    assert_int_equal(n, 3);
    assert_int_equal(out[0].segment_id, b->id);
    check_replicas(&t, 4096, out, n);
    release(&t, out, n);
    /* b full: the avoided ones take it */
    kvp_replica_t held[16];
    req.replica_num = 1;
    for (unsigned i = 0; i < 16; i++) {
        assert_int_equal(kvp_placement_alloc(&t, &req, &rng, &held[i], &n), KVP_OK);
        assert_int_equal(held[i].segment_id, b->id);
    }
    for (int trial = 0; trial < 50; trial++) {
        assert_int_equal(kvp_placement_alloc(&t, &req, &rng, out, &n), KVP_OK);
        assert_int_equal(n, 1);
        assert_true(out[0].segment_id == a->id || out[0].segment_id == c->id);
        release(&t, out, n);
    }
    release(&t, held, 16);
    kvp_segment_table_cleanup(&t);
}

static void test_weighted_by_free_space(void **state)
{
    (void)state;
    kvp_segment_table_t t;
    kvp_segment_table_init(&t);
    kvp_segment_t *small = add_seg(&t, "small", "h1", 1 << 20);
    kvp_segment_t *large = add_seg(&t, "large", "h2", 3 << 20);
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    kvp_replica_t out[KVP_MAX_REPLICAS];
    unsigned n;
    const int trials = 20000;
    int on_large = 0;
    for (int i = 0; i < trials; i++) {
        assert_int_equal(place(&t, 64, 1, NULL, &rng, out, &n), KVP_OK);
        assert_int_equal(n, 1);
        assert_true(out[0].segment_id == small->id || out[0].segment_id == large->id);
        on_large += out[0].segment_id == large->id;
        release(&t, out, n);
    }
    /* expected 3/4; 20000 draws have a standard deviation of ~0.3% */
    double frac = (double)on_large / trials;
    if (frac < 0.70 || frac > 0.80)
        fail_msg("larger segment got %.3f of the draws, want ~0.75", frac);

    /* the weight is free space, not size: use 2 MiB of the large one, now 1:1 */
    kvp_replica_t hold;
    unsigned hn;
    kvp_placement_req_t req = {.size = 2 << 20, .replica_num = 1, .preferred = large};
    assert_int_equal(kvp_placement_alloc(&t, &req, &rng, &hold, &hn), KVP_OK);
    assert_true(hold.segment_id == large->id);
    on_large = 0;
    for (int i = 0; i < trials; i++) {
        assert_int_equal(place(&t, 64, 1, NULL, &rng, out, &n), KVP_OK);
        on_large += out[0].segment_id == large->id;
        release(&t, out, n);
    }
    frac = (double)on_large / trials;
    if (frac < 0.45 || frac > 0.55)
        fail_msg("with equal free space the larger segment got %.3f, want ~0.5", frac);
    release(&t, &hold, 1);
    kvp_segment_table_cleanup(&t);
}

typedef struct extent {
    uint64_t seg_id;
    uint64_t offset;
    uint64_t len; /* rounded to ALIGN */
    uint32_t handle;
} extent_t;

static int extent_cmp(const void *a, const void *b)
{
    const extent_t *x = a, *y = b;
    if (x->seg_id != y->seg_id)
        return x->seg_id < y->seg_id ? -1 : 1;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static void test_fill_until_full(void **state)
{
    (void)state;
    kvp_segment_table_t t;
    kvp_segment_table_init(&t);
    add_seg(&t, "a", "h1", 256 * 1024);
    add_seg(&t, "b", "h1", 128 * 1024);
    add_seg(&t, "c", "h2", 192 * 1024);
    add_seg(&t, "d", "h3", 64 * 1024);
    uint64_t total = (256 + 128 + 192 + 64) * 1024;

    size_t cap = 1 << 16, n_ext = 0;
    extent_t *ext = calloc(cap, sizeof(*ext));
    assert_non_null(ext);
    uint64_t rng = 31337, sizes_rng = 1;
    kvp_replica_t out[KVP_MAX_REPLICAS];
    unsigned n;
    uint64_t max_size = 8192;
    int full_hits = 0;
    while (max_size > 0) {
        sizes_rng = sizes_rng * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t size = 1 + (sizes_rng >> 33) % max_size;
        unsigned want = 1 + (unsigned)((sizes_rng >> 20) % 3);
        kvp_status_t st = place(&t, size, want, NULL, &rng, out, &n);
        if (st == KVP_ERR_POOL_FULL) {
            /* truthful: no segment has a free block that could take it */
            uint64_t rounded = (size + ALIGN - 1) & ~(uint64_t)(ALIGN - 1);
            for (uint32_t i = 0; i < t.n_slots; i++)
                if (t.slots[i])
                    assert_true(kvp_offset_alloc_largest_free(t.slots[i]->alloc) < rounded);
            full_hits++;
            max_size = size - 1; /* keep going with smaller objects until even 1 byte fails */
            continue;
        }
        assert_int_equal(st, KVP_OK);
        assert_true(n >= 1 && n <= want);
        check_replicas(&t, size, out, n);
        for (unsigned i = 0; i < n; i++) {
            assert_true(n_ext < cap);
            ext[n_ext].seg_id = out[i].segment_id;
            ext[n_ext].offset = out[i].offset;
            ext[n_ext].len = (size + ALIGN - 1) & ~(uint64_t)(ALIGN - 1);
            ext[n_ext].handle = out[i].handle;
            n_ext++;
        }
    }
    assert_true(full_hits > 0);

    /* 1 byte no longer fits anywhere: every byte of every segment is handed out */
    uint64_t used = 0;
    for (uint32_t i = 0; i < t.n_slots; i++) {
        if (t.slots[i] == NULL)
            continue;
        assert_int_equal(kvp_segment_used(t.slots[i]), t.slots[i]->size);
        used += kvp_segment_used(t.slots[i]);
    }
    assert_int_equal(used, total);

    /* extents in bounds and pairwise disjoint; their sum is what the segments report used */
    qsort(ext, n_ext, sizeof(*ext), extent_cmp);
    uint64_t sum = 0;
    for (size_t i = 0; i < n_ext; i++) {
        kvp_segment_t *seg = kvp_segment_table_get(&t, ext[i].seg_id);
        assert_non_null(seg);
        assert_true(ext[i].offset + ext[i].len <= seg->size);
        if (i > 0 && ext[i - 1].seg_id == ext[i].seg_id &&
            ext[i - 1].offset + ext[i - 1].len > ext[i].offset)
            fail_msg("extents overlap on segment %s: [%llu,+%llu) and [%llu,+%llu)", seg->name,
                     (unsigned long long)ext[i - 1].offset, (unsigned long long)ext[i - 1].len,
                     (unsigned long long)ext[i].offset, (unsigned long long)ext[i].len);
        sum += ext[i].len;
    }
    assert_int_equal(sum, total);

    /* seg->objects counts the replicas stored on each segment */
    for (uint32_t s = 0; s < t.n_slots; s++) {
        kvp_segment_t *seg = t.slots[s];
        if (seg == NULL)
            continue;
        uint64_t cnt = 0;
        for (size_t i = 0; i < n_ext; i++)
            cnt += ext[i].seg_id == seg->id;
        assert_int_equal(seg->objects, cnt);
        assert_int_equal(kvp_offset_alloc_count(seg->alloc), cnt);
    }

    /* free everything: all space comes back */
    for (size_t i = 0; i < n_ext; i++) {
        kvp_segment_t *seg = kvp_segment_table_get(&t, ext[i].seg_id);
        kvp_offset_alloc_free(seg->alloc, ext[i].handle);
        seg->objects--;
    }
    for (uint32_t s = 0; s < t.n_slots; s++)
        if (t.slots[s]) {
            assert_int_equal(kvp_segment_used(t.slots[s]), 0);
            assert_int_equal(t.slots[s]->objects, 0);
        }
    assert_int_equal(place(&t, 256 * 1024, 1, NULL, &rng, out, &n), KVP_OK);
    release(&t, out, n);
    free(ext);
    kvp_segment_table_cleanup(&t);
}

static void test_partial_replicas_when_space_short(void **state)
{
    (void)state;
    kvp_segment_table_t t;
    kvp_segment_table_init(&t);
    kvp_segment_t *a = add_seg(&t, "a", "h1", 64 * 1024);
    kvp_segment_t *b = add_seg(&t, "b", "h2", 8 * 1024);
    uint64_t rng = 3;
    kvp_replica_t out[KVP_MAX_REPLICAS];
    unsigned n;
    /* only segment a can take 16 KiB: one replica rather than a failure */
    assert_int_equal(place(&t, 16 * 1024, 2, NULL, &rng, out, &n), KVP_OK);
    assert_int_equal(n, 1);
    assert_true(out[0].segment_id == a->id);
    assert_int_equal(a->objects, 1);
    assert_int_equal(b->objects, 0);
    release(&t, out, n);
    kvp_segment_table_cleanup(&t);
}

static void test_many_segments(void **state)
{
    (void)state;
    kvp_segment_table_t t;
    kvp_segment_table_init(&t);
    /* more than the table's first 16 slots, one host each */
    enum { NSEG = 40 };
    for (int i = 0; i < NSEG; i++) {
        char name[16], host[16];
        snprintf(name, sizeof(name), "s%d", i);
        snprintf(host, sizeof(host), "h%d", i);
        add_seg(&t, name, host, 64 * 1024);
    }
    assert_int_equal(t.count, NSEG);
    assert_int_equal(t.capacity, NSEG * 64 * 1024);
    uint64_t rng = 11;
    kvp_replica_t out[KVP_MAX_REPLICAS];
    unsigned n;
    int hits[NSEG] = {0};
    for (int trial = 0; trial < 2000; trial++) {
        /* more than KVP_MAX_REPLICAS asked: capped */
        assert_int_equal(place(&t, 4096, 12, NULL, &rng, out, &n), KVP_OK);
        assert_int_equal(n, KVP_MAX_REPLICAS);
        check_replicas(&t, 4096, out, n);
        for (unsigned i = 0; i < n; i++)
            hits[(uint32_t)out[i].segment_id]++;
        release(&t, out, n);
    }
    /* every segment gets used */
    for (int i = 0; i < NSEG; i++)
        assert_true(hits[i] > 0);
    kvp_segment_table_cleanup(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_segment),
        cmocka_unit_test(test_too_large),
        cmocka_unit_test(test_replicas_distinct_segments),
        cmocka_unit_test(test_replicas_distinct_hosts),
        cmocka_unit_test(test_hosts_first_then_segments),
        cmocka_unit_test(test_preferred),
        cmocka_unit_test(test_preferred_list),
        cmocka_unit_test(test_avoided_segments),
        cmocka_unit_test(test_weighted_by_free_space),
        cmocka_unit_test(test_fill_until_full),
        cmocka_unit_test(test_partial_replicas_when_space_short),
        cmocka_unit_test(test_many_segments),
    };
    return cmocka_run_group_tests_name("placement", tests, NULL, NULL);
}
