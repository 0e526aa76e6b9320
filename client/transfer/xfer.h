/*
 * xfer.h - what the transfer engine moves and counts: an op (a local buffer,
 * an extent of a peer's segment, a direction), the transports one can be
 * forced to, and the relaxed counters of what moved. Shared by the engine
 * (engine.c), the transports (transport/) and the data servers that count
 * what they serve (segment/, ssd/).
 */
#ifndef KVP_CLIENT_TRANSFER_XFER_H
#define KVP_CLIENT_TRANSFER_XFER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client/include/kvpool.h"
#include "common/crc32c.h"
#include "common/grant.h"
#include "common/status.h"

struct kvp_peer;
struct kvp_mem_region;

/* An op's local buffer as the engine routes it: its memory kind and registration, found once
 * (kvp_transfer_mem_find) by whoever plans the op; known false: the engine finds it. */
typedef struct kvp_xfer_mem {
    const struct kvp_mem_region *region; /* NULL: not registered */
    uint8_t kind;                        /* kvp_mem_kind_t */
    bool known;
} kvp_xfer_mem_t;

typedef enum kvp_xfer_kind {
    KVP_XFER_READ = 1,  /* segment -> local (the wire's KVP_DATA_READ) */
    KVP_XFER_WRITE = 2, /* local -> segment (the wire's KVP_DATA_WRITE) */
} kvp_xfer_kind_t;

typedef struct kvp_xfer_op {
    kvp_xfer_kind_t kind;
    void *local;
    uint64_t offset;
    uint64_t length;
    struct kvp_peer *peer; /* borrowed for the call */
    bool want_crc;         /* compute crc of the bytes moved into `crc` */
    bool stream;           /* a piece of a move of >= KVP_CRC32C_STREAM_MIN bytes: copies stream */
    kvp_xfer_mem_t mem;    /* its local buffer's memory, when the planner found it */
    const void *grant;     /* the master's grant for the extent (KVP_GRANT_LEN bytes, borrowed
                              for the call; common/grant.h), or NULL: none was given */
    const void *grant_set; /* or the grant set (header and extents, borrowed) whose extent
                              grant_index covers it */
    uint32_t grant_index;
    uint32_t crc;        /* out */
    kvp_status_t status; /* out */
    bool pass; /* out: the transport cannot carry this op but keeps its peer (an rdma target's
                  range it offers no key for): the engine runs it once on the next transport
                  of its list that reaches the peer, the peer's transport unchanged */
} kvp_xfer_op_t;

/* What a planner hands an op of the master's grants for its extent. */
typedef struct kvp_xfer_grant {
    const void *one; /* a grant of its own, or NULL */
    const void *set; /* or the set (bytes off the wire: length checked) and its extent index */
    uint32_t index;
} kvp_xfer_grant_t;

/* A replica's grant off the wire (a ProtobufCBinaryData): its bytes when it is one, or NULL. */
#define KVP_XFER_GRANT(bin) ((bin).len == KVP_GRANT_LEN ? (const void *)(bin).data : NULL)

typedef enum kvp_transport_id {
    KVP_TRANSPORT_AUTO = 0,
    KVP_TRANSPORT_TCP = 1,
    KVP_TRANSPORT_SHM = 2,
    KVP_TRANSPORT_RDMA = 3,
    KVP_TRANSPORT_DFS = 4, /* DFS shard files read and written in place (never forced) */
} kvp_transport_id_t;

/* A transport that moves bytes in slices, in any order, checksums whole ops: the source of
 * each WRITE that wants one before it starts, each READ that landed after it ends. */
static inline void kvp_xfer_crc_writes(kvp_xfer_op_t **ops, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (ops[i]->want_crc && ops[i]->kind == KVP_XFER_WRITE)
            ops[i]->crc = kvp_crc32c(0, ops[i]->local, ops[i]->length);
}
static inline void kvp_xfer_crc_reads(kvp_xfer_op_t **ops, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (ops[i]->want_crc && ops[i]->kind == KVP_XFER_READ && ops[i]->status == KVP_OK)
            ops[i]->crc = kvp_crc32c(0, ops[i]->local, ops[i]->length);
}

/* Counters (client/metrics.c reads them).
 * Relaxed atomics, added once per batch (engine) or per request (data servers): never a
 * lock, never an allocation. Index [dir]: 0 put (WRITE), 1 get (READ). */
typedef struct kvp_count_stats {
    _Atomic uint64_t ops, bytes;
} kvp_count_stats_t;

typedef struct kvp_xfer_stats {
    kvp_count_stats_t tp[KVP_METRICS_TP_MAX][2]; /* [KVP_METRICS_TP_*][dir] */
    _Atomic uint64_t errors[2];                  /* [dir] */
    kvp_count_stats_t staged[2];                 /* [0] host, [1] gpu */
    kvp_count_stats_t runs[2]; /* [dir]: kvp_transfer_run calls (ops) and their ns (bytes) */
} kvp_xfer_stats_t;

static inline void kvp_count_add(kvp_count_stats_t *c, uint64_t ops, uint64_t bytes)
{
    atomic_fetch_add_explicit(&c->ops, ops, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->bytes, bytes, memory_order_relaxed);
}
/* Take back a count added ahead of a reply that then failed. */
static inline void kvp_count_sub(kvp_count_stats_t *c, uint64_t ops, uint64_t bytes)
{
    atomic_fetch_sub_explicit(&c->ops, ops, memory_order_relaxed);
    atomic_fetch_sub_explicit(&c->bytes, bytes, memory_order_relaxed);
}

#endif
