/*
 * rpc.h - control-plane framing: a fixed 32-byte header, then a protobuf-c body.
 *
 *   offset size field
 *   0      4    magic       0x3150564B ("KVP1" on the wire, little-endian)
 *   4      2    version     KVP_RPC_VERSION
 *   6      2    method      kvp_rpc_method_t; responses set KVP_RPC_RESPONSE_BIT
 *   8      8    request_id  echoed in the response
 *   16     4    body_len    <= the receiver's maximum (KVP_RPC_MAX_BODY)
 *   20     4    status      0 in requests; in a response, a frame-level
 *                           kvp_status_t (then the body is an error text)
 *   24     8    epoch       in a response: the answering master's leader epoch
 *                           (0: standalone); a client refuses a reply whose
 *                           epoch is older than one it has seen. 0 in requests.
 *
 * All integers little-endian. A receiver that sees a bad magic closes the
 * connection; a bad version or an oversized body gets an error response
 * (status set, body = message text) and then the close.
 *
 * Thread: the codec functions are pure; kvp_rpc_call is blocking and must
 * not be used on one fd by two threads at once.
 */
#ifndef KVP_COMMON_RPC_H
#define KVP_COMMON_RPC_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "common/tls.h"

#define KVP_RPC_MAGIC 0x3150564Bu
#define KVP_RPC_VERSION 2
#define KVP_RPC_HDR_LEN 32
#define KVP_RPC_MAX_BODY (64u << 20)
#define KVP_RPC_RESPONSE_BIT 0x8000u

typedef enum kvp_rpc_method {
    KVP_RPC_PING = 1,
    KVP_RPC_MOUNT = 2,
    KVP_RPC_UNMOUNT = 3,
    KVP_RPC_PUT_START = 4,
    KVP_RPC_PUT_END = 5,
    KVP_RPC_PUT_REVOKE = 6,
    KVP_RPC_GET_REPLICA_LIST = 7,
    KVP_RPC_EXIST = 8,
    KVP_RPC_REMOVE = 9,
    KVP_RPC_GET_SIZE = 10,
    KVP_RPC_STAT = 11,
    KVP_RPC_HEARTBEAT = 12,
    KVP_RPC_LIST = 13,
    KVP_RPC_REMOVE_BY_REGEX = 14,
    KVP_RPC_DRAIN = 15,
    KVP_RPC_MOVE_START = 16,
    KVP_RPC_MOVE_END = 17,
    KVP_RPC_LEASE_RELEASE = 18, /* one-way: the master sends no response */
    KVP_RPC_SSD_TASKS = 19,     /* the master may hold the answer up to ~1 s (long poll) */
    KVP_RPC_ADOPT = 20,         /* a segment's owner offers what it holds (after a mount) */
    KVP_RPC_SEG_RECORD = 21,    /* long poll, like SSD_TASKS */
    KVP_RPC_AUTH = 22,          /* a token, the first request on a TLS connection (server.c) */
    KVP_RPC_TASK_CREATE = 23,   /* copy and move tasks (rpc/task_calls.c) */
    KVP_RPC_TASK_QUERY = 24,
    KVP_RPC_TASK_START = 25, /* the owner of the task's source segment runs it */
    KVP_RPC_TASK_END = 26,
    KVP_RPC_REPLICA_CLEAR = 27, /* drop an object's replicas on one segment (Mooncake's) */
    KVP_RPC_PUT_COMMIT = 28,    /* puts ended and space held ahead, in one call (object_calls.c) */
    KVP_RPC_METHOD_MAX = 28,
} kvp_rpc_method_t;

typedef struct kvp_rpc_hdr {
    uint16_t version;
    uint16_t method;
    uint64_t request_id;
    uint32_t body_len;
    int32_t status;
    uint64_t epoch;
} kvp_rpc_hdr_t;

/* Write the 24-byte header for `hdr` (magic and version filled in). */
void kvp_rpc_hdr_pack(const kvp_rpc_hdr_t *hdr, uint8_t out[KVP_RPC_HDR_LEN]);

/*
 * Decode and validate a header. KVP_OK; KVP_ERR_PROTOCOL (bad magic: the
 * stream is not ours, close it); KVP_ERR_VERSION; KVP_ERR_FRAME_TOO_LARGE
 * (body_len > max_body). *hdr is written in every case but bad magic so that
 * an error reply can echo the request id.
 */
kvp_status_t kvp_rpc_hdr_unpack(const uint8_t in[KVP_RPC_HDR_LEN], uint32_t max_body,
                                kvp_rpc_hdr_t *hdr);

/*
 * Incremental frame scanner for a non-blocking reader: looks at the bytes
 * buffered so far. Returns KVP_OK with *frame_len set when a whole frame
 * (header + body) is available at buf, KVP_ERR_PENDING when more bytes are
 * needed (*need_p: total bytes needed, when known), or the header's error.
 */
kvp_status_t kvp_rpc_frame_scan(const uint8_t *buf, size_t len, uint32_t max_body,
                                kvp_rpc_hdr_t *hdr, size_t *frame_len_p);

/* Methods the master never answers (the sender does not wait). */
static inline int kvp_rpc_is_oneway(uint16_t method)
{
    return method == KVP_RPC_LEASE_RELEASE;
}

/* Send one frame and wait for nothing (one-way methods). Blocking. */
kvp_status_t kvp_rpc_send(int fd, uint16_t method, uint64_t request_id, const void *body,
                          size_t body_len);

/*
 * Blocking call on a connected socket: send one request frame with `body`
 * and read the response with the same request id. On KVP_OK *resp_p is a
 * malloc'd body of *resp_len_p bytes (caller frees; may be NULL for 0 bytes).
 * A frame-level error status in the response is returned as the status.
 */
kvp_status_t kvp_rpc_call(int fd, uint16_t method, uint64_t request_id, const void *body,
                          size_t body_len, uint8_t **resp_p, size_t *resp_len_p);

/* The same two over a channel (common/tls.h: TLS or plain). */
kvp_status_t kvp_rpc_chan_send(kvp_chan_t *ch, uint16_t method, uint64_t request_id,
                               const void *body, size_t body_len);
kvp_status_t kvp_rpc_chan_call(kvp_chan_t *ch, uint16_t method, uint64_t request_id,
                               const void *body, size_t body_len, uint8_t **resp_p,
                               size_t *resp_len_p);

#endif
