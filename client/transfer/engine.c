/*
 * transfer.c - the transfer engine: route each op to a transport, run them.
 *
 * Routing (kvp_transfer_route), per peer: shm when the peer is on this host
 * (same host id) and its segment could be mapped; else rdma when both sides
 * have it (we opened a device, the peer's descriptor has an rdma endpoint);
 * else tcp. A forced transport (KVPOOL_TRANSPORT or the client param) is
 * honoured: forcing shm to a peer on another host, or rdma to a peer that
 * serves no rdma, fails the op with KVP_ERR_TRANSPORT rather than silently
 * using something else.
 *
 * Staging: an op whose local buffer the chosen transport cannot reach goes
 * through a stager (client/staging.c), which moves it in chunks through
 * staging buffers registered once: host memory not registered with rdma,
 * and CUDA device memory on tcp/shm (or on rdma without a GPU registration).
 * The copy of chunk i+1 overlaps the transfer of chunk i.
 *
 * Thread: any client thread; transports are reentrant.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <dirent.h>
#include <stdatomic.h>

#include "client/mem/gpu.h"
#include "client/internal.h"
#include "client/transfer/staging.h"
#include "common/crc32c.h"
#include "common/log.h"

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

/* Does this host have any RDMA device at all? (Cheap; touches no verbs.) */
static bool rdma_devices_present(void)
{
    DIR *d = opendir("/sys/class/infiniband");
    if (d == NULL)
        return false;
    bool any = false;
    struct dirent *e;
    while (!any && (e = readdir(d)) != NULL)
        any = e->d_name[0] != '.';
    closedir(d);
    return any;
}

kvp_status_t kvp_transfer_init(kvp_transfer_t *xfer)
{
    static atomic_bool fallback_said;
    kvp_status_t st = kvp_transport_tcp_ops.init(xfer, &xfer->tcp_ctx);
    if (st != KVP_OK)
        return st;
    st = kvp_transport_shm_ops.init(xfer, &xfer->shm_ctx);
    if (st != KVP_OK)
        goto err_tcp;
    if (xfer->forced == KVP_TRANSPORT_RDMA ||
        (xfer->forced == KVP_TRANSPORT_AUTO && rdma_devices_present())) {
        st = kvp_transport_rdma_ops.init(xfer, &xfer->rdma_ctx);
        if (st != KVP_OK && xfer->forced == KVP_TRANSPORT_RDMA) {
            KVP_LOG_ERROR("transport rdma: no usable RDMA device: %s", xfer->rdma_error);
            goto err_shm;
        }
        if (st != KVP_OK && !atomic_exchange(&fallback_said, true))
            KVP_LOG_WARN("transport auto: rdma unavailable (%s); using tcp between hosts",
                         xfer->rdma_error);
        xfer->rdma_ctx = st == KVP_OK ? xfer->rdma_ctx : NULL;
    } else if (xfer->forced == KVP_TRANSPORT_AUTO && !atomic_exchange(&fallback_said, true)) {
        snprintf(xfer->rdma_error, sizeof(xfer->rdma_error), "no RDMA device on this host");
        KVP_LOG_INFO("transport auto: no RDMA device on this host; using tcp between hosts");
    }
    xfer->gpu = kvp_gpu_available();
    pthread_mutex_init(&xfer->stage_lock, NULL);
    return KVP_OK;

err_shm:
    kvp_transport_shm_ops.cleanup(xfer->shm_ctx);
err_tcp:
    kvp_transport_tcp_ops.cleanup(xfer->tcp_ctx);
    return st;
}

void kvp_transfer_cleanup(kvp_transfer_t *xfer)
{
    kvp_stager_destroy(xfer->stager_host);
    kvp_stager_destroy(xfer->stager_gpu);
    if (xfer->rdma_ctx != NULL)
        kvp_transport_rdma_ops.cleanup(xfer->rdma_ctx);
    kvp_transport_shm_ops.cleanup(xfer->shm_ctx);
    kvp_transport_tcp_ops.cleanup(xfer->tcp_ctx);
    pthread_mutex_destroy(&xfer->stage_lock);
}

kvp_transport_id_t kvp_transfer_route(kvp_transfer_t *xfer, kvp_peer_t *peer)
{
    bool same_host = strcmp(peer->host_id, xfer->host_id) == 0;
    bool rdma = xfer->rdma_ctx != NULL && peer->rdma_endpoint[0] != '\0';
    switch (xfer->forced) {
    case KVP_TRANSPORT_TCP:
        return KVP_TRANSPORT_TCP;
    case KVP_TRANSPORT_RDMA:
        return rdma ? KVP_TRANSPORT_RDMA : KVP_TRANSPORT_AUTO; /* caller fails the op */
    case KVP_TRANSPORT_SHM:
        return same_host && peer->shm_base != NULL ? KVP_TRANSPORT_SHM : KVP_TRANSPORT_AUTO;
    default:
        if (same_host && peer->shm_base != NULL)
            return KVP_TRANSPORT_SHM;
        return rdma ? KVP_TRANSPORT_RDMA : KVP_TRANSPORT_TCP;
    }
}

kvp_status_t kvp_transfer_serve_segment(kvp_transfer_t *xfer, void *base, uint64_t size,
                                        char *endpoint, size_t endpoint_len, uint64_t *addr_p,
                                        uint32_t *rkey_p)
{
    endpoint[0] = '\0';
    *addr_p = 0;
    *rkey_p = 0;
    if (xfer->rdma_ctx == NULL)
        return KVP_OK;
    kvp_status_t st = kvp_rdma_transport_serve(xfer->rdma_ctx, base, size, endpoint, endpoint_len,
                                               addr_p, rkey_p);
    if (st != KVP_OK && xfer->forced != KVP_TRANSPORT_RDMA) {
        KVP_LOG_WARN("transport auto: the segment is served over tcp only");
        endpoint[0] = '\0';
        return KVP_OK;
    }
    return st;
}

kvp_status_t kvp_transfer_register(kvp_transfer_t *xfer, void *addr, size_t len)
{
    if (xfer->rdma_ctx == NULL)
        return KVP_OK;
    if (xfer->gpu && kvp_gpu_is_device_ptr(addr)) {
        /* GPUDirect: a dma-buf of the range, else the peer-memory path of
         * ibv_reg_mr, else nothing (the transfers stage through host memory) */
        kvp_dmabuf_t db;
        if (kvp_gpu_dmabuf_fd(addr, len, &db.fd, &db.offset) == KVP_OK) {
            kvp_status_t st = kvp_rdma_transport_reg(xfer->rdma_ctx, addr, len, &db);
            close(db.fd);
            if (st == KVP_OK || st == KVP_ERR_EXISTS)
                return st;
        }
        if (kvp_rdma_transport_reg(xfer->rdma_ctx, addr, len, NULL) == KVP_OK)
            return KVP_OK;
        KVP_LOG_INFO("rdma: GPU buffer %p cannot be registered with the NIC; its transfers are "
                     "staged through pinned host memory",
                     addr);
        return KVP_OK;
    }
    kvp_status_t st = kvp_rdma_transport_reg(xfer->rdma_ctx, addr, len, NULL);
    if (st != KVP_OK && st != KVP_ERR_EXISTS && xfer->forced != KVP_TRANSPORT_RDMA) {
        /* auto: the buffer still works, its rdma transfers are staged */
        KVP_LOG_WARN("rdma: %zu bytes at %p not registered (%s; memlock limit?); its rdma "
                     "transfers are copied through staging buffers",
                     len, addr, kvp_strerror(st));
        return KVP_OK;
    }
    return st;
}

void kvp_transfer_unregister(kvp_transfer_t *xfer, void *addr)
{
    if (xfer->rdma_ctx != NULL)
        kvp_rdma_transport_dereg(xfer->rdma_ctx, addr);
}

/* ---- staging ---- */

static void transfer_run(kvp_transfer_t *xfer, kvp_xfer_op_t *ops, size_t n, bool may_stage);

static void stage_run_cb(void *arg, kvp_xfer_op_t *ops, size_t n)
{
    /* staging buffers are registered host memory: never staged again */
    transfer_run(arg, ops, n, false);
}

static kvp_status_t stage_reg_cb(void *arg, void *buf, size_t len)
{
    kvp_transfer_t *xfer = arg;
    return xfer->rdma_ctx ? kvp_rdma_transport_reg(xfer->rdma_ctx, buf, len, NULL) : KVP_OK;
}

static void stage_dereg_cb(void *arg, void *buf)
{
    kvp_transfer_unregister(arg, buf);
}

static kvp_stager_t *stager_get(kvp_transfer_t *xfer, bool gpu)
{
    pthread_mutex_lock(&xfer->stage_lock);
    kvp_stager_t **sp = gpu ? &xfer->stager_gpu : &xfer->stager_host;
    if (*sp == NULL) {
        kvp_stager_params_t p = {.chunk_bytes = 1 << 20,
                                 .depth = 4,
                                 .run = stage_run_cb,
                                 .reg = stage_reg_cb,
                                 .dereg = stage_dereg_cb,
                                 .arg = xfer};
        if (kvp_stager_create(&p, sp) != KVP_OK)
            *sp = NULL;
    }
    kvp_stager_t *s = *sp;
    pthread_mutex_unlock(&xfer->stage_lock);
    return s;
}

static void run_staged(kvp_transfer_t *xfer, bool gpu, kvp_xfer_op_t **ops, size_t n)
{
    if (n == 0)
        return;
    kvp_stager_t *s = stager_get(xfer, gpu);
    if (s == NULL) {
        for (size_t i = 0; i < n; i++)
            ops[i]->status = KVP_ERR_NOMEM;
        return;
    }
    kvp_stager_run(s, gpu ? KVP_STAGE_GPU : KVP_STAGE_HOST, ops, n);
}

/* A bucket of ops for one transport (or stager). */
enum { B_SHM, B_TCP, B_RDMA, B_STAGE_HOST, B_STAGE_GPU, B_COUNT };

void kvp_transfer_run(kvp_transfer_t *xfer, kvp_xfer_op_t *ops, size_t n)
{
    transfer_run(xfer, ops, n, true);
}

static void transfer_run(kvp_transfer_t *xfer, kvp_xfer_op_t *ops, size_t n, bool may_stage)
{
    kvp_xfer_op_t *stack[B_COUNT][32];
    kvp_xfer_op_t **bucket[B_COUNT];
    kvp_xfer_op_t **heap = NULL;
    if (n > 32) {
        heap = malloc(B_COUNT * n * sizeof(*heap));
        if (heap == NULL) {
            for (size_t i = 0; i < n; i++)
                ops[i].status = KVP_ERR_NOMEM;
            return;
        }
    }
    for (int b = 0; b < B_COUNT; b++)
        bucket[b] = heap ? heap + (size_t)b * n : stack[b];
    size_t cnt[B_COUNT] = {0};
    for (size_t i = 0; i < n; i++) {
        kvp_xfer_op_t *op = &ops[i];
        bool gpu = xfer->gpu && kvp_gpu_is_device_ptr(op->local);
        int b;
        switch (kvp_transfer_route(xfer, op->peer)) {
        case KVP_TRANSPORT_SHM:
            b = gpu ? B_STAGE_GPU : B_SHM;
            break;
        case KVP_TRANSPORT_TCP:
            b = gpu ? B_STAGE_GPU : B_TCP;
            break;
        case KVP_TRANSPORT_RDMA:
            /* device memory with a CRC wanted: the CPU cannot read it, the
             * stager checksums its host copies */
            if (kvp_rdma_transport_covers(xfer->rdma_ctx, op->local, op->length) &&
                !(gpu && op->want_crc))
                b = B_RDMA;
            else
                b = gpu ? B_STAGE_GPU : B_STAGE_HOST;
            break;
        default:
            op->status = KVP_ERR_TRANSPORT;
            continue;
        }
        if (!may_stage && b >= B_STAGE_HOST) {
            op->status = KVP_ERR_TRANSPORT;
            continue;
        }
        bucket[b][cnt[b]++] = op;
    }
    if (cnt[B_SHM])
        kvp_transport_shm_ops.transfer(xfer->shm_ctx, bucket[B_SHM], cnt[B_SHM]);
    if (cnt[B_TCP])
        kvp_transport_tcp_ops.transfer(xfer->tcp_ctx, bucket[B_TCP], cnt[B_TCP]);
    if (cnt[B_RDMA])
        kvp_transport_rdma_ops.transfer(xfer->rdma_ctx, bucket[B_RDMA], cnt[B_RDMA]);
    run_staged(xfer, false, bucket[B_STAGE_HOST], cnt[B_STAGE_HOST]);
    run_staged(xfer, true, bucket[B_STAGE_GPU], cnt[B_STAGE_GPU]);
    free(heap);
}
