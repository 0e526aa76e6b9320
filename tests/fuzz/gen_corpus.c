/*
 * gen_corpus.c - writes the seed corpus of fuzz_master (tests/fuzz/corpus).
 *
 *   gen_corpus CORPUS_DIR [CRASHES_DIR]
 *
 * Each file is a stream of request frames as a client would send them: one
 * valid request for every method in common/rpc.h, multi-frame sequences
 * (put start/end/get/remove of one key, revoke, wrong owner, put timeout,
 * eviction, a connection closing, unmount), and invalid input (bad magic,
 * bad version, oversized body_len, truncated frames, undecodable bodies,
 * bad keys). Request ids follow fuzz_master.c's encoding: bit 0 picks the
 * connection, bits 1..3 run put timeouts / eviction / a connection close
 * after the frame, bits 8..23 advance the master clock (ms).
 *
 * fuzz_master mounts "fuzz-seg" (1 MiB, id SEG0) from connection 1 before
 * the input; a segment a seed mounts next gets id SEG1.
 *
 * With a second directory it also writes the reproducers of findings
 * (tests/fuzz/crashes): inputs that make fuzz_master fail until fixed.
 *
 * Regenerate: ninja -C build-fuzz tests/fuzz/gen_corpus &&
 *             build-fuzz/tests/fuzz/gen_corpus tests/fuzz/corpus tests/fuzz/crashes
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rpc.h"
#include "kvpool.pb-c.h"

#define SEG0 ((1ull << 32) | 0) /* the segment fuzz_master mounts */
#define SEG1 ((1ull << 32) | 1) /* the next one mounted */

/* Request id flags (see fuzz_master.c). */
#define C1 0ull
#define C2 1ull
#define EXPIRE 2ull
#define EVICT 4ull
#define CLOSE 8ull
#define ADV(ms) ((uint64_t)(ms) << 8)

typedef struct stream {
    uint8_t *buf;
    size_t len, cap;
} stream_t;

static const char *out_dir;

static void die(const char *what)
{
    fprintf(stderr, "gen_corpus: %s: %s\n", what, strerror(errno));
    exit(1);
}

static void append(stream_t *s, const void *p, size_t n)
{
    if (s->len + n > s->cap) {
        size_t cap = s->cap ? s->cap : 256;
        while (cap < s->len + n)
            cap *= 2;
        uint8_t *b = realloc(s->buf, cap);
        if (b == NULL)
            die("realloc");
        s->buf = b;
        s->cap = cap;
    }
    if (n > 0)
        memcpy(s->buf + s->len, p, n);
    s->len += n;
}

/* One frame with a raw body. */
static void frame_raw(stream_t *s, uint16_t method, uint64_t rid, const void *body, size_t len)
{
    kvp_rpc_hdr_t h = {.method = method, .request_id = rid, .body_len = (uint32_t)len};
    uint8_t hdr[KVP_RPC_HDR_LEN];
    kvp_rpc_hdr_pack(&h, hdr);
    append(s, hdr, sizeof(hdr));
    append(s, body, len);
}

/* One frame with a packed protobuf-c message as the body (NULL: empty body). */
static void frame(stream_t *s, uint16_t method, uint64_t rid, const ProtobufCMessage *msg)
{
    if (msg == NULL) {
        frame_raw(s, method, rid, NULL, 0);
        return;
    }
    size_t n = protobuf_c_message_get_packed_size(msg);
    uint8_t *b = malloc(n ? n : 1);
    if (b == NULL)
        die("malloc");
    protobuf_c_message_pack(msg, b);
    frame_raw(s, method, rid, b, n);
    free(b);
}

static void emit(stream_t *s, const char *name)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", out_dir, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        die(path);
    if (s->len > 0 && fwrite(s->buf, 1, s->len, f) != s->len)
        die(path);
    if (fclose(f) != 0)
        die(path);
    s->len = 0;
}

/* ---- request builders ---- */

static void mount_req(stream_t *s, uint64_t rid, const char *name, const char *medium,
                      uint64_t size)
{
    Kvpool__SegmentDesc d = KVPOOL__SEGMENT_DESC__INIT;
    d.name = (char *)name;
    d.medium = (char *)medium;
    d.size = size;
    d.host_id = "h2";
    d.tcp_endpoint = "127.0.0.1:2";
    d.shm_path = "/dev/shm/kvpool-fuzz";
    Kvpool__MountRequest req = KVPOOL__MOUNT_REQUEST__INIT;
    req.client_id = 2;
    req.segment = &d;
    frame(s, KVP_RPC_MOUNT, rid, &req.base);
}

static void unmount_req(stream_t *s, uint64_t rid, uint64_t segment_id)
{
    Kvpool__UnmountRequest req = KVPOOL__UNMOUNT_REQUEST__INIT;
    req.segment_id = segment_id;
    frame(s, KVP_RPC_UNMOUNT, rid, &req.base);
}

static ProtobufCBinaryData bin(const char *key)
{
    ProtobufCBinaryData b = {.len = strlen(key), .data = (uint8_t *)key};
    return b;
}

/* PutStart of n keys of `size` bytes each; cfg may be NULL. */
static void put_start_n(stream_t *s, uint64_t rid, const char *const *keys, size_t n, uint64_t size,
                        Kvpool__PutConfig *cfg)
{
    ProtobufCBinaryData kb[16];
    uint64_t sizes[16];
    for (size_t i = 0; i < n; i++) {
        kb[i] = bin(keys[i]);
        sizes[i] = size;
    }
    Kvpool__PutStartRequest req = KVPOOL__PUT_START_REQUEST__INIT;
    req.n_keys = n;
    req.keys = kb;
    req.n_sizes = n;
    req.sizes = sizes;
    req.config = cfg;
    frame(s, KVP_RPC_PUT_START, rid, &req.base);
}

static void put_start(stream_t *s, uint64_t rid, const char *key, uint64_t size)
{
    put_start_n(s, rid, &key, 1, size, NULL);
}

static void put_end_n(stream_t *s, uint64_t rid, const char *const *keys, size_t n)
{
    ProtobufCBinaryData kb[16];
    uint32_t crc[16];
    for (size_t i = 0; i < n; i++) {
        kb[i] = bin(keys[i]);
        crc[i] = 0xC0FFEE00u + (uint32_t)i;
    }
    Kvpool__PutEndRequest req = KVPOOL__PUT_END_REQUEST__INIT;
    req.n_keys = n;
    req.keys = kb;
    req.n_crc32c = n;
    req.crc32c = crc;
    frame(s, KVP_RPC_PUT_END, rid, &req.base);
}

static void put_end(stream_t *s, uint64_t rid, const char *key)
{
    put_end_n(s, rid, &key, 1);
}

/* A KeysRequest method: PutRevoke, GetReplicaList, Exist, Remove, GetSize. */
static void keys_n(stream_t *s, uint16_t method, uint64_t rid, const char *const *keys, size_t n,
                   int force)
{
    ProtobufCBinaryData kb[16];
    for (size_t i = 0; i < n; i++)
        kb[i] = bin(keys[i]);
    Kvpool__KeysRequest req = KVPOOL__KEYS_REQUEST__INIT;
    req.n_keys = n;
    req.keys = kb;
    req.force = force;
    frame(s, method, rid, &req.base);
}

static void keys1(stream_t *s, uint16_t method, uint64_t rid, const char *key)
{
    keys_n(s, method, rid, &key, 1, 0);
}

static void stat_req(stream_t *s, uint64_t rid)
{
    Kvpool__StatRequest req = KVPOOL__STAT_REQUEST__INIT;
    frame(s, KVP_RPC_STAT, rid, &req.base);
}

/* ---- the corpus ---- */

static void single_methods(stream_t *s)
{
    frame(s, KVP_RPC_PING, C1, NULL);
    emit(s, "ping");

    mount_req(s, C2, "seg-b", "dram", 1u << 20);
    emit(s, "mount");

    mount_req(s, C2, "seg-b", "ssd", 1u << 20);     /* refused: medium */
    mount_req(s, C2, "fuzz-seg", "dram", 1u << 20); /* refused: name taken */
    mount_req(s, C2, "seg-c", "dram", 100);         /* refused: too small */
    emit(s, "mount_invalid");

    unmount_req(s, C1, SEG0);
    emit(s, "unmount");

    put_start(s, C1, "key-a", 4096);
    emit(s, "put_start");

    put_end(s, C1, "key-a"); /* no such put */
    emit(s, "put_end");

    keys1(s, KVP_RPC_PUT_REVOKE, C1, "key-a");
    emit(s, "put_revoke");

    keys1(s, KVP_RPC_GET_REPLICA_LIST, C1, "key-a");
    emit(s, "get_replica_list");

    keys1(s, KVP_RPC_EXIST, C1, "key-a");
    emit(s, "exist");

    const char *k = "key-a";
    keys_n(s, KVP_RPC_REMOVE, C1, &k, 1, 1);
    emit(s, "remove");

    keys1(s, KVP_RPC_GET_SIZE, C1, "key-a");
    emit(s, "get_size");

    stat_req(s, C1);
    emit(s, "stat");
}

static void sequences(stream_t *s)
{
    /* The whole life of one key, every read method on it, a lease, a remove. */
    put_start(s, C1, "seq/k1", 8192);
    put_end(s, C1, "seq/k1");
    keys1(s, KVP_RPC_GET_REPLICA_LIST, C1, "seq/k1");
    keys1(s, KVP_RPC_REMOVE, C1, "seq/k1");
    emit(s, "seq_put_get_remove");

    put_start(s, C1, "seq/k1", 8192);
    put_end(s, C1, "seq/k1");
    keys1(s, KVP_RPC_EXIST, C1, "seq/k1");
    keys1(s, KVP_RPC_GET_SIZE, C2, "seq/k1");
    keys1(s, KVP_RPC_GET_REPLICA_LIST, C2, "seq/k1");
    keys1(s, KVP_RPC_REMOVE, C1, "seq/k1");             /* leased */
    keys1(s, KVP_RPC_REMOVE, C1 | ADV(6000), "seq/k1"); /* lease over */
    keys1(s, KVP_RPC_EXIST, C1, "seq/k1");
    stat_req(s, C1);
    emit(s, "seq_lease");

    put_start(s, C1, "seq/k2", 100);
    keys1(s, KVP_RPC_GET_REPLICA_LIST, C1, "seq/k2"); /* pending: invisible */
    keys1(s, KVP_RPC_PUT_REVOKE, C1, "seq/k2");
    put_start(s, C1, "seq/k2", 100);
    put_end(s, C1, "seq/k2");
    emit(s, "seq_put_revoke");

    put_start(s, C1, "seq/k3", 64);
    put_end(s, C2, "seq/k3");                   /* not the writer */
    keys1(s, KVP_RPC_PUT_REVOKE, C2, "seq/k3"); /* not the writer */
    put_start(s, C2, "seq/k3", 64);             /* pending */
    put_end(s, C1, "seq/k3");
    put_start(s, C2, "seq/k3", 64); /* exists */
    put_end(s, C1, "seq/k3");       /* not pending */
    emit(s, "seq_wrong_owner");

    put_start(s, C1, "seq/k4", 1000);
    frame(s, KVP_RPC_PING, C1 | ADV(31000) | EXPIRE, NULL); /* put timeout */
    put_end(s, C1, "seq/k4");
    put_start(s, C1, "seq/k4", 1000);
    put_end(s, C1, "seq/k4");
    stat_req(s, C1);
    emit(s, "seq_put_timeout");

    /* Fill the 1 MiB segment, then put more: eviction on the way in, then by watermark. */
    const char *fill[] = {"fill/0", "fill/1", "fill/2", "fill/3"};
    put_start_n(s, C1, fill, 4, 240u << 10, NULL);
    put_end_n(s, C1, fill, 4);
    const char *more[] = {"more/0", "more/1"};
    put_start_n(s, C1 | ADV(100), more, 2, 200u << 10, NULL);
    put_end_n(s, C1, more, 2);
    frame(s, KVP_RPC_PING, C1 | EVICT, NULL);
    keys_n(s, KVP_RPC_EXIST, C1, fill, 4, 0);
    stat_req(s, C1);
    emit(s, "seq_fill_evict");

    /* Pins, replicas on two segments, a preferred segment. */
    mount_req(s, C2, "seg-b", "dram", 1u << 20);
    Kvpool__PutConfig cfg = KVPOOL__PUT_CONFIG__INIT;
    cfg.replica_num = 2;
    cfg.pin = 1;
    cfg.soft_pin_ttl_s = 10;
    cfg.preferred_segment = "seg-b";
    const char *pk[] = {"pin/soft0", "pin/soft1"};
    put_start_n(s, C1, pk, 2, 300u << 10, &cfg);
    put_end_n(s, C1, pk, 2);
    keys_n(s, KVP_RPC_GET_REPLICA_LIST, C2, pk, 2, 0);
    Kvpool__PutConfig hard = KVPOOL__PUT_CONFIG__INIT;
    hard.pin = 2;
    const char *hk = "pin/hard";
    put_start_n(s, C1, &hk, 1, 500u << 10, &hard);
    put_end(s, C1, "pin/hard");
    put_start(s, C2 | ADV(20000), "pin/late", 700u << 10);
    keys_n(s, KVP_RPC_GET_REPLICA_LIST, C1, pk, 2, 0); /* soft pins evicted: nothing else left */
    stat_req(s, C1 | EVICT);
    emit(s, "seq_pins_replicas");

    /* A second segment's owner goes away with objects on it. */
    mount_req(s, C2, "seg-b", "dram", 1u << 20);
    Kvpool__PutConfig pref = KVPOOL__PUT_CONFIG__INIT;
    pref.preferred_segment = "seg-b";
    const char *bk = "on-b";
    put_start_n(s, C1, &bk, 1, 4096, &pref);
    put_end(s, C1, "on-b");
    put_start(s, C2, "pending-of-2", 4096);
    frame(s, KVP_RPC_PING, C2 | CLOSE, NULL);
    keys1(s, KVP_RPC_GET_REPLICA_LIST, C1, "on-b");
    keys1(s, KVP_RPC_EXIST, C1, "pending-of-2");
    stat_req(s, C1);
    emit(s, "seq_conn_close");

    mount_req(s, C2, "seg-b", "dram", 1u << 20);
    unmount_req(s, C1, SEG1); /* not the owner */
    put_start_n(s, C2, &bk, 1, 4096, &pref);
    put_end(s, C2, "on-b");
    unmount_req(s, C2, SEG1);
    unmount_req(s, C2, SEG1); /* gone */
    mount_req(s, C2, "seg-b", "dram", 1u << 20);
    stat_req(s, C2);
    emit(s, "seq_mount_unmount");

    /* One of everything, in a row. */
    frame(s, KVP_RPC_PING, C1, NULL);
    mount_req(s, C2, "seg-b", "dram", 64u << 10);
    put_start(s, C1, "all", 128);
    put_end(s, C1, "all");
    keys1(s, KVP_RPC_GET_REPLICA_LIST, C2, "all");
    keys1(s, KVP_RPC_EXIST, C2, "all");
    keys1(s, KVP_RPC_GET_SIZE, C2, "all");
    stat_req(s, C2);
    keys_n(s, KVP_RPC_REMOVE, C2, (const char *const[]){"all"}, 1, 1);
    put_start(s, C1, "all", 128);
    keys1(s, KVP_RPC_PUT_REVOKE, C1, "all");
    unmount_req(s, C2, SEG1);
    emit(s, "seq_all_methods");
}

static void invalid(stream_t *s)
{
    uint8_t hdr[KVP_RPC_HDR_LEN];
    kvp_rpc_hdr_t h = {.method = KVP_RPC_PING, .request_id = 7};

    kvp_rpc_hdr_pack(&h, hdr);
    hdr[0] ^= 0xff;
    frame(s, KVP_RPC_PING, C1, NULL);
    append(s, hdr, sizeof(hdr));
    emit(s, "bad_magic");

    kvp_rpc_hdr_pack(&h, hdr);
    hdr[4] = 2; /* version 2 */
    frame(s, KVP_RPC_PING, C1, NULL);
    append(s, hdr, sizeof(hdr));
    emit(s, "bad_version");

    h.body_len = 0xffffffffu;
    kvp_rpc_hdr_pack(&h, hdr);
    append(s, hdr, sizeof(hdr));
    emit(s, "huge_body_len");

    h.body_len = KVP_RPC_MAX_BODY;
    kvp_rpc_hdr_pack(&h, hdr);
    append(s, hdr, sizeof(hdr));
    append(s, "short", 5);
    emit(s, "truncated_body");

    frame(s, KVP_RPC_PING, C1, NULL);
    kvp_rpc_hdr_pack(&h, hdr);
    append(s, hdr, 10);
    emit(s, "truncated_header");

    put_start(s, C1, "cut", 4096);
    s->len -= 3; /* the body's last bytes never arrive */
    emit(s, "truncated_put_start");

    static const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0x0f, 0x0a, 0x80, 0x12};
    for (uint16_t m = KVP_RPC_MOUNT; m <= KVP_RPC_METHOD_MAX; m++)
        frame_raw(s, m, C1, junk, sizeof(junk));
    emit(s, "undecodable_bodies");

    frame(s, 99, C1, NULL);
    frame(s, KVP_RPC_PING | KVP_RPC_RESPONSE_BIT, C1, NULL);
    frame(s, 0, C1, NULL);
    frame(s, KVP_RPC_METHOD_MAX + 1, C2, NULL);
    frame(s, KVP_RPC_PING, C1, NULL);
    emit(s, "unknown_methods");

    /* Keys: empty, a NUL inside, too long, not UTF-8. */
    static char long_key[4098];
    memset(long_key, 'k', sizeof(long_key) - 1);
    ProtobufCBinaryData kb[4] = {
        {.len = 0, .data = (uint8_t *)""},
        {.len = 5, .data = (uint8_t *)"a\0bcd"},
        {.len = 4097, .data = (uint8_t *)long_key},
        {.len = 3, .data = (uint8_t *)"\xff\xfe\xfd"},
    };
    uint64_t sizes[4] = {64, 64, 64, 64};
    Kvpool__PutStartRequest ps = KVPOOL__PUT_START_REQUEST__INIT;
    ps.n_keys = 4;
    ps.keys = kb;
    ps.n_sizes = 4;
    ps.sizes = sizes;
    frame(s, KVP_RPC_PUT_START, C1, &ps.base);
    Kvpool__KeysRequest kr = KVPOOL__KEYS_REQUEST__INIT;
    kr.n_keys = 4;
    kr.keys = kb;
    frame(s, KVP_RPC_GET_REPLICA_LIST, C1, &kr.base);
    emit(s, "bad_keys");

    /* Mismatched arrays, size 0, larger than the segment, absurd replica count. */
    ps.n_keys = 1;
    ps.keys = (ProtobufCBinaryData[]){bin("mm")};
    ps.n_sizes = 2;
    frame(s, KVP_RPC_PUT_START, C1, &ps.base);
    Kvpool__PutEndRequest pe = KVPOOL__PUT_END_REQUEST__INIT;
    pe.n_keys = 1;
    pe.keys = ps.keys;
    pe.n_crc32c = 0;
    frame(s, KVP_RPC_PUT_END, C1, &pe.base);
    put_start(s, C1, "zero", 0);
    put_start(s, C1, "huge", 2u << 20);
    put_start(s, C1, "max", UINT64_MAX);
    Kvpool__PutConfig many = KVPOOL__PUT_CONFIG__INIT;
    many.replica_num = 1000;
    many.pin = 7;
    many.preferred_segment = "nowhere";
    const char *r = "reps";
    put_start_n(s, C1, &r, 1, 64, &many);
    emit(s, "bad_put_args");
}

/*
 * Reproducers of findings (tests/fuzz/crashes; see the README there). They
 * fail fuzz_master until the bug is fixed, so they are not seeds.
 */
/* The methods added for liveness, listing, bulk remove, drain; upsert; written masks. */
static void admin_methods(stream_t *s)
{
    Kvpool__HeartbeatRequest hb = KVPOOL__HEARTBEAT_REQUEST__INIT;
    uint64_t ids[2] = {SEG0, 12345};
    hb.client_id = 7;
    hb.segment_ids = ids;
    hb.n_segment_ids = 2;
    frame(s, KVP_RPC_HEARTBEAT, C1, &hb.base);
    frame(s, KVP_RPC_HEARTBEAT, C2, &hb.base);
    emit(s, "heartbeat");

    const char *keys[] = {"ls/a1", "ls/a2", "ls/b1"};
    put_start_n(s, C1, keys, 3, 1000, NULL);
    put_end_n(s, C1, keys, 3);
    Kvpool__ListRequest lr = KVPOOL__LIST_REQUEST__INIT;
    lr.pattern = "^ls/a";
    lr.limit = 1;
    frame(s, KVP_RPC_LIST, C1, &lr.base);
    lr.pattern = "";
    lr.segment_id = SEG0;
    lr.cursor = 3;
    frame(s, KVP_RPC_LIST, C2, &lr.base);
    lr.pattern = "([";
    frame(s, KVP_RPC_LIST, C2, &lr.base);
    emit(s, "list");

    put_start_n(s, C1, keys, 3, 1000, NULL);
    put_end_n(s, C1, keys, 3);
    Kvpool__RemoveByRegexRequest rr = KVPOOL__REMOVE_BY_REGEX_REQUEST__INIT;
    rr.pattern = "a[12]$";
    frame(s, KVP_RPC_REMOVE_BY_REGEX, C2, &rr.base);
    rr.pattern = "";
    rr.all = 1;
    rr.force = 1;
    frame(s, KVP_RPC_REMOVE_BY_REGEX, C2, &rr.base);
    emit(s, "remove_by_regex");

    /* a drain of fuzz-seg by its owner: move every object to a second segment */
    mount_req(s, C2, "seg-b", "dram", 1u << 20);
    put_start_n(s, C1, keys, 3, 3000, NULL);
    put_end_n(s, C1, keys, 3);
    Kvpool__DrainRequest dr = KVPOOL__DRAIN_REQUEST__INIT;
    dr.segment_name = "fuzz-seg";
    frame(s, KVP_RPC_DRAIN, C2, &dr.base);
    frame(s, KVP_RPC_HEARTBEAT, C1, &hb.base);
    ProtobufCBinaryData mk[3] = {bin(keys[0]), bin(keys[1]), bin(keys[2])};
    Kvpool__MoveStartRequest ms = KVPOOL__MOVE_START_REQUEST__INIT;
    ms.from_segment_id = SEG0;
    ms.keys = mk;
    ms.n_keys = 3;
    frame(s, KVP_RPC_MOVE_START, C1, &ms.base);
    Kvpool__MoveEndRequest me = KVPOOL__MOVE_END_REQUEST__INIT;
    int32_t sts[3] = {0, -14, 0};
    me.from_segment_id = SEG0;
    me.keys = mk;
    me.n_keys = 3;
    me.statuses = sts;
    me.n_statuses = 3;
    frame(s, KVP_RPC_MOVE_END, C1, &me.base);
    keys_n(s, KVP_RPC_GET_REPLICA_LIST, C2, keys, 3, 0);
    unmount_req(s, C1, SEG0);
    emit(s, "drain_move");

    /* upsert in place and into new extents; best-effort PutEnd masks */
    Kvpool__PutConfig up = KVPOOL__PUT_CONFIG__INIT;
    up.upsert = 1;
    up.replica_num = 2;
    mount_req(s, C2, "seg-b", "dram", 1u << 20);
    put_start_n(s, C1, keys, 3, 2000, &up);
    ProtobufCBinaryData ek[3] = {bin(keys[0]), bin(keys[1]), bin(keys[2])};
    uint32_t crcs[3] = {1, 2, 3}, masks[3] = {1, 2, 0};
    Kvpool__PutEndRequest pe = KVPOOL__PUT_END_REQUEST__INIT;
    pe.keys = ek;
    pe.n_keys = 3;
    pe.crc32c = crcs;
    pe.n_crc32c = 3;
    pe.written_mask = masks;
    pe.n_written_mask = 3;
    frame(s, KVP_RPC_PUT_END, C1, &pe.base);
    put_start_n(s, C2, keys, 3, 2000, &up);
    put_end_n(s, C2, keys, 3);
    put_start_n(s, C1, keys, 3, 5000, &up);
    put_end_n(s, C1, keys, 3);
    emit(s, "upsert_masks");
}

static void crashes(stream_t *s)
{
    /* Segment table capacity wraps: a mount of 2^64 - 1 MiB + 4 KiB next to the
     * 1 MiB fuzz-seg makes capacity 4096 while 128 KiB are in use, and the next
     * watermark check evicts every object in the pool. */
    const char *keys[] = {"victim/0", "victim/1", "victim/2", "victim/3",
                          "victim/4", "victim/5", "victim/6", "victim/7"};
    put_start_n(s, C1, keys, 8, 16u << 10, NULL);
    put_end_n(s, C1, keys, 8);
    stat_req(s, C1);
    mount_req(s, C2, "evil", "dram", UINT64_MAX - (1ull << 20) + 4096 + 1);
    stat_req(s, C2 | EVICT);                  /* capacity 4096, used 128 KiB */
    keys_n(s, KVP_RPC_EXIST, C1, keys, 8, 0); /* all 0: evicted */
    stat_req(s, C1);
    emit(s, "regress_capacity_overflow");
}

int main(int argc, char **argv)
{
    if (argc != 2 && argc != 3) {
        fprintf(stderr, "usage: %s CORPUS_DIR [CRASHES_DIR]\n", argv[0]);
        return 2;
    }
    out_dir = argv[1];
    stream_t s = {0};
    single_methods(&s);
    sequences(&s);
    invalid(&s);
    admin_methods(&s);
    crashes(&s); /* fixed findings stay as regression seeds */
    if (argc == 3)
        out_dir = argv[2]; /* findings not fixed yet would be written here */
    free(s.buf);
    return 0;
}
