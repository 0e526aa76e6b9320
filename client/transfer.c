/*
 * transfer.c - the transfer engine: route each op to a transport, run them.
 *
 * Routing (kvp_transfer_route), per peer: shm when the peer is on this host
 * (same host id) and its segment could be mapped, else tcp; a forced
 * transport (KVPOOL_TRANSPORT or the client param) is honoured, except that
 * forcing shm to a peer on another host fails the op with
 * KVP_ERR_TRANSPORT rather than silently using tcp.
 *
 * Thread: any client thread; transports are reentrant.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/internal.h"
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

kvp_status_t kvp_transfer_init(kvp_transfer_t *xfer)
{
    kvp_status_t st = kvp_transport_tcp_ops.init(xfer, &xfer->tcp_ctx);
    if (st != KVP_OK)
        return st;
    st = kvp_transport_shm_ops.init(xfer, &xfer->shm_ctx);
    if (st != KVP_OK) {
        kvp_transport_tcp_ops.cleanup(xfer->tcp_ctx);
        return st;
    }
    return KVP_OK;
}

void kvp_transfer_cleanup(kvp_transfer_t *xfer)
{
    kvp_transport_shm_ops.cleanup(xfer->shm_ctx);
    kvp_transport_tcp_ops.cleanup(xfer->tcp_ctx);
}

kvp_transport_id_t kvp_transfer_route(kvp_transfer_t *xfer, kvp_peer_t *peer)
{
    bool same_host = strcmp(peer->host_id, xfer->host_id) == 0;
    if (xfer->forced == KVP_TRANSPORT_TCP)
        return KVP_TRANSPORT_TCP;
    if (same_host && peer->shm_base != NULL)
        return KVP_TRANSPORT_SHM;
    if (xfer->forced == KVP_TRANSPORT_SHM)
        return KVP_TRANSPORT_AUTO; /* cannot honour: caller fails the op */
    return KVP_TRANSPORT_TCP;
}

void kvp_transfer_run(kvp_transfer_t *xfer, kvp_xfer_op_t *ops, size_t n)
{
    kvp_xfer_op_t *stack_shm[64], *stack_tcp[64];
    kvp_xfer_op_t **shm = stack_shm, **tcp = stack_tcp;
    if (n > 64) {
        shm = malloc(n * sizeof(*shm));
        tcp = malloc(n * sizeof(*tcp));
        if (shm == NULL || tcp == NULL) {
            free(shm);
            free(tcp);
            for (size_t i = 0; i < n; i++)
                ops[i].status = KVP_ERR_NOMEM;
            return;
        }
    }
    size_t ns = 0, nt = 0;
    for (size_t i = 0; i < n; i++) {
        kvp_xfer_op_t *op = &ops[i];
        switch (kvp_transfer_route(xfer, op->peer)) {
        case KVP_TRANSPORT_SHM:
            shm[ns++] = op;
            break;
        case KVP_TRANSPORT_TCP:
            /* tcp moves bytes in slices on several streams: checksum the source up front */
            if (op->want_crc && op->kind == KVP_XFER_WRITE)
                op->crc = kvp_crc32c(0, op->local, op->length);
            tcp[nt++] = op;
            break;
        default:
            op->status = KVP_ERR_TRANSPORT;
            break;
        }
    }
    if (ns)
        kvp_transport_shm_ops.transfer(xfer->shm_ctx, shm, ns);
    if (nt) {
        kvp_transport_tcp_ops.transfer(xfer->tcp_ctx, tcp, nt);
        for (size_t i = 0; i < nt; i++)
            if (tcp[i]->want_crc && tcp[i]->kind == KVP_XFER_READ && tcp[i]->status == KVP_OK)
                tcp[i]->crc = kvp_crc32c(0, tcp[i]->local, tcp[i]->length);
    }
    if (shm != stack_shm) {
        free(shm);
        free(tcp);
    }
}
