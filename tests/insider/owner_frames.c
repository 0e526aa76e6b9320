/*
 * owner_frames.c - the insider fuzzer against a segment owner (issue 45): tenant B's
 * principals, each in turn, and a stranger with no credentials, send every data-plane frame
 * (docs/protocol.md, "Data plane": READ, WRITE, READV, WRITEV, HELLO, MAP, BIND_READ,
 * BIND_WRITE, UNBIND, an unknown op, a bad magic) to the owner's tcp data ports (its DRAM
 * segment's and, when it serves one, its SSD segment's: the addresses the master's
 * descriptors name) and to its shm socket, while insider_fuzz.c's canary (tenant A) works
 * on the same shared DRAM segment.
 *
 * The principals get real grants first: PutStart of keys of their own (a third of them
 * straight to the SSD tier; written honestly over a proven connection, then PutEnd),
 * GetReplicaList of those keys; the answers' descriptors give the segments, their
 * addresses, connection keys and tags, single grants and grant sets.
 * A stranger has what the principals left behind (grants sealed for others) and the
 * addresses. Each round: a connection (tcp, or the shm socket), a HELLO (proven, or with a
 * wrong tag, segment or proof, or none), then a few frames built from what is held and
 * mutated: segment ids (the real one, next to it, 0, random), offsets and lengths (the
 * granted extent, next to it, anywhere in the segment, past its end, wrapping), entry
 * counts (0, 1..4, 256, 257, huge), flags (none, GRANT, GRANT_SET, GRANT_SAME, several),
 * grants (the right one, another extent's, another principal's, a bit flipped, garbage),
 * grant sets (a bit flipped, a count that lies), indices past the set; then now and then the
 * frame cut, trickled a byte at a time, the connection half-closed, or a burst of idle
 * connections opened at once.
 *
 * Checked here: with grants on, no reply payload (READ, READV, a window's answer) carries
 * tenant A's marker, and no MAP hands tenant B the segment's memory. Without grants (a
 * master without TLS: the owner trusts every peer, by design) reads are not checked and
 * writes go only to tenant B's own objects (hard-pinned, never freed), so that the canary's
 * bytes stay its own: what is fuzzed then is the owner's parsing and its limits. The
 * canary, the owner's RSS and descriptors, and the owner staying up are insider_fuzz.c's.
 *
 * One thread (the fuzzer's): no locks.
 */
#include "tests/insider/owner_frames.h"

#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "client/transport/wire.h"
#include "common/crc32c.h"
#include "common/grant.h"
#include "common/rpc.h"
#include "common/sock.h"
#include "kvpool.pb-c.h"

#define KINDS 12    /* ops 1..9, an unknown op (10), a bad magic (11) */
#define HELD 256    /* extents held (a ring) */
#define SETS 32     /* grant sets held (a ring) */
#define KEYS 16     /* connection keys held */
#define B_KEYS 4096 /* tenant B's keys put */
#define PAYLOAD_CAP (1u << 20)
#define READ_CAP (96u << 20) /* a reply payload larger than this: the connection is dropped */
#define WAIT_MS 3000
#define BURST 48

static const char *const kind_name[KINDS] = {"?",          "READ",   "WRITE",      "READV",
                                             "WRITEV",     "HELLO",  "MAP",        "BIND_READ",
                                             "BIND_WRITE", "UNBIND", "unknown op", "bad magic"};

static struct {
    char host[256];
    uint16_t port;
    const char *shm;
    bool grants;
} tg;

/* ---- what tenant B was handed ---- */

typedef struct extent {
    uint64_t seg, off, len, tag;
    uint8_t op;  /* KVP_GRANT_READ / WRITE / MAP */
    bool single; /* grant holds a single grant; else set/idx name one of sets[] */
    bool ended;  /* its put ended (a hard-pinned object of B's: never freed) */
    uint8_t grant[KVP_GRANT_LEN];
    int set;
    uint32_t idx;
} extent_t;

typedef struct gset {
    uint8_t *b;
    size_t len;
    uint64_t tag;
} gset_t;

typedef struct ckey {
    uint64_t seg, tag;
    uint8_t key[KVP_GRANT_KEY_LEN];
    const char *who;
} ckey_t;

static extent_t held[HELD];
static size_t n_held;
static gset_t sets[SETS];
static size_t n_sets;
static ckey_t keys[KEYS];
static size_t n_keys;
/* the segments the answers named (the owner's DRAM one, its SSD one): where to reach them */
typedef struct seg {
    uint64_t id, size;
    char host[64];
    uint16_t port;
    bool dram;
} seg_t;
#define SEGS 8
static seg_t segs[SEGS];
static size_t n_segs;
static uint64_t seg_id, seg_size = 64u << 20; /* the round's segment */
static uint64_t cur_tag;                      /* the principal the round's HELLO proved (0: none) */
static uint64_t b_next, b_ended[B_KEYS], n_ended; /* B's keys: "b/ofz/N" */
static bool unwritten_puts;                       /* owner_init's: end some puts unwritten */

/* ---- tallies ---- */

static struct {
    uint64_t sent, cut, trickled, closed, unanswered;
    uint64_t by_status[64];
} per[KINDS];
static uint64_t n_tcp, n_ssd, n_shm, n_bursts, n_half, n_puts, n_gets, n_refused_calls, read_bytes;

static void tally(int kind, int32_t st)
{
    per[kind].by_status[st > 0 || st < -63 ? 63 : -st]++;
}

/* ---- setup ---- */

bool owner_init(const char *data_addr, const char *shm_name, bool grants, bool unwritten)
{
    unwritten_puts = unwritten;
    const char *colon = data_addr != NULL ? strrchr(data_addr, ':') : NULL;
    if (colon == NULL || (size_t)(colon - data_addr) >= sizeof(tg.host))
        return false;
    memcpy(tg.host, data_addr, (size_t)(colon - data_addr));
    tg.port = (uint16_t)atoi(colon + 1);
    tg.shm = shm_name;
    tg.grants = grants;
    return tg.port != 0;
}

/* ---- the master's answers ---- */

static void learn_desc(const Kvpool__SegmentDesc *d, const char *who)
{
    seg_t *sg = NULL;
    for (size_t i = 0; i < n_segs && i < SEGS; i++)
        if (segs[i].id == d->id)
            sg = &segs[i];
    const char *colon = d->tcp_endpoint != NULL ? strrchr(d->tcp_endpoint, ':') : NULL;
    if (sg == NULL && colon != NULL && (size_t)(colon - d->tcp_endpoint) < sizeof(sg->host)) {
        sg = &segs[n_segs++ % SEGS];
        *sg = (seg_t){.id = d->id,
                      .size = d->size,
                      .port = (uint16_t)atoi(colon + 1),
                      .dram = d->medium == NULL || strcmp(d->medium, "ssd") != 0};
        memcpy(sg->host, d->tcp_endpoint, (size_t)(colon - d->tcp_endpoint));
    }
    if (d->conn_key.len == KVP_GRANT_KEY_LEN) {
        ckey_t *k = NULL;
        for (size_t i = 0; i < n_keys && i < KEYS; i++)
            if (keys[i].seg == d->id && keys[i].tag == d->conn_tag)
                k = &keys[i];
        if (k == NULL)
            k = &keys[n_keys++ % KEYS];
        *k = (ckey_t){.seg = d->id, .tag = d->conn_tag, .who = who};
        memcpy(k->key, d->conn_key.data, KVP_GRANT_KEY_LEN);
    }
    if (d->shm_grant.len == KVP_GRANT_LEN) { /* not for tenant B on a shared segment */
        extent_t *e = &held[n_held++ % HELD];
        *e = (extent_t){
            .seg = d->id, .len = d->size, .tag = d->conn_tag, .op = KVP_GRANT_MAP, .single = true};
        memcpy(e->grant, d->shm_grant.data, KVP_GRANT_LEN);
    }
}

/* The replicas of one answer: their extents and grants (sets: the answer's descriptors'). */
static void learn_replicas(Kvpool__Replica **reps, size_t n, Kvpool__SegmentDesc **segs,
                           size_t n_segs, const int *set_of, uint8_t op, bool ended)
{
    for (size_t j = 0; j < n; j++) {
        const Kvpool__Replica *p = reps[j];
        uint64_t tag = 0;
        for (size_t k = 0; k < n_segs; k++)
            if (segs[k]->id == p->segment_id)
                tag = segs[k]->conn_tag;
        extent_t *e = &held[n_held++ % HELD];
        *e = (extent_t){.seg = p->segment_id,
                        .off = p->offset,
                        .len = p->length,
                        .tag = tag,
                        .op = op,
                        .ended = ended,
                        .set = -1};
        if (p->grant.len == KVP_GRANT_LEN) {
            e->single = true;
            memcpy(e->grant, p->grant.data, KVP_GRANT_LEN);
        } else if (p->grant_set >= 1 && p->grant_set <= n_segs && set_of[p->grant_set - 1] >= 0) {
            e->set = set_of[p->grant_set - 1];
            e->idx = p->grant_index;
        }
    }
}

/* The answer's grant sets, kept: set_of[k] the slot of segs[k]'s (-1: none). */
static void learn_sets(Kvpool__SegmentDesc **segs, size_t n_segs, int *set_of, const char *who)
{
    for (size_t k = 0; k < n_segs && k < 8; k++) {
        learn_desc(segs[k], who);
        set_of[k] = -1;
        if (segs[k]->grant_set.len < KVP_GRANT_SET_HDR_LEN)
            continue;
        gset_t *s = &sets[n_sets % SETS];
        free(s->b);
        s->b = malloc(segs[k]->grant_set.len);
        if (s->b == NULL)
            continue;
        memcpy(s->b, segs[k]->grant_set.data, segs[k]->grant_set.len);
        s->len = segs[k]->grant_set.len;
        s->tag = segs[k]->conn_tag;
        set_of[k] = (int)(n_sets++ % SETS);
    }
}

/* ---- a data connection ---- */

typedef struct dconn {
    int fd;
    bool shm;
    bool proven;
    const ckey_t *key; /* the key its HELLO proved (NULL: none) */
} dconn_t;

/* The round's segment: a known one at random (shm: the DRAM one), or none yet. Returns it
 * (NULL: none known; the owner's address from owner_init). */
static const seg_t *choose_seg(rng_t *r, bool shm)
{
    size_t n = n_segs < SEGS ? n_segs : SEGS;
    const seg_t *sg = NULL;
    for (int t = 0; n > 0 && t < 8 && (sg == NULL || (shm && !sg->dram)); t++)
        sg = &segs[below(r, n)];
    if (sg != NULL && shm && !sg->dram)
        sg = NULL;
    seg_id = sg != NULL ? sg->id : seg_id;
    seg_size = sg != NULL && sg->size ? sg->size : seg_size;
    return sg;
}

static bool dconn_open(dconn_t *d, bool shm, const seg_t *sg)
{
    *d = (dconn_t){.fd = -1, .shm = shm};
    kvp_status_t s = shm          ? kvp_unix_connect(tg.shm, WAIT_MS, &d->fd)
                     : sg != NULL ? kvp_tcp_connect(sg->host, sg->port, WAIT_MS, &d->fd)
                                  : kvp_tcp_connect(tg.host, tg.port, WAIT_MS, &d->fd);
    if (s != KVP_OK)
        return false;
    kvp_sock_set_timeout(d->fd, WAIT_MS);
    *(shm ? &n_shm : &n_tcp) += 1;
    n_ssd += sg != NULL && !sg->dram;
    return true;
}

static void dconn_close(dconn_t *d)
{
    if (d->fd >= 0)
        close(d->fd);
    d->fd = -1;
}

static bool readable(int fd, int ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, ms) > 0;
}

/* A reply to a frame of `kind`: 1 read (its payload too), 0 none in time, -1 closed. */
static int reply(dconn_t *d, int kind, int wait_ms)
{
    if (!readable(d->fd, wait_ms))
        return 0;
    kvp_data_resp_t r;
    int passed = -1;
    kvp_status_t s = kind == KVP_DATA_MAP && d->shm
                         ? kvp_unix_recv_fd(d->fd, &r, sizeof(r), &passed)
                         : kvp_recv_all(d->fd, &r, sizeof(r));
    if (passed >= 0) {
        close(passed); /* never mapped: the owner's memory is not ours to look at */
        if (tg.grants)
            violation("a MAP on the shm socket handed tenant B's fuzzer the segment's memory");
    }
    if (s != KVP_OK)
        return -1;
    if (r.magic != KVP_DATA_MAGIC) /* never: each frame's reply is read whole, or dropped */
        violation("a reply without the data plane's magic (%#x) to a %s", r.magic, kind_name[kind]);
    tally(kind, r.status);
    bool payload = r.status == 0 && kind != KVP_DATA_MAP && kind != KVP_DATA_WRITE &&
                   kind != KVP_DATA_WRITEV; /* a HELLO's: its challenge */
    if (!payload || r.length == 0)
        return 1;
    if (r.length > READ_CAP)
        return -1;
    uint8_t *b = malloc(r.length);
    if (b == NULL || kvp_recv_all(d->fd, b, r.length) != KVP_OK) {
        free(b);
        return -1;
    }
    read_bytes += r.length;
    if (tg.grants)
        check_leak(b, r.length, kind_name[kind]);
    free(b);
    return 1;
}

/* HELLO on d: proven with a key held (mutated now and then), or not. false: closed. */
static bool hello(rng_t *r, dconn_t *d, const char *who, bool honest)
{
    const ckey_t *k = NULL;
    for (int t = 0; n_keys > 0 && t < 8 && (k == NULL || k->seg != seg_id); t++)
        k = &keys[below(r, n_keys < KEYS ? n_keys : KEYS)];
    for (size_t i = 0; honest && i < n_keys && i < KEYS; i++)
        if (keys[i].who == who && keys[i].seg == seg_id)
            k = &keys[i];
    kvp_data_req_t h = {.magic = KVP_DATA_MAGIC,
                        .op = KVP_DATA_HELLO,
                        .segment_id = k != NULL ? k->seg : seg_id,
                        .offset = k != NULL ? k->tag : rnd(r) | 1};
    unsigned m = honest ? 99 : (unsigned)below(r, 12);
    if (m == 0)
        h.segment_id += 1 + below(r, 3);
    else if (m == 1)
        h.offset ^= 1ull << below(r, 64);
    else if (m == 2)
        h.length = below(r, 2) ? 32 : rnd(r);
    else if (m == 3)
        h.flags = (uint16_t)rnd(r);
    remember(who, "HELLO", (const uint8_t *)&h, sizeof(h), NULL, 0);
    per[KVP_DATA_HELLO].sent++;
    if (kvp_send_all(d->fd, &h, sizeof(h)) != KVP_OK || !readable(d->fd, WAIT_MS))
        return false;
    kvp_data_resp_t resp;
    if (kvp_recv_all(d->fd, &resp, sizeof(resp)) != KVP_OK)
        return false;
    tally(KVP_DATA_HELLO, resp.status);
    if (resp.status != 0)
        return resp.status == KVP_ERR_SEGMENT_GONE;
    if (resp.length == 0)
        return true; /* grants off: nothing to prove */
    uint8_t chal[KVP_GRANT_CHALLENGE_LEN], proof[KVP_GRANT_PROOF_LEN];
    if (resp.length != sizeof(chal) || kvp_recv_all(d->fd, chal, sizeof(chal)) != KVP_OK)
        return false;
    if (k == NULL || !kvp_grant_hello_proof(k->key, chal, h.segment_id, h.offset, proof))
        for (size_t i = 0; i < sizeof(proof); i++)
            proof[i] = (uint8_t)rnd(r);
    else if (m == 4)
        proof[below(r, sizeof(proof))] ^= (uint8_t)(1u << below(r, 8));
    size_t n = m == 5 ? below(r, sizeof(proof)) : sizeof(proof); /* cut: the owner waits */
    if (kvp_send_all(d->fd, proof, n) != KVP_OK)
        return false;
    d->proven = k != NULL && m > 5;
    d->key = k;
    cur_tag = d->proven ? k->tag : 0; /* its grants first: the paths that pass, then on */
    return n == sizeof(proof);
}

/* ---- one frame ---- */

static uint8_t
    frame[KVP_DATA_VEC_MAX * (sizeof(kvp_data_vec_t) + KVP_GRANT_LEN) + (1u << 16) + PAYLOAD_CAP];

static const extent_t *forced; /* an honest write of this extent (acquire) */

static const extent_t *pick(rng_t *r, uint8_t op)
{
    size_t n = n_held < HELD ? n_held : HELD;
    if (forced != NULL)
        return forced;
    if (n == 0)
        return NULL;
    for (int t = 0; t < 16; t++) {
        const extent_t *e = &held[below(r, n)];
        if ((e->op == op || chance(r, 6)) && (e->seg == seg_id || chance(r, 8)) &&
            (cur_tag == 0 || e->tag == cur_tag || chance(r, 4)))
            return e;
    }
    return &held[below(r, n)];
}

static uint64_t gen_u64(rng_t *r, uint64_t near)
{
    switch (below(r, 10)) {
    case 0:
        return 0;
    case 1:
        return near + 1 + below(r, 4096);
    case 2:
        return near - 1 - below(r, 4096);
    case 3:
        return UINT64_MAX - below(r, 4096);
    case 4:
        return below(r, seg_size + 1);
    case 5:
        return seg_size - below(r, 64);
    case 6:
        return rnd(r);
    default:
        return near;
    }
}

/* Without grants a write may land only on tenant B's own ended objects (or miss the
 * segment): anything else would be the owner doing as told, not a finding. */
static void keep_writes_to_b(rng_t *r, kvp_data_vec_t *v)
{
    if (tg.grants || v->segment_id != seg_id)
        return;
    for (size_t i = 0; i < n_held && i < HELD; i++)
        if (held[i].ended && held[i].seg == v->segment_id && v->offset >= held[i].off &&
            v->length <= held[i].len && v->offset - held[i].off <= held[i].len - v->length)
            return;
    for (int t = 0; t < 8; t++) {
        const extent_t *e = &held[below(r, n_held < HELD ? n_held : HELD)];
        if (n_held && e->ended && e->seg == seg_id) {
            *v = (kvp_data_vec_t){.segment_id = e->seg, .offset = e->off, .length = e->len};
            return;
        }
    }
    v->segment_id = seg_id + 1; /* a stale segment: refused before anything is read */
}

/*
 * Build one frame of `kind` (a data op, 10: an unknown op, 11: a bad magic) in frame[],
 * honest or mutated: its length.
 */
static size_t build(rng_t *r, int kind, bool honest)
{
    kvp_data_req_t *h = (kvp_data_req_t *)frame;
    size_t len = sizeof(*h);
    bool vec = kind == KVP_DATA_READV || kind == KVP_DATA_WRITEV ||
               (kind >= KVP_DATA_BIND_READ && kind <= KVP_DATA_UNBIND);
    bool write = kind == KVP_DATA_WRITE || kind == KVP_DATA_WRITEV || kind == KVP_DATA_BIND_WRITE;
    uint8_t gop = kind == KVP_DATA_MAP ? KVP_GRANT_MAP : write ? KVP_GRANT_WRITE : KVP_GRANT_READ;
    *h = (kvp_data_req_t){.magic = KVP_DATA_MAGIC, .op = (uint16_t)kind};
    if (kind == 10)
        h->op = (uint16_t)(10 + below(r, 65526));
    if (kind == 11)
        h->magic = (uint32_t)rnd(r);
    /* the extents: granted ones, or mutated */
    uint64_t n = vec ? 1 + below(r, 4) : 1, wire_n = n;
    if (vec && !honest && chance(r, 8)) {
        static const uint64_t counts[] = {0, 256, 257, 65536, UINT32_MAX + 1ull, UINT64_MAX};
        wire_n = counts[below(r, sizeof(counts) / sizeof(counts[0]))];
        if (wire_n <= KVP_DATA_VEC_MAX)
            n = wire_n;
    }
    if (n > KVP_DATA_VEC_MAX)
        n = KVP_DATA_VEC_MAX;
    kvp_data_vec_t v[KVP_DATA_VEC_MAX];
    const extent_t *ex[KVP_DATA_VEC_MAX];
    uint64_t total = 0;
    for (uint64_t i = 0; i < n; i++) {
        const extent_t *e = ex[i] = pick(r, gop);
        v[i] = e != NULL
                   ? (kvp_data_vec_t){.segment_id = e->seg, .offset = e->off, .length = e->len}
                   : (kvp_data_vec_t){.segment_id = seg_id,
                                      .offset = below(r, seg_size),
                                      .length = 1 + below(r, 65536)};
        if (kind == KVP_DATA_MAP)
            v[i] = (kvp_data_vec_t){.segment_id = seg_id, .offset = 0, .length = seg_size};
        if (!honest && chance(r, 3)) {
            switch (below(r, 3)) {
            case 0:
                v[i].segment_id = gen_u64(r, v[i].segment_id);
                break;
            case 1:
                v[i].offset = gen_u64(r, v[i].offset);
                break;
            default:
                v[i].length = gen_u64(r, v[i].length);
            }
        }
        if (write && !honest) /* an honest write is of B's own new object */
            keep_writes_to_b(r, &v[i]);
        total += v[i].length;
    }
    if (vec) {
        h->segment_id = kind >= KVP_DATA_BIND_READ ? below(r, 4) : 0;
        h->offset = wire_n;
        h->length = total;
        memcpy(frame + len, v, n * sizeof(v[0]));
        len += n * sizeof(v[0]);
    } else {
        h->segment_id = v[0].segment_id;
        h->offset = v[0].offset;
        h->length = v[0].length;
    }
    if (vec && !honest && chance(r, 10)) /* not the entries' sum (READ/WRITE: mutated above) */
        h->length = gen_u64(r, h->length);
    /* the grants */
    unsigned how = (unsigned)below(r, 10); /* 0-4 single, 5-6 set, 7-8 same, 9 none */
    if (ex[0] != NULL && ex[0]->set >= 0 && (honest || chance(r, 2)))
        how = honest ? 5 : 5 + (unsigned)below(r, 4);
    else if (honest)
        how = 0;
    if (!tg.grants && !honest && chance(r, 2))
        how = 9;
    if (how <= 4) {
        h->flags = KVP_DATA_F_GRANT;
        for (uint64_t i = 0; i < n; i++) {
            uint8_t *g = frame + len;
            if (ex[i] != NULL && ex[i]->single)
                memcpy(g, ex[i]->grant, KVP_GRANT_LEN);
            else
                for (size_t k = 0; k < KVP_GRANT_LEN; k++)
                    g[k] = (uint8_t)rnd(r);
            if (!honest && chance(r, 6))
                g[below(r, KVP_GRANT_LEN)] ^= (uint8_t)(1u << below(r, 8));
            len += KVP_GRANT_LEN;
        }
    } else if (how <= 8) {
        const gset_t *s = ex[0] != NULL && ex[0]->set >= 0 ? &sets[ex[0]->set]
                          : n_sets ? &sets[below(r, n_sets < SETS ? n_sets : SETS)]
                                   : NULL;
        h->flags = how <= 6 ? KVP_DATA_F_GRANT_SET : KVP_DATA_F_GRANT_SAME;
        if (how <= 6 && s != NULL && s->len <= (1u << 16)) {
            size_t sl = s->len;
            memcpy(frame + len, s->b, sl);
            if (!honest && chance(r, 5))
                frame[len + below(r, sl)] ^= (uint8_t)(1u << below(r, 8));
            if (!honest && chance(r, 8)) { /* a count that lies */
                uint32_t c = (uint32_t)gen_u64(r, ((const kvp_grant_set_hdr_t *)s->b)->count);
                memcpy(frame + len + 4, &c, 4);
            }
            len += sl;
        }
        for (uint64_t i = 0; i < n; i++) {
            uint32_t idx = ex[i] != NULL && ex[i]->set >= 0 ? ex[i]->idx : (uint32_t)below(r, 8);
            if (!honest && chance(r, 8))
                idx = (uint32_t)gen_u64(r, idx);
            memcpy(frame + len, &idx, 4);
            len += 4;
        }
    }
    if (!honest && chance(r, 30))
        h->flags = (uint16_t)rnd(r);
    /* the payload: tenant B's bytes, as much as the header says (up to PAYLOAD_CAP) */
    if (write && kind != KVP_DATA_BIND_WRITE) {
        size_t p = h->length < PAYLOAD_CAP ? (size_t)h->length : PAYLOAD_CAP;
        memset(frame + len, 'B', p);
        len += p;
    }
    return len;
}

/* Send one frame (honest, or mutated, cut, trickled) and read its reply. false: the
 * connection is over. */
static bool one_frame(rng_t *r, dconn_t *d, const char *who, bool honest, int kind)
{
    size_t len = build(r, kind, honest);
    remember(who, kind_name[kind], frame, len < 32 ? len : 32, frame + 32, len > 32 ? len - 32 : 0);
    per[kind].sent++;
    unsigned how = honest ? 99 : (unsigned)below(r, 40);
    if (how == 0) { /* cut, then closed or half-closed: the owner must let go */
        per[kind].cut++;
        kvp_send_all(d->fd, frame, below(r, len));
        if (chance(r, 2)) {
            shutdown(d->fd, SHUT_WR);
            n_half++;
            while (reply(d, kind, WAIT_MS) > 0)
                ;
        }
        return false;
    }
    if (how == 1) { /* trickled: a byte at a time, a few, then given up */
        per[kind].trickled++;
        size_t n = 1 + below(r, len < 40 ? len : 40);
        for (size_t i = 0; i < n; i++) {
            if (kvp_send_all(d->fd, frame + i, 1) != KVP_OK)
                return false;
            usleep(2000);
        }
        if (n == len)
            reply(d, kind, 200);
        return false;
    }
    if (kvp_send_all(d->fd, frame, len) != KVP_OK) {
        per[kind].closed++;
        return false;
    }
    if (how == 2) { /* half-closed behind a whole frame: its reply still comes, then EOF */
        shutdown(d->fd, SHUT_WR);
        n_half++;
    }
    if (kind == KVP_DATA_UNBIND)
        return how != 2 && !readable(d->fd, 20); /* no answer: a close, or nothing */
    int got = reply(d, kind, honest ? WAIT_MS : 1000);
    if (got > 0 && kind == KVP_DATA_HELLO) { /* a second HELLO: a proof of nothing */
        uint8_t proof[KVP_GRANT_PROOF_LEN];
        for (size_t i = 0; i < sizeof(proof); i++)
            proof[i] = (uint8_t)rnd(r);
        if (kvp_send_all(d->fd, proof, sizeof(proof)) != KVP_OK)
            return false;
    }
    if (got < 0)
        per[kind].closed++;
    else if (got == 0)
        per[kind].unanswered++; /* a late reply would be read as the next one's: dropped */
    return got > 0 && how != 2 && kind != KVP_DATA_MAP;
}

/* ---- tenant B's grants from the master ---- */

/* Put 1..4 objects of B's (hard-pinned), written honestly over a proven connection, and
 * end them; or GetReplicaList some of them. */
static void acquire(rng_t *r, conn_t *c, const char *who)
{
    char names[4][32];
    ProtobufCBinaryData kb[4];
    size_t nk = 1 + below(r, 4);
    bool put = n_ended == 0 || chance(r, 2);
    for (size_t i = 0; i < nk; i++) {
        uint64_t num = put ? b_next++ : b_ended[below(r, n_ended < B_KEYS ? n_ended : B_KEYS)];
        snprintf(names[i], sizeof(names[i]), "b/ofz/%" PRIu64, num);
        kb[i] = (ProtobufCBinaryData){.len = strlen(names[i]), .data = (uint8_t *)names[i]};
    }
    uint8_t *resp = NULL, *body = NULL;
    size_t resp_len = 0;
    int set_of[8];
    if (!put) {
        Kvpool__KeysRequest kr = KVPOOL__KEYS_REQUEST__INIT;
        kr.n_keys = nk;
        kr.keys = kb;
        body = malloc(kvpool__keys_request__get_packed_size(&kr));
        size_t bl = body ? kvpool__keys_request__pack(&kr, body) : 0;
        if (!master_call(c, KVP_RPC_GET_REPLICA_LIST, body, bl, &resp, &resp_len)) {
            n_refused_calls++;
            goto out;
        }
        Kvpool__GetReplicaListResponse *g =
            kvpool__get_replica_list_response__unpack(NULL, resp_len, resp);
        if (g == NULL)
            goto out;
        learn_sets(g->segments, g->n_segments, set_of, who);
        for (size_t i = 0; i < g->n_results; i++)
            if (g->results[i]->status == 0) {
                learn_replicas(g->results[i]->replicas, g->results[i]->n_replicas, g->segments,
                               g->n_segments, set_of, KVP_GRANT_READ, true);
                n_gets++;
            }
        kvpool__get_replica_list_response__free_unpacked(g, NULL);
        goto out;
    }
    uint64_t sizes[4];
    for (size_t i = 0; i < nk; i++)
        sizes[i] = 512 + below(r, 16384);
    Kvpool__PutConfig pc = KVPOOL__PUT_CONFIG__INIT;
    pc.pin = 2;
    pc.medium = chance(r, 3) ? "ssd" : ""; /* straight to the owner's SSD segment, if any */
    Kvpool__PutStartRequest ps = KVPOOL__PUT_START_REQUEST__INIT;
    ps.n_keys = ps.n_sizes = nk;
    ps.keys = kb;
    ps.sizes = sizes;
    ps.config = &pc;
    body = malloc(kvpool__put_start_request__get_packed_size(&ps));
    size_t bl = body ? kvpool__put_start_request__pack(&ps, body) : 0;
    if (!master_call(c, KVP_RPC_PUT_START, body, bl, &resp, &resp_len)) {
        n_refused_calls++;
        goto out;
    }
    Kvpool__PutStartResponse *p = kvpool__put_start_response__unpack(NULL, resp_len, resp);
    if (p == NULL)
        goto out;
    learn_sets(p->segments, p->n_segments, set_of, who);
    size_t first = n_held, at[4] = {0}, got[4] = {0}; /* key i's extents: held[at, at + got) */
    for (size_t i = 0; i < p->n_results && i < nk; i++) {
        at[i] = n_held;
        if (p->results[i]->status == 0)
            learn_replicas(p->results[i]->replicas, p->results[i]->n_replicas, p->segments,
                           p->n_segments, set_of, KVP_GRANT_WRITE, false);
        got[i] = n_held - at[i];
    }
    kvpool__put_start_response__free_unpacked(p, NULL);
    /* write them honestly (B's bytes, 'B' all through), or now and then not at all: an
     * object ended unwritten holds what its extent held before (of whichever tenant) */
    for (size_t i = first; i < n_held && !(unwritten_puts && chance(r, 4)); i++) {
        const seg_t *sg = NULL;
        for (size_t k = 0; k < n_segs && k < SEGS; k++)
            if (segs[k].id == held[i % HELD].seg)
                sg = &segs[k];
        dconn_t d;
        if (sg == NULL || !dconn_open(&d, false, sg))
            continue;
        seg_id = sg->id;
        seg_size = sg->size;
        if (hello(r, &d, who, true)) {
            forced = &held[i % HELD];
            one_frame(r, &d, who, true, KVP_DATA_WRITE);
            forced = NULL;
        }
        dconn_close(&d);
    }
    /* and end them */
    uint32_t crc[4];
    static uint8_t bytes[16384 + 512];
    memset(bytes, 'B', sizeof(bytes));
    for (size_t i = 0; i < nk; i++)
        crc[i] = kvp_crc32c(0, bytes, sizes[i]);
    Kvpool__PutEndRequest pe = KVPOOL__PUT_END_REQUEST__INIT;
    pe.n_keys = pe.n_crc32c = nk;
    pe.keys = kb;
    pe.crc32c = crc;
    free(body);
    free(resp);
    resp = NULL;
    body = malloc(kvpool__put_end_request__get_packed_size(&pe));
    bl = body ? kvpool__put_end_request__pack(&pe, body) : 0;
    if (master_call(c, KVP_RPC_PUT_END, body, bl, &resp, &resp_len)) {
        Kvpool__StatusesResponse *s = kvpool__statuses_response__unpack(NULL, resp_len, resp);
        for (size_t i = 0; s != NULL && i < s->n_statuses && i < nk; i++) {
            if (s->statuses[i] != 0)
                continue;
            n_puts++;
            b_ended[n_ended++ % B_KEYS] = (uint64_t)strtoull(names[i] + 6, NULL, 10);
            for (size_t k = at[i]; k < at[i] + got[i]; k++)
                held[k % HELD].ended = true;
        }
        if (s != NULL)
            kvpool__statuses_response__free_unpacked(s, NULL);
    }
out:
    free(body);
    free(resp);
}

/* Many idle or half-spoken connections at once, held a moment, closed. */
static void burst(rng_t *r)
{
    int fds[BURST];
    size_t n = 0;
    bool shm = tg.shm != NULL && chance(r, 3);
    n_bursts++;
    for (; n < BURST; n++) {
        dconn_t d;
        if (!dconn_open(&d, shm, shm ? NULL : choose_seg(r, false)))
            break;
        fds[n] = d.fd;
        if (chance(r, 2)) {
            kvp_data_req_t h = {.magic = KVP_DATA_MAGIC, .op = KVP_DATA_HELLO};
            send(d.fd, &h, below(r, sizeof(h)), MSG_NOSIGNAL);
        }
    }
    usleep(100000);
    for (size_t i = 0; i < n; i++)
        close(fds[i]);
}

void owner_fuzz_one(rng_t *r, conn_t *c, const char *who)
{
    if (c != NULL && (n_held == 0 || chance(r, 6)))
        acquire(r, c, who);
    if (chance(r, 150)) {
        burst(r);
        return;
    }
    bool shm = tg.shm != NULL && chance(r, 4);
    const seg_t *sg = choose_seg(r, shm);
    cur_tag = 0;
    dconn_t d;
    if (!dconn_open(&d, shm, sg))
        return;
    bool alive = chance(r, 6) || hello(r, &d, who, chance(r, 2));
    for (unsigned i = 0, n = 1 + (unsigned)below(r, 8); alive && i < n; i++) {
        static const int weight[] = {1, 1, 1, 2, 2, 3, 3, 4, 4, 5, 6, 7, 8, 9, 10, 11};
        int kind = weight[below(r, sizeof(weight) / sizeof(weight[0]))];
        alive = one_frame(r, &d, who, false, kind);
    }
    dconn_close(&d);
}

size_t owner_report(char *out, size_t cap)
{
    size_t n = 0;
#define OUT(...)                                                                                   \
    do {                                                                                           \
        int w_ = snprintf(out + n, cap - n, __VA_ARGS__);                                          \
        if (w_ > 0 && (size_t)w_ < cap - n)                                                        \
            n += (size_t)w_;                                                                       \
    } while (0)
    OUT("owner frames");
    for (int k = 1; k < KINDS; k++) {
        OUT(" %s %" PRIu64 " {", kind_name[k], per[k].sent);
        for (int s = 0, any = 0; s < 64; s++)
            if (per[k].by_status[s])
                OUT("%s%d: %" PRIu64, any++ ? ", " : "", s == 63 ? 1 : -s, per[k].by_status[s]);
        OUT("} cut %" PRIu64 " trickled %" PRIu64 " closed %" PRIu64 " unanswered %" PRIu64 ";",
            per[k].cut, per[k].trickled, per[k].closed, per[k].unanswered);
    }
    OUT(" connections tcp %" PRIu64 " (SSD segment %" PRIu64 ") shm %" PRIu64 ", bursts %" PRIu64
        ", half-closed %" PRIu64 "; tenant B's puts %" PRIu64 " gets %" PRIu64
        " (calls refused %" PRIu64 "), segments %zu, extents held %zu, keys %zu, read %" PRIu64
        " bytes, grants %s)",
        n_tcp, n_ssd, n_shm, n_bursts, n_half, n_puts, n_gets, n_refused_calls, n_segs,
        n_held < HELD ? n_held : HELD, n_keys < KEYS ? n_keys : KEYS, read_bytes,
        tg.grants ? "on" : "off");
#undef OUT
    return n;
}
