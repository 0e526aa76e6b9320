/*
 * events.h - KV events for cache-aware routers (Mooncake Conductor, Dynamo):
 * which object keys (and the block hashes in them) are stored on, or removed
 * from, which medium of the pool (see events.c).
 *
 * Wire format: vLLM's ZMQ publisher. A PUB socket sends one message of three
 * frames per batch: the topic, an 8-byte big-endian batch sequence number
 * (consecutive from 0), and msgpack [timestamp (float seconds), [events],
 * dp_rank]. Each event is a msgpack map with the standardized envelope of
 * ../shared/context/conductor-indexer-api.txt ("KV Events API"): event_id
 * (consecutive per stream, i.e. per medium), timestamp (ms), event_type
 * ("stored" | "removed" | "cleared"), model_name, block_size,
 * additional_salt, lora_name, tenant_id, backend_id, medium ("cpu" |
 * "disk"), dp_rank; stored/removed add seq_hashes ([u64], empty when the key
 * ends in no hash), base_block_idx (nil), parent_hash (nil, stored), token_ids
 * (nil, stored) and object_key (the key, always). A ROUTER replay socket
 * answers a request [8-byte big-endian start seq] with every batch it still
 * holds from that seq on ([seq, payload] each), then [-1 as 8 bytes, ""].
 *
 * The request may come from a REQ socket or a DEALER sending ["", seq]
 * (vLLM's _service_replay); a DEALER sending [seq] alone gets the replies
 * without the empty delimiter.
 *
 * Tenants. With an ACL the master stores a tenant's key as TENANT 0x1f KEY;
 * events carry KEY (object_key and the hash read from it) and tenant_id
 * TENANT, except the ACL's "default" tenant (principals naming none), which
 * keeps the tenant_id setting, as do keys without 0x1f (or with a prefix
 * that is no tenant's name: the whole key). Without CURVE that is the only
 * change: one stream, as above, readable by anyone who reaches the port.
 *
 * CURVE (curve_secret + curve_allow, events_curve.h). Both sockets are CURVE
 * servers; only the allow-list's keys get in, each with a tenant or "*". The
 * PUB socket becomes an XPUB (ZMQ_XPUB_MANUAL) and events go in streams: one
 * per tenant, topic "<topic>/<TENANT>/", and the stream of keys of no tenant,
 * topic "<topic>". Each stream has its own batch seq and event_ids
 * (consecutive from 0 per stream, per medium), so a subscriber of one stream
 * sees no gaps. A subscription of a tenant's subscriber that is a prefix of
 * its own topic ("" and "<topic>" included) is applied as its own topic;
 * any other is refused and counted. "*" subscribers' subscriptions apply as
 * given: "<topic>" hears every stream, told apart by the topic frame (and
 * tenant_id). A replay request may name the stream: [topic, seq] (or ["",
 * topic, seq]); [seq] alone replays the subscriber's own tenant's stream
 * ("*": the stream of no tenant), a topic of another tenant is refused.
 * cleared (no key) goes to every stream. A reload that removes a key closes
 * every connection (kvp_events_reload below).
 *
 * Thread: the kvp_events_* calls are made by the master's loop; they copy the
 * event into a bounded queue under a mutex and return (no I/O, no
 * allocation; an eventfd write only when the publisher sleeps). A publisher
 * thread of its own batches, encodes and sends. When the queue is full (its
 * queue_max events, or the queue_max * 256 bytes of keys it keeps) the oldest
 * queued events are dropped and counted; event_ids are given when a batch is
 * sent, so they stay consecutive and drops show only in the counter. ZMQ's
 * send high-water mark (1000 batches) bounds what a stalled subscriber can
 * hold. Memory is bounded by the queue + replay_batches batches (at most
 * 32 MiB) + the HWM per subscriber.
 */
#ifndef KVP_MASTER_OBS_EVENTS_H
#define KVP_MASTER_OBS_EVENTS_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "master/core/event_sink.h"

typedef struct kvp_events kvp_events_t;

/* kvp_medium_t (KVP_MEDIUM_CPU, KVP_MEDIUM_DISK): core/event_sink.h */

typedef struct kvp_events_params {
    const char *bind;        /* ZMQ endpoint of the PUB socket, e.g. "tcp://127.0.0.1:5557" */
    const char *replay_bind; /* ROUTER endpoint for replays; NULL or "": none */
    const char *topic;       /* first frame of every message (default "kvpool") */
    uint32_t queue_max;      /* events waiting to be sent (default 65536; 1..4194304) */
    uint32_t replay_batches; /* batches kept for replay (default 4096; 0..1048576) */
    uint32_t batch_max;      /* events per batch at most (default 256; 1..65536) */
    /* the envelope (NULL: the defaults, JSON null where the contract allows it) */
    const char *model_name;      /* default "kvpool" */
    uint32_t block_size;         /* default 0 (unknown) */
    const char *additional_salt; /* default nil */
    const char *lora_name;       /* default nil */
    const char *tenant_id;       /* default "default" */
    const char *backend_id;      /* default "kvpool-master" */
    int32_t dp_rank;             /* default 0 */
    /* CURVE (events_curve.h): both or neither; NULL or "": off */
    const char *curve_secret; /* file of the master's secret key (mode 0600) */
    const char *curve_allow;  /* file of the subscribers' public keys and tenants */
    int tenants;              /* an ACL is on: keys may carry a tenant (warned without CURVE) */
} kvp_events_params_t;

typedef struct kvp_events_stats {
    uint64_t queued;          /* events waiting now */
    uint64_t published;       /* events sent */
    uint64_t dropped;         /* events dropped (queue full) */
    uint64_t batches;         /* batches sent (without CURVE: the next batch's seq) */
    uint64_t replay_requests; /* replay requests answered */
    int curve;                /* 1: CURVE with an allow-list */
    uint64_t refused_curve;   /* handshakes without CURVE or failed */
    uint64_t refused_key;     /* CURVE keys not in the allow-list */
    uint64_t refused_topic;   /* subscriptions and replays of another tenant's stream */
    uint64_t cuts;            /* reloads that closed every connection (a key was removed) */
} kvp_events_stats_t;

/* Defaults for every field (bind NULL: the caller must set it). */
void kvp_events_params_init(kvp_events_params_t *p);

/* Bind the sockets and start the publisher thread. KVP_ERR_INVALID_ARG (bad
 * endpoint, an unsafe or malformed CURVE file, with a sentence in err) or
 * KVP_ERR_SYSTEM (cannot bind). */
kvp_status_t kvp_events_create(const kvp_events_params_t *p, kvp_events_t **ev_p, char *err,
                               size_t err_len);
/* Send what is queued (within ~1 s), stop the thread, close the sockets. NULL is fine. */
void kvp_events_destroy(kvp_events_t *ev);

/* An object was stored on / removed from a medium. ev may be NULL (no-op). */
void kvp_events_stored(kvp_events_t *ev, kvp_medium_t medium, const char *key, size_t key_len);
void kvp_events_removed(kvp_events_t *ev, kvp_medium_t medium, const char *key, size_t key_len);
/* Every object of the medium is gone (remove-all). */
void kvp_events_cleared(kvp_events_t *ev, kvp_medium_t medium);

/* SIGHUP: read the CURVE allow-list again (the master's loop). NULL or no
 * CURVE: nothing. When the new list lacks a key of the old one (or gives it
 * another tenant), both sockets are closed and bound again on the same
 * endpoints by the publisher thread before it sends another batch: no event
 * pushed after this returns reaches a connection made before it, so a
 * removed key hears nothing more, and its reconnection is refused by ZAP
 * (counted: refused_key). Allowed subscribers reconnect by themselves
 * (ZeroMQ does); batches wait 300 ms for them, and seqs go on, so one that
 * comes back later sees a gap and replays it. A reload that only adds keys
 * (or fails) touches no connection. Returns at once (the reopening is the
 * publisher's). */
void kvp_events_reload(kvp_events_t *ev);

/* The event sink (core/event_sink.h) that pushes into ev: the server hands it to the
 * state (kvp_master_state_t.events). NULL when ev is NULL. Borrowed until
 * kvp_events_destroy. */
const kvp_event_sink_t *kvp_events_sink(kvp_events_t *ev);

/* Counters; ev may be NULL (zeros). */
void kvp_events_stats(kvp_events_t *ev, kvp_events_stats_t *out);

/*
 * The block hash a key ends in, for seq_hashes: 1 and *hash set, or 0 when it
 * ends in none. Thread-safe (pure).
 *
 * The key is cut into components at '@' and '_'. The last component is tried
 * first; when it is not a hash and is at most 24 bytes long, it is skipped and
 * the one before is tried, up to 3 skips (LMCache's "@{dtype}", SGLang's
 * "_{tp}_k" / "_{tp}_v"). A component is a hash when it is, after an optional
 * '-' (Python's str()/format() of a negative int):
 *   - "0x" or "0X" and 1 or more hex digits (Python's hex()), or
 *   - 8 to 20 decimal digits whose value fits in u64, in the key's last
 *     component: read as decimal (plain decimal keys, str() of an int), or
 *   - 8 or more hex digits (any case) otherwise: read as hex, including runs
 *     of decimal digits that are longer, too large, or followed by skipped
 *     components (LMCache's and SGLang's hashes are hex);
 * its value is the number mod 2^64, i.e. the last 16 hex digits of a longer
 * digest (sha256 and the like), two's complement when negative. That is
 * vLLM's own conversion of a block hash to the u64 of its KV events
 * (maybe_convert_block_hash: int.from_bytes(digest, "big") & (2^64 - 1)), so
 * a key made of a vLLM block hash gives the number vLLM's own events give it.
 * A tp rank ("0"), a dtype ("bf16", "bfloat16"), "k"/"v" or a short word is
 * never taken for a hash: fewer than 8 digits, or not all hex. Examples:
 *   vLLM     "p@m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@<64 hex>"  last 16 hex
 *   LMCache  "m@8@3@1f2e3d4c5b6a7988@bfloat16"  0x1f2e3d4c5b6a7988
 *            "m@8@3@1234567890123456@bf16"      0x1234567890123456 (hex)
 *   SGLang   "<sha256 hex>_1_k"                   last 16 hex of the digest
 *   A        "m@...@cache_family:x@123456789012"  123456789012
 *   plain    "12345678901234", "deadbeefcafef00d"
 */
int kvp_events_key_hash(const char *key, size_t key_len, uint64_t *hash);

/* The endpoint a socket is bound to, with the port resolved when the bind
 * asked for "tcp://HOST:*" (ZMQ_LAST_ENDPOINT); replay != 0: the replay
 * socket's. "" when there is none. Borrowed until kvp_events_destroy. */
const char *kvp_events_endpoint(const kvp_events_t *ev, int replay);

#endif
