/*
 * decode.c - KV event batches from msgpack (decode.h).
 *
 * Design. A cursor reads the payload in place, once: nothing is allocated per batch (the
 * op, hash and token arrays grow to the largest batch seen and stay), no object tree is
 * built, and a container header is taken only when its count fits in the bytes left
 * (each element needs one), so a few bytes that claim 2^32 elements cost nothing. Values
 * we do not use are skipped iteratively (a count of elements still to skip, no
 * recursion), so nesting cannot exhaust the stack. The events' hashes and token ids are
 * read into the decoder's arrays as they are checked (token ids by a reader of their
 * common forms); the index takes them through the batch's callbacks (decode_hashes,
 * decode_tokens) once it applies the batch, which the caller does only when the whole
 * batch decoded.
 *
 * Hashes: an integer (negative ones as their two's complement), or bytes (bin or str,
 * 1..64 bytes) read as the u64 of their last 8 bytes, big-endian.
 *
 * Thread: the decoder's caller.
 */
#include "indexer/decode.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct cur {
    const uint8_t *p, *end;
} cur_t;

static size_t left(const cur_t *c)
{
    return (size_t)(c->end - c->p);
}

static bool take(cur_t *c, size_t n, const uint8_t **out)
{
    if (left(c) < n)
        return false;
    if (out != NULL)
        *out = c->p;
    c->p += n;
    return true;
}

static uint64_t be(const uint8_t *b, size_t n)
{
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++)
        v = (v << 8) | b[i];
    return v;
}

/* A number of n bytes big-endian after the type byte. */
static bool num(cur_t *c, size_t n, uint64_t *v)
{
    const uint8_t *b;
    if (!take(c, n, &b))
        return false;
    *v = be(b, n);
    return true;
}

static bool peek(const cur_t *c, uint8_t *t)
{
    if (c->p >= c->end)
        return false;
    *t = *c->p;
    return true;
}

static bool nil(cur_t *c)
{
    uint8_t t;
    if (!peek(c, &t) || t != 0xc0)
        return false;
    c->p++;
    return true;
}

/* A container header: its count (a map's: entries) when it fits in what is left. */
static bool container(cur_t *c, bool map, size_t *n_p)
{
    uint8_t t;
    if (!peek(c, &t))
        return false;
    uint64_t n;
    if (!map && t >= 0x90 && t <= 0x9f) {
        c->p++;
        n = t & 0x0f;
    } else if (map && t >= 0x80 && t <= 0x8f) {
        c->p++;
        n = t & 0x0f;
    } else if (t == (map ? 0xde : 0xdc)) {
        c->p++;
        if (!num(c, 2, &n))
            return false;
    } else if (t == (map ? 0xdf : 0xdd)) {
        c->p++;
        if (!num(c, 4, &n))
            return false;
    } else {
        return false;
    }
    if (n > left(c) / (map ? 2 : 1))
        return false;
    *n_p = (size_t)n;
    return true;
}

/* A str or bin: its bytes. */
static bool bytes(cur_t *c, bool str_ok, bool bin_ok, const uint8_t **s, size_t *len)
{
    uint8_t t;
    if (!peek(c, &t))
        return false;
    uint64_t n;
    c->p++;
    if (str_ok && t >= 0xa0 && t <= 0xbf)
        n = t & 0x1f;
    else if ((str_ok && t == 0xd9) || (bin_ok && t == 0xc4)) {
        if (!num(c, 1, &n))
            return false;
    } else if ((str_ok && t == 0xda) || (bin_ok && t == 0xc5)) {
        if (!num(c, 2, &n))
            return false;
    } else if ((str_ok && t == 0xdb) || (bin_ok && t == 0xc6)) {
        if (!num(c, 4, &n))
            return false;
    } else {
        c->p--;
        return false;
    }
    return n <= left(c) && take(c, (size_t)n, s) && (*len = (size_t)n, true);
}

static bool str(cur_t *c, const uint8_t **s, size_t *len)
{
    return bytes(c, true, false, s, len);
}

/* An integer; *neg: it was negative (*v its two's complement). */
static bool integer(cur_t *c, uint64_t *v, bool *neg)
{
    uint8_t t;
    if (!peek(c, &t))
        return false;
    *neg = false;
    if (t <= 0x7f) {
        c->p++;
        *v = t;
        return true;
    }
    if (t >= 0xe0) {
        c->p++;
        *v = (uint64_t)(int64_t)(int8_t)t;
        *neg = true;
        return true;
    }
    static const uint8_t width[] = {1, 2, 4, 8};
    if (t >= 0xcc && t <= 0xcf) {
        c->p++;
        return num(c, width[t - 0xcc], v);
    }
    if (t >= 0xd0 && t <= 0xd3) {
        c->p++;
        size_t w = width[t - 0xd0];
        if (!num(c, w, v))
            return false;
        if (w < 8 && (*v >> (8 * w - 1)) & 1) /* sign-extend */
            *v |= ~0ull << (8 * w);
        *neg = (int64_t)*v < 0;
        return true;
    }
    return false;
}

static bool uint_max(cur_t *c, uint64_t max, uint64_t *v)
{
    bool neg;
    return integer(c, v, &neg) && !neg && *v <= max;
}

/* A block hash: an integer or 1..64 bytes. */
static bool hash(cur_t *c, uint64_t *v)
{
    bool neg;
    if (integer(c, v, &neg))
        return true;
    const uint8_t *b;
    size_t n;
    if (!bytes(c, true, true, &b, &n) || n == 0 || n > 64)
        return false;
    *v = n >= 8 ? be(b + n - 8, 8) : be(b, n);
    return true;
}

/* Skip one value, of any depth, without recursion. */
static bool skip(cur_t *c)
{
    uint64_t pending = 1;
    while (pending > 0) {
        uint8_t t;
        if (!peek(c, &t))
            return false;
        pending--;
        size_t n;
        uint64_t v;
        bool neg;
        const uint8_t *b;
        if ((t >= 0x90 && t <= 0x9f) || t == 0xdc || t == 0xdd) {
            if (!container(c, false, &n))
                return false;
            pending += n;
        } else if ((t >= 0x80 && t <= 0x8f) || t == 0xde || t == 0xdf) {
            if (!container(c, true, &n))
                return false;
            pending += 2 * (uint64_t)n;
        } else if (t == 0xc0 || t == 0xc2 || t == 0xc3) {
            c->p++;
        } else if (t == 0xca || t == 0xcb) {
            c->p++;
            if (!take(c, t == 0xca ? 4 : 8, NULL))
                return false;
        } else if (t >= 0xd4 && t <= 0xd8) { /* fixext: type + 1..16 bytes */
            c->p++;
            if (!take(c, 1 + (1u << (t - 0xd4)), NULL))
                return false;
        } else if (t >= 0xc7 && t <= 0xc9) { /* ext 8/16/32 */
            c->p++;
            if (!num(c,
                     t == 0xc7   ? 1
                     : t == 0xc8 ? 2
                                 : 4,
                     &v) ||
                !take(c, 1, NULL) || v > left(c) || !take(c, (size_t)v, NULL))
                return false;
        } else if (integer(c, &v, &neg)) {
            ;
        } else if (!bytes(c, true, true, &b, &n)) {
            return false; /* 0xc1, never used */
        }
        if (pending > left(c))
            return false;
    }
    return true;
}

static bool is(const uint8_t *s, size_t len, const char *lit)
{
    return strlen(lit) == len && memcmp(s, lit, len) == 0;
}

/* Room for n more elements of size sz in a growable array (the decoder keeps it); NULL
 * when out of memory (d->oom), or for none while the array is still empty. */
static void *room(kvp_decoder_t *d, void **buf, size_t *cap, size_t used, size_t n, size_t sz)
{
    if (used + n > *cap) {
        size_t c = *cap ? *cap : 4096;
        while (c < used + n)
            c *= 2;
        void *b = realloc(*buf, c * sz);
        if (b == NULL) {
            d->oom = true;
            return NULL;
        }
        *buf = b;
        *cap = c;
    }
    return *buf != NULL ? (char *)*buf + used * sz : NULL;
}

/* An array of hashes, read into the decoder's hash array: *at where they start there,
 * *n how many. */
static bool hash_array(kvp_decoder_t *d, cur_t *c, size_t *at, size_t *n)
{
    if (!container(c, false, n))
        return false;
    uint64_t *v = room(d, (void **)&d->hv, &d->cap_hv, d->n_hv, *n, sizeof(*v));
    if (v == NULL && *n > 0)
        return false;
    for (size_t i = 0; i < *n; i++)
        if (!hash(c, &v[i]))
            return false;
    *at = d->n_hv;
    d->n_hv += *n;
    return true;
}

/* A token id: the common forms (fixint, uint16, uint32) without the general reader's
 * branches. */
static inline bool token(cur_t *c, uint32_t *v)
{
    if (c->p < c->end) {
        uint8_t t = c->p[0];
        if (t <= 0x7f) {
            *v = t;
            c->p++;
            return true;
        }
        if (t == 0xcd && c->end - c->p >= 3) {
            *v = (uint32_t)c->p[1] << 8 | c->p[2];
            c->p += 3;
            return true;
        }
        if (t == 0xce && c->end - c->p >= 5) {
            *v = (uint32_t)c->p[1] << 24 | (uint32_t)c->p[2] << 16 | (uint32_t)c->p[3] << 8 |
                 c->p[4];
            c->p += 5;
            return true;
        }
    }
    uint64_t w;
    if (!uint_max(c, UINT32_MAX, &w))
        return false;
    *v = (uint32_t)w;
    return true;
}

static bool token_array(kvp_decoder_t *d, cur_t *c, size_t *at, size_t *n)
{
    if (!container(c, false, n))
        return false;
    uint32_t *v = room(d, (void **)&d->tv, &d->cap_tv, d->n_tv, *n, sizeof(*v));
    if (v == NULL && *n > 0)
        return false;
    for (size_t i = 0; i < *n; i++)
        if (!token(c, &v[i]))
            return false;
    *at = d->n_tv;
    d->n_tv += *n;
    return true;
}

/* A string or nil into (*s, *len) (NULL when nil). */
static bool opt_str(cur_t *c, const char **s, size_t *len)
{
    if (nil(c)) {
        *s = NULL;
        *len = 0;
        return true;
    }
    const uint8_t *b;
    if (!str(c, &b, len))
        return false;
    *s = (const char *)b;
    return true;
}

static kvp_idx_op_t *op_new(kvp_decoder_t *d)
{
    if (d->n_ops == d->cap_ops) {
        size_t cap = d->cap_ops ? d->cap_ops * 2 : 64;
        kvp_idx_op_t *ops = realloc(d->ops, cap * sizeof(*ops));
        if (ops == NULL)
            return NULL;
        d->ops = ops;
        d->cap_ops = cap;
    }
    kvp_idx_op_t *op = &d->ops[d->n_ops++];
    memset(op, 0, sizeof(*op));
    return op;
}

typedef enum { EV_OK, EV_BAD, EV_NOMEM, EV_SKIP } ev_t;

/* vLLM's array-like event: [tag, fields...]. */
static ev_t event_array(kvp_decoder_t *d, cur_t *c, size_t n)
{
    const uint8_t *tag;
    size_t tlen;
    if (n == 0 || !str(c, &tag, &tlen))
        return EV_BAD;
    size_t i = 1;
    kvp_idx_op_t op = {0};
    if (is(tag, tlen, "BlockStored")) {
        op.kind = KVP_IDX_STORED;
        /* block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, ... */
        if (n < 4 || !hash_array(d, c, &op.hashes_at, &op.n_hashes))
            return EV_BAD;
        if (!nil(c)) {
            if (!hash(c, &op.parent))
                return EV_BAD;
            op.has_parent = true;
        }
        if (!token_array(d, c, &op.tokens_at, &op.n_tokens))
            return EV_BAD;
        op.has_tokens = true;
        i = 4;
        uint64_t v;
        if (i < n && !(nil(c) || uint_max(c, UINT32_MAX, &v))) /* block_size */
            return EV_BAD;
        i += i < n;
        if (i < n && !skip(c)) /* lora_id */
            return EV_BAD;
        i += i < n;
        if (i < n) { /* medium */
            if (!opt_str(c, &op.medium, &op.medium_len))
                return EV_BAD;
            i++;
        }
    } else if (is(tag, tlen, "BlockRemoved")) {
        op.kind = KVP_IDX_REMOVED;
        if (n < 2 || !hash_array(d, c, &op.hashes_at, &op.n_hashes))
            return EV_BAD;
        i = 2;
        if (i < n) {
            if (!opt_str(c, &op.medium, &op.medium_len))
                return EV_BAD;
            i++;
        }
    } else if (is(tag, tlen, "AllBlocksCleared")) {
        op.kind = KVP_IDX_CLEARED;
        op.all_media = true;
    } else {
        for (; i < n; i++)
            if (!skip(c))
                return EV_BAD;
        d->unknown++;
        return EV_SKIP;
    }
    for (; i < n; i++)
        if (!skip(c))
            return EV_BAD;
    kvp_idx_op_t *o = op_new(d);
    if (o == NULL)
        return EV_NOMEM;
    *o = op;
    return EV_OK;
}

/* An event as a map: vLLM's tagged struct ({"type": ...}) or the standardized envelope
 * ({"event_type": ...}). */
static ev_t event_map(kvp_decoder_t *d, cur_t *c, size_t n)
{
    kvp_idx_op_t op = {0};
    const uint8_t *tag = NULL;
    size_t tlen = 0;
    bool envelope = false, has_hashes = false;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *k;
        size_t klen;
        if (!str(c, &k, &klen))
            return EV_BAD;
        bool ok = true;
        uint64_t v;
        if (is(k, klen, "type") || is(k, klen, "event_type")) {
            envelope = is(k, klen, "event_type");
            ok = str(c, &tag, &tlen);
        } else if (is(k, klen, "block_hashes") || is(k, klen, "seq_hashes")) {
            ok = hash_array(d, c, &op.hashes_at, &op.n_hashes);
            has_hashes = ok;
        } else if (is(k, klen, "parent_block_hash") || is(k, klen, "parent_hash")) {
            if (!nil(c)) {
                ok = hash(c, &op.parent);
                op.has_parent = ok;
            }
        } else if (is(k, klen, "token_ids")) {
            if (!nil(c)) {
                ok = token_array(d, c, &op.tokens_at, &op.n_tokens);
                op.has_tokens = ok;
            }
        } else if (is(k, klen, "medium")) {
            ok = opt_str(c, &op.medium, &op.medium_len);
        } else if (is(k, klen, "tenant_id")) {
            ok = opt_str(c, &op.tenant, &op.tenant_len);
        } else if (is(k, klen, "dp_rank")) {
            if (!nil(c)) {
                ok = uint_max(c, KVP_IDX_RANK_MAX, &v);
                op.has_rank = ok;
                op.rank = (uint32_t)v;
            }
        } else if (is(k, klen, "base_block_idx")) {
            if (!nil(c)) {
                ok = uint_max(c, UINT32_MAX, &op.base);
                op.has_base = ok;
            }
        } else {
            ok = skip(c);
        }
        if (!ok)
            return EV_BAD;
    }
    if (tag == NULL)
        return EV_BAD;
    if (envelope && is(tag, tlen, "stored"))
        op.kind = KVP_IDX_STORED;
    else if (envelope && is(tag, tlen, "removed"))
        op.kind = KVP_IDX_REMOVED;
    else if (envelope && is(tag, tlen, "cleared"))
        op.kind = KVP_IDX_CLEARED;
    else if (!envelope && is(tag, tlen, "BlockStored"))
        op.kind = KVP_IDX_STORED;
    else if (!envelope && is(tag, tlen, "BlockRemoved"))
        op.kind = KVP_IDX_REMOVED;
    else if (!envelope && is(tag, tlen, "AllBlocksCleared")) {
        op.kind = KVP_IDX_CLEARED;
        op.all_media = true;
    } else {
        d->unknown++;
        return EV_SKIP;
    }
    if (op.kind != KVP_IDX_CLEARED && !has_hashes)
        return EV_BAD;
    op.envelope = envelope;
    if (!envelope) { /* vLLM's tenant and rank come from the registration and the batch */
        op.tenant = NULL;
        op.has_rank = false;
        op.has_base = false;
    }
    kvp_idx_op_t *o = op_new(d);
    if (o == NULL)
        return EV_NOMEM;
    *o = op;
    return EV_OK;
}

static ev_t events(kvp_decoder_t *d, cur_t *c)
{
    size_t n;
    if (!container(c, false, &n) || n > KVP_DECODE_EVENTS_MAX)
        return EV_BAD;
    for (size_t i = 0; i < n; i++) {
        uint8_t t;
        size_t m;
        if (!peek(c, &t))
            return EV_BAD;
        ev_t r;
        if ((t >= 0x90 && t <= 0x9f) || t == 0xdc || t == 0xdd)
            r = container(c, false, &m) ? event_array(d, c, m) : EV_BAD;
        else if ((t >= 0x80 && t <= 0x8f) || t == 0xde || t == 0xdf)
            r = container(c, true, &m) ? event_map(d, c, m) : EV_BAD;
        else
            r = EV_BAD;
        if (r == EV_BAD || r == EV_NOMEM)
            return r;
    }
    return EV_OK;
}

static void decode_hashes(void *arg, const kvp_idx_op_t *op, uint64_t *out)
{
    const kvp_decoder_t *d = arg;
    if (op->n_hashes > 0)
        memcpy(out, d->hv + op->hashes_at, op->n_hashes * sizeof(*out));
}

static void decode_tokens(void *arg, const kvp_idx_op_t *op, uint32_t *out)
{
    const kvp_decoder_t *d = arg;
    if (op->n_tokens > 0)
        memcpy(out, d->tv + op->tokens_at, op->n_tokens * sizeof(*out));
}

void kvp_decoder_init(kvp_decoder_t *d)
{
    memset(d, 0, sizeof(*d));
}

void kvp_decoder_cleanup(kvp_decoder_t *d)
{
    free(d->hv);
    free(d->tv);
    free(d->ops);
    memset(d, 0, sizeof(*d));
}

kvp_status_t kvp_decode_batch(kvp_decoder_t *d, const uint8_t *buf, size_t len, kvp_idx_batch_t *b,
                              char *why, size_t why_len)
{
    d->buf = buf;
    d->len = len;
    d->n_ops = d->n_hv = d->n_tv = 0;
    d->oom = false;
    memset(b, 0, sizeof(*b));
    cur_t c = {buf, buf + len};
    size_t n;
    ev_t r = EV_BAD;
    uint8_t t;
    uint64_t v;
    bool bad = false;
    if (peek(&c, &t) && ((t >= 0x90 && t <= 0x9f) || t == 0xdc || t == 0xdd)) {
        /* [ts, events, dp_rank?, ...] */
        if (!container(&c, false, &n) || n < 2 || !skip(&c))
            bad = true;
        else if ((r = events(d, &c)) == EV_OK && n >= 3 && !nil(&c)) {
            if (uint_max(&c, KVP_IDX_RANK_MAX, &v)) {
                b->has_rank = true;
                b->rank = (uint32_t)v;
            } else {
                bad = true;
            }
        }
        for (size_t i = 3; !bad && r == EV_OK && i < n; i++)
            bad = !skip(&c);
    } else if (peek(&c, &t) && container(&c, true, &n)) {
        bool have_events = false;
        for (size_t i = 0; i < n && !bad && (r == EV_OK || !have_events); i++) {
            const uint8_t *k;
            size_t klen;
            if (!str(&c, &k, &klen)) {
                bad = true;
            } else if (is(k, klen, "events")) {
                have_events = true;
                r = events(d, &c);
            } else if (is(k, klen, "data_parallel_rank") && !nil(&c)) {
                if (uint_max(&c, KVP_IDX_RANK_MAX, &v)) {
                    b->has_rank = true;
                    b->rank = (uint32_t)v;
                } else {
                    bad = true;
                }
            } else if (!is(k, klen, "data_parallel_rank") && !skip(&c)) {
                bad = true;
            }
        }
        if (!have_events)
            bad = true;
    } else {
        bad = true;
    }
    if (r == EV_NOMEM || d->oom) {
        snprintf(why, why_len, "out of memory for the batch's events");
        return KVP_ERR_NOMEM;
    }
    if (bad || r != EV_OK || c.p != c.end) {
        snprintf(why, why_len, "a malformed batch (%zu bytes; at byte %zu)", len,
                 (size_t)(c.p - buf));
        d->n_ops = 0;
        return KVP_ERR_PROTOCOL;
    }
    b->ops = d->ops;
    b->n_ops = d->n_ops;
    b->hashes = decode_hashes;
    b->tokens = decode_tokens;
    b->arg = d;
    return KVP_OK;
}
