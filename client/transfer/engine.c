/*
 * engine.c - the transfer engine: run each op on its peer's transport.
 *
 * Transports (transfer/transport.h) sit in a priority list its creator hands
 * it (xfer->list: kvp_transports[], transport/transports.h: shm (same host, the
 * segment mapped), rdma (both sides have it), tcp). The engine names none of
 * them. A peer's transport is chosen once, when it is
 * attached (its descriptor arrived, or its first use): the first transport of
 * the list whose attach accepts it, kept on the peer (peer->tp). It is chosen
 * again only when that transport fails an op to it with KVP_ERR_TRANSPORT
 * ("cannot carry this peer"): then from the next transports of the list, and
 * the op is retried once on the new one. Other failures (connect, timeout,
 * a gone segment) fail the op and keep the transport, as before. A forced
 * transport (KVPOOL_TRANSPORT or the client param) is the only one created, so
 * forcing shm to a peer on another host, or rdma to a peer that serves no
 * rdma, leaves the peer with no transport and fails its ops with
 * KVP_ERR_TRANSPORT rather than silently using something else.
 *
 * Staging: an op whose local buffer its transport cannot reach zero-copy (CUDA
 * memory on a transport without a registration of it, or wanting a CRC the CPU
 * cannot compute; host memory on a transport that needs registration) goes
 * through a stager (staging.h) taken from a pool: up to KVP_STAGERS_MAX per
 * kind (engine.h, KVP_STAGE_POOL_*: host memory, four 1 MiB buffers; device
 * memory to a shm peer, the same; device memory to any other, two buffers of
 * stage_chunk, 16 MiB, each one batch on the streams), made on demand, each used
 * by one thread at a time and given back after; the pool's lock is held only to
 * take and give back. The memory
 * kind and the registrations come from the registry (mem/registry.h), filled
 * at kvp_register_buffer; only unregistered memory is asked of the driver.
 *
 * Per batch the engine allocates nothing: ops are sorted by transport with a
 * counting sort into per-thread scratch arrays that grow to the largest batch
 * the thread has run and are kept (freed when the thread exits).
 *
 * Counters (xfer->stats, read by client/metrics.c): each finished batch is summed
 * on the stack, then added with one relaxed atomic per transport and direction
 * it used; the metrics slot is the transport that finally carried the op (an
 * SSD segment's peer counts as "ssd").
 *
 * Thread: any client thread; transports are reentrant.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/transfer/engine.h"
#include "common/clock.h"
#include "client/mem/gpu.h"
#include "client/transfer/staging.h"
#include "client/transfer/transport.h"
#include "common/log.h"

/* Tests only (the static library; libkvpool.map does not export it): the list every engine
 * created from now on uses instead of its own, so a test can put fakes behind a whole
 * client. NULL: each engine's. */
const kvp_transport_ops_t *const *kvp_transports_test;

void kvp_host_id(char *buf, size_t len)
{
    char boot[64] = "unknown";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
    if (f != NULL) {
        if (fgets(boot, sizeof(boot), f) != NULL)
            boot[strcspn(boot, "\n")] = '\0';
        fclose(f);
    }
    /* /proc/<pid>/fd paths only resolve inside the same pid namespace */
    struct stat sb;
    unsigned long long ns = stat("/proc/self/ns/pid", &sb) == 0 ? (unsigned long long)sb.st_ino : 0;
    snprintf(buf, len, "%s/%llu", boot, ns);
}

/* ---- the stager pool ---- */

static void stager_pool_init(kvp_stager_pool_t *pool)
{
    memset(pool, 0, sizeof(*pool));
    pthread_mutex_init(&pool->lock, NULL);
    pthread_cond_init(&pool->cond, NULL);
}

/* Every stager must have been given back. */
static void stager_pool_cleanup(kvp_stager_pool_t *pool)
{
    for (int k = 0; k < KVP_STAGE_POOLS; k++)
        for (unsigned i = 0; i < pool->n[k]; i++)
            kvp_stager_destroy(pool->all[k][i]);
    pthread_cond_destroy(&pool->cond);
    pthread_mutex_destroy(&pool->lock);
}

static void stage_run_cb(void *arg, kvp_xfer_op_t *ops, size_t n);
static kvp_status_t stage_reg_cb(void *arg, void *buf, size_t len);
static void stage_dereg_cb(void *arg, void *buf);

/* A stager of this kind for the calling thread alone: a free one, a new one while
 * fewer than KVP_STAGERS_MAX exist, else the next one given back. NULL: no memory. */
static kvp_stager_t *stager_take(kvp_transfer_t *xfer, int kind)
{
    kvp_stager_pool_t *pool = &xfer->stagers;
    kvp_stager_t *s = NULL;
    pthread_mutex_lock(&pool->lock);
    for (;;) {
        if (pool->n_free[kind] > 0) {
            s = pool->free[kind][--pool->n_free[kind]];
            break;
        }
        if (pool->n[kind] < KVP_STAGERS_MAX) {
            /* the far kind: few large buffers (engine.h); the others: four of 1 MiB */
            bool far = kind == KVP_STAGE_POOL_GPU_FAR;
            size_t far_chunk = xfer->stage_chunk ? xfer->stage_chunk : (size_t)16 << 20;
            kvp_stager_params_t p = {.chunk_bytes = far ? far_chunk : (size_t)1 << 20,
                                     .depth = far ? 2 : 4,
                                     .run = stage_run_cb,
                                     .reg = stage_reg_cb,
                                     .dereg = stage_dereg_cb,
                                     .arg = xfer};
            /* cheap: its buffers are made on its first run, by its user */
            if (kvp_stager_create(&p, &s) == KVP_OK)
                pool->all[kind][pool->n[kind]++] = s;
            else
                s = NULL;
            break;
        }
        pthread_cond_wait(&pool->cond, &pool->lock);
    }
    pthread_mutex_unlock(&pool->lock);
    return s;
}

static void stager_give(kvp_transfer_t *xfer, int kind, kvp_stager_t *s)
{
    kvp_stager_pool_t *pool = &xfer->stagers;
    pthread_mutex_lock(&pool->lock);
    pool->free[kind][pool->n_free[kind]++] = s;
    pthread_cond_broadcast(&pool->cond); /* waiters of every kind share it */
    pthread_mutex_unlock(&pool->lock);
}

/* ---- life ---- */

static void tps_destroy(kvp_transfer_t *xfer)
{
    while (xfer->n_tps > 0) {
        kvp_transport_t *tp = &xfer->tps[--xfer->n_tps];
        tp->ops->destroy(tp->ctx);
    }
}

kvp_status_t kvp_transfer_init(kvp_transfer_t *xfer)
{
    static atomic_uint unavailable_said; /* bit k: list[k] said unavailable (once a process) */
    const kvp_transport_ops_t *const *list =
        kvp_transports_test != NULL ? kvp_transports_test : xfer->list;
    if (list == NULL)
        return KVP_ERR_INVALID_ARG;
    kvp_status_t st = KVP_OK;
    xfer->n_tps = 0;
    memset(&xfer->stats, 0, sizeof(xfer->stats));
    kvp_grant_keyring_init(&xfer->seg_grants);
    atomic_store(&xfer->serve_refused, 0);
    atomic_store(&xfer->serve_access_errors, 0);
    atomic_store(&xfer->nic_access_errors, -1);
    xfer->gpu = kvp_gpu_available();
    if (xfer->first != NULL) { /* DFS: its own peers only, so forcing another keeps it */
        kvp_transport_t *tp = &xfer->tps[0];
        xfer->why[0] = '\0';
        st = xfer->first->create(xfer, 0, &tp->ctx);
        if (st != KVP_OK) {
            KVP_LOG_ERROR("transport %s cannot be used: %s", xfer->first->name,
                          xfer->why[0] ? xfer->why : kvp_strerror(st));
            return st;
        }
        tp->ops = xfer->first;
        tp->index = xfer->n_tps++;
    }
    for (unsigned k = 0; list[k] != NULL && xfer->n_tps < KVP_TP_MAX; k++) {
        const kvp_transport_ops_t *ops = list[k];
        if (xfer->forced != KVP_TRANSPORT_AUTO && ops->id != (int)xfer->forced)
            continue;
        kvp_transport_t *tp = &xfer->tps[xfer->n_tps];
        xfer->why[0] = '\0';
        st = ops->create(xfer, xfer->n_tps, &tp->ctx);
        if (st != KVP_OK) {
            const char *why = xfer->why[0] ? xfer->why : kvp_strerror(st);
            if (xfer->forced != KVP_TRANSPORT_AUTO) {
                KVP_LOG_ERROR("transport %s (forced) cannot be used: %s", ops->name, why);
                goto err_tps;
            }
            uint32_t bit = k < 32 ? 1u << k : 0;
            if ((atomic_fetch_or(&unavailable_said, bit) & bit) == 0) {
                if (st == KVP_ERR_NOT_FOUND)
                    KVP_LOG_INFO("transport auto: no %s here (%s); using the others", ops->name,
                                 why);
                else
                    KVP_LOG_WARN("transport auto: %s unavailable (%s); using the others", ops->name,
                                 why);
            }
            continue;
        }
        tp->ops = ops;
        tp->index = xfer->n_tps++;
    }
    if (xfer->n_tps == 0) {
        KVP_LOG_ERROR("no data transport could be created");
        return KVP_ERR_TRANSPORT;
    }
    kvp_mem_registry_init(&xfer->mem);
    stager_pool_init(&xfer->stagers);
    return KVP_OK;

err_tps:
    tps_destroy(xfer);
    return st;
}

void kvp_transfer_cleanup(kvp_transfer_t *xfer)
{
    stager_pool_cleanup(&xfer->stagers); /* deregisters the staging buffers */
    /* buffers the application left registered */
    const kvp_mem_snap_t *s = atomic_load(&xfer->mem.cur);
    for (size_t i = 0; s != NULL && i < s->n; i++)
        kvp_transfer_unregister(xfer, (void *)s->r[i].addr, s->r[i].tp_regs);
    kvp_mem_registry_cleanup(&xfer->mem);
    tps_destroy(xfer);
    kvp_grant_keyring_cleanup(&xfer->seg_grants); /* after the serving threads are gone */
}

/* ---- peers ---- */

/* Choose the peer's transport among tps[from..]: the first that attaches it (or
 * attached it before). Holds tp_lock. */
static kvp_transport_t *attach_from_locked(kvp_transfer_t *xfer, kvp_peer_t *peer, unsigned from)
{
    peer->xfer = xfer;
    peer->detach = kvp_transfer_detach_peer;
    for (unsigned i = from; i < xfer->n_tps; i++) {
        kvp_transport_t *tp = &xfer->tps[i];
        if (peer->tp_attached & (1u << i))
            return tp;
        void *state = NULL;
        if (tp->ops->attach(tp->ctx, peer, &state) == KVP_OK) {
            peer->tp_state[i] = state;
            peer->tp_attached |= 1u << i;
            return tp;
        }
    }
    return NULL;
}

void kvp_transfer_attach(kvp_transfer_t *xfer, kvp_peer_t *peer)
{
    pthread_mutex_lock(&peer->tp_lock);
    if (!peer->tp_tried) {
        peer->tp_tried = true;
        kvp_transport_t *tp = attach_from_locked(xfer, peer, 0);
        atomic_store_explicit(&peer->tp, tp, memory_order_release);
        if (tp == NULL)
            KVP_LOG_INFO("segment %s: no transport reaches it", peer->name);
        else
            KVP_LOG_DEBUG("segment %s: transport %s", peer->name, tp->ops->name);
    }
    pthread_mutex_unlock(&peer->tp_lock);
}

/* The peer's transport, attaching it on first use. */
static kvp_transport_t *peer_tp(kvp_transfer_t *xfer, kvp_peer_t *peer)
{
    kvp_transport_t *tp = atomic_load_explicit(&peer->tp, memory_order_acquire);
    if (tp == NULL) {
        kvp_transfer_attach(xfer, peer); /* cheap once tried: a lock and a flag */
        tp = atomic_load_explicit(&peer->tp, memory_order_acquire);
    }
    return tp;
}

/* `failed` failed an op to the peer with KVP_ERR_TRANSPORT: choose again from the next
 * transports of the list (auto only). True when the peer now has another transport. */
static bool rechoose(kvp_transfer_t *xfer, kvp_peer_t *peer, kvp_transport_t *failed)
{
    if (xfer->forced != KVP_TRANSPORT_AUTO)
        return false;
    bool moved = false;
    pthread_mutex_lock(&peer->tp_lock);
    kvp_transport_t *cur = atomic_load_explicit(&peer->tp, memory_order_relaxed);
    if (cur == failed) {
        kvp_transport_t *tp = attach_from_locked(xfer, peer, failed->index + 1);
        if (tp != NULL) {
            /* the failed one's state stays until the peer goes: ops in flight use it */
            atomic_store_explicit(&peer->tp, tp, memory_order_release);
            KVP_LOG_WARN("segment %s: transport %s failed it; using %s", peer->name,
                         failed->ops->name, tp->ops->name);
            moved = true;
        }
    } else {
        moved = cur != NULL; /* another thread chose again already */
    }
    pthread_mutex_unlock(&peer->tp_lock);
    return moved;
}

/* The first transport among tps[from..] that reaches the peer (attaching it there), for ops
 * a transport handed on (op->pass); the peer's own transport stays as it is. */
static kvp_transport_t *pass_to(kvp_transfer_t *xfer, kvp_peer_t *peer, unsigned from)
{
    pthread_mutex_lock(&peer->tp_lock);
    kvp_transport_t *tp = attach_from_locked(xfer, peer, from);
    pthread_mutex_unlock(&peer->tp_lock);
    return tp;
}

kvp_transport_id_t kvp_transfer_route(kvp_transfer_t *xfer, kvp_peer_t *peer)
{
    kvp_transport_t *tp = peer_tp(xfer, peer);
    return tp != NULL ? (kvp_transport_id_t)tp->ops->id : KVP_TRANSPORT_AUTO;
}

bool kvp_transfer_peer_stale(kvp_transfer_t *xfer, kvp_peer_t *peer)
{
    (void)xfer;
    kvp_transport_t *tp = atomic_load_explicit(&peer->tp, memory_order_acquire);
    return tp != NULL && tp->ops->stale != NULL &&
           tp->ops->stale(tp->ctx, peer, peer->tp_state[tp->index]);
}

void kvp_transfer_detach_peer(kvp_peer_t *peer)
{
    kvp_transfer_t *xfer = peer->xfer;
    if (xfer == NULL)
        return;
    for (unsigned i = 0; i < xfer->n_tps; i++) {
        kvp_transport_t *tp = &xfer->tps[i];
        if ((peer->tp_attached & (1u << i)) && tp->ops->detach != NULL)
            tp->ops->detach(tp->ctx, peer, peer->tp_state[i]);
    }
    peer->tp_attached = 0;
}

/* ---- memory ---- */

kvp_mem_kind_t kvp_transfer_mem_find(kvp_transfer_t *xfer, const void *addr, size_t len,
                                     const kvp_mem_region_t **region_p)
{
    const kvp_mem_region_t *r = kvp_mem_lookup(&xfer->mem, addr, len);
    *region_p = r;
    if (r != NULL)
        return r->kind;
    return xfer->gpu && kvp_gpu_is_device_ptr(addr) ? KVP_MEM_CUDA : KVP_MEM_HOST;
}

kvp_status_t kvp_transfer_register(kvp_transfer_t *xfer, void *addr, size_t len,
                                   kvp_mem_kind_t kind, uint32_t *tp_regs_p)
{
    uint32_t regs = 0;
    for (unsigned i = 0; i < xfer->n_tps; i++) {
        kvp_transport_t *tp = &xfer->tps[i];
        if (tp->ops->mem_reg == NULL)
            continue;
        kvp_status_t st = tp->ops->mem_reg(tp->ctx, addr, len, kind);
        if (st == KVP_OK) {
            regs |= 1u << i;
        } else if (kind == KVP_MEM_CUDA) {
            KVP_LOG_INFO("%s: GPU buffer %p cannot be registered with it; its transfers are "
                         "staged through pinned host memory",
                         tp->ops->name, addr);
        } else if (st == KVP_ERR_EXISTS || xfer->forced != KVP_TRANSPORT_AUTO) {
            kvp_transfer_unregister(xfer, addr, regs);
            return st;
        } else {
            /* auto: the buffer still works, its transfers on this transport are staged */
            KVP_LOG_WARN("%s: %zu bytes at %p not registered (%s; memlock limit?); its "
                         "transfers are copied through staging buffers",
                         tp->ops->name, len, addr, kvp_strerror(st));
        }
    }
    *tp_regs_p = regs;
    return KVP_OK;
}

void kvp_transfer_unregister(kvp_transfer_t *xfer, void *addr, uint32_t tp_regs)
{
    for (unsigned i = 0; i < xfer->n_tps; i++) {
        kvp_transport_t *tp = &xfer->tps[i];
        if ((tp_regs & (1u << i)) && tp->ops->mem_dereg != NULL)
            tp->ops->mem_dereg(tp->ctx, addr);
    }
}

kvp_status_t kvp_transfer_serve_segment(kvp_transfer_t *xfer, void *base, uint64_t size,
                                        char *endpoint, size_t endpoint_len, uint64_t *addr_p,
                                        uint32_t *rkey_p)
{
    kvp_serve_desc_t desc = {.rdma_endpoint = ""};
    xfer->seg_base = base;
    xfer->seg_size = size;
    xfer->seg_tp_regs = 0;
    for (unsigned i = 0; i < xfer->n_tps; i++) {
        kvp_transport_t *tp = &xfer->tps[i];
        if (tp->ops->serve == NULL)
            continue;
        kvp_serve_desc_t d = desc;
        kvp_status_t st = tp->ops->serve(tp->ctx, base, size, &d);
        if (st == KVP_OK) {
            desc = d;
            xfer->seg_tp_regs |= 1u << i;
        } else if (xfer->forced != KVP_TRANSPORT_AUTO) {
            return st;
        } else {
            KVP_LOG_WARN("transport auto: the segment is not served over %s", tp->ops->name);
        }
    }
    snprintf(endpoint, endpoint_len, "%s", desc.rdma_endpoint);
    *addr_p = desc.rdma_addr;
    *rkey_p = desc.rdma_rkey;
    xfer->seg_windows = desc.rdma_windows;
    return KVP_OK;
}

kvp_status_t kvp_transfer_windows(kvp_transfer_t *xfer, uint32_t qp_num, uint64_t tag,
                                  const uint64_t *offs, const uint64_t *lens, size_t n_bind,
                                  bool write, uint64_t expiry_ms, uint32_t *rkeys, uint32_t *slots,
                                  size_t n_unbind)
{
    for (unsigned i = 0; i < xfer->n_tps; i++) {
        kvp_transport_t *tp = &xfer->tps[i];
        if (tp->ops->windows != NULL && (xfer->seg_tp_regs & (1u << i)))
            return tp->ops->windows(tp->ctx, qp_num, tag, offs, lens, n_bind, write, expiry_ms,
                                    rkeys, slots, n_unbind);
    }
    return KVP_ERR_INVALID_ARG; /* no windows here */
}

/* ---- staging ---- */

static void transfer_run(kvp_transfer_t *xfer, kvp_xfer_op_t *ops, size_t n, int level);

static void stage_run_cb(void *arg, kvp_xfer_op_t *ops, size_t n)
{
    /* staging buffers are registered host memory: never staged again */
    transfer_run(arg, ops, n, 1);
}

/* A staging buffer is registered with every transport that registers memory. */
static kvp_status_t stage_reg_cb(void *arg, void *buf, size_t len)
{
    kvp_transfer_t *xfer = arg;
    for (unsigned i = 0; i < xfer->n_tps; i++) {
        kvp_transport_t *tp = &xfer->tps[i];
        if (tp->ops->mem_reg == NULL)
            continue;
        kvp_status_t st = tp->ops->mem_reg(tp->ctx, buf, len, KVP_MEM_HOST);
        if (st != KVP_OK) {
            kvp_transfer_unregister(xfer, buf, (1u << i) - 1);
            return st;
        }
    }
    return KVP_OK;
}

static void stage_dereg_cb(void *arg, void *buf)
{
    kvp_transfer_unregister(arg, buf, UINT32_MAX);
}

/* kind: KVP_STAGE_POOL_* */
static void run_staged(kvp_transfer_t *xfer, int kind, kvp_xfer_op_t **ops, size_t n)
{
    if (n == 0)
        return;
    kvp_stager_t *s = stager_take(xfer, kind);
    if (s == NULL) {
        for (size_t i = 0; i < n; i++)
            ops[i]->status = KVP_ERR_NOMEM;
        return;
    }
    bool gpu = kind != KVP_STAGE_POOL_HOST;
    kvp_stager_run(s, gpu ? KVP_STAGE_GPU : KVP_STAGE_HOST, ops, n);
    stager_give(xfer, kind, s);
    uint64_t done = 0, bytes = 0;
    for (size_t i = 0; i < n; i++)
        if (ops[i]->status == KVP_OK) {
            done++;
            bytes += ops[i]->length;
        }
    if (done > 0)
        kvp_count_add(&xfer->stats.staged[gpu], done, bytes);
}

/* ---- per-thread scratch ---- */

/* Level 0: a batch from the caller; level 1: a staging slot's ops, run by the stager
 * while level 0's arrays are in use. */
typedef struct scratch {
    size_t cap;
    kvp_xfer_op_t **sorted;
    uint8_t *bucket;
} scratch_t;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_free(void *p)
{
    scratch_t *sc = p;
    for (int l = 0; l < 2; l++) {
        free(sc[l].sorted);
        free(sc[l].bucket);
    }
    free(sc);
}

static void scratch_key_init(void)
{
    if (pthread_key_create(&scratch_key, scratch_free) != 0)
        abort(); /* out of keys at library start: nothing sensible to do */
}

/* The calling thread's level-`level` scratch with room for n ops, or NULL: no memory. */
static scratch_t *scratch_get(int level, size_t n)
{
    pthread_once(&scratch_once, scratch_key_init);
    scratch_t *sc = pthread_getspecific(scratch_key);
    if (sc == NULL) {
        sc = calloc(2, sizeof(*sc));
        if (sc == NULL || pthread_setspecific(scratch_key, sc) != 0) {
            free(sc);
            return NULL;
        }
    }
    scratch_t *s = &sc[level];
    if (s->cap < n) {
        size_t cap = n < 64 ? 64 : n;
        kvp_xfer_op_t **sorted = realloc(s->sorted, cap * sizeof(*sorted));
        if (sorted != NULL)
            s->sorted = sorted;
        uint8_t *bucket = realloc(s->bucket, cap);
        if (bucket != NULL)
            s->bucket = bucket;
        if (sorted == NULL || bucket == NULL)
            return NULL;
        s->cap = cap;
    }
    return s;
}

/* ---- running a batch ---- */

/* Buckets: transport i is bucket i; then the stagers (KVP_STAGE_POOL_*); then "failed" and
 * "not this pass". */
#define B_STAGE_HOST (KVP_TP_MAX + KVP_STAGE_POOL_HOST)
#define B_STAGE_GPU_NEAR (KVP_TP_MAX + KVP_STAGE_POOL_GPU_NEAR)
#define B_STAGE_GPU_FAR (KVP_TP_MAX + KVP_STAGE_POOL_GPU_FAR)
#define B_COUNT (KVP_TP_MAX + KVP_STAGE_POOLS)
#define B_NONE 0xFF  /* not in this pass */
#define B_RETRY 0xFE /* its peer has a new transport: run it again */
#define B_PASS 0xE0  /* B_PASS + i: handed on (op->pass) to transport i */

_Static_assert(B_COUNT < B_PASS && B_PASS + KVP_TP_MAX < B_RETRY, "bucket ids fit in a byte");

/* Where an op goes: its peer's transport, or a stager when that transport cannot reach its
 * buffer zero-copy; B_NONE when it failed here (status set). */
static uint8_t route_op(kvp_transfer_t *xfer, kvp_xfer_op_t *op, int level, kvp_transport_t *tp)
{
    op->pass = false;
    if (tp == NULL)
        tp = peer_tp(xfer, op->peer);
    if (tp == NULL) {
        op->status = KVP_ERR_TRANSPORT;
        return B_NONE;
    }
    if (level > 0)
        return (uint8_t)tp->index; /* a staging buffer: host memory every transport reaches */
    /* the buffer's memory: as the planner found it, or found here (once per op) */
    const kvp_mem_region_t *r = op->mem.region;
    kvp_mem_kind_t kind = op->mem.known ? (kvp_mem_kind_t)op->mem.kind
                                        : kvp_transfer_mem_find(xfer, op->local, op->length, &r);
    bool zero_copy;
    if (tp->ops->mem_reg == NULL) {
        zero_copy = kind == KVP_MEM_HOST;
    } else {
        uint32_t bit = 1u << tp->index;
        uintptr_t a = (uintptr_t)op->local, seg = (uintptr_t)xfer->seg_base;
        bool in_seg = (xfer->seg_tp_regs & bit) && a >= seg && a - seg <= xfer->seg_size &&
                      op->length <= xfer->seg_size - (a - seg);
        zero_copy = (r != NULL && (r->tp_regs & bit)) || in_seg;
    }
    /* device memory with a CRC wanted: the CPU cannot read it, the stager checksums its
     * host copies */
    if (zero_copy && !(kind == KVP_MEM_CUDA && op->want_crc))
        return (uint8_t)tp->index;
    if (kind != KVP_MEM_CUDA)
        return B_STAGE_HOST;
    return tp->ops->id == KVP_TRANSPORT_SHM ? B_STAGE_GPU_NEAR : B_STAGE_GPU_FAR;
}

/* Route the ops whose bucket[i] is `only` (B_NONE on the first pass; B_RETRY later: those
 * of B_RETRY on their peer's transport, and of any B_PASS + i on transport i), sort them by
 * bucket into sorted[], run each bucket. */
static void dispatch(kvp_transfer_t *xfer, kvp_xfer_op_t *ops, size_t n, int level, scratch_t *sc,
                     uint8_t only)
{
    size_t cnt[B_COUNT] = {0};
    for (size_t i = 0; i < n; i++) {
        uint8_t at_b = sc->bucket[i];
        bool pass = only == B_RETRY && at_b >= B_PASS && at_b < B_PASS + KVP_TP_MAX;
        if (at_b != only && !pass)
            continue;
        uint8_t b = route_op(xfer, &ops[i], level, pass ? &xfer->tps[at_b - B_PASS] : NULL);
        sc->bucket[i] = b;
        if (b != B_NONE)
            cnt[b]++;
    }
    size_t at[B_COUNT], beg[B_COUNT];
    size_t sum = 0;
    for (int b = 0; b < B_COUNT; b++) {
        beg[b] = at[b] = sum;
        sum += cnt[b];
    }
    for (size_t i = 0; i < n; i++)
        if (sc->bucket[i] < B_COUNT)
            sc->sorted[at[sc->bucket[i]]++] = &ops[i];
    for (unsigned t = 0; t < xfer->n_tps; t++)
        if (cnt[t] > 0)
            xfer->tps[t].ops->submit(xfer->tps[t].ctx, sc->sorted + beg[t], cnt[t]);
    for (int k = 0; k < KVP_STAGE_POOLS; k++)
        run_staged(xfer, k, sc->sorted + beg[KVP_TP_MAX + k], cnt[KVP_TP_MAX + k]);
}

static void transfer_run(kvp_transfer_t *xfer, kvp_xfer_op_t *ops, size_t n, int level)
{
    if (n == 0)
        return;
    scratch_t *sc = scratch_get(level, n);
    if (sc == NULL) {
        for (size_t i = 0; i < n; i++)
            ops[i].status = KVP_ERR_NOMEM;
        return;
    }
    memset(sc->bucket, B_NONE, n);
    dispatch(xfer, ops, n, level, sc, B_NONE);
    /* then rounds of: an op whose transport cannot carry its peer any more, on the peer's
     * new transport (the first round only: retried once); an op a transport handed on
     * (op->pass), on the next transport of the list that reaches its peer (never back: at
     * most n_tps rounds) */
    for (int round = 0;; round++) {
        size_t again = 0;
        for (size_t i = 0; i < n; i++) {
            uint8_t b = sc->bucket[i];
            sc->bucket[i] = B_NONE;
            if (b >= xfer->n_tps) /* failed before a transport, or staged (the stager ran it) */
                continue;
            if (ops[i].pass) {
                kvp_transport_t *next = pass_to(xfer, ops[i].peer, b + 1u);
                if (next == NULL) {
                    ops[i].pass = false; /* none: its status stands (KVP_ERR_TRANSPORT) */
                    continue;
                }
                sc->bucket[i] = (uint8_t)(B_PASS + next->index);
                again++;
            } else if (round == 0 && ops[i].status == KVP_ERR_TRANSPORT &&
                       rechoose(xfer, ops[i].peer, &xfer->tps[b])) {
                sc->bucket[i] = B_RETRY;
                again++;
            }
        }
        if (again == 0)
            break;
        dispatch(xfer, ops, n, level, sc, B_RETRY);
    }
}

/* The metrics slot (KVP_METRICS_TP_*) of the transport that carried an op to `peer`, or -1
 * (no transport; a test's fake). */
static int metrics_slot(const kvp_peer_t *peer)
{
    const kvp_transport_t *tp = atomic_load_explicit(&peer->tp, memory_order_acquire);
    if (tp == NULL)
        return -1;
    if (tp->ops->id == KVP_TRANSPORT_DFS)
        return KVP_METRICS_TP_DFS;
    if (peer->ssd)
        return KVP_METRICS_TP_SSD;
    switch (tp->ops->id) {
    case KVP_TRANSPORT_TCP:
        return KVP_METRICS_TP_TCP;
    case KVP_TRANSPORT_SHM:
        return KVP_METRICS_TP_SHM;
    case KVP_TRANSPORT_RDMA:
        return KVP_METRICS_TP_RDMA;
    default:
        return -1;
    }
}

/* Add a finished batch to the counters: summed here, then one relaxed add per (transport,
 * direction) the batch used, so a batch of thousands of ops costs a few atomics. */
static void count_batch(kvp_transfer_t *xfer, const kvp_xfer_op_t *ops, size_t n)
{
    uint64_t cnt[KVP_METRICS_TP_COUNT][2] = {{0}}, bytes[KVP_METRICS_TP_COUNT][2] = {{0}};
    uint64_t errors[2] = {0, 0};
    for (size_t i = 0; i < n; i++) {
        int dir = ops[i].kind == KVP_XFER_READ;
        if (ops[i].status != KVP_OK) {
            errors[dir]++;
            continue;
        }
        int slot = metrics_slot(ops[i].peer);
        if (slot < 0)
            continue;
        cnt[slot][dir]++;
        bytes[slot][dir] += ops[i].length;
    }
    for (int t = 0; t < KVP_METRICS_TP_COUNT; t++)
        for (int d = 0; d < 2; d++)
            if (cnt[t][d] > 0)
                kvp_count_add(&xfer->stats.tp[t][d], cnt[t][d], bytes[t][d]);
    for (int d = 0; d < 2; d++)
        if (errors[d] > 0)
            atomic_fetch_add_explicit(&xfer->stats.errors[d], errors[d], memory_order_relaxed);
}

void kvp_transfer_run(kvp_transfer_t *xfer, kvp_xfer_op_t *ops, size_t n)
{
    if (n == 0)
        return;
    uint64_t t0 = kvp_now_ns();
    transfer_run(xfer, ops, n, 0);
    /* the batch's wall time, by the direction of its first op (a batch is one direction) */
    kvp_count_add(&xfer->stats.runs[ops[0].kind == KVP_XFER_READ], 1, kvp_now_ns() - t0);
    count_batch(xfer, ops, n);
}

/* ---- registered buffers (kvp_register_buffer) ---- */

kvp_status_t kvp_transfer_register_buffer(kvp_transfer_t *xfer, void *addr, size_t len)
{
    if (addr == NULL || len == 0)
        return KVP_ERR_INVALID_ARG;
    kvp_mem_registry_t *reg = &xfer->mem;
    kvp_status_t st = KVP_ERR_EXISTS;
    pthread_mutex_lock(&reg->lock);
    if (kvp_mem_overlaps_locked(reg, (uintptr_t)addr, len))
        goto out;
    /* the one time the driver is asked about this memory */
    kvp_mem_region_t r = {
        .addr = (uintptr_t)addr,
        .len = len,
        .kind = xfer->gpu && kvp_gpu_is_device_ptr(addr) ? KVP_MEM_CUDA : KVP_MEM_HOST,
    };
    st = kvp_transfer_register(xfer, addr, len, r.kind, &r.tp_regs);
    if (st != KVP_OK)
        goto out;
    st = kvp_mem_insert_locked(reg, &r);
    if (st != KVP_OK)
        kvp_transfer_unregister(xfer, addr, r.tp_regs);
out:
    pthread_mutex_unlock(&reg->lock);
    return st;
}

kvp_status_t kvp_transfer_unregister_buffer(kvp_transfer_t *xfer, void *addr)
{
    if (addr == NULL)
        return KVP_ERR_INVALID_ARG;
    kvp_mem_registry_t *reg = &xfer->mem;
    kvp_mem_region_t r;
    pthread_mutex_lock(&reg->lock);
    kvp_status_t st = kvp_mem_remove_locked(reg, (uintptr_t)addr, &r);
    if (st == KVP_OK)
        kvp_transfer_unregister(xfer, addr, r.tp_regs);
    pthread_mutex_unlock(&reg->lock);
    return st;
}
