/*
 * rpc.c - header codec, incremental frame scanning and a blocking call.
 *
 * The codec never trusts the peer: every length is checked against the
 * receiver's maximum before any allocation.
 */
#include "common/rpc.h"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/macros.h"
#include "common/sock.h"

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

void kvp_rpc_hdr_pack(const kvp_rpc_hdr_t *hdr, uint8_t out[KVP_RPC_HDR_LEN])
{
    put32(out, KVP_RPC_MAGIC);
    put16(out + 4, KVP_RPC_VERSION);
    put16(out + 6, hdr->method);
    put64(out + 8, hdr->request_id);
    put32(out + 16, hdr->body_len);
    put32(out + 20, (uint32_t)hdr->status);
    put64(out + 24, hdr->epoch);
}

kvp_status_t kvp_rpc_hdr_unpack(const uint8_t in[KVP_RPC_HDR_LEN], uint32_t max_body,
                                kvp_rpc_hdr_t *hdr)
{
    if (get32(in) != KVP_RPC_MAGIC)
        return KVP_ERR_PROTOCOL;
    hdr->version = get16(in + 4);
    hdr->method = get16(in + 6);
    hdr->request_id = get64(in + 8);
    hdr->body_len = get32(in + 16);
    hdr->status = (int32_t)get32(in + 20);
    hdr->epoch = get64(in + 24);
    if (hdr->version != KVP_RPC_VERSION)
        return KVP_ERR_VERSION;
    if (hdr->body_len > max_body)
        return KVP_ERR_FRAME_TOO_LARGE;
    return KVP_OK;
}

kvp_status_t kvp_rpc_frame_scan(const uint8_t *buf, size_t len, uint32_t max_body,
                                kvp_rpc_hdr_t *hdr, size_t *frame_len_p)
{
    if (len < KVP_RPC_HDR_LEN) {
        /* Reject a bad magic as soon as its bytes are in, not after 32. */
        static const uint8_t magic[4] = {0x4B, 0x56, 0x50, 0x31};
        if (memcmp(buf, magic, KVP_MIN(len, sizeof(magic))) != 0)
            return KVP_ERR_PROTOCOL;
        *frame_len_p = KVP_RPC_HDR_LEN;
        return KVP_ERR_PENDING;
    }
    kvp_status_t status = kvp_rpc_hdr_unpack(buf, max_body, hdr);
    if (status != KVP_OK)
        return status;
    *frame_len_p = KVP_RPC_HDR_LEN + (size_t)hdr->body_len;
    return len >= *frame_len_p ? KVP_OK : KVP_ERR_PENDING;
}

/* The two ways frames travel: a plain socket (fd) or a channel (ch, TLS or not). */
typedef struct rpc_io {
    int fd;
    kvp_chan_t *ch;
} rpc_io_t;

static kvp_status_t io_recv(const rpc_io_t *io, void *buf, size_t len)
{
    return io->ch ? kvp_chan_recv_all(io->ch, buf, len) : kvp_recv_all(io->fd, buf, len);
}

static kvp_status_t rpc_send(const rpc_io_t *io, uint16_t method, uint64_t request_id,
                             const void *body, size_t body_len)
{
    if (body_len > KVP_RPC_MAX_BODY)
        return KVP_ERR_FRAME_TOO_LARGE;
    uint8_t hb[KVP_RPC_HDR_LEN];
    kvp_rpc_hdr_t hdr = {
        .method = method, .request_id = request_id, .body_len = (uint32_t)body_len};
    kvp_rpc_hdr_pack(&hdr, hb);
    if (io->ch != NULL)
        return kvp_chan_send2(io->ch, hb, sizeof(hb), body, body_len);
    struct iovec iov[2] = {{.iov_base = hb, .iov_len = sizeof(hb)},
                           {.iov_base = (void *)body, .iov_len = body_len}};
    return kvp_sendv_all(io->fd, iov, body_len ? 2 : 1);
}

static kvp_status_t rpc_call(const rpc_io_t *io, uint16_t method, uint64_t request_id,
                             const void *body, size_t body_len, uint8_t **resp_p,
                             size_t *resp_len_p)
{
    kvp_status_t status = rpc_send(io, method, request_id, body, body_len);
    if (status != KVP_OK)
        return status;
    uint8_t hb[KVP_RPC_HDR_LEN];

    for (;;) {
        status = io_recv(io, hb, sizeof(hb));
        if (status != KVP_OK)
            return status;
        kvp_rpc_hdr_t rh;
        status = kvp_rpc_hdr_unpack(hb, KVP_RPC_MAX_BODY, &rh);
        if (status != KVP_OK)
            return status;
        uint8_t *rb = NULL;
        if (rh.body_len > 0) {
            rb = malloc(rh.body_len + 1);
            if (rb == NULL)
                return KVP_ERR_NOMEM;
            status = io_recv(io, rb, rh.body_len);
            if (status != KVP_OK) {
                free(rb);
                return status;
            }
            rb[rh.body_len] = '\0';
        }
        if (rh.request_id != request_id) {
            /* a stale reply to a call that timed out earlier: skip it */
            free(rb);
            continue;
        }
        if (rh.status != 0) {
            KVP_LOG_WARN("master refused request (method %u): %s", method,
                         rb ? (char *)rb : kvp_strerror(rh.status));
            if (rb != NULL)
                kvp_status_note((char *)rb);
            free(rb);
            return rh.status < KVP_STATUS_MIN || rh.status > 0 ? KVP_ERR_PROTOCOL
                                                               : (kvp_status_t)rh.status;
        }
        if (rh.method != (method | KVP_RPC_RESPONSE_BIT)) {
            free(rb);
            return KVP_ERR_PROTOCOL;
        }
        *resp_p = rb;
        *resp_len_p = rh.body_len;
        return KVP_OK;
    }
}

kvp_status_t kvp_rpc_send(int fd, uint16_t method, uint64_t request_id, const void *body,
                          size_t body_len)
{
    rpc_io_t io = {.fd = fd};
    return rpc_send(&io, method, request_id, body, body_len);
}

kvp_status_t kvp_rpc_call(int fd, uint16_t method, uint64_t request_id, const void *body,
                          size_t body_len, uint8_t **resp_p, size_t *resp_len_p)
{
    rpc_io_t io = {.fd = fd};
    return rpc_call(&io, method, request_id, body, body_len, resp_p, resp_len_p);
}

kvp_status_t kvp_rpc_chan_send(kvp_chan_t *ch, uint16_t method, uint64_t request_id,
                               const void *body, size_t body_len)
{
    rpc_io_t io = {.fd = -1, .ch = ch};
    return rpc_send(&io, method, request_id, body, body_len);
}

kvp_status_t kvp_rpc_chan_call(kvp_chan_t *ch, uint16_t method, uint64_t request_id,
                               const void *body, size_t body_len, uint8_t **resp_p,
                               size_t *resp_len_p)
{
    rpc_io_t io = {.fd = -1, .ch = ch};
    return rpc_call(&io, method, request_id, body, body_len, resp_p, resp_len_p);
}
