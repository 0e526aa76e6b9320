/*
 * segment_server.c - the memory backend of the data server (data_backend.h):
 * a DRAM segment's bytes are moved in place, a READ's payload sent straight
 * out of the segment's memory and a WRITE's received straight into it, with
 * one sendmsg/recvmsg over an iovec of segment ranges per request. No object
 * byte is buffered or copied in user space, and nothing is allocated per
 * request or per connection.
 *
 * Its memory can also be handed whole (MAP, the shm transport) and served
 * through rdma windows: the server does both (data_server.c), this backend
 * says they are allowed.
 *
 * Threads: the data server's connection threads; the backend holds no state
 * but the segment's first byte.
 */
#include "client/segment/segment_server.h"

#include <sys/uio.h>

#include "client/segment/data_backend.h"
#include "client/segment/seg_record.h"
#include "client/transport/wire.h"
#include "common/sock.h"

/* v[0..n) as an iovec over the segment starting at base, after iov[0]. */
static void extents_iov(uint8_t *base, const kvp_data_vec_t *v, size_t n, struct iovec *iov)
{
    for (size_t i = 0; i < n; i++)
        iov[i + 1] = (struct iovec){.iov_base = base + v[i].offset, .iov_len = v[i].length};
}

static bool mem_read(void *backend, void *conn, int fd, const kvp_data_vec_t *v, size_t n,
                     uint64_t total, kvp_status_t *reply_p)
{
    (void)conn;
    (void)reply_p; /* memory does not fail: the socket does */
    struct iovec iov[KVP_DATA_VEC_MAX + 1];
    kvp_data_resp_t r = {.magic = KVP_DATA_MAGIC, .status = 0, .length = total};
    iov[0] = (struct iovec){.iov_base = &r, .iov_len = sizeof(r)};
    extents_iov(backend, v, n, iov);
    return kvp_sendv_all(fd, iov, (int)n + 1) == KVP_OK;
}

static bool mem_write(void *backend, void *conn, int fd, const kvp_data_vec_t *v, size_t n,
                      kvp_status_t *reply_p)
{
    (void)conn;
    (void)reply_p;
    struct iovec iov[KVP_DATA_VEC_MAX + 1];
    extents_iov(backend, v, n, iov);
    return kvp_recvv_all(fd, iov + 1, (int)n) == KVP_OK;
}

static const kvp_data_backend_ops_t mem_ops = {
    .name = "segment server",
    .frames = KVP_DATA_FRAME_MAP | KVP_DATA_FRAME_WINDOWS,
    .read = mem_read,
    .write = mem_write,
};

kvp_status_t kvp_segment_server_create(void *base, uint64_t size, const char *host, uint16_t port,
                                       bool protected_mode, kvp_data_server_t **srv_p,
                                       uint16_t *bound_port_p)
{
    kvp_data_server_params_t p = {.ops = &mem_ops,
                                  .backend = base, /* its context: the segment's byte 0 */
                                  .size = size,
                                  .segment_id = UINT64_MAX,
                                  .host = host,
                                  .port = port,
                                  .protected_mode = protected_mode};
    return kvp_data_server_create(&p, srv_p, bound_port_p);
}

static void record_versions_at(void *record, const uint64_t *offsets, uint64_t *versions, size_t n)
{
    kvp_seg_record_versions_at(record, offsets, versions, n);
}

static bool record_wait(void *record, const uint64_t *offsets, const uint64_t *versions, size_t n)
{
    return kvp_seg_record_wait(record, offsets, versions, n);
}

void kvp_segment_server_set_record(kvp_data_server_t *srv, struct kvp_seg_record *record)
{
    kvp_data_server_set_versions(srv, record != NULL ? record_versions_at : NULL,
                                 record != NULL ? record_wait : NULL, record);
    if (record != NULL)
        kvp_seg_record_set_pending(record, kvp_data_server_pending(srv));
}
