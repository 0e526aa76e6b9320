/*
 * wire.h - the tcp data plane's wire format (docs/protocol.md): the request
 * and reply headers a tcp transport sends and a data server
 * (segment/data_server.c, over a DRAM segment's memory or an SSD segment's
 * file) reads.
 *
 * Little-endian host order (x86-64, aarch64); every size is pinned below.
 */
#ifndef KVP_CLIENT_TRANSPORT_WIRE_H
#define KVP_CLIENT_TRANSPORT_WIRE_H

#include <stdint.h>

#define KVP_DATA_MAGIC 0x4450564Bu /* "KVPD" little-endian */
#define KVP_DATA_READ 1
#define KVP_DATA_WRITE 2
/* Vectored: `offset` carries the entry count n (1..KVP_DATA_VEC_MAX), `length` the sum of the
 * entries' lengths, segment_id is 0; n kvp_data_vec_t follow the header (then, for WRITEV,
 * the entries' payloads back to back). One response for the whole chain. */
#define KVP_DATA_READV 3
#define KVP_DATA_WRITEV 4
#define KVP_DATA_VEC_MAX 256
/* HELLO (data grants on, the first request of a connection): segment_id names the segment,
 * `offset` carries the principal's tag, length 0. The reply's length is 32 and a challenge
 * follows (grants off: 0, nothing follows, the connection goes on unproven); the client
 * sends its 32-byte proof (common/grant.h); a second reply says 0 (the connection is the
 * tag's principal's) or KVP_ERR_DENIED (closed). */
#define KVP_DATA_HELLO 5
/* MAP (same host only, on the owner's Unix socket: the descriptor's shm_path "@NAME", an
 * abstract name): ask for the segment's memory. segment_id names it, offset 0, length its
 * size; with data grants on, after a HELLO on the same connection, flags KVP_DATA_F_GRANT
 * and one MAP grant over the whole segment follow. The owner checks the peer's uid
 * (SO_PEERCRED: its own or root) and the grant; the reply (status 0, length the size)
 * carries the segment's memfd (SCM_RIGHTS), and the connection ends. Refused: the reply
 * says KVP_ERR_DENIED, no descriptor travels. */
#define KVP_DATA_MAP 6
/* rdma memory windows (an owner serving with KVPOOL_RDMA_WINDOWS=1, data grants on; on a
 * connection that proved its principal in a HELLO): BIND_READ / BIND_WRITE are vectored like
 * READV / WRITEV (`offset` n, `length` the entries' sum, the entries and their grants
 * follow, no payload) but segment_id carries the number of the owner's queue pair (the
 * client's QP's destination) the windows are for, which must be the same principal's. The
 * owner checks the grants as for a READV / WRITEV, binds a type 2 window per entry on that
 * QP with remote READ or WRITE over exactly the entry's extent, and answers with length
 * 8 * n and n kvp_data_window_t. UNBIND: segment_id the QP, `offset` n, then n
 * kvp_data_window_t from earlier answers: those windows are invalidated; no answer. */
#define KVP_DATA_BIND_READ 7
#define KVP_DATA_BIND_WRITE 8
#define KVP_DATA_UNBIND 9
/* PROVE (the master, before it answers a Mount; needs no HELLO): segment_id 0, offset 0,
 * length 32 + the segment name's length (1..255); a 32-byte nonce and the name follow. A
 * server serving a segment of that name answers status 0, length 32 and the proof
 * (common/grant.h, kvp_grant_mount_proof of the secret its owner sent in the Mount);
 * otherwise KVP_ERR_DENIED, length 0. The connection ends either way. */
#define KVP_DATA_PROVE 10
/* REGIONS (a transfer engine's server only, client/te/te.c): header with segment_id the engine's,
 * offset 0, length 0; answered status 0, length 16 x n, then n (address, length) pairs of
 * u64, the ranges the engine registered, lowest address first (at most
 * KVP_DATA_REGIONS_MAX). The connection goes on. */
#define KVP_DATA_REGIONS 11
#define KVP_DATA_REGIONS_MAX 4096
/* TE_AUTH (a transfer engine's server only, client/te/te.c, with credentials): header with
 * segment_id the engine's, offset 0, length 0; answered status 0 and length 32 + c: a fresh
 * 32-byte challenge and the target's certificate (DER, c bytes, at most
 * KVP_DATA_TE_CERT_MAX) (length 0: the engine has no credentials, asks for no proof and
 * proves nothing). The peer then sends u32 cert_len, u32 sig_len (LE), its own 32-byte
 * challenge, its certificate (DER) and its signature (SHA-256, at most KVP_DATA_TE_SIG_MAX)
 * over the message te.c's auth_message builds ("kvpool te auth 3", both challenges, the
 * segment id, both ends of the connection, the SHA-256 of the target's certificate);
 * answered status 0 with length s and the target's signature (s bytes) over the same with
 * the tag "kvpool te targ 3" and the SHA-256 of the peer's certificate (the connection is
 * now that certificate's principal, its CN), or KVP_ERR_DENIED, length 0 (not of the
 * engine's CA, revoked, a bad signature, a principal KVPOOL_TE_PEERS does not name), and
 * the connection closes. docs/protocol.md has the whole exchange. */
#define KVP_DATA_TE_AUTH 12
/* The segment id of a transfer engine's frames (its "segment": the process's registered
 * memory, an extent's offset a virtual address). */
#define KVP_TE_SEGMENT_ID 0x4b56505445ull /* "KVPTE" */
#define KVP_DATA_TE_CERT_MAX 16384
#define KVP_DATA_TE_SIG_MAX 1024
/* TE_CMA (a transfer engine's Unix socket only, client/te/te.c): the peer moves the bytes itself
 * with process_vm_writev / process_vm_readv. Header: segment_id the engine's, flags
 * KVP_DATA_TE_CMA_WRITE for a write (else a read), offset the entry count n (1..
 * KVP_DATA_VEC_MAX), length their total; n kvp_data_vec_t follow. Checked as a READV /
 * WRITEV; answered status 0, length 0 (go: the target lets the peer at its memory and holds
 * the ranges registered) or the refusal (the connection goes on). After a go the peer moves
 * the bytes and sends an int32 errno (0: all moved), not answered. */
#define KVP_DATA_TE_CMA 13
#define KVP_DATA_TE_CMA_WRITE 0x1
/* TE_CMA with flags KVP_DATA_TE_CMA_LEASE, offset 0, length 0 and no entries: a standing
 * lease of the one-copy path (client/te/te_lease.h). Granted only to a peer the kernel already
 * lets at all of the target's memory (its Unix socket, the same user or root, a dumpable
 * target, no Yama ptrace restriction, no other principal and no KVPOOL_TE_ACL): answered
 * status 0, length 0, with two memfds as SCM_RIGHTS on the answer's first byte: the
 * target's regions (a kvp_data_te_lease_regions_t, sealed against shrinking, growing and
 * writing: the peer maps it read-only) and the peer's own slot (a kvp_data_te_lease_slot_t,
 * sealed against shrinking and growing). Otherwise KVP_ERR_UNSUPPORTED or KVP_ERR_DENIED,
 * length 0, and the peer asks per batch. The connection goes on; when it closes, the target
 * revokes the slot. */
#define KVP_DATA_TE_CMA_LEASE 0x2
#define KVP_TE_LEASE_MAGIC 0x5347455250544b50ull /* "PKTPREGS" little-endian */
#define KVP_TE_SLOT_MAGIC 0x544f4c5350544b50ull  /* "PKTPSLOT" little-endian */
#define KVP_TE_LEASE_REGIONS 4096
typedef struct kvp_data_te_lease_regions {
    uint64_t magic;     /* KVP_TE_LEASE_MAGIC */
    uint64_t gen;       /* atomic: even, the regions stand; odd, the target rewrites them */
    uint64_t n_regions; /* at most KVP_TE_LEASE_REGIONS: the host ranges the target registered */
    uint64_t pad[5];
    uint64_t regions[KVP_TE_LEASE_REGIONS][2]; /* (address, length), lowest address first */
} kvp_data_te_lease_regions_t;
_Static_assert(sizeof(kvp_data_te_lease_regions_t) == 64 + 4096 * 16,
               "kvp_data_te_lease_regions_t is pinned");
typedef struct kvp_data_te_lease_slot {
    uint64_t magic;    /* KVP_TE_SLOT_MAGIC */
    uint64_t state;    /* atomic, the peer's: the generation it checked against << 1 | busy */
    uint64_t revoked;  /* atomic, the target's: 1 once the lease's connection closed */
    uint64_t moved[2]; /* atomic, the peer's: [KVP_TE_READ], [KVP_TE_WRITE] ranges it moved */
    uint64_t bytes[2]; /* atomic, the peer's: ... their bytes */
    uint64_t pad;
} kvp_data_te_lease_slot_t;
_Static_assert(sizeof(kvp_data_te_lease_slot_t) == 64, "kvp_data_te_lease_slot_t is pinned");
/* TE_NOTIFY (a transfer engine's only): header with segment_id the engine's, offset the
 * name's length, length the name's and the message's; the name then the message follow
 * (length at most KVP_DATA_TE_NOTIFY_MAX). Answered status 0 (queued for get_notifies),
 * KVP_ERR_DENIED (a peer not admitted) or KVP_ERR_NO_SPACE (KVP_TE_NOTIFIES_MAX pending),
 * length 0, the payload read first; the connection goes on. */
#define KVP_DATA_TE_NOTIFY 14
#define KVP_DATA_TE_NOTIFY_MAX 65536
/* TE_RDMA (a transfer engine's only, client/te/te_rdma.c): header with segment_id the engine's,
 * offset 0, length 0. An admitted peer is answered status 0, length 40 + 24 x n: a
 * kvp_data_te_rdma_t (the rdma_cm address to connect to, n, a fresh one-time token) and n
 * kvp_data_te_rdma_region_t (the ranges the engine registered, lowest address first, each
 * with its memory region's rkey; at most KVP_DATA_REGIONS_MAX). The peer connects an RC
 * queue pair there with private data {u32 "KVPT", u32 1, the token}: the target accepts a
 * token it handed out within KVP_DATA_TE_RDMA_TOKEN_MS, once. Otherwise KVP_ERR_DENIED (not
 * admitted) or KVP_ERR_UNSUPPORTED (no rdma here), length 0. The connection goes on. */
#define KVP_DATA_TE_RDMA 15
#define KVP_DATA_TE_RDMA_TOKEN_MS 30000u
typedef struct kvp_data_te_rdma {
    char ipv4[16]; /* dotted, NUL-terminated */
    uint16_t port;
    uint16_t pad;
    uint32_t n;
    uint8_t token[16];
} kvp_data_te_rdma_t;
_Static_assert(sizeof(kvp_data_te_rdma_t) == 40, "kvp_data_te_rdma_t is pinned");
typedef struct kvp_data_te_rdma_region {
    uint64_t addr;
    uint64_t len;
    uint32_t rkey;
    uint32_t pad;
} kvp_data_te_rdma_region_t;
_Static_assert(sizeof(kvp_data_te_rdma_region_t) == 24, "kvp_data_te_rdma_region_t is pinned");
/* flags: grants follow (data grants on, common/grant.h): a READ/WRITE's one grant after the
 * header; a READV/WRITEV's n grants after its n entries, in their order. Then any payload. */
#define KVP_DATA_F_GRANT 0x1
/* A grant set (common/grant.h) covers the entries instead: F_GRANT_SET, the set (its header
 * and extents) follows the header or entries, then n u32 indices, entry i lying inside the
 * set's extent idx[i]; F_GRANT_SAME, only the n indices follow, naming extents of the set
 * this connection sent last (and the owner took). At most one of the three flags. */
#define KVP_DATA_F_GRANT_SET 0x2
#define KVP_DATA_F_GRANT_SAME 0x4
#define KVP_DATA_F_GRANTS (KVP_DATA_F_GRANT | KVP_DATA_F_GRANT_SET | KVP_DATA_F_GRANT_SAME)

typedef struct kvp_data_req {
    uint32_t magic;
    uint16_t op;
    uint16_t flags;
    uint64_t segment_id;
    uint64_t offset;
    uint64_t length;
} kvp_data_req_t; /* 32 bytes, little-endian host order (x86-64, aarch64) */

typedef struct kvp_data_resp {
    uint32_t magic;
    int32_t status;
    uint64_t length; /* READ(V): payload bytes that follow when status == 0 */
} kvp_data_resp_t;   /* 16 bytes */

typedef struct kvp_data_vec {
    uint64_t segment_id;
    uint64_t offset;
    uint64_t length;
} kvp_data_vec_t; /* 24 bytes: one extent of a READV/WRITEV */

typedef struct kvp_data_window {
    uint32_t rkey; /* the window's, for RDMA READ/WRITE on the QP it was bound on */
    uint32_t slot; /* the owner's name for it (UNBIND) */
} kvp_data_window_t;

_Static_assert(sizeof(kvp_data_window_t) == 8, "a window is 8 bytes");
_Static_assert(sizeof(kvp_data_vec_t) == 24, "data vector entry is 24 bytes");
_Static_assert(sizeof(kvp_data_req_t) == 32, "data request header is 32 bytes");
_Static_assert(sizeof(kvp_data_resp_t) == 16, "data response header is 16 bytes");

#endif
