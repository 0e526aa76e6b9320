/*
 * test_multi.c - scatter/gather puts and gets, ranged reads and asynchronous
 * batches end to end: a real kvpool-master, two real `kvpool serve` segments
 * on 127.0.0.1, and this process as the client. Every byte read is compared
 * with what was put, and the bytes around it with what was there before.
 *
 * The cases run over tcp and over shm (both forced); under KVPOOL_TRANSPORT
 * (the rdma suite in the Soft-RoCE VM) once over that transport.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/include/kvpool.h"
#include "tests/harness_pool.h"

#define SEG_SIZE "96MiB"
#define FILL 0xAB /* what a destination holds before a read: must survive where not read */
#define MIN_SZ(a, b) ((a) < (b) ? (a) : (b))

typedef struct env {
    kvp_test_pool_t p; /* master, segments, client (harness_pool.h) */
    kvp_aq_t *aq;      /* the test's queue: a failed check leaves it to the teardown */
    const char *transport;
    int key_gen;
} env_t;

static int setup(void **state, const char *transport)
{
    env_t *e = calloc(1, sizeof(*e));
    e->transport = transport;
    char *args[] = {"--lease-ttl", "0", "--no-eviction", NULL};
    *state = e;
    return kvp_test_pool_start(&e->p, args, 2, SEG_SIZE, transport) ? 0 : -1;
}

static int setup_tcp(void **state)
{
    return setup(state, "tcp");
}

static int setup_shm(void **state)
{
    return setup(state, "shm");
}

static int setup_forced(void **state)
{
    return setup(state, kvp_test_transport());
}

static int teardown(void **state)
{
    env_t *e = *state;
    kvp_aq_destroy(e->aq); /* before its client: it waits for the batches on it */
    int rc = kvp_test_pool_stop(&e->p);
    free(e);
    return rc;
}

/* Keys unique per test so cases never see each other's objects. */
static void key_of(env_t *e, char *buf, size_t len, const char *tag, int i)
{
    snprintf(buf, len, "model@tp_rank:0@%s-%s-%d-%d", e->transport, tag, e->key_gen, i);
}

/* Every test leaves the pool empty, so the next one has all of its room. */
static void remove_all(env_t *e)
{
    uint64_t removed = 0;
    assert_int_equal(kvp_remove_all(e->p.client, 1, &removed), KVP_OK);
    kvp_pool_stat_t *s = NULL;
    assert_int_equal(kvp_pool_stat(e->p.client, &s), KVP_OK);
    assert_int_equal(s->objects, 0);
    kvp_pool_stat_free(s);
}

static bool all_bytes(const void *buf, size_t len, uint8_t v)
{
    const uint8_t *p = buf;
    for (size_t i = 0; i < len; i++)
        if (p[i] != v)
            return false;
    return true;
}

/* ---------------- scatter/gather ---------------- */

/*
 * Objects made of uneven pieces (empty ones among them, NULL or not), and of one
 * piece, put with kvp_batch_put_from_multi: a plain get returns each one's
 * concatenation, byte for byte (its CRC, computed over the pieces, checked), and
 * kvp_batch_get_into_multi scatters it back into pieces of another shape.
 */
static void test_multi_put_then_get(void **state)
{
    env_t *e = *state;
    e->key_gen++;
    static const size_t shape[][6] = {
        {1, 4095, 0, 65537, 3, 7}, /* uneven, with an empty piece */
        {1 << 20, 0, 0, 1, 0, 0},  /* a large piece, empty ones after it */
        {0, 0, 333, 0, 0, 0},      /* one piece of data among empty ones */
        {4096, 4096, 4096, 4096, 4096, 4096},
    };
    enum { N = 5 }; /* the last object: one buffer */
    const size_t one_size = 300000;
    char kb[N][128];
    const char *keys[N];
    const void *pieces[N][6];
    size_t sizes[N][6];
    const void *const *bufs[N];
    const size_t *szp[N];
    size_t n_bufs[N];
    size_t total[N];
    uint8_t *whole[N]; /* the expected concatenation */
    for (int i = 0; i < N; i++) {
        key_of(e, kb[i], sizeof(kb[i]), "mp", i);
        keys[i] = kb[i];
        n_bufs[i] = i < 4 ? 6 : 1;
        total[i] = 0;
        for (size_t b = 0; b < n_bufs[i]; b++) {
            sizes[i][b] = i < 4 ? shape[i][b] : one_size;
            total[i] += sizes[i][b];
        }
        whole[i] = malloc(total[i]);
        kvp_fill_pattern(whole[i], total[i], (uint64_t)i + 77);
        /* each piece in a buffer of its own, so the put really gathers */
        size_t at = 0;
        for (size_t b = 0; b < n_bufs[i]; b++) {
            void *p = NULL;
            if (sizes[i][b] > 0 || b % 2 == 0) {
                p = malloc(sizes[i][b] ? sizes[i][b] : 1);
                memcpy(p, whole[i] + at, sizes[i][b]);
            }
            pieces[i][b] = p; /* an empty piece: NULL or a real buffer */
            at += sizes[i][b];
        }
        bufs[i] = pieces[i];
        szp[i] = sizes[i];
    }
    kvp_status_t res[N];
    assert_int_equal(kvp_batch_put_from_multi(e->p.client, keys, bufs, szp, n_bufs, N, NULL, res),
                     KVP_OK);
    for (int i = 0; i < N; i++)
        assert_int_equal(res[i], KVP_OK);

    /* a plain get: the concatenation, nothing past it */
    void *dst[N];
    size_t caps[N];
    int64_t got[N];
    for (int i = 0; i < N; i++) {
        caps[i] = total[i] + 64;
        dst[i] = malloc(caps[i]);
        memset(dst[i], FILL, caps[i]);
        assert_int_equal(kvp_get_size(e->p.client, keys[i]), (int64_t)total[i]);
    }
    assert_int_equal(kvp_batch_get_into(e->p.client, keys, dst, caps, N, got), KVP_OK);
    for (int i = 0; i < N; i++) {
        assert_int_equal(got[i], (int64_t)total[i]);
        assert_memory_equal(dst[i], whole[i], total[i]);
        assert_true(all_bytes((uint8_t *)dst[i] + total[i], 64, FILL));
    }

    /* scattered back into the put's own shape (fresh buffers) */
    void *out[N][6];
    void *const *obufs[N];
    for (int i = 0; i < N; i++) {
        for (size_t b = 0; b < n_bufs[i]; b++) {
            out[i][b] = malloc(sizes[i][b] + 1);
            memset(out[i][b], FILL, sizes[i][b] + 1);
        }
        obufs[i] = out[i];
    }
    assert_int_equal(kvp_batch_get_into_multi(e->p.client, keys, obufs, szp, n_bufs, N, got),
                     KVP_OK);
    for (int i = 0; i < N; i++) {
        assert_int_equal(got[i], (int64_t)total[i]);
        size_t at = 0;
        for (size_t b = 0; b < n_bufs[i]; b++) {
            assert_memory_equal(out[i][b], whole[i] + at, sizes[i][b]);
            assert_int_equal(((uint8_t *)out[i][b])[sizes[i][b]], FILL);
            at += sizes[i][b];
            free(out[i][b]);
        }
    }
    for (int i = 0; i < N; i++) {
        for (size_t b = 0; b < n_bufs[i]; b++)
            free((void *)pieces[i][b]);
        free(whole[i]);
        free(dst[i]);
    }
    remove_all(e);
}

/*
 * Objects put whole, read with kvp_batch_get_into_multi: scattered in order
 * over uneven buffers; more room than needed returns the true length and
 * leaves the buffers past the end untouched; too little room is
 * KVP_ERR_BUFFER_TOO_SMALL with nothing written.
 */
static void test_single_put_then_multi_get(void **state)
{
    env_t *e = *state;
    e->key_gen++;
    enum { LEN = 100003 };
    char key[128];
    key_of(e, key, sizeof(key), "sg", 0);
    uint8_t *src = malloc(LEN);
    kvp_fill_pattern(src, LEN, 5);
    assert_int_equal(kvp_put(e->p.client, key, src, LEN, NULL), KVP_OK);
    const char *keys[1] = {key};

    /* exact fit over uneven pieces, an empty one in the middle */
    {
        size_t sizes[4] = {1, 50000, 0, LEN - 50001};
        uint8_t *b0 = malloc(sizes[0]), *b1 = malloc(sizes[1]), *b3 = malloc(sizes[3]);
        void *pieces[4] = {b0, b1, NULL, b3};
        void *const *bufs[1] = {pieces};
        const size_t *szp[1] = {sizes};
        size_t nb[1] = {4};
        int64_t got = 0;
        assert_int_equal(kvp_batch_get_into_multi(e->p.client, keys, bufs, szp, nb, 1, &got),
                         KVP_OK);
        assert_int_equal(got, LEN);
        assert_memory_equal(b0, src, sizes[0]);
        assert_memory_equal(b1, src + 1, sizes[1]);
        assert_memory_equal(b3, src + 50001, sizes[3]);
        free(b0);
        free(b1);
        free(b3);
    }
    /* more room than the object: the true length; the buffers past its end untouched */
    {
        size_t sizes[3] = {60000, 60000, 4096};
        uint8_t *p[3];
        for (int b = 0; b < 3; b++) {
            p[b] = malloc(sizes[b]);
            memset(p[b], FILL, sizes[b]);
        }
        void *const *bufs[1] = {(void *const *)p};
        const size_t *szp[1] = {sizes};
        size_t nb[1] = {3};
        int64_t got = 0;
        assert_int_equal(kvp_batch_get_into_multi(e->p.client, keys, bufs, szp, nb, 1, &got),
                         KVP_OK);
        assert_int_equal(got, LEN);
        assert_memory_equal(p[0], src, 60000);
        assert_memory_equal(p[1], src + 60000, LEN - 60000);
        assert_true(all_bytes(p[1] + (LEN - 60000), 60000 - (LEN - 60000), FILL));
        assert_true(all_bytes(p[2], sizes[2], FILL));
        for (int b = 0; b < 3; b++)
            free(p[b]);
    }
    /* one byte short: refused, nothing written */
    {
        size_t sizes[2] = {50000, LEN - 50000 - 1};
        uint8_t *p[2];
        for (int b = 0; b < 2; b++) {
            p[b] = malloc(sizes[b]);
            memset(p[b], FILL, sizes[b]);
        }
        void *const *bufs[1] = {(void *const *)p};
        const size_t *szp[1] = {sizes};
        size_t nb[1] = {2};
        int64_t got = 0;
        assert_int_equal(kvp_batch_get_into_multi(e->p.client, keys, bufs, szp, nb, 1, &got),
                         KVP_ERR_BUFFER_TOO_SMALL);
        assert_int_equal(got, KVP_ERR_BUFFER_TOO_SMALL);
        assert_true(all_bytes(p[0], sizes[0], FILL));
        assert_true(all_bytes(p[1], sizes[1], FILL));
        for (int b = 0; b < 2; b++)
            free(p[b]);
    }
    /* one buffer of exactly the object */
    {
        uint8_t *p = malloc(LEN);
        void *pieces[1] = {p};
        void *const *bufs[1] = {pieces};
        size_t sz[1] = {LEN};
        const size_t *szp[1] = {sz};
        size_t nb[1] = {1};
        int64_t got = 0;
        assert_int_equal(kvp_batch_get_into_multi(e->p.client, keys, bufs, szp, nb, 1, &got),
                         KVP_OK);
        assert_int_equal(got, LEN);
        assert_memory_equal(p, src, LEN);
        free(p);
    }
    free(src);
    remove_all(e);
}

/*
 * The layer-wise layout of a KV cache block: 32 objects of 64 buffers of 16 KiB
 * each (a K and a V per layer), in one batch each way, with 2 replicas.
 */
static void test_layerwise(void **state)
{
    env_t *e = *state;
    e->key_gen++;
    enum { OBJS = 32, LAYERS = 64, PIECE = 16 << 10 };
    const size_t bytes = (size_t)OBJS * LAYERS * PIECE;
    /* the pieces of object i are strided through one region, as a layer-major cache is */
    uint8_t *src = malloc(bytes), *dst = malloc(bytes);
    kvp_fill_pattern(src, bytes, 42);
    memset(dst, FILL, bytes);
    char kb[OBJS][128];
    const char *keys[OBJS];
    const void *sp[OBJS][LAYERS];
    void *dp[OBJS][LAYERS];
    size_t sizes[LAYERS];
    const void *const *sbufs[OBJS];
    void *const *dbufs[OBJS];
    const size_t *szp[OBJS];
    size_t nb[OBJS];
    for (int l = 0; l < LAYERS; l++)
        sizes[l] = PIECE;
    for (int i = 0; i < OBJS; i++) {
        key_of(e, kb[i], sizeof(kb[i]), "layer", i);
        keys[i] = kb[i];
        for (int l = 0; l < LAYERS; l++) {
            size_t at = ((size_t)l * OBJS + (size_t)i) * PIECE;
            sp[i][l] = src + at;
            dp[i][l] = dst + at;
        }
        sbufs[i] = sp[i];
        dbufs[i] = dp[i];
        szp[i] = sizes;
        nb[i] = LAYERS;
    }
    kvp_put_config_t cfg;
    kvp_put_config_init(&cfg);
    cfg.replica_num = 2;
    kvp_status_t res[OBJS];
    assert_int_equal(kvp_batch_put_from_multi(e->p.client, keys, sbufs, szp, nb, OBJS, &cfg, res),
                     KVP_OK);
    int64_t got[OBJS];
    assert_int_equal(kvp_batch_get_into_multi(e->p.client, keys, dbufs, szp, nb, OBJS, got),
                     KVP_OK);
    for (int i = 0; i < OBJS; i++) {
        assert_int_equal(res[i], KVP_OK);
        assert_int_equal(got[i], (int64_t)LAYERS * PIECE);
    }
    assert_memory_equal(dst, src, bytes);
    /* two replicas of each, each written whole: read one object through a plain get */
    kvp_key_info_t *info = NULL;
    size_t n_info = 0;
    assert_int_equal(kvp_list_keys(e->p.client, NULL, 1000, &info, &n_info), KVP_OK);
    assert_int_equal(n_info, OBJS);
    for (size_t i = 0; i < n_info; i++)
        assert_int_equal(info[i].n_replicas, 2);
    kvp_key_list_free(info, n_info);
    uint8_t *one = malloc((size_t)LAYERS * PIECE);
    assert_int_equal(kvp_get_into(e->p.client, keys[7], one, (size_t)LAYERS * PIECE),
                     (int64_t)LAYERS * PIECE);
    for (int l = 0; l < LAYERS; l++)
        assert_memory_equal(one + (size_t)l * PIECE, sp[7][l], PIECE);
    free(one);
    free(src);
    free(dst);
    remove_all(e);
}

/* Missing keys, a batch of present and missing ones, and arguments refused per key. */
static void test_multi_missing_and_bad(void **state)
{
    env_t *e = *state;
    e->key_gen++;
    char kb[4][128];
    const char *keys[4];
    for (int i = 0; i < 4; i++) {
        key_of(e, kb[i], sizeof(kb[i]), "mix", i);
        keys[i] = kb[i];
    }
    uint8_t a[1000], b[2000];
    kvp_fill_pattern(a, sizeof(a), 1);
    kvp_fill_pattern(b, sizeof(b), 2);
    /* keys 0 and 2 exist: 0 from two pieces, 2 from one */
    {
        const void *p0[2] = {a, b};
        size_t s0[2] = {sizeof(a), sizeof(b)};
        const void *p2[1] = {b};
        size_t s2[1] = {sizeof(b)};
        const void *const *bufs[2] = {p0, p2};
        const size_t *szp[2] = {s0, s2};
        size_t nb[2] = {2, 1};
        const char *k[2] = {keys[0], keys[2]};
        kvp_status_t res[2];
        assert_int_equal(kvp_batch_put_from_multi(e->p.client, k, bufs, szp, nb, 2, NULL, res),
                         KVP_OK);
    }
    uint8_t out[4][4000];
    memset(out, FILL, sizeof(out));
    void *op[4][1] = {{out[0]}, {out[1]}, {out[2]}, {out[3]}};
    void *const *bufs[4] = {op[0], op[1], op[2], op[3]};
    size_t cap[1] = {sizeof(out[0])};
    const size_t *szp[4] = {cap, cap, cap, cap};
    size_t nb[4] = {1, 1, 1, 1};
    int64_t got[4];
    /* a missing key alone */
    assert_int_equal(
        kvp_batch_get_into_multi(e->p.client, &keys[1], &bufs[1], &szp[1], &nb[1], 1, &got[1]),
        KVP_ERR_NOT_FOUND);
    assert_int_equal(got[1], KVP_ERR_NOT_FOUND);
    /* present and missing in one batch: the batch returns the first failure */
    assert_int_equal(kvp_batch_get_into_multi(e->p.client, keys, bufs, szp, nb, 4, got),
                     KVP_ERR_NOT_FOUND);
    assert_int_equal(got[0], (int64_t)(sizeof(a) + sizeof(b)));
    assert_int_equal(got[1], KVP_ERR_NOT_FOUND);
    assert_int_equal(got[2], (int64_t)sizeof(b));
    assert_int_equal(got[3], KVP_ERR_NOT_FOUND);
    assert_memory_equal(out[0], a, sizeof(a));
    assert_memory_equal(out[0] + sizeof(a), b, sizeof(b));
    assert_memory_equal(out[2], b, sizeof(b));
    assert_true(all_bytes(out[1], sizeof(out[1]), FILL));
    assert_true(all_bytes(out[3], sizeof(out[3]), FILL));

    /* refused per key: no buffers, only empty ones, a NULL buffer with bytes; a good key
     * beside them is stored */
    {
        size_t zero[2] = {0, 0};
        const void *pz[2] = {a, NULL};
        size_t s1[1] = {10};
        const void *pnull[1] = {NULL};
        const void *pgood[1] = {a};
        size_t sgood[1] = {sizeof(a)};
        const void *const *pb[4] = {pgood, pz, pnull, pgood};
        const size_t *ps[4] = {sgood, zero, s1, sgood};
        size_t pn[4] = {1, 2, 1, 0};
        const char *k[4] = {keys[1], keys[3], "model@bad-null", "model@bad-none"};
        kvp_status_t res[4];
        assert_int_equal(kvp_batch_put_from_multi(e->p.client, k, pb, ps, pn, 4, NULL, res),
                         KVP_ERR_INVALID_ARG);
        assert_int_equal(res[0], KVP_OK);
        assert_int_equal(res[1], KVP_ERR_INVALID_ARG);
        assert_int_equal(res[2], KVP_ERR_INVALID_ARG);
        assert_int_equal(res[3], KVP_ERR_INVALID_ARG);
        assert_int_equal(kvp_is_exist(e->p.client, keys[1]), 1);
        assert_int_equal(kvp_is_exist(e->p.client, keys[3]), 0);
        /* missing arrays: the whole call */
        assert_int_equal(kvp_batch_put_from_multi(e->p.client, k, NULL, ps, pn, 1, NULL, res),
                         KVP_ERR_INVALID_ARG);
        assert_int_equal(kvp_batch_get_into_multi(e->p.client, keys, bufs, szp, NULL, 1, got),
                         KVP_ERR_INVALID_ARG);
    }
    /* no room at all (every buffer empty) is too small, not an error of the arguments */
    {
        size_t zero[1] = {0};
        const size_t *zs[1] = {zero};
        assert_int_equal(kvp_batch_get_into_multi(e->p.client, keys, bufs, zs, nb, 1, got),
                         KVP_ERR_BUFFER_TOO_SMALL);
    }
    remove_all(e);
}

/* ---------------- ranges ---------------- */

static void test_ranges(void **state)
{
    env_t *e = *state;
    e->key_gen++;
    enum { LEN = (1 << 20) + 17, SMALL = 10 };
    char k0[128], k1[128], missing[128];
    key_of(e, k0, sizeof(k0), "rng", 0);
    key_of(e, k1, sizeof(k1), "rng", 1);
    key_of(e, missing, sizeof(missing), "rng", 2);
    uint8_t *src = malloc(LEN);
    kvp_fill_pattern(src, LEN, 9);
    uint8_t small[SMALL];
    kvp_fill_pattern(small, SMALL, 10);
    assert_int_equal(kvp_put(e->p.client, k0, src, LEN, NULL), KVP_OK);
    assert_int_equal(kvp_put(e->p.client, k1, small, SMALL, NULL), KVP_OK);

    enum { NR = 10 };
    uint8_t *out[NR];
    kvp_range_t r[NR] = {
        {k0, 0, 1, NULL},            /* first byte */
        {k0, 0, 4096, NULL},         /* first page */
        {k0, 500000, 70000, NULL},   /* middle */
        {k0, LEN - 1, 1, NULL},      /* last byte */
        {k0, LEN - 100, 4096, NULL}, /* past the end: 100 bytes */
        {k0, LEN, 1, NULL},          /* offset == size */
        {k1, 3, 0, NULL},            /* length 0 */
        {missing, 0, 10, NULL},      /* unknown key */
        {k1, 2, 5, NULL},            /* another key in the same batch */
        {k1, SMALL + 100, 1, NULL},  /* offset past the size */
    };
    for (int i = 0; i < NR; i++) {
        out[i] = malloc(r[i].length + 64);
        memset(out[i], FILL, r[i].length + 64);
        r[i].buf = out[i];
    }
    int64_t got[NR];
    assert_int_equal(kvp_get_into_ranges(e->p.client, r, NR, got), KVP_ERR_OUT_OF_RANGE);
    const int64_t want[NR] = {1,
                              4096,
                              70000,
                              1,
                              100,
                              KVP_ERR_OUT_OF_RANGE,
                              KVP_ERR_INVALID_ARG,
                              KVP_ERR_NOT_FOUND,
                              5,
                              KVP_ERR_OUT_OF_RANGE};
    for (int i = 0; i < NR; i++) {
        assert_int_equal(got[i], want[i]);
        size_t n = got[i] > 0 ? (size_t)got[i] : 0;
        const uint8_t *obj = r[i].key == k0 ? src : small;
        if (n > 0)
            assert_memory_equal(out[i], obj + r[i].offset, n);
        /* nothing written past what was read */
        assert_true(all_bytes(out[i] + n, r[i].length + 64 - n, FILL));
        free(out[i]);
    }

    /* many ranges of one key in one batch: every 4 KiB page of it, backwards, with the
     * last one short */
    enum { PAGES = (LEN + 4095) / 4096 };
    kvp_range_t *pr = calloc(PAGES, sizeof(*pr));
    uint8_t *dst = malloc((size_t)PAGES * 4096);
    memset(dst, FILL, (size_t)PAGES * 4096);
    for (int p = 0; p < PAGES; p++) {
        int q = PAGES - 1 - p;
        pr[p] = (kvp_range_t){k0, (uint64_t)q * 4096, 4096, dst + (size_t)q * 4096};
    }
    int64_t *pg = calloc(PAGES, sizeof(*pg));
    assert_int_equal(kvp_get_into_ranges(e->p.client, pr, PAGES, pg), KVP_OK);
    for (int p = 0; p < PAGES; p++)
        assert_int_equal(pg[p], p == 0 ? LEN - (int64_t)(PAGES - 1) * 4096 : 4096);
    assert_memory_equal(dst, src, LEN);
    assert_true(all_bytes(dst + LEN, (size_t)PAGES * 4096 - LEN, FILL));
    /* a whole-object range reads it all */
    kvp_range_t all = {k0, 0, LEN, dst};
    int64_t got_all = 0;
    memset(dst, 0, LEN);
    assert_int_equal(kvp_get_into_ranges(e->p.client, &all, 1, &got_all), KVP_OK);
    assert_int_equal(got_all, LEN);
    assert_memory_equal(dst, src, LEN);
    /* a bad key and a NULL buffer, reported per range */
    kvp_range_t bad[2] = {{"", 0, 1, dst}, {k0, 0, 1, NULL}};
    int64_t gb[2];
    assert_int_equal(kvp_get_into_ranges(e->p.client, bad, 2, gb), KVP_ERR_BAD_KEY);
    assert_int_equal(gb[0], KVP_ERR_BAD_KEY);
    assert_int_equal(gb[1], KVP_ERR_INVALID_ARG);
    free(pg);
    free(pr);
    free(dst);
    free(src);
    remove_all(e);
}

/* ---------------- asynchronous batches ---------------- */

static kvp_aq_t *aq_open(env_t *e, unsigned workers)
{
    kvp_aq_destroy(e->aq); /* left by a failed test: its arrays were never freed */
    e->aq = NULL;
    assert_int_equal(kvp_aq_create(e->p.client, workers, &e->aq), KVP_OK);
    return e->aq;
}

static void aq_close(env_t *e)
{
    kvp_aq_destroy(e->aq);
    e->aq = NULL;
}

/* Reap every one of `n` completions, waiting on the eventfd with poll() before each
 * reap of at most `max`: the fd must stay readable while completions wait (or poll
 * would block for ever, which the suite's timeout reports), and be readable only when
 * a reap finds something (this test is the only reaper). */
static void reap_all(kvp_aq_t *aq, size_t n, size_t max, kvp_aq_completion_t *done)
{
    size_t got = 0;
    while (got < n) {
        struct pollfd pfd = {.fd = kvp_aq_fd(aq), .events = POLLIN};
        assert_int_equal(poll(&pfd, 1, -1), 1);
        assert_true(pfd.revents & POLLIN);
        size_t k = kvp_aq_reap(aq, done + got, MIN_SZ(max, n - got));
        assert_true(k >= 1);
        got += k;
    }
    /* all reaped: nothing can come any more, so the fd must not be readable */
    struct pollfd pfd = {.fd = kvp_aq_fd(aq), .events = POLLIN};
    assert_int_equal(poll(&pfd, 1, 0), 0);
    assert_int_equal(kvp_aq_reap(aq, done, 1), 0);
}

/*
 * n objects for the async tests: keys, patterned sources of `base` + (i * 7919) % spread
 * bytes, destinations of 16 bytes more filled with FILL, and the arrays batches write
 * results to. All on the heap: the batches write into them, and a failed check leaves
 * them to the process (the teardown destroys the queue), never to a later test's stack.
 */
typedef struct objs {
    size_t n;
    char (*kb)[128];
    const char **keys;
    const void **src;
    void **dst;
    size_t *sizes, *caps;
    kvp_status_t *put_res;
    int64_t *got;
    int *ex;
} objs_t;

static objs_t *objs_make(env_t *e, const char *tag, size_t n, size_t base, size_t spread)
{
    objs_t *o = calloc(1, sizeof(*o));
    o->n = n;
    o->kb = calloc(n, sizeof(*o->kb));
    o->keys = calloc(n, sizeof(*o->keys));
    o->src = calloc(n, sizeof(*o->src));
    o->dst = calloc(n, sizeof(*o->dst));
    o->sizes = calloc(n, sizeof(*o->sizes));
    o->caps = calloc(n, sizeof(*o->caps));
    o->put_res = calloc(n, sizeof(*o->put_res));
    o->got = calloc(n, sizeof(*o->got));
    o->ex = calloc(n, sizeof(*o->ex));
    for (size_t i = 0; i < n; i++) {
        key_of(e, o->kb[i], sizeof(o->kb[i]), tag, (int)i);
        o->keys[i] = o->kb[i];
        o->sizes[i] = base + (i * 7919) % spread;
        o->caps[i] = o->sizes[i] + 16;
        void *p = malloc(o->sizes[i]);
        kvp_fill_pattern(p, o->sizes[i], (uint64_t)i + 3);
        o->src[i] = p;
        o->dst[i] = malloc(o->caps[i]);
        memset(o->dst[i], FILL, o->caps[i]);
        o->put_res[i] = (kvp_status_t)12345; /* what no batch writes */
        o->got[i] = 12345;
        o->ex[i] = 12345;
    }
    return o;
}

/* Object i read back whole into its destination, nothing written past it. */
static void objs_check(const objs_t *o, size_t i)
{
    assert_int_equal(o->got[i], (int64_t)o->sizes[i]);
    assert_memory_equal(o->dst[i], o->src[i], o->sizes[i]);
    assert_true(all_bytes((uint8_t *)o->dst[i] + o->sizes[i], 16, FILL));
}

static void objs_free(objs_t *o)
{
    for (size_t i = 0; i < o->n; i++) {
        free((void *)o->src[i]);
        free(o->dst[i]);
    }
    free(o->ex);
    free(o->got);
    free(o->put_res);
    free(o->caps);
    free(o->sizes);
    free(o->dst);
    free(o->src);
    free(o->keys);
    free(o->kb);
    free(o);
}

/* 1000 get batches in flight on one queue, reaped through the eventfd, byte-exact. */
static void test_async_gets(void **state)
{
    env_t *e = *state;
    e->key_gen++;
    enum { N = 1000 };
    objs_t *o = objs_make(e, "aget", N, 1, 20000);
    assert_int_equal(
        kvp_batch_put_from(e->p.client, o->keys, o->src, o->sizes, N, NULL, o->put_res), KVP_OK);
    kvp_aq_t *aq = aq_open(e, 0);
    for (size_t i = 0; i < N; i++)
        assert_int_equal(kvp_aq_get(aq, &o->keys[i], &o->dst[i], &o->caps[i], 1, &o->got[i],
                                    (void *)(uintptr_t)(i + 1)),
                         KVP_OK);
    kvp_aq_completion_t *done = calloc(N, sizeof(*done));
    reap_all(aq, N, 64, done);
    bool *seen = calloc(N, sizeof(*seen));
    for (size_t j = 0; j < N; j++) {
        uintptr_t i = (uintptr_t)done[j].user_data - 1;
        assert_true(i < N);
        assert_false(seen[i]);
        seen[i] = true;
        assert_int_equal(done[j].status, KVP_OK);
        objs_check(o, i);
    }
    aq_close(e);
    free(seen);
    free(done);
    objs_free(o);
    remove_all(e);
}

/*
 * Put, get and exist batches mixed on one queue, reaped one at a time; user_data
 * comes back with each; the put config is the queue's copy (the caller's, with
 * its strings, is scribbled over right after the submit).
 */
static void test_async_mixed(void **state)
{
    env_t *e = *state;
    e->key_gen++;
    enum { N = 32 }; /* half of them on one named segment: 2^-16 to land there by chance */
    objs_t *o = objs_make(e, "amix", N, 1000, 3000);
    int *tag = calloc(5, sizeof(*tag));
    for (int t = 0; t < 5; t++)
        tag[t] = t;
    kvp_pool_stat_t *s = NULL;
    assert_int_equal(kvp_pool_stat(e->p.client, &s), KVP_OK);
    assert_int_equal(s->n_segments, 2);
    uint64_t want_seg = s->segments[1].id;
    char *seg_name = strdup(s->segments[1].name);
    kvp_pool_stat_free(s);

    kvp_aq_t *aq = aq_open(e, 3);
    /* the first half put on a named segment, through a config that goes away */
    kvp_put_config_t *cfg = malloc(sizeof(*cfg));
    kvp_put_config_init(cfg);
    cfg->preferred_segment = seg_name;
    assert_int_equal(kvp_aq_put(aq, o->keys, o->src, o->sizes, N / 2, cfg, o->put_res, &tag[1]),
                     KVP_OK);
    memset(seg_name, 'x', strlen(seg_name));
    memset(cfg, 0xFF, sizeof(*cfg));
    free(cfg);
    free(seg_name);
    kvp_aq_completion_t c;
    struct pollfd pfd = {.fd = kvp_aq_fd(aq), .events = POLLIN};
    assert_int_equal(poll(&pfd, 1, -1), 1);
    assert_int_equal(kvp_aq_reap(aq, &c, 1), 1);
    assert_ptr_equal(c.user_data, &tag[1]);
    assert_int_equal(c.status, KVP_OK);
    /* the rest put, while exist and get of the first half run beside it */
    assert_int_equal(kvp_aq_put(aq, o->keys + N / 2, o->src + N / 2, o->sizes + N / 2, N / 2, NULL,
                                o->put_res + N / 2, &tag[2]),
                     KVP_OK);
    assert_int_equal(kvp_aq_get(aq, o->keys, o->dst, o->caps, N / 2, o->got, &tag[3]), KVP_OK);
    assert_int_equal(kvp_aq_exist(aq, o->keys, N / 2, o->ex, &tag[4]), KVP_OK);
    bool seen[5] = {false};
    for (int j = 0; j < 3; j++) {
        assert_int_equal(poll(&pfd, 1, -1), 1);
        assert_int_equal(kvp_aq_reap(aq, &c, 1), 1);
        int t = *(int *)c.user_data;
        assert_true(t >= 2 && t <= 4);
        assert_ptr_equal(c.user_data, &tag[t]);
        assert_false(seen[t]);
        seen[t] = true;
        assert_int_equal(c.status, KVP_OK);
    }
    assert_int_equal(kvp_aq_reap(aq, &c, 1), 0);
    for (size_t i = 0; i < N; i++)
        assert_int_equal(o->put_res[i], KVP_OK);
    for (size_t i = 0; i < N / 2; i++) {
        assert_int_equal(o->ex[i], 1);
        objs_check(o, i);
    }
    /* the copied config was used: the first half lives on the named segment */
    kvp_key_info_t *info = NULL;
    size_t n_info = 0;
    assert_int_equal(kvp_list_keys(e->p.client, NULL, 100, &info, &n_info), KVP_OK);
    assert_int_equal(n_info, N);
    int on_named = 0;
    for (size_t i = 0; i < n_info; i++)
        for (int k = 0; k < N / 2; k++)
            if (strcmp(info[i].key, o->keys[k]) == 0 && info[i].segment_ids[0] == want_seg)
                on_named++;
    assert_int_equal(on_named, N / 2);
    kvp_key_list_free(info, n_info);
    /* a batch refused by the call itself comes back as that call's status */
    assert_int_equal(kvp_aq_get(aq, o->keys, NULL, o->caps, 1, o->got, &tag[3]), KVP_OK);
    assert_int_equal(poll(&pfd, 1, -1), 1);
    assert_int_equal(kvp_aq_reap(aq, &c, 1), 1);
    assert_int_equal(c.status, KVP_ERR_INVALID_ARG);
    aq_close(e);
    free(tag);
    objs_free(o);
    remove_all(e);
}

/* Destroy with batches in flight and none reaped: it waits for them (every result
 * written), then frees (ASan: nothing leaked, nothing touched after). */
static void test_async_destroy_in_flight(void **state)
{
    env_t *e = *state;
    e->key_gen++;
    enum { N = 300 };
    objs_t *o = objs_make(e, "adestroy", N, 32 << 10, 1);
    kvp_aq_t *aq = aq_open(e, 4);
    for (size_t i = 0; i < N; i++) {
        assert_int_equal(
            kvp_aq_put(aq, &o->keys[i], &o->src[i], &o->sizes[i], 1, NULL, &o->put_res[i], NULL),
            KVP_OK);
        assert_int_equal(kvp_aq_exist(aq, &o->keys[i], 1, &o->ex[i], NULL), KVP_OK);
    }
    aq_close(e); /* with every batch still in flight */
    for (size_t i = 0; i < N; i++) {
        assert_int_equal(o->put_res[i], KVP_OK);
        assert_true(o->ex[i] == 0 || o->ex[i] == 1); /* raced its put: either answer, but one */
        assert_int_equal(kvp_is_exist(e->p.client, o->keys[i]), 1);
    }
    /* a queue destroyed with nothing submitted, and NULL */
    aq_open(e, 1);
    aq_close(e);
    kvp_aq_destroy(NULL);
    objs_free(o);
    remove_all(e);
}

/* KVP_AQ_MAX_INFLIGHT batches submitted and not reaped: the next is refused until one
 * is reaped; bad queue arguments. */
static void test_async_too_many(void **state)
{
    env_t *e = *state;
    e->key_gen++;
    char key[128];
    key_of(e, key, sizeof(key), "amany", 0);
    const char *keys[1] = {key};
    kvp_aq_t *aq = NULL;
    assert_int_equal(kvp_aq_create(e->p.client, 65, &aq), KVP_ERR_INVALID_ARG);
    assert_int_equal(kvp_aq_create(NULL, 1, &aq), KVP_ERR_INVALID_ARG);
    assert_null(aq);
    aq = aq_open(e, 2);
    int *ex = calloc(KVP_AQ_MAX_INFLIGHT + 1, sizeof(*ex));
    for (int i = 0; i < KVP_AQ_MAX_INFLIGHT; i++)
        assert_int_equal(kvp_aq_exist(aq, keys, 1, &ex[i], NULL), KVP_OK);
    assert_int_equal(kvp_aq_exist(aq, keys, 1, &ex[KVP_AQ_MAX_INFLIGHT], NULL), KVP_ERR_TOO_MANY);
    /* one reaped: room for one */
    struct pollfd pfd = {.fd = kvp_aq_fd(aq), .events = POLLIN};
    assert_int_equal(poll(&pfd, 1, -1), 1);
    kvp_aq_completion_t c;
    assert_int_equal(kvp_aq_reap(aq, &c, 1), 1);
    assert_int_equal(kvp_aq_exist(aq, keys, 1, &ex[KVP_AQ_MAX_INFLIGHT], NULL), KVP_OK);
    assert_int_equal(kvp_aq_exist(aq, keys, 1, &ex[0], NULL), KVP_ERR_TOO_MANY);
    /* a config string too long for the queue's copy */
    char *long_name = malloc(400);
    memset(long_name, 'a', 399);
    long_name[399] = '\0';
    kvp_put_config_t cfg;
    kvp_put_config_init(&cfg);
    cfg.preferred_segment = long_name;
    uint8_t v = 1;
    const void *vb[1] = {&v};
    size_t vs[1] = {1};
    kvp_status_t r;
    kvp_aq_completion_t *done = calloc(KVP_AQ_MAX_INFLIGHT, sizeof(*done));
    reap_all(aq, KVP_AQ_MAX_INFLIGHT, KVP_AQ_MAX_INFLIGHT, done);
    for (int i = 0; i < KVP_AQ_MAX_INFLIGHT; i++)
        assert_int_equal(done[i].status, KVP_OK);
    assert_int_equal(kvp_aq_put(aq, keys, vb, vs, 1, &cfg, &r, NULL), KVP_ERR_INVALID_ARG);
    assert_int_equal(kvp_aq_put(NULL, keys, vb, vs, 1, NULL, &r, NULL), KVP_ERR_INVALID_ARG);
    assert_int_equal(kvp_aq_fd(NULL), KVP_ERR_INVALID_ARG);
    /* the refused put took no slot: all of them are free again */
    for (int i = 0; i < KVP_AQ_MAX_INFLIGHT; i++)
        assert_int_equal(kvp_aq_exist(aq, keys, 1, &ex[i], NULL), KVP_OK);
    reap_all(aq, KVP_AQ_MAX_INFLIGHT, 100, done);
    for (int i = 0; i < KVP_AQ_MAX_INFLIGHT; i++)
        assert_int_equal(ex[i], 0);
    aq_close(e);
    free(done);
    free(long_name);
    free(ex);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_multi_put_then_get),
        cmocka_unit_test(test_single_put_then_multi_get),
        cmocka_unit_test(test_layerwise),
        cmocka_unit_test(test_multi_missing_and_bad),
        cmocka_unit_test(test_ranges),
        cmocka_unit_test(test_async_gets),
        cmocka_unit_test(test_async_mixed),
        cmocka_unit_test(test_async_destroy_in_flight),
        cmocka_unit_test(test_async_too_many),
    };
    if (kvp_test_transport() != NULL) /* the same suite on the transport under test */
        return cmocka_run_group_tests_name("multi_forced", tests, setup_forced, teardown);
    int fails = cmocka_run_group_tests_name("multi_tcp", tests, setup_tcp, teardown);
    fails += cmocka_run_group_tests_name("multi_shm", tests, setup_shm, teardown);
    return fails;
}
