/*
 * shm.c - same-host transport: map the peer's segment, copy.
 *
 * A segment's memory is a memfd owned by the process that mounted it; a
 * same-host peer opens it through /proc/<pid>/fd/<n> (shm_path in the
 * segment descriptor) and maps it MAP_SHARED once. A transfer is then one
 * memcpy per op between the caller's buffer and the mapping; with a CRC
 * wanted, copy and checksum are one pass (kvp_crc32c_copy). The mapping
 * keeps the memfd alive, so a mapping of a dead owner stays readable: the
 * client drops peers the master no longer lists (transfer/peer.c), and the CRC
 * checked on every get catches reuse races.
 *
 * Thread: transfer() is reentrant; the mapping is made once under the
 * peer table lock (kvp_shm_map_peer) and is immutable afterwards.
 */
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/internal.h"
#include "common/crc32c.h"
#include "common/log.h"

bool kvp_shm_map_peer(kvp_peer_t *peer)
{
    if (peer->shm_base != NULL)
        return true;
    if (peer->shm_tried || peer->shm_path[0] == '\0')
        return false;
    peer->shm_tried = true;
    int fd = open(peer->shm_path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        KVP_LOG_INFO("shm: cannot open segment %s at %s (%m); using tcp for it", peer->name,
                     peer->shm_path);
        return false;
    }
    struct stat sb;
    void *base = MAP_FAILED;
    if (fstat(fd, &sb) == 0 && (uint64_t)sb.st_size >= peer->size)
        base = mmap(NULL, peer->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) {
        KVP_LOG_INFO("shm: cannot map segment %s (%m); using tcp for it", peer->name);
        return false;
    }
    peer->shm_base = base;
    return true;
}

static kvp_status_t shm_init(kvp_transfer_t *xfer, void **ctx_p)
{
    (void)xfer;
    *ctx_p = NULL;
    return KVP_OK;
}

static void shm_cleanup(void *ctx)
{
    (void)ctx;
}

static void shm_transfer(void *ctx, kvp_xfer_op_t **ops, size_t n)
{
    (void)ctx;
    for (size_t i = 0; i < n; i++) {
        kvp_xfer_op_t *op = ops[i];
        kvp_peer_t *p = op->peer;
        if (p->shm_base == NULL) {
            op->status = KVP_ERR_TRANSPORT;
            continue;
        }
        if (op->offset > p->size || op->length > p->size - op->offset) {
            op->status = KVP_ERR_OUT_OF_RANGE;
            continue;
        }
        uint8_t *seg = (uint8_t *)p->shm_base + op->offset;
        uint8_t *dst = op->kind == KVP_XFER_READ ? op->local : seg;
        const uint8_t *src = op->kind == KVP_XFER_READ ? seg : op->local;
        if (op->want_crc)
            op->crc = kvp_crc32c_copy(0, dst, src, op->length);
        else
            memcpy(dst, src, op->length);
        op->status = KVP_OK;
    }
}

const kvp_transport_ops_t kvp_transport_shm_ops = {
    .name = "shm",
    .init = shm_init,
    .cleanup = shm_cleanup,
    .transfer = shm_transfer,
};
