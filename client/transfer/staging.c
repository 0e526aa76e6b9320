/*
 * staging.c - the pipelined staging engine (contract in staging.h).
 *
 * Design: the ops of one call are cut into pieces and packed, in op order,
 * into a ring of `depth` staging buffers ("slots") of chunk_bytes each: a big
 * op becomes one piece per buffer, small ops share a buffer (each piece
 * 64-byte aligned, at most STAGE_MAX_PIECES per buffer). One slot is one
 * run-callback call: a batch of plain ops whose local buffers lie in it.
 * For slot k the loop does
 *
 *     wait for slot k's copy-in          (WRITE pieces: op buffer -> slot)
 *     CRC of slot k's WRITE pieces
 *     fill slot k+1 and issue its copy-in   <- overlaps the transfer below
 *     run slot k on the transports
 *     CRC of slot k's READ pieces, issue their copy-out (slot -> op buffer)
 *
 * so the copy of chunk k+1 overlaps the transfer of chunk k, and a READ
 * copy-out overlaps the transfers of the next depth-1 slots: a slot's
 * copy-out is waited for only when the slot comes round again (before it is
 * refilled), and at the end of the call. GPU copies use CUDA streams of the
 * op's device: one copy-in stream and one copy-out stream per slot, so that
 * waiting for one slot never waits for the others. Host buffers are plain
 * memcpy through the same code (their "copies" are done when issued).
 * Streams are created on first use and buffers allocated and registered (reg
 * callback) on the first run; both live until kvp_stager_destroy.
 *
 * Errors: a failed piece (transport status, CUDA copy or wait) fails its op,
 * the first error wins, and the op's later pieces are skipped at fill, run
 * and copy time. A READ op is OK only when every piece was moved and copied
 * out. Other ops go on.
 *
 * Thread: kvp_stager_run holds the stager's mutex for the whole call; the run
 * callback is called on the caller's thread.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "client/mem/gpu.h"
#include "client/transfer/staging.h"
#include "common/crc32c.h"
#include "common/log.h"

#define STAGE_DEFAULT_CHUNK ((size_t)1 << 20)
#define STAGE_DEFAULT_DEPTH 4u
#define STAGE_MAX_PIECES 512 /* plain ops per run-callback call (a 16 MiB buffer: 32 KiB runs) */
#define STAGE_ALIGN 64       /* piece start inside a staging buffer */
#define STAGE_MAX_DEVS 16    /* GPUs one stager copies to and from */

typedef struct stage_dev {
    int ordinal;
    kvp_gpu_stream_t *in;   /* op buffer -> staging (WRITE); one slot has copies at a time */
    kvp_gpu_stream_t **out; /* staging -> op buffer (READ), one stream per slot */
    bool in_busy;
} stage_dev_t;

typedef struct stage_piece {
    kvp_xfer_op_t *op;
    int dev; /* index in devs[], -1: host memory (memcpy) */
    uint64_t op_off;
    size_t len;
    size_t buf_off;
} stage_piece_t;

typedef struct stage_slot {
    uint8_t *buf;
    bool registered;
    bool in_pending;   /* copy-in issued and not yet waited for */
    uint32_t out_devs; /* bit d: copy-outs pending on devs[d].out[slot] */
    unsigned n;
    size_t used;
    stage_piece_t pieces[STAGE_MAX_PIECES];
    kvp_xfer_op_t plain[STAGE_MAX_PIECES];
    uint16_t plain_piece[STAGE_MAX_PIECES]; /* plain[j] moves pieces[plain_piece[j]] */
} stage_slot_t;

typedef struct stage_cursor {
    size_t i;     /* next op */
    uint64_t off; /* bytes of ops[i] already packed */
    int dev;      /* ops[i]'s device (valid once off > 0) */
} stage_cursor_t;

struct kvp_stager {
    size_t chunk;
    unsigned depth;
    kvp_stage_run_cb_t run;
    kvp_stage_reg_cb_t reg;
    kvp_stage_dereg_cb_t dereg;
    void *arg;
    pthread_mutex_t lock;
    bool bufs_ready;
    bool pinned; /* buffers from kvp_gpu_host_alloc */
    stage_slot_t *slots;
    unsigned ndevs;
    stage_dev_t devs[STAGE_MAX_DEVS];
    kvp_gpu_stream_t **out_streams; /* STAGE_MAX_DEVS x depth, devs[d].out points in */
};

_Static_assert(STAGE_MAX_DEVS <= 32, "out_devs is a 32-bit mask");
_Static_assert(STAGE_MAX_PIECES <= UINT16_MAX, "plain_piece is 16-bit");

kvp_status_t kvp_stager_create(const kvp_stager_params_t *p, kvp_stager_t **s_p)
{
    if (p == NULL || p->run == NULL || p->depth == 1)
        return KVP_ERR_INVALID_ARG;
    kvp_status_t status = KVP_ERR_NOMEM;
    kvp_stager_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return status;
    s->chunk = p->chunk_bytes ? p->chunk_bytes : STAGE_DEFAULT_CHUNK;
    s->depth = p->depth ? p->depth : STAGE_DEFAULT_DEPTH;
    s->run = p->run;
    s->reg = p->reg;
    s->dereg = p->dereg;
    s->arg = p->arg;

    s->slots = calloc(s->depth, sizeof(*s->slots));
    if (s->slots == NULL)
        goto err_free_stager;
    s->out_streams = calloc((size_t)STAGE_MAX_DEVS * s->depth, sizeof(*s->out_streams));
    if (s->out_streams == NULL)
        goto err_free_slots;
    if (pthread_mutex_init(&s->lock, NULL) != 0) {
        status = KVP_ERR_SYSTEM;
        goto err_free_streams;
    }
    *s_p = s;
    return KVP_OK;

err_free_streams:
    free(s->out_streams);
err_free_slots:
    free(s->slots);
err_free_stager:
    free(s);
    return status;
}

static void buf_free(kvp_stager_t *s, void *buf)
{
    if (s->pinned)
        kvp_gpu_host_free(buf);
    else
        free(buf);
}

static void bufs_release(kvp_stager_t *s)
{
    for (unsigned i = 0; i < s->depth; i++) {
        stage_slot_t *sl = &s->slots[i];
        if (sl->buf == NULL)
            continue;
        if (sl->registered && s->dereg != NULL)
            s->dereg(s->arg, sl->buf);
        buf_free(s, sl->buf);
        sl->buf = NULL;
        sl->registered = false;
    }
    s->bufs_ready = false;
}

/* Allocate and register the ring once: pinned when staging GPU memory with CUDA present. */
static kvp_status_t bufs_ensure(kvp_stager_t *s, kvp_stage_mem_t mem)
{
    if (s->bufs_ready)
        return KVP_OK;
    s->pinned = mem == KVP_STAGE_GPU && kvp_gpu_available();
    for (unsigned i = 0; i < s->depth; i++) {
        stage_slot_t *sl = &s->slots[i];
        void *buf = NULL;
        kvp_status_t st;
        if (s->pinned)
            st = kvp_gpu_host_alloc(s->chunk, &buf);
        else
            st = posix_memalign(&buf, 4096, s->chunk) == 0 ? KVP_OK : KVP_ERR_NOMEM;
        if (st != KVP_OK) {
            KVP_LOG_ERROR("staging: cannot allocate %zu-byte staging buffer: %s", s->chunk,
                          kvp_strerror(st));
            bufs_release(s);
            return st;
        }
        sl->buf = buf;
        if (s->reg != NULL) {
            st = s->reg(s->arg, buf, s->chunk);
            if (st != KVP_OK) {
                KVP_LOG_ERROR("staging: cannot register staging buffer: %s", kvp_strerror(st));
                bufs_release(s); /* sl->registered is false: freed, not deregistered */
                return st;
            }
            sl->registered = true;
        }
    }
    s->bufs_ready = true;
    return KVP_OK;
}

void kvp_stager_destroy(kvp_stager_t *s)
{
    if (s == NULL)
        return;
    for (unsigned d = 0; d < s->ndevs; d++) {
        kvp_gpu_stream_destroy(s->devs[d].in);
        for (unsigned j = 0; j < s->depth; j++)
            kvp_gpu_stream_destroy(s->devs[d].out[j]);
    }
    bufs_release(s);
    pthread_mutex_destroy(&s->lock);
    free(s->out_streams);
    free(s->slots);
    free(s);
}

static void fail_op(kvp_xfer_op_t *op, kvp_status_t st)
{
    if (op->status == KVP_OK)
        op->status = st;
}

/* Which device's streams copy op's buffer: -1 for host memory. */
static kvp_status_t op_dev(kvp_stager_t *s, kvp_stage_mem_t mem, const kvp_xfer_op_t *op,
                           int *dev_p)
{
    *dev_p = -1;
    if (mem != KVP_STAGE_GPU)
        return KVP_OK;
    int ordinal;
    kvp_status_t st = kvp_gpu_device_ordinal(op->local, &ordinal);
    if (st == KVP_ERR_INVALID_ARG)
        return KVP_OK; /* host memory in a GPU batch: memcpy */
    if (st != KVP_OK)
        return st;
    for (unsigned d = 0; d < s->ndevs; d++) {
        if (s->devs[d].ordinal == ordinal) {
            *dev_p = (int)d;
            return KVP_OK;
        }
    }
    if (s->ndevs == STAGE_MAX_DEVS) {
        KVP_LOG_ERROR("staging: ops on more than %d GPUs in one stager", STAGE_MAX_DEVS);
        return KVP_ERR_TOO_MANY;
    }
    stage_dev_t *dev = &s->devs[s->ndevs];
    dev->ordinal = ordinal;
    dev->out = &s->out_streams[(size_t)s->ndevs * s->depth];
    st = kvp_gpu_stream_create(op->local, &dev->in);
    if (st != KVP_OK)
        return st;
    unsigned j;
    for (j = 0; j < s->depth; j++) {
        st = kvp_gpu_stream_create(op->local, &dev->out[j]);
        if (st != KVP_OK)
            goto err_destroy_streams;
    }
    *dev_p = (int)s->ndevs++;
    return KVP_OK;

err_destroy_streams:
    while (j-- > 0) {
        kvp_gpu_stream_destroy(dev->out[j]);
        dev->out[j] = NULL;
    }
    kvp_gpu_stream_destroy(dev->in);
    dev->in = NULL;
    return st;
}

/* Pack the next pieces of ops[] (from the cursor on) into slot sl. */
static void slot_fill(kvp_stager_t *s, stage_slot_t *sl, kvp_stage_mem_t mem, kvp_xfer_op_t **ops,
                      size_t n, stage_cursor_t *c)
{
    sl->n = 0;
    sl->used = 0;
    while (c->i < n && sl->n < STAGE_MAX_PIECES) {
        kvp_xfer_op_t *op = ops[c->i];
        if (op->status != KVP_OK || c->off >= op->length) {
            c->i++;
            c->off = 0;
            continue;
        }
        if (c->off == 0) {
            kvp_status_t st = op_dev(s, mem, op, &c->dev);
            if (st != KVP_OK) {
                fail_op(op, st);
                continue;
            }
        }
        size_t at = (sl->used + STAGE_ALIGN - 1) & ~(size_t)(STAGE_ALIGN - 1);
        if (at >= s->chunk)
            break;
        size_t room = s->chunk - at;
        uint64_t left = op->length - c->off;
        /* a big op does not start in a small leftover: that would only add a piece */
        if (left > room && room < s->chunk / 8 && sl->n > 0)
            break;
        size_t len = left < room ? (size_t)left : room;
        sl->pieces[sl->n++] =
            (stage_piece_t){.op = op, .dev = c->dev, .op_off = c->off, .len = len, .buf_off = at};
        sl->used = at + len;
        c->off += len;
    }
}

/* Issue the copies op buffer -> slot for the WRITE pieces. */
static void slot_copy_in(kvp_stager_t *s, stage_slot_t *sl)
{
    for (unsigned i = 0; i < sl->n; i++) {
        stage_piece_t *pc = &sl->pieces[i];
        kvp_xfer_op_t *op = pc->op;
        if (op->kind != KVP_XFER_WRITE || op->status != KVP_OK)
            continue;
        uint8_t *dst = sl->buf + pc->buf_off;
        const uint8_t *src = (const uint8_t *)op->local + pc->op_off;
        if (pc->dev < 0) {
            memcpy(dst, src, pc->len);
            continue;
        }
        stage_dev_t *dev = &s->devs[pc->dev];
        kvp_status_t st = kvp_gpu_copy_async(dev->in, dst, src, pc->len, false);
        if (st != KVP_OK) {
            fail_op(op, st);
            continue;
        }
        dev->in_busy = true;
        sl->in_pending = true;
    }
}

/* Wait for the copy-in of slot sl (the only slot with copy-ins in flight). */
static void slot_wait_in(kvp_stager_t *s, stage_slot_t *sl)
{
    for (unsigned d = 0; d < s->ndevs; d++) {
        stage_dev_t *dev = &s->devs[d];
        if (!dev->in_busy)
            continue;
        dev->in_busy = false;
        kvp_status_t st = kvp_gpu_stream_sync(dev->in);
        if (st == KVP_OK)
            continue;
        for (unsigned i = 0; i < sl->n; i++)
            if (sl->pieces[i].dev == (int)d && sl->pieces[i].op->kind == KVP_XFER_WRITE)
                fail_op(sl->pieces[i].op, st);
    }
    sl->in_pending = false;
}

/* Wait for the copy-outs of slot k. */
static void slot_wait_out(kvp_stager_t *s, unsigned k)
{
    stage_slot_t *sl = &s->slots[k];
    for (unsigned d = 0; d < s->ndevs; d++) {
        if (!(sl->out_devs & (1u << d)))
            continue;
        kvp_status_t st = kvp_gpu_stream_sync(s->devs[d].out[k]);
        if (st == KVP_OK)
            continue;
        for (unsigned i = 0; i < sl->n; i++)
            if (sl->pieces[i].dev == (int)d && sl->pieces[i].op->kind == KVP_XFER_READ)
                fail_op(sl->pieces[i].op, st);
    }
    sl->out_devs = 0;
}

static void slot_crc_in(stage_slot_t *sl)
{
    for (unsigned i = 0; i < sl->n; i++) {
        stage_piece_t *pc = &sl->pieces[i];
        kvp_xfer_op_t *op = pc->op;
        if (op->kind == KVP_XFER_WRITE && op->want_crc && op->status == KVP_OK)
            op->crc = kvp_crc32c(op->crc, sl->buf + pc->buf_off, pc->len);
    }
}

/* Move slot k on the transports, then CRC and issue the copy-out of its READ pieces. */
static void slot_run(kvp_stager_t *s, unsigned k)
{
    stage_slot_t *sl = &s->slots[k];
    size_t m = 0;
    for (unsigned i = 0; i < sl->n; i++) {
        stage_piece_t *pc = &sl->pieces[i];
        kvp_xfer_op_t *op = pc->op;
        if (op->status != KVP_OK)
            continue; /* an earlier piece failed: skip the rest of the op */
        sl->plain[m] = (kvp_xfer_op_t){
            .kind = op->kind,
            .local = sl->buf + pc->buf_off,
            .offset = op->offset + pc->op_off,
            .length = pc->len,
            .peer = op->peer,
            /* the op's grant covers each piece of it (rdma windows are asked with it) */
            .grant = op->grant,
            .grant_set = op->grant_set,
            .grant_index = op->grant_index,
            .status = KVP_ERR_INTERNAL, /* a callback that sets nothing fails the op */
        };
        sl->plain_piece[m++] = (uint16_t)i;
    }
    if (m == 0)
        return;
    s->run(s->arg, sl->plain, m);
    for (size_t j = 0; j < m; j++) {
        stage_piece_t *pc = &sl->pieces[sl->plain_piece[j]];
        kvp_xfer_op_t *op = pc->op;
        if (sl->plain[j].status != KVP_OK) {
            fail_op(op, sl->plain[j].status);
            continue;
        }
        if (op->kind != KVP_XFER_READ || op->status != KVP_OK)
            continue;
        const uint8_t *src = sl->buf + pc->buf_off;
        uint8_t *dst = (uint8_t *)op->local + pc->op_off;
        if (op->want_crc)
            op->crc = kvp_crc32c(op->crc, src, pc->len);
        if (pc->dev < 0) {
            memcpy(dst, src, pc->len);
            continue;
        }
        kvp_status_t st = kvp_gpu_copy_async(s->devs[pc->dev].out[k], dst, src, pc->len, true);
        if (st != KVP_OK) {
            fail_op(op, st);
            continue;
        }
        sl->out_devs |= 1u << pc->dev;
    }
}

void kvp_stager_run(kvp_stager_t *s, kvp_stage_mem_t mem, kvp_xfer_op_t **ops, size_t n)
{
    pthread_mutex_lock(&s->lock);
    for (size_t i = 0; i < n; i++) {
        kvp_xfer_op_t *op = ops[i];
        op->crc = 0;
        op->status = KVP_OK;
        if ((op->kind != KVP_XFER_READ && op->kind != KVP_XFER_WRITE) ||
            (op->local == NULL && op->length > 0))
            op->status = KVP_ERR_INVALID_ARG;
    }
    kvp_status_t st = KVP_OK;
    if (mem == KVP_STAGE_GPU && !kvp_gpu_available()) {
        static atomic_flag logged = ATOMIC_FLAG_INIT; /* once per process, not per call */
        if (!atomic_flag_test_and_set(&logged))
            KVP_LOG_ERROR("staging: GPU buffers given but CUDA is not available (see the "
                          "gpu: message); such transfers fail with KVP_ERR_TRANSPORT");
        st = KVP_ERR_TRANSPORT;
    } else {
        st = bufs_ensure(s, mem);
    }
    if (st != KVP_OK) {
        for (size_t i = 0; i < n; i++)
            fail_op(ops[i], st);
        pthread_mutex_unlock(&s->lock);
        return;
    }

    stage_cursor_t c = {.i = 0, .off = 0, .dev = -1};
    unsigned k = 0; /* slot being moved; every slot's copy-outs were waited for last call */
    slot_fill(s, &s->slots[k], mem, ops, n, &c);
    slot_copy_in(s, &s->slots[k]);
    while (s->slots[k].n > 0) {
        stage_slot_t *cur = &s->slots[k];
        if (cur->in_pending)
            slot_wait_in(s, cur);
        slot_crc_in(cur);
        unsigned next = (k + 1) % s->depth;
        if (s->slots[next].out_devs)
            slot_wait_out(s, next); /* its pieces are still needed to fail their ops */
        slot_fill(s, &s->slots[next], mem, ops, n, &c);
        slot_copy_in(s, &s->slots[next]); /* overlaps the transfer of slot k */
        slot_run(s, k);
        k = next;
    }
    for (unsigned i = 0; i < s->depth; i++)
        if (s->slots[i].out_devs)
            slot_wait_out(s, i);
    pthread_mutex_unlock(&s->lock);
}
