/*
 * te_cuda.c - Mooncake's `_on_cuda` transfers (kvp_te_transfer_on_cuda, kvpool_te.h) and
 * the device-memory test te.c's route choice needs (te_cuda.h).
 *
 * Mooncake (transfer_engine_py.cpp, batchTransferOnCuda) enqueues a host function on the
 * caller's CUDA stream (cudaLaunchHostFunc) that runs the transfer once the work before it
 * on the stream is done, returns at once, and _exit(1)s the process when the transfer
 * fails. Here the call waits for the caller's stream (cuStreamSynchronize: the data the
 * stream's kernels produced is there, and nothing on it still reads a READ's destination),
 * then moves the ranges as kvp_te_transfer does and returns its status: the bytes have
 * moved when it returns, and a failure is an error code, not the end of the process. A
 * host function may make no CUDA call, and staging device memory needs them; a blocking
 * call is what a host function would do to the stream anyway.
 *
 * Device memory is moved by the transfer engine's staging (client/transfer/staging.c): a
 * pool of stagers, each a ring of pinned host buffers and copy streams made once and
 * reused, copying chunk k+1 while the transport moves chunk k; nothing is allocated per
 * transfer once warm. Host memory among the ranges moves as in kvp_te_transfer (Mooncake
 * moves whatever address it is given, ordered after the stream).
 *
 * Thread: any, as kvp_te_transfer.
 */
#include "client/include/kvpool_te.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "client/mem/gpu.h"
#include "client/te_cuda.h"
#include "common/log.h"
#include "common/sock.h"

bool kvp_te_cuda_locals(kvp_transfer_t *xfer, size_t n, void *const *locals, const uint64_t *lens)
{
    if (!xfer->gpu)
        return false;
    for (size_t i = 0; i < n; i++) {
        const kvp_mem_region_t *r;
        if (kvp_transfer_mem_find(xfer, locals[i], lens[i], &r) == KVP_MEM_CUDA)
            return true;
    }
    return false;
}

kvp_status_t kvp_te_transfer_on_cuda(kvp_te_t *te, const char *target, int opcode, size_t n,
                                     void *const *locals, const uint64_t *remotes,
                                     const uint64_t *lens, uintptr_t stream)
{
    if (te == NULL || target == NULL || (n > 0 && locals == NULL))
        return KVP_ERR_INVALID_ARG;
    if (!kvp_gpu_available())
        return KVP_ERR_TRANSPORT; /* Mooncake: cudaLaunchHostFunc fails, RuntimeError */
    const void *dev = NULL;       /* a device range, for the context when the thread has none */
    for (size_t i = 0; i < n && dev == NULL; i++)
        if (kvp_gpu_is_device_ptr(locals[i]))
            dev = locals[i];
    kvp_status_t st = kvp_gpu_caller_stream_sync(stream, dev);
    if (st != KVP_OK)
        return st;
    return kvp_te_transfer(te, target, opcode, n, locals, remotes, lens);
}

/* ---- a target's registered device memory ---- */

#define TE_CUDA_CHUNK ((size_t)1 << 20)
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

/* Receive len bytes into device memory dst: chunk k into half k % 2, then its copy to the
 * device on that half's stream, so receiving chunk k+1 overlaps copying chunk k. A CUDA
 * failure drains the rest of this extent and is returned in *cuda_p; false: the socket. */
static bool recv_dev(te_cuda_slot_t *sl, int fd, uint8_t *dst, uint64_t len, kvp_status_t *cuda_p)
{
    bool pending[2] = {false, false};
    for (uint64_t off = 0, k = 0; off < len; k++) {
        int h = (int)(k & 1);
        size_t m = len - off < TE_CUDA_CHUNK ? (size_t)(len - off) : TE_CUDA_CHUNK;
        uint8_t *half = sl->buf + (size_t)h * TE_CUDA_CHUNK;
        if (pending[h] && *cuda_p == KVP_OK)
            *cuda_p = kvp_gpu_stream_sync(sl->s[h]);
        pending[h] = false;
        if (kvp_recv_all(fd, half, m) != KVP_OK)
            return false;
        if (*cuda_p == KVP_OK) {
            *cuda_p = kvp_gpu_copy_async(sl->s[h], dst + off, half, m, true);
            pending[h] = *cuda_p == KVP_OK;
        }
        off += m;
    }
    for (int h = 0; h < 2; h++)
        if (pending[h]) {
            kvp_status_t st = kvp_gpu_stream_sync(sl->s[h]);
            if (*cuda_p == KVP_OK)
                *cuda_p = st;
        }
    return true;
}

bool kvp_te_cuda_recv(te_cuda_t *c, kvp_transfer_t *xfer, int fd, const kvp_data_vec_t *v, size_t n,
                      kvp_status_t *reply_p)
{
    te_cuda_slot_t *sl = slot_take(c);
    kvp_status_t cuda = sl == NULL ? KVP_ERR_NOMEM : KVP_OK;
    bool ok = true;
    for (size_t i = 0; i < n && ok; i++) {
        uint8_t *p = (uint8_t *)(uintptr_t)v[i].offset;
        if (!vec_dev(xfer, &v[i])) {
            ok = kvp_recv_all(fd, p, v[i].length) == KVP_OK;
            continue;
        }
        if (cuda == KVP_OK)
            cuda = slot_streams(sl, p);
        if (cuda != KVP_OK) { /* drain it: the peer reads the refusal */
            uint8_t sink[16384];
            for (uint64_t left = v[i].length; left > 0 && ok;) {
                size_t k = left < sizeof(sink) ? (size_t)left : sizeof(sink);
                ok = kvp_recv_all(fd, sink, k) == KVP_OK;
                left -= k;
            }
            continue;
        }
        ok = recv_dev(sl, fd, p, v[i].length, &cuda);
    }
    if (sl != NULL)
        slot_give(c, sl);
    if (ok && cuda != KVP_OK) {
        KVP_LOG_ERROR("transfer engine: a peer's write into device memory failed: %s",
                      kvp_strerror(cuda));
        *reply_p = KVP_ERR_IO;
    }
    return ok;
}

/* Send len bytes of device memory src: chunk k+1 is copied into the other half while
 * chunk k is sent. False: a CUDA failure or the socket (the reply is cut short). */
static bool send_dev(te_cuda_slot_t *sl, int fd, const uint8_t *src, uint64_t len)
{
    size_t m0 = len < TE_CUDA_CHUNK ? (size_t)len : TE_CUDA_CHUNK;
    if (kvp_gpu_copy_async(sl->s[0], sl->buf, src, m0, false) != KVP_OK)
        return false;
    for (uint64_t off = 0, k = 0; off < len; k++) {
        int h = (int)(k & 1);
        size_t m = len - off < TE_CUDA_CHUNK ? (size_t)(len - off) : TE_CUDA_CHUNK;
        uint64_t next = off + m;
        if (kvp_gpu_stream_sync(sl->s[h]) != KVP_OK)
            return false;
        if (next < len) {
            size_t m2 = len - next < TE_CUDA_CHUNK ? (size_t)(len - next) : TE_CUDA_CHUNK;
            if (kvp_gpu_copy_async(sl->s[h ^ 1], sl->buf + (size_t)(h ^ 1) * TE_CUDA_CHUNK,
                                   src + next, m2, false) != KVP_OK)
                return false;
        }
        if (kvp_send_all(fd, sl->buf + (size_t)h * TE_CUDA_CHUNK, m) != KVP_OK) {
            (void)kvp_gpu_stream_sync(sl->s[h ^ 1]); /* the half is not left in flight */
            return false;
        }
        off = next;
    }
    return true;
}

bool kvp_te_cuda_send(te_cuda_t *c, kvp_transfer_t *xfer, int fd, const kvp_data_vec_t *v, size_t n,
                      uint64_t total)
{
    te_cuda_slot_t *sl = slot_take(c);
    if (sl == NULL)
        return false;
    kvp_data_resp_t r = {.magic = KVP_DATA_MAGIC, .status = 0, .length = total};
    bool ok = kvp_send_all(fd, &r, sizeof(r)) == KVP_OK;
    for (size_t i = 0; i < n && ok; i++) {
        const uint8_t *p = (const uint8_t *)(uintptr_t)v[i].offset;
        if (!vec_dev(xfer, &v[i]))
            ok = kvp_send_all(fd, p, v[i].length) == KVP_OK;
        else
            ok = slot_streams(sl, p) == KVP_OK && send_dev(sl, fd, p, v[i].length);
    }
    slot_give(c, sl);
    return ok;
}
