/*
 * test_seg_record.c - a DRAM segment owner's record of the objects on its segment
 * (client/segment/seg_record.c), fed hand-built change streams in the master's
 * SegRecordResponse.changes encoding: ADD and DEL applied, snapshot newest first
 * with each entry's key, size, CRC, pin and offset; an ADD replacing the entry at its
 * offset; a DEL of an unknown offset; streams for another segment ignored; truncated
 * and unknown-op streams refused (and the record cleared); forget by version; clear;
 * 100 000 entries (growth, order); one thread applying while another snapshots.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client/segment/seg_record.h"

#include "client/segment/data_grant.h"
#include "common/crc32c.h"

#define SEG_ID 7u

/* ---- the master's encoding (proto/kvpool.proto, SegRecordResponse.changes) ---- */

typedef struct stream {
    uint8_t *buf;
    size_t len, cap;
} stream_t;

static void s_put(stream_t *s, uint64_t v, size_t n)
{
    if (s->len + n > s->cap) {
        s->cap = s->cap ? s->cap * 2 : 256;
        while (s->cap < s->len + n)
            s->cap *= 2;
        s->buf = realloc(s->buf, s->cap);
        assert_non_null(s->buf);
    }
    for (size_t i = 0; i < n; i++)
        s->buf[s->len++] = (uint8_t)(v >> (8 * i));
}

static void s_add(stream_t *s, uint64_t offset, uint64_t size, uint64_t version, uint32_t crc,
                  uint8_t pin, const char *key)
{
    size_t kl = strlen(key);
    s_put(s, 1, 1);
    s_put(s, offset, 8);
    s_put(s, size, 8);
    s_put(s, version, 8);
    s_put(s, crc, 4);
    s_put(s, pin, 1);
    s_put(s, kl, 2);
    for (size_t i = 0; i < kl; i++)
        s_put(s, (uint8_t)key[i], 1);
}

static void s_del(stream_t *s, uint64_t offset)
{
    s_put(s, 2, 1);
    s_put(s, offset, 8);
}

static void s_reset(stream_t *s)
{
    s->len = 0;
}

static void s_free(stream_t *s)
{
    free(s->buf);
    memset(s, 0, sizeof(*s));
}

/* ---- fixture ---- */

static int setup(void **state)
{
    kvp_seg_record_t *r = NULL;
    if (kvp_seg_record_create(&r) != KVP_OK)
        return -1;
    kvp_seg_record_bind(r, SEG_ID);
    *state = r;
    return 0;
}

static int teardown(void **state)
{
    kvp_seg_record_destroy(*state);
    return 0;
}

static kvp_status_t apply(kvp_seg_record_t *r, const stream_t *s)
{
    return kvp_seg_record_apply(r, SEG_ID, s->buf, s->len);
}

static void assert_entry(const kvp_record_entry_t *e, uint64_t offset, uint64_t size,
                         uint64_t version, uint32_t crc, uint32_t pin, const char *key)
{
    assert_int_equal(e->offset, offset);
    assert_int_equal(e->size, size);
    assert_int_equal(e->version, version);
    assert_int_equal(e->crc32c, crc);
    assert_int_equal(e->pin, pin);
    assert_int_equal(e->key_len, strlen(key));
    assert_memory_equal(e->key, key, strlen(key));
}

/* Three entries at offsets 0, 1024, 2048 (versions 10, 30, 20). */
static void fill3(kvp_seg_record_t *r)
{
    stream_t s = {0};
    s_add(&s, 0, 1000, 10, 0xA, 0, "a");
    s_add(&s, 1024, 64, 30, 0xB, 2, "bb");
    s_add(&s, 2048, 500, 20, 0xC, 1, "ccc");
    assert_int_equal(apply(r, &s), KVP_OK);
    s_free(&s);
    assert_int_equal(kvp_seg_record_count(r), 3);
}

/* ---- tests ---- */

static void test_add_del_snapshot_newest_first(void **state)
{
    kvp_seg_record_t *r = *state;
    assert_int_equal(kvp_seg_record_count(r), 0);
    stream_t s = {0};
    s_add(&s, 0, 1000, 10, 0xA, 0, "a");
    s_add(&s, 1024, 64, 30, 0xDEADBEEF, 2, "bb");
    s_add(&s, 2048, 500, 20, 0xC, 1, "ccc");
    s_add(&s, 4096, 77, 40, 0xD, 0, "dddd");
    s_del(&s, 0);
    assert_int_equal(apply(r, &s), KVP_OK);
    /* a second stream: more of the same, applied on top */
    s_reset(&s);
    s_del(&s, 4096);
    s_add(&s, 8192, 4000, 25, 0xE, 0, "key/with/slashes");
    assert_int_equal(apply(r, &s), KVP_OK);
    s_free(&s);
    assert_int_equal(kvp_seg_record_count(r), 3);
    kvp_record_entry_t *e = NULL;
    size_t n = 99;
    assert_int_equal(kvp_seg_record_snapshot(r, &e, &n), KVP_OK);
    assert_int_equal(n, 3);
    assert_entry(&e[0], 1024, 64, 30, 0xDEADBEEF, 2, "bb");
    assert_entry(&e[1], 8192, 4000, 25, 0xE, 0, "key/with/slashes");
    assert_entry(&e[2], 2048, 500, 20, 0xC, 1, "ccc");
    free(e);
}

static void test_add_replaces_entry_at_offset(void **state)
{
    kvp_seg_record_t *r = *state;
    fill3(r);
    stream_t s = {0};
    s_add(&s, 1024, 4096, 50, 0x77, 0, "a-much-longer-key-than-before");
    assert_int_equal(apply(r, &s), KVP_OK);
    s_free(&s);
    assert_int_equal(kvp_seg_record_count(r), 3);
    kvp_record_entry_t *e = NULL;
    size_t n = 0;
    assert_int_equal(kvp_seg_record_snapshot(r, &e, &n), KVP_OK);
    assert_int_equal(n, 3);
    assert_entry(&e[0], 1024, 4096, 50, 0x77, 0, "a-much-longer-key-than-before");
    assert_entry(&e[1], 2048, 500, 20, 0xC, 1, "ccc");
    assert_entry(&e[2], 0, 1000, 10, 0xA, 0, "a");
    for (size_t i = 0; i < n; i++)
        assert_false(e[i].key_len == 2 && memcmp(e[i].key, "bb", 2) == 0);
    free(e);
}

static void test_del_of_unknown_offset_is_harmless(void **state)
{
    kvp_seg_record_t *r = *state;
    stream_t s = {0};
    s_del(&s, 4096);
    assert_int_equal(apply(r, &s), KVP_OK); /* empty record */
    assert_int_equal(kvp_seg_record_count(r), 0);
    fill3(r);
    s_reset(&s);
    s_del(&s, 4096);
    s_del(&s, 1024 + 64); /* inside bb's extent, not its offset */
    s_del(&s, 1024);
    s_del(&s, 1024); /* twice */
    assert_int_equal(apply(r, &s), KVP_OK);
    s_free(&s);
    assert_int_equal(kvp_seg_record_count(r), 2);
    kvp_record_entry_t *e = NULL;
    size_t n = 0;
    assert_int_equal(kvp_seg_record_snapshot(r, &e, &n), KVP_OK);
    assert_int_equal(n, 2);
    assert_entry(&e[0], 2048, 500, 20, 0xC, 1, "ccc");
    assert_entry(&e[1], 0, 1000, 10, 0xA, 0, "a");
    free(e);
}

static void test_other_segment_ignored(void **state)
{
    kvp_seg_record_t *r = *state;
    fill3(r);
    stream_t s = {0};
    s_add(&s, 8192, 1, 99, 1, 0, "stray");
    s_del(&s, 0);
    assert_int_equal(kvp_seg_record_apply(r, SEG_ID + 1, s.buf, s.len), KVP_OK);
    assert_int_equal(kvp_seg_record_count(r), 3);
    /* even a malformed one: not ours, not looked at */
    uint8_t junk[3] = {9, 9, 9};
    assert_int_equal(kvp_seg_record_apply(r, SEG_ID + 1, junk, sizeof(junk)), KVP_OK);
    assert_int_equal(kvp_seg_record_count(r), 3);
    /* remounted as another id: the old id's changes are late, the new id's apply; the
     * record itself is kept (it is what the remount offers) */
    kvp_seg_record_bind(r, SEG_ID + 1);
    assert_int_equal(kvp_seg_record_count(r), 3);
    s_reset(&s);
    s_del(&s, 2048);
    assert_int_equal(kvp_seg_record_apply(r, SEG_ID, s.buf, s.len), KVP_OK);
    assert_int_equal(kvp_seg_record_count(r), 3);
    assert_int_equal(kvp_seg_record_apply(r, SEG_ID + 1, s.buf, s.len), KVP_OK);
    assert_int_equal(kvp_seg_record_count(r), 2);
    s_free(&s);
    kvp_record_entry_t *e = NULL;
    size_t n = 0;
    assert_int_equal(kvp_seg_record_snapshot(r, &e, &n), KVP_OK);
    assert_int_equal(n, 2);
    assert_entry(&e[0], 1024, 64, 30, 0xB, 2, "bb");
    assert_entry(&e[1], 0, 1000, 10, 0xA, 0, "a");
    free(e);
}

/* A malformed stream: KVP_ERR_PROTOCOL, and nothing of the record is trusted any more. */
static void refused(kvp_seg_record_t *r, const uint8_t *buf, size_t len)
{
    fill3(r);
    assert_int_equal(kvp_seg_record_apply(r, SEG_ID, buf, len), KVP_ERR_PROTOCOL);
    assert_int_equal(kvp_seg_record_count(r), 0);
    kvp_record_entry_t *e = NULL;
    size_t n = 99;
    assert_int_equal(kvp_seg_record_snapshot(r, &e, &n), KVP_OK);
    assert_int_equal(n, 0);
    free(e);
}

static void test_malformed_stream_clears(void **state)
{
    kvp_seg_record_t *r = *state;
    stream_t s = {0};
    s_add(&s, 4096, 100, 5, 1, 0, "key");
    /* an ADD cut anywhere: in the op's fixed part, in the offset, in the key */
    for (size_t cut = 1; cut < s.len; cut++)
        refused(r, s.buf, cut);
    /* a DEL cut short */
    s_reset(&s);
    s_del(&s, 4096);
    for (size_t cut = 1; cut < s.len; cut++)
        refused(r, s.buf, cut);
    /* unknown ops, alone or where a whole ADD's worth of bytes follows */
    uint8_t bad[9] = {0};
    refused(r, bad, sizeof(bad));
    static const uint8_t ops[] = {0, 4, 0x81, 0xFF};
    for (size_t i = 0; i < sizeof(ops); i++) {
        bad[0] = ops[i];
        refused(r, bad, sizeof(bad));
        s_reset(&s);
        s_add(&s, 4096, 100, 5, 1, 0, "key");
        s.buf[0] = ops[i];
        refused(r, s.buf, s.len);
        /* after a good DEL */
        s_reset(&s);
        s_del(&s, 0);
        s_add(&s, 4096, 100, 5, 1, 0, "key");
        s.buf[9] = ops[i];
        refused(r, s.buf, s.len);
    }
    /* a key length past the end of the stream */
    s_reset(&s);
    s_add(&s, 4096, 100, 5, 1, 0, "key");
    s.buf[30] = 200; /* key_len's low byte */
    refused(r, s.buf, s.len);
    /* well-formed changes followed by a bad one: none of it kept, not even the good part */
    s_reset(&s);
    s_add(&s, 4096, 100, 5, 1, 0, "good");
    s_del(&s, 0);
    s_put(&s, 7, 1);
    s_put(&s, 0, 8);
    refused(r, s.buf, s.len);
    s_free(&s);
    /* and it works again afterwards */
    fill3(r);
    assert_int_equal(kvp_seg_record_count(r), 3);
}

/* ADD_GROUPED (3): an ADD and its object's group id, offered back with it; cut or with
 * an empty group: refused. */
static void test_grouped_add(void **state)
{
    kvp_seg_record_t *r = *state;
    stream_t s = {0};
    s_add(&s, 0, 100, 5, 1, 0, "plain");
    size_t at = s.len;
    s_add(&s, 4096, 200, 6, 2, 1, "grouped");
    s.buf[at] = 3;
    s_put(&s, 5, 2);
    for (const char *g = "req-7"; *g; g++)
        s_put(&s, (uint8_t)*g, 1);
    assert_int_equal(apply(r, &s), KVP_OK);
    kvp_record_entry_t *e = NULL;
    size_t n = 0;
    assert_int_equal(kvp_seg_record_snapshot(r, &e, &n), KVP_OK);
    assert_int_equal(n, 2);
    assert_entry(&e[0], 4096, 200, 6, 2, 1, "grouped"); /* newest first */
    assert_int_equal(e[0].group_len, 5);
    assert_memory_equal(e[0].group, "req-7", 5);
    assert_entry(&e[1], 0, 100, 5, 1, 0, "plain");
    assert_int_equal(e[1].group_len, 0);
    free(e);
    for (size_t cut = at + 1; cut < s.len; cut++) /* cut in the ADD or its group */
        assert_int_equal(kvp_seg_record_apply(r, SEG_ID, s.buf + at, cut - at), KVP_ERR_PROTOCOL);
    s.buf[s.len - 7] = 0; /* group_len 0 */
    s.buf[s.len - 6] = 0;
    assert_int_equal(kvp_seg_record_apply(r, SEG_ID, s.buf + at, s.len - at - 5), KVP_ERR_PROTOCOL);
    assert_int_equal(kvp_seg_record_count(r), 0); /* out of step: cleared */
    s_free(&s);
}

static void test_forget_only_that_version(void **state)
{
    kvp_seg_record_t *r = *state;
    fill3(r);
    kvp_seg_record_forget(r, 1024, 29); /* bb is version 30: a newer one is there now */
    kvp_seg_record_forget(r, 1024, 31);
    assert_int_equal(kvp_seg_record_count(r), 3);
    kvp_seg_record_forget(r, 4096, 30); /* nothing there */
    assert_int_equal(kvp_seg_record_count(r), 3);
    kvp_seg_record_forget(r, 1024, 30);
    assert_int_equal(kvp_seg_record_count(r), 2);
    kvp_seg_record_forget(r, 1024, 30); /* twice: harmless */
    assert_int_equal(kvp_seg_record_count(r), 2);
    kvp_record_entry_t *e = NULL;
    size_t n = 0;
    assert_int_equal(kvp_seg_record_snapshot(r, &e, &n), KVP_OK);
    assert_int_equal(n, 2);
    assert_entry(&e[0], 2048, 500, 20, 0xC, 1, "ccc");
    assert_entry(&e[1], 0, 1000, 10, 0xA, 0, "a");
    free(e);
}

static void test_clear(void **state)
{
    kvp_seg_record_t *r = *state;
    fill3(r);
    kvp_seg_record_clear(r);
    assert_int_equal(kvp_seg_record_count(r), 0);
    kvp_record_entry_t *e = NULL;
    size_t n = 99;
    assert_int_equal(kvp_seg_record_snapshot(r, &e, &n), KVP_OK);
    assert_int_equal(n, 0);
    free(e);
    /* a DEL of what was there is harmless now; the record fills again */
    stream_t s = {0};
    s_del(&s, 0);
    s_add(&s, 0, 1, 3, 4, 0, "again");
    assert_int_equal(apply(r, &s), KVP_OK);
    s_free(&s);
    assert_int_equal(kvp_seg_record_count(r), 1);
    assert_int_equal(kvp_seg_record_snapshot(r, &e, &n), KVP_OK);
    assert_int_equal(n, 1);
    assert_entry(&e[0], 0, 1, 3, 4, 0, "again");
    free(e);
}

#define MANY 100000u

static void test_many_entries(void **state)
{
    kvp_seg_record_t *r = *state;
    stream_t s = {0};
    /* versions a permutation of 1..MANY (7919 is prime to MANY): the order is the sort's */
    for (uint32_t i = 0; i < MANY; i++) {
        char key[32];
        snprintf(key, sizeof(key), "obj-%u", i);
        s_add(&s, (uint64_t)i * 64, 64, (uint64_t)(i * 7919u % MANY) + 1, i, (uint8_t)(i % 3), key);
        if (s.len > (1u << 20)) { /* in batches, as the master sends them */
            assert_int_equal(apply(r, &s), KVP_OK);
            s_reset(&s);
        }
    }
    assert_int_equal(apply(r, &s), KVP_OK);
    s_free(&s);
    assert_int_equal(kvp_seg_record_count(r), MANY);
    kvp_record_entry_t *e = NULL;
    size_t n = 0;
    assert_int_equal(kvp_seg_record_snapshot(r, &e, &n), KVP_OK);
    assert_int_equal(n, MANY);
    uint8_t *seen = calloc(MANY, 1);
    assert_non_null(seen);
    for (size_t j = 0; j < n; j++) {
        assert_int_equal(e[j].version, MANY - j); /* newest first, every one */
        assert_int_equal(e[j].offset % 64, 0);
        uint32_t i = (uint32_t)(e[j].offset / 64);
        assert_true(i < MANY);
        assert_false(seen[i]);
        seen[i] = 1;
        char key[32];
        int kl = snprintf(key, sizeof(key), "obj-%u", i);
        assert_int_equal(e[j].key_len, (size_t)kl);
        assert_memory_equal(e[j].key, key, (size_t)kl);
        assert_int_equal(e[j].crc32c, i);
        assert_int_equal(e[j].pin, i % 3);
        assert_int_equal(e[j].size, 64);
    }
    free(seen);
    free(e);
    /* half of them deleted: the rest still found by offset */
    s = (stream_t){0};
    for (uint32_t i = 0; i < MANY; i += 2)
        s_del(&s, (uint64_t)i * 64);
    assert_int_equal(apply(r, &s), KVP_OK);
    s_free(&s);
    assert_int_equal(kvp_seg_record_count(r), MANY / 2);
    kvp_seg_record_forget(r, 64, 7919 + 1); /* i = 1 */
    assert_int_equal(kvp_seg_record_count(r), MANY / 2 - 1);
    kvp_seg_record_clear(r);
    assert_int_equal(kvp_seg_record_count(r), 0);
}

/* ---- one thread applies, another snapshots ---- */

typedef struct race {
    kvp_seg_record_t *r;
    atomic_bool stop;
    unsigned long applied, snapshots; /* each by its own thread */
    atomic_bool bad;
} race_t;

#define SLOTS 512u

static void *applier(void *arg)
{
    race_t *x = arg;
    stream_t s = {0};
    uint64_t version = 1;
    for (unsigned round = 0; !x->stop; round++) {
        s_reset(&s);
        for (unsigned k = 0; k < 64; k++) {
            unsigned slot = (round * 64 + k * 37) % SLOTS;
            char key[32];
            snprintf(key, sizeof(key), "slot-%u", slot);
            if ((round + k) % 3 == 0)
                s_del(&s, (uint64_t)slot * 4096);
            else
                s_add(&s, (uint64_t)slot * 4096, 4096, version++, slot, 0, key);
        }
        if (kvp_seg_record_apply(x->r, SEG_ID, s.buf, s.len) != KVP_OK)
            x->bad = true;
        if (round % 50 == 49)
            kvp_seg_record_forget(x->r, (uint64_t)(round % SLOTS) * 4096, version - 1);
        if (round % 500 == 499)
            kvp_seg_record_clear(x->r);
        x->applied++;
    }
    s_free(&s);
    return NULL;
}

static void *snapshotter(void *arg)
{
    race_t *x = arg;
    while (!x->stop) {
        kvp_record_entry_t *e = NULL;
        size_t n = 0;
        if (kvp_seg_record_snapshot(x->r, &e, &n) != KVP_OK) {
            x->bad = true;
            continue;
        }
        if (n > SLOTS)
            x->bad = true;
        for (size_t j = 0; j < n; j++) {
            /* each entry whole: its key names its offset; newest first */
            char key[32];
            unsigned slot = (unsigned)(e[j].offset / 4096);
            int kl = snprintf(key, sizeof(key), "slot-%u", slot);
            if (e[j].key_len != (size_t)kl || memcmp(e[j].key, key, (size_t)kl) != 0 ||
                e[j].crc32c != slot || e[j].size != 4096 ||
                (j > 0 && e[j].version > e[j - 1].version))
                x->bad = true;
        }
        free(e);
        (void)kvp_seg_record_count(x->r);
        x->snapshots++;
    }
    return NULL;
}

static void test_apply_while_snapshotting(void **state)
{
    race_t x = {.r = *state};
    atomic_init(&x.stop, false);
    atomic_init(&x.bad, false);
    pthread_t a, b;
    assert_int_equal(pthread_create(&a, NULL, applier, &x), 0);
    assert_int_equal(pthread_create(&b, NULL, snapshotter, &x), 0);
    struct timespec one = {.tv_sec = 1};
    nanosleep(&one, NULL);
    x.stop = true;
    assert_int_equal(pthread_join(a, NULL), 0);
    assert_int_equal(pthread_join(b, NULL), 0);
    assert_false(x.bad);
    assert_true(x.applied > 0);
    assert_true(x.snapshots > 0);
    assert_true(kvp_seg_record_count(x.r) <= SLOTS);
}

/* An object ended without its bytes: checked once two tenants' objects were seen (never
 * before), bad (UINT64_MAX to grants, not in the snapshot, its extent zeroed); reads wait
 * for their object's ADD once a tenant's key was seen, and not for a removed one. */
static void test_ended_without_bytes(void **state)
{
    kvp_seg_record_t *r = *state;
    static uint8_t mem[4 * 4096];
    memset(mem, 'A', sizeof(mem)); /* team-a's bytes everywhere */
    kvp_seg_record_set_memory(r, mem, sizeof(mem));
    uint32_t crc_a = kvp_crc32c(0, mem, 4096);
    uint64_t off = 0, v = 1;
    /* before any tenant's key: nothing waits */
    assert_true(kvp_seg_record_wait(r, &off, &v, 1));
    stream_t s = {0};
    /* one tenant: a wrong CRC is not looked at (nothing of another tenant can be there) */
    s_add(&s, 0, 4096, 1, crc_a ^ 1, 0, "team-a\x1fk1");
    assert_int_equal(apply(r, &s), KVP_OK);
    assert_int_equal(kvp_seg_record_version_at(r, 0), 1);
    assert_int_equal(kvp_seg_record_bad(r), 0);
    /* a second tenant: each ADD is checked from then on, this one's too */
    s_reset(&s);
    s_del(&s, 0);
    s_add(&s, 0, 4096, 2, 0x1234, 0, "team-b\x1fstolen"); /* nothing written: team-a's bytes */
    s_add(&s, 4096, 4096, 3, crc_a, 0, "team-b\x1fhonest");
    assert_int_equal(apply(r, &s), KVP_OK);
    assert_int_equal(kvp_seg_record_bad(r), 1);
    assert_int_equal(kvp_seg_record_version_at(r, 0), UINT64_MAX);
    assert_int_equal(kvp_seg_record_version_at(r, 4096), 3);
    for (size_t i = 0; i < 4096; i++)
        assert_int_equal(mem[i], 0); /* zeroed: a guess finds nothing */
    assert_int_equal(mem[4096], 'A');
    kvp_record_entry_t *e = NULL;
    size_t n = 0;
    assert_int_equal(kvp_seg_record_snapshot(r, &e, &n), KVP_OK);
    assert_int_equal(n, 1);
    assert_int_equal(e[0].version, 3);
    free(e);
    /* reads: recorded (the bad one too: grants refuse it), removed since (tombstone), and one
     * whose ADD never comes (waits its 500 ms) */
    uint64_t offs[2] = {0, 4096}, vers[2] = {2, 3};
    assert_true(kvp_seg_record_wait(r, offs, vers, 2));
    s_reset(&s);
    s_del(&s, 4096);
    assert_int_equal(apply(r, &s), KVP_OK);
    assert_true(kvp_seg_record_wait(r, &offs[1], &vers[1], 1));
    uint64_t off3 = 8192, v9 = 9;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_false(kvp_seg_record_wait(r, &off3, &v9, 1));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double waited = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    assert_true(waited >= 0.4);
    /* ... and is let go once it is applied */
    s_reset(&s);
    uint32_t crc_z = kvp_crc32c(0, mem + 8192, 4096);
    s_add(&s, 8192, 4096, 9, crc_z, 0, "team-a\x1fk9");
    assert_int_equal(apply(r, &s), KVP_OK);
    assert_true(kvp_seg_record_wait(r, &off3, &v9, 1));
    assert_int_equal(kvp_seg_record_version_at(r, 8192), 9);
    s_free(&s);
}

/* The record applies its stream behind the writers: an object's ADD may come after the
 * master removed it and a later put (let in by the data server's grant check, which notes
 * it) wrote over part of its extent. Its bytes are then not the object's to judge: it is
 * not bad and the later object's bytes stay. An object nothing later wrote over is judged
 * as ever, its own put's note notwithstanding. */
static void test_superseded_object_not_judged(void **state)
{
    kvp_seg_record_t *r = *state;
    static uint8_t mem[8 * 4096];
    memset(mem, 'A', sizeof(mem));
    kvp_seg_record_set_memory(r, mem, sizeof(mem));
    kvp_data_pending_t pend;
    kvp_data_pending_init(&pend);
    kvp_seg_record_set_pending(r, &pend);
    stream_t s = {0};
    s_add(&s, 28672, 4096, 1, kvp_crc32c(0, mem, 4096), 0, "team-a\x1fk");
    s_add(&s, 24576, 4096, 2, kvp_crc32c(0, mem, 4096), 0, "team-b\x1fk"); /* two tenants */
    assert_int_equal(apply(r, &s), KVP_OK);
    /* team-b's X (v5) wrote 'B' over [0, 8 KiB) and ended; the master removed it and gave
     * [4 KiB, 8 KiB) to Y (v6), whose writer the owner let in (noted) and wrote 'C' there,
     * all before the record thread reads X's ADD */
    memset(mem, 'B', 8192);
    uint32_t crc_x = kvp_crc32c(0, mem, 8192);
    const uint64_t off_y = 4096, len_y = 4096, v_y = 6, rec0 = 0;
    assert_int_equal(kvp_data_pending_check(&pend, 1, &off_y, &len_y, &v_y, &rec0, 1, true, 1), 1);
    memset(mem + 4096, 'C', 4096);
    uint32_t crc_y = kvp_crc32c(0, mem + 4096, 4096);
    s_reset(&s);
    s_add(&s, 0, 8192, 5, crc_x, 0, "team-b\x1fx");
    assert_int_equal(apply(r, &s), KVP_OK);
    assert_int_equal(kvp_seg_record_bad(r), 0);
    assert_int_equal(kvp_seg_record_version_at(r, 0), 5);
    for (size_t i = 4096; i < 8192; i++)
        assert_int_equal(mem[i], 'C'); /* Y's bytes stay */
    s_reset(&s);
    s_del(&s, 0);
    s_add(&s, 4096, 4096, 6, crc_y, 0, "team-b\x1fy");
    assert_int_equal(apply(r, &s), KVP_OK);
    assert_int_equal(kvp_seg_record_bad(r), 0);
    assert_int_equal(kvp_seg_record_version_at(r, 4096), 6);
    /* Z (v7) ended without its bytes at [8 KiB, 16 KiB): its own write's note (v7) and an
     * earlier one's (v4) are no later put, so it is bad and zeroed */
    const uint64_t offs_z[2] = {8192, 12288}, lens_z[2] = {8192, 4096}, v_z[2] = {7, 4};
    const uint64_t recs_z[2] = {0, 0};
    assert_int_equal(kvp_data_pending_check(&pend, 1, offs_z, lens_z, v_z, recs_z, 2, true, 2), 2);
    s_reset(&s);
    s_add(&s, 8192, 8192, 7, 0x1234, 0, "team-b\x1fz");
    assert_int_equal(apply(r, &s), KVP_OK);
    assert_int_equal(kvp_seg_record_bad(r), 1);
    assert_int_equal(kvp_seg_record_version_at(r, 8192), UINT64_MAX);
    for (size_t i = 8192; i < 16384; i++)
        assert_int_equal(mem[i], 0);
    assert_int_equal(mem[16384], 'A');
    kvp_seg_record_set_pending(r, NULL);
    kvp_data_pending_cleanup(&pend);
    s_free(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_add_del_snapshot_newest_first, setup, teardown),
        cmocka_unit_test_setup_teardown(test_add_replaces_entry_at_offset, setup, teardown),
        cmocka_unit_test_setup_teardown(test_del_of_unknown_offset_is_harmless, setup, teardown),
        cmocka_unit_test_setup_teardown(test_other_segment_ignored, setup, teardown),
        cmocka_unit_test_setup_teardown(test_malformed_stream_clears, setup, teardown),
        cmocka_unit_test_setup_teardown(test_grouped_add, setup, teardown),
        cmocka_unit_test_setup_teardown(test_forget_only_that_version, setup, teardown),
        cmocka_unit_test_setup_teardown(test_clear, setup, teardown),
        cmocka_unit_test_setup_teardown(test_many_entries, setup, teardown),
        cmocka_unit_test_setup_teardown(test_apply_while_snapshotting, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ended_without_bytes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_superseded_object_not_judged, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
