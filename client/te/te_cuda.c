/*
 * te_cuda.c - a transfer engine's registered CUDA device memory, as a target (te_cuda.h):
 * a peer's writes into it received into pinned host staging buffers and copied to the
 * device, its reads copied out of the device into them and sent. (An initiator's device
 * memory is staged by its transfer engine, client/transfer/staging.c; the _on_cuda forms
 * are in te.c.)
 *
 * Thread: any, as the data server's connections.
 */
#include "client/include/kvpool_te.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "client/mem/gpu.h"
#include "client/te/te_cuda.h"
#include "common/log.h"
#include "common/sock.h"

/* ---- a target's registered device memory ---- */

#define TE_CUDA_CHUNK ((size_t)256 << 10)
#define TE_CUDA_SLOTS 16

typedef struct te_cuda_slot {
    uint8_t *buf;           /* pinned, 2 * TE_CUDA_CHUNK */
    kvp_gpu_stream_t *s[2]; /* one copy stream per half, of GPU `ordinal` */
    int ordinal;            /* -1: no streams yet */
} te_cuda_slot_t;

struct te_cuda {
    _Atomic size_t n_dev; /* device regions registered */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    te_cuda_slot_t *all[TE_CUDA_SLOTS], *free[TE_CUDA_SLOTS];
    size_t n_all, n_free;
};

kvp_status_t kvp_te_cuda_new(te_cuda_t **c_p)
{
    te_cuda_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return KVP_ERR_NOMEM;
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->cond, NULL);
    *c_p = c;
    return KVP_OK;
}

static void slot_streams_free(te_cuda_slot_t *sl)
{
    for (int h = 0; h < 2; h++) {
        kvp_gpu_stream_destroy(sl->s[h]);
        sl->s[h] = NULL;
    }
    sl->ordinal = -1;
}

void kvp_te_cuda_free(te_cuda_t *c)
{
    if (c == NULL)
        return;
    for (size_t i = 0; i < c->n_all; i++) {
        slot_streams_free(c->all[i]);
        kvp_gpu_host_free(c->all[i]->buf);
        free(c->all[i]);
    }
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->cond);
    free(c);
}

static bool vec_dev(kvp_transfer_t *xfer, const kvp_data_vec_t *v)
{
    const kvp_mem_region_t *r;
    return kvp_transfer_mem_find(xfer, (void *)(uintptr_t)v->offset, v->length, &r) == KVP_MEM_CUDA;
}

bool kvp_te_cuda_vecs(te_cuda_t *c, kvp_transfer_t *xfer, const kvp_data_vec_t *v, size_t n)
{
    if (c == NULL || atomic_load(&c->n_dev) == 0)
        return false;
    for (size_t i = 0; i < n; i++)
        if (vec_dev(xfer, &v[i]))
            return true;
    return false;
}

void kvp_te_cuda_registered(te_cuda_t *c)
{
    atomic_fetch_add(&c->n_dev, 1);
}

void kvp_te_cuda_unregistered(te_cuda_t *c, kvp_transfer_t *xfer, uintptr_t addr, uint64_t len)
{
    if (c != NULL && kvp_te_cuda_vecs(c, xfer, &(kvp_data_vec_t){.offset = addr, .length = len}, 1))
        atomic_fetch_sub(&c->n_dev, 1);
}

/* A staging slot for this request alone: a free one, a new one while fewer than
 * TE_CUDA_SLOTS exist, else the next one given back. NULL: out of (pinned) memory. */
static te_cuda_slot_t *slot_take(te_cuda_t *c)
{
    te_cuda_slot_t *sl = NULL;
    pthread_mutex_lock(&c->lock);
    while (c->n_free == 0 && c->n_all == TE_CUDA_SLOTS)
        pthread_cond_wait(&c->cond, &c->lock);
    if (c->n_free > 0) {
        sl = c->free[--c->n_free];
        pthread_mutex_unlock(&c->lock);
        return sl;
    }
    sl = calloc(1, sizeof(*sl));
    if (sl != NULL) {
        sl->ordinal = -1;
        if (kvp_gpu_host_alloc(2 * TE_CUDA_CHUNK, (void **)&sl->buf) != KVP_OK) {
            free(sl);
            sl = NULL;
        } else
            c->all[c->n_all++] = sl;
    }
    pthread_mutex_unlock(&c->lock);
    return sl;
}

static void slot_give(te_cuda_t *c, te_cuda_slot_t *sl)
{
    pthread_mutex_lock(&c->lock);
    c->free[c->n_free++] = sl;
    pthread_cond_signal(&c->cond);
    pthread_mutex_unlock(&c->lock);
}

/* The slot's streams on dev's GPU. */
static kvp_status_t slot_streams(te_cuda_slot_t *sl, const void *dev)
{
    int ordinal;
    kvp_status_t st = kvp_gpu_device_ordinal(dev, &ordinal);
    if (st != KVP_OK || ordinal == sl->ordinal)
        return st;
    slot_streams_free(sl);
    for (int h = 0; h < 2; h++)
        if ((st = kvp_gpu_stream_create(dev, &sl->s[h])) != KVP_OK) {
            slot_streams_free(sl);
            return st;
        }
    sl->ordinal = ordinal;
    return KVP_OK;
}

/* A request's bytes for device memory go through the slot's two halves as one stream:
 * pieces of the extents are packed into the half being filled, each with its own async
 * copy on that half's stream, and a half is waited for only when it comes round again
 * (or at the end of the request, or before the slot's streams change GPU), so extents of
 * 64 KiB cost a copy launch each, not a copy's round trip. */
typedef struct te_cuda_ring {
    te_cuda_slot_t *sl;
    int cur;           /* the half being filled */
    size_t fill[2];    /* bytes packed into each half */
    bool pending[2];   /* copies issued on the half's stream, not waited for */
    kvp_status_t cuda; /* the first CUDA failure */
} te_cuda_ring_t;

static void ring_wait(te_cuda_ring_t *r, int h)
{
    if (r->pending[h]) {
        kvp_status_t st = kvp_gpu_stream_sync(r->sl->s[h]);
        if (r->cuda == KVP_OK)
            r->cuda = st;
        r->pending[h] = false;
    }
}

/* The slot's streams on p's GPU; every copy on the old ones waited for first. */
static kvp_status_t ring_streams(te_cuda_ring_t *r, const void *p)
{
    int ordinal;
    kvp_status_t st = kvp_gpu_device_ordinal(p, &ordinal);
    if (st != KVP_OK || ordinal == r->sl->ordinal)
        return st;
    ring_wait(r, 0);
    ring_wait(r, 1);
    return r->cuda != KVP_OK ? r->cuda : slot_streams(r->sl, p);
}

/* Receive len bytes into device memory dst through the ring. False: the socket. */
static bool recv_dev(te_cuda_ring_t *r, int fd, uint8_t *dst, uint64_t len)
{
    for (uint64_t off = 0; off < len;) {
        int h = r->cur;
        if (r->fill[h] == TE_CUDA_CHUNK) { /* full: the other half, once its copies are done */
            h = r->cur ^= 1;
            ring_wait(r, h);
            r->fill[h] = 0;
        }
        size_t room = TE_CUDA_CHUNK - r->fill[h];
        size_t m = len - off < room ? (size_t)(len - off) : room;
        uint8_t *at = r->sl->buf + (size_t)h * TE_CUDA_CHUNK + r->fill[h];
        if (kvp_recv_all(fd, at, m) != KVP_OK)
            return false;
        if (r->cuda == KVP_OK) {
            r->cuda = kvp_gpu_copy_async(r->sl->s[h], dst + off, at, m, true);
            r->pending[h] |= r->cuda == KVP_OK;
        }
        r->fill[h] += m;
        off += m;
    }
    return true;
}

bool kvp_te_cuda_recv(te_cuda_t *c, kvp_transfer_t *xfer, int fd, const kvp_data_vec_t *v, size_t n,
                      kvp_status_t *reply_p)
{
    te_cuda_ring_t r = {.sl = slot_take(c), .cuda = KVP_OK};
    if (r.sl == NULL)
        r.cuda = KVP_ERR_NOMEM;
    bool ok = true;
    for (size_t i = 0; i < n && ok; i++) {
        uint8_t *p = (uint8_t *)(uintptr_t)v[i].offset;
        if (!vec_dev(xfer, &v[i])) {
            ok = kvp_recv_all(fd, p, v[i].length) == KVP_OK;
            continue;
        }
        if (r.cuda == KVP_OK)
            r.cuda = ring_streams(&r, p);
        /* after a failure the rest is drained: the peer reads the refusal */
        ok = r.cuda == KVP_OK ? recv_dev(&r, fd, p, v[i].length)
                              : kvp_recv_discard(fd, v[i].length) == KVP_OK;
    }
    if (r.sl != NULL) {
        ring_wait(&r, 0);
        ring_wait(&r, 1);
        slot_give(c, r.sl);
    }
    if (ok && r.cuda != KVP_OK) {
        KVP_LOG_ERROR("transfer engine: a peer's write into device memory failed: %s",
                      kvp_strerror(r.cuda));
        *reply_p = KVP_ERR_IO;
    }
    return ok;
}

/* Send half h's bytes, if it holds any, once its copies are done; it is then empty.
 * False: a CUDA failure or the socket. */
static bool ring_send(te_cuda_ring_t *r, int fd, int h)
{
    ring_wait(r, h);
    if (r->cuda != KVP_OK)
        return false;
    bool ok = r->fill[h] == 0 ||
              kvp_send_all(fd, r->sl->buf + (size_t)h * TE_CUDA_CHUNK, r->fill[h]) == KVP_OK;
    r->fill[h] = 0;
    return ok;
}

/* Everything packed, in order: the older half, then the one being filled. */
static bool ring_flush(te_cuda_ring_t *r, int fd)
{
    return ring_send(r, fd, r->cur ^ 1) && ring_send(r, fd, r->cur);
}

/* Pack len bytes of device memory src into the ring: each half, once full, is sent while
 * the next is being copied into. False: a CUDA failure or the socket. */
static bool send_dev(te_cuda_ring_t *r, int fd, const uint8_t *src, uint64_t len)
{
    for (uint64_t off = 0; off < len;) {
        int h = r->cur;
        if (r->fill[h] == TE_CUDA_CHUNK) { /* full: send the older half, fill it next */
            if (!ring_send(r, fd, h ^ 1))
                return false;
            h = r->cur ^= 1;
        }
        size_t room = TE_CUDA_CHUNK - r->fill[h];
        size_t m = len - off < room ? (size_t)(len - off) : room;
        r->cuda = kvp_gpu_copy_async(
            r->sl->s[h], r->sl->buf + (size_t)h * TE_CUDA_CHUNK + r->fill[h], src + off, m, false);
        if (r->cuda != KVP_OK)
            return false;
        r->pending[h] = true;
        r->fill[h] += m;
        off += m;
    }
    return true;
}

bool kvp_te_cuda_send(te_cuda_t *c, kvp_transfer_t *xfer, int fd, const kvp_data_vec_t *v, size_t n,
                      uint64_t total)
{
    te_cuda_ring_t r = {.sl = slot_take(c), .cuda = KVP_OK};
    if (r.sl == NULL)
        return false;
    kvp_data_resp_t resp = {.magic = KVP_DATA_MAGIC, .status = 0, .length = total};
    bool ok = kvp_send_all(fd, &resp, sizeof(resp)) == KVP_OK;
    for (size_t i = 0; i < n && ok; i++) {
        const uint8_t *p = (const uint8_t *)(uintptr_t)v[i].offset;
        if (!vec_dev(xfer, &v[i])) /* after what is packed before it */
            ok = ring_flush(&r, fd) && kvp_send_all(fd, p, v[i].length) == KVP_OK;
        else
            ok = (r.cuda = ring_streams(&r, p)) == KVP_OK && send_dev(&r, fd, p, v[i].length);
    }
    ok = ok && ring_flush(&r, fd);
    /* no half is left in flight when the slot is given back */
    ring_wait(&r, 0);
    ring_wait(&r, 1);
    slot_give(c, r.sl);
    return ok;
}
