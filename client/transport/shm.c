/*
 * shm.c - same-host transport: map the peer's segment, copy.
 *
 * A segment's memory is a memfd owned by the process that mounted it. A same-host peer
 * asks the owner for it on the owner's Unix socket (the descriptor's shm_path "@NAME", an
 * abstract name): HELLO proving its principal and MAP with the MAP grant the master gave
 * it (data grants on; hello.c), and gets the memfd over SCM_RIGHTS, after the owner
 * checked its uid (SO_PEERCRED) and the grant (segment/data_server.c). The master gives
 * a MAP grant only to principals whose grants would cover every object the segment can
 * hold; without one, the peer is reached over tcp. A shm_path that is a file name is
 * opened instead (an owner that shares a file; the unit tests). The memfd is mapped
 * MAP_SHARED once, at attach. A transfer is
 * then one memcpy per op between the caller's buffer and the mapping; with a
 * CRC wanted, copy and checksum are one pass (kvp_crc32c_copy). The mapping
 * keeps the memfd alive, so a mapping of a dead owner stays readable: the
 * client drops peers whose owner is gone (stale: a pidfd of the owner taken at the
 * hand-off says it exited; transfer/peer.c), and the
 * CRC checked on every get catches reuse races. Our own segment is not mapped
 * again: its state points at the client's mapping.
 *
 * Cold start: a fresh mapping has no page tables, so the first puts into it
 * would pay a page fault per 4 KiB (3.5x slower). Attach starts a thread that
 * faults the mapping in ahead of use, in 64 MiB steps, with
 * MADV_POPULATE_READ (Linux 5.14): read faults map 16 pages at a time
 * (fault-around) and, the memfd being shmem, map them writable, so it runs at
 * ~12 GB/s here, ahead of the puts; MADV_POPULATE_WRITE (one page per fault)
 * was 4-5x slower. Older kernels: a read of each page. Detach stops it
 * between steps and joins it before the unmap.
 *
 * Thread: submit is reentrant; a peer's state is made at attach (under the
 * peer's tp_lock) and immutable until detach (its last reference).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "client/transfer/engine.h"
#include "client/transfer/transport.h"
#include "client/transport/hello.h"
#include "common/crc32c.h"
#include "common/log.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

#define POPULATE_STEP ((size_t)64 << 20)

typedef struct shm_ctx {
    kvp_transfer_t *xfer;
    unsigned index;
} shm_ctx_t;

typedef struct shm_peer {
    uint8_t *base;
    uint64_t size;
    bool own;  /* the client's own segment: not unmapped here */
    int pidfd; /* the owner that handed it over (-1: none; then stale when the path is gone) */
    pthread_t populate;
    bool populating;
    atomic_bool stop;
} shm_peer_t;

static kvp_status_t shm_create(kvp_transfer_t *xfer, unsigned index, void **ctx_p)
{
    shm_ctx_t *ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL)
        return KVP_ERR_NOMEM;
    ctx->xfer = xfer;
    ctx->index = index;
    *ctx_p = ctx;
    return KVP_OK;
}

static void shm_destroy(void *ctx)
{
    free(ctx);
}

/* Fault the mapping in, writable, ahead of the first transfers. */
static void *populate_main(void *arg)
{
    shm_peer_t *sp = arg;
    int advice = MADV_POPULATE_READ;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    for (uint64_t off = 0; off < sp->size && !atomic_load(&sp->stop); off += POPULATE_STEP) {
        size_t len = sp->size - off < POPULATE_STEP ? (size_t)(sp->size - off) : POPULATE_STEP;
        while (advice != 0 && madvise(sp->base + off, len, advice) != 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            /* EINVAL: an older kernel; touch the pages instead */
            advice = 0;
        }
        if (advice == 0) {
            for (size_t p = 0; p < len; p += page)
                (void)*(volatile uint8_t *)(sp->base + off + p);
        }
    }
    return NULL;
}

/* The segment's memory: handed over by its owner (shm_path "@NAME"), or a file to open.
 * -1: not for us (logged); *pidfd_p: the owner's pidfd, when handed over. */
static int open_segment(shm_ctx_t *ctx, const kvp_peer_t *peer, int *pidfd_p)
{
    if (peer->shm_path[0] == '\0')
        return -1;
    if (peer->shm_path[0] != '@') {
        int fd = open(peer->shm_path, O_RDWR | O_CLOEXEC);
        if (fd < 0)
            KVP_LOG_INFO("shm: cannot open segment %s at %s (%m); using another transport for it",
                         peer->name, peer->shm_path);
        return fd;
    }
    if ((peer->grants || peer->has_conn_key) && !peer->has_shm_grant)
        return -1; /* the master does not let our principal have all of it: tcp */
    int fd, pid;
    kvp_status_t st = kvp_data_map(peer, ctx->xfer->timeout_ms, &fd, &pid);
    if (st != KVP_OK) {
        KVP_LOG_INFO("shm: segment %s's owner did not hand its memory over (%s); using another "
                     "transport for it",
                     peer->name, kvp_strerror(st));
        return -1;
    }
    *pidfd_p = (int)syscall(SYS_pidfd_open, pid, 0); /* -1 (no pidfd): never stale */
    return fd;
}

static kvp_status_t shm_attach(void *vctx, kvp_peer_t *peer, void **state_p)
{
    shm_ctx_t *ctx = vctx;
    kvp_transfer_t *xfer = ctx->xfer;
    if (strcmp(peer->host_id, xfer->host_id) != 0)
        return KVP_ERR_TRANSPORT;
    shm_peer_t *sp = calloc(1, sizeof(*sp));
    if (sp == NULL)
        return KVP_ERR_NOMEM;
    sp->size = peer->size;
    sp->pidfd = -1;
    if (peer->own && xfer->seg_base != NULL) {
        sp->base = xfer->seg_base; /* mapped and populated by the client */
        sp->own = true;
        *state_p = sp;
        return KVP_OK;
    }
    int fd = open_segment(ctx, peer, &sp->pidfd);
    if (fd < 0)
        goto err_free;
    struct stat sb;
    void *base = MAP_FAILED;
    if (fstat(fd, &sb) == 0 && (uint64_t)sb.st_size >= peer->size)
        base = mmap(NULL, peer->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) {
        KVP_LOG_INFO("shm: cannot map segment %s (%m); using another transport for it", peer->name);
        goto err_free;
    }
    sp->base = base;
    atomic_init(&sp->stop, false);
    /* without the thread the mapping still works, faulted in by the first transfers */
    sp->populating = pthread_create(&sp->populate, NULL, populate_main, sp) == 0;
    *state_p = sp;
    return KVP_OK;

err_free:
    if (sp->pidfd >= 0)
        close(sp->pidfd);
    free(sp);
    return KVP_ERR_TRANSPORT;
}

static void shm_detach(void *ctx, kvp_peer_t *peer, void *state)
{
    (void)ctx;
    (void)peer;
    shm_peer_t *sp = state;
    if (sp->populating) {
        atomic_store(&sp->stop, true);
        pthread_join(sp->populate, NULL);
    }
    if (!sp->own)
        munmap(sp->base, sp->size);
    if (sp->pidfd >= 0)
        close(sp->pidfd);
    free(sp);
}

static bool shm_stale(void *ctx, const kvp_peer_t *peer, const void *state)
{
    (void)ctx;
    const shm_peer_t *sp = state;
    if (sp->own)
        return false;
    if (peer->shm_path[0] != '@')
        return access(peer->shm_path, F_OK) != 0;
    struct pollfd pfd = {.fd = sp->pidfd, .events = POLLIN};
    return sp->pidfd >= 0 && poll(&pfd, 1, 0) > 0; /* readable: the owner exited */
}

static void shm_submit(void *vctx, kvp_xfer_op_t **ops, size_t n)
{
    shm_ctx_t *ctx = vctx;
    for (size_t i = 0; i < n; i++) {
        kvp_xfer_op_t *op = ops[i];
        const shm_peer_t *sp = kvp_peer_tp_state(op->peer, ctx->index);
        if (sp == NULL) {
            op->status = KVP_ERR_TRANSPORT;
            continue;
        }
        if (op->offset > sp->size || op->length > sp->size - op->offset) {
            op->status = KVP_ERR_OUT_OF_RANGE;
            continue;
        }
        uint8_t *seg = sp->base + op->offset;
        uint8_t *dst = op->kind == KVP_XFER_READ ? op->local : seg;
        const uint8_t *src = op->kind == KVP_XFER_READ ? seg : op->local;
        if (op->want_crc)
            op->crc = kvp_crc32c_copy_piece(0, dst, src, op->length, op->stream);
        else
            memcpy(dst, src, op->length);
        op->status = KVP_OK;
    }
}

const kvp_transport_ops_t kvp_transport_shm_ops = {
    .name = "shm",
    .id = KVP_TRANSPORT_SHM,
    .create = shm_create,
    .destroy = shm_destroy,
    .attach = shm_attach,
    .detach = shm_detach,
    .stale = shm_stale,
    .submit = shm_submit,
};
