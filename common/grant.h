/*
 * grant.h - data-plane capabilities: what the master seals into its PutStart
 * and GetReplicaList answers (and a drain's MoveStart, an SSD owner's tasks)
 * so that a segment's owner can tell, with no call to the master, that the
 * master let the sender READ or WRITE this extent of its segment, until when.
 *
 * A grant is 80 bytes on the wire (docs/protocol.md, "Grants"): the extent
 * (segment, offset, length), the op, an expiry on the wall clock, the
 * master's epoch (random at each start: a restarted or new master's grants
 * never match the old keys, and the old ones never match the new), a nonce,
 * the principal's tag, and an HMAC-SHA256 of the first 64 bytes under the
 * segment's key, truncated to 128 bits. The master draws the key when the
 * segment mounts and gives it to the owner in the MountResponse, over the
 * authenticated control connection; nobody else ever sees it.
 *
 * A kvp_grant_mac_t holds a keyed HMAC context made once (per segment on the
 * master, per connection on an owner): sealing or checking one grant then
 * allocates nothing. Not thread-safe: one user at a time.
 */
#ifndef KVP_COMMON_GRANT_H
#define KVP_COMMON_GRANT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/status.h"

#define KVP_GRANT_VERSION 1
#define KVP_GRANT_READ 1 /* the wire's KVP_DATA_READ */
#define KVP_GRANT_WRITE 2
#define KVP_GRANT_MAP 3 /* the whole segment's memory, handed over on its host (shm) */
#define KVP_GRANT_KEY_LEN 32
#define KVP_GRANT_MAC_LEN 16
/* How far an owner's wall clock may run ahead of the master's: a grant is taken until
 * its expiry plus this (hosts keep their clocks in step with NTP; docs/security.md). */
#define KVP_GRANT_SKEW_MS 1000u

typedef struct kvp_grant {
    uint8_t version; /* KVP_GRANT_VERSION */
    uint8_t op;      /* KVP_GRANT_READ, KVP_GRANT_WRITE or KVP_GRANT_MAP */
    uint16_t reserved0;
    uint32_t reserved1;
    uint64_t segment_id;
    uint64_t offset; /* the extent it covers; a request may name any part of it */
    uint64_t length;
    uint64_t expiry_ms; /* CLOCK_REALTIME, ms: good until then */
    uint64_t epoch;     /* the master's, at the segment's mount */
    uint64_t nonce;
    uint64_t principal; /* tag of the principal it was given to (0: none) */
    uint8_t mac[KVP_GRANT_MAC_LEN];
} kvp_grant_t; /* 80 bytes, little-endian host order like the rest of the data wire */

#define KVP_GRANT_LEN 80
_Static_assert(sizeof(kvp_grant_t) == KVP_GRANT_LEN, "a grant is 80 bytes");

typedef struct kvp_grant_mac kvp_grant_mac_t;

/*
 * A grant set: what the master seals once for all the extents of one segment that one
 * answer (PutStart, GetReplicaList) hands out, instead of a grant per extent. The 64-byte
 * header (the op, the segment, the expiry, the epoch, a nonce, the principal, the count)
 * is followed by `count` extents; the MAC is HMAC-SHA256 under the segment's key of the
 * header's first 48 bytes and then the extents, truncated to 128 bits. A set's first byte
 * is its version (2), a single grant's is 1, so neither's MAC ever stands for the other.
 * A request names, per entry, which extent of the set covers it (docs/protocol.md
 * "Grant sets"): one MAC per segment per answer, checked once per data connection.
 */
#define KVP_GRANT_SET_VERSION 2
#define KVP_GRANT_SET_MAX 8192u /* extents in one set: the master seals single grants past it */

typedef struct kvp_grant_set_hdr {
    uint8_t version; /* KVP_GRANT_SET_VERSION */
    uint8_t op;      /* KVP_GRANT_READ or KVP_GRANT_WRITE */
    uint16_t reserved0;
    uint32_t count; /* extents that follow: 1..KVP_GRANT_SET_MAX */
    uint64_t segment_id;
    uint64_t expiry_ms;
    uint64_t epoch;
    uint64_t nonce;
    uint64_t principal;
    uint8_t mac[KVP_GRANT_MAC_LEN];
} kvp_grant_set_hdr_t; /* 64 bytes */

typedef struct kvp_grant_extent {
    uint64_t offset;
    uint64_t length;
    uint64_t version; /* the object's: a WRITE ends with its put, a READ once a later object
                         is recorded at the extent */
} kvp_grant_extent_t; /* 24 bytes */

#define KVP_GRANT_SET_HDR_LEN 64
_Static_assert(sizeof(kvp_grant_set_hdr_t) == KVP_GRANT_SET_HDR_LEN, "a set header is 64 bytes");
_Static_assert(sizeof(kvp_grant_extent_t) == 24, "a set extent is 24 bytes");

/* The bytes of a set of `count` extents (header included). */
static inline size_t kvp_grant_set_len(uint32_t count)
{
    return KVP_GRANT_SET_HDR_LEN + (size_t)count * sizeof(kvp_grant_extent_t);
}

/* The extent count of the set in [data, data + len), as a client takes it from an answer:
 * 0 unless its header's count is 1..KVP_GRANT_SET_MAX and len is that count's length. */
static inline uint32_t kvp_grant_set_count(const void *data, size_t len)
{
    kvp_grant_set_hdr_t h;
    if (len < sizeof(h))
        return 0;
    memcpy(&h, data, sizeof(h));
    if (h.count == 0 || h.count > KVP_GRANT_SET_MAX || len != kvp_grant_set_len(h.count))
        return 0;
    return h.count;
}

/* A keyed MAC context for key (KVP_GRANT_KEY_LEN bytes). */
kvp_status_t kvp_grant_mac_create(const uint8_t *key, kvp_grant_mac_t **mac_p);
void kvp_grant_mac_destroy(kvp_grant_mac_t *mac);

/* Fill g->mac from g's other fields. false: the MAC could not be computed (g unusable). */
bool kvp_grant_seal(kvp_grant_mac_t *mac, kvp_grant_t *g);

/*
 * May the holder of g do `op` on [offset, offset + length) of segment_id, now? KVP_OK, or
 * KVP_ERR_DENIED with *why_p (static text) saying which check failed: the MAC (compared in
 * constant time), the version, the op, the segment, the range (overflow-checked), the
 * epoch, the expiry. The MAC is checked first, so nothing else of an unsealed grant is
 * believed.
 */
kvp_status_t kvp_grant_check(kvp_grant_mac_t *mac, const kvp_grant_t *g, uint8_t op,
                             uint64_t segment_id, uint64_t offset, uint64_t length, uint64_t epoch,
                             uint64_t now_ms, const char **why_p);

/* Fill h->mac from h's other fields and the h->count extents ext (contiguous after h on the
 * wire, but any memory here). false: not computed. */
bool kvp_grant_set_seal(kvp_grant_mac_t *mac, kvp_grant_set_hdr_t *h,
                        const kvp_grant_extent_t *ext);

/*
 * May the holder of set h (with its extents ext) do `op` on segment_id, now? Checks, in this
 * order, the MAC (constant time), the version, the count, the op, the segment, the epoch and
 * the expiry; each extent of a request must then lie inside the one it names
 * (kvp_grant_extent_covers). KVP_OK or KVP_ERR_DENIED with *why_p as kvp_grant_check's.
 */
kvp_status_t kvp_grant_set_check(kvp_grant_mac_t *mac, const kvp_grant_set_hdr_t *h,
                                 const kvp_grant_extent_t *ext, uint8_t op, uint64_t segment_id,
                                 uint64_t epoch, uint64_t now_ms, const char **why_p);

/* Does e cover [offset, offset + length) (length > 0; overflow-checked)? */
bool kvp_grant_extent_covers(const kvp_grant_extent_t *e, uint64_t offset, uint64_t length);

/*
 * Binding grants to a data connection's principal. The master gives a principal, with
 * the descriptor of each segment it may transfer to or from, that segment's connection
 * key for it: K_p = HMAC-SHA256(segment key, "kvpool conn key" 0x00 || tag). A client
 * opening a data connection says HELLO with its tag; the owner answers a fresh 32-byte
 * challenge; the client proves K_p with HMAC-SHA256(K_p, "kvpool hello" 0x00 0x00 0x00 0x00
 * || challenge || segment id || tag). From then on the connection is that principal's, and
 * only grants sealed for its tag pass (docs/protocol.md "Grants").
 */
#define KVP_GRANT_CHALLENGE_LEN 32
#define KVP_GRANT_PROOF_LEN 32

/* K_p of `tag` under the segment key `mac` holds. false: the MAC could not be computed. */
bool kvp_grant_conn_key(kvp_grant_mac_t *mac, uint64_t tag, uint8_t out[KVP_GRANT_KEY_LEN]);
/*
 * RDMA (one-sided: whoever holds a connected queue pair and the segment's rkey reads and
 * writes all of it). The master gives a principal whose grants would cover every object
 * the segment can hold its rdma key K_r = HMAC-SHA256(segment key, "kvpool rdma key" 0x00
 * || tag); a client connecting a queue pair to the owner sends, in the connect's private
 * data, a proof of K_r bound to the segment, its tag, the time and a random nonce:
 * HMAC-SHA256(K_r, "kvpool rdma qp" 0x00 0x00 || segment || tag || time_ms || nonce),
 * its first 16 bytes. The owner derives K_r, checks the MAC, the time (a window) and that
 * the nonce is new, and only then accepts the queue pair.
 */
typedef struct kvp_grant_qp_proof {
    uint64_t segment_id;
    uint64_t tag;
    uint64_t time_ms; /* the wall clock, as grants count it */
    uint64_t nonce;
    uint8_t mac[16];
} kvp_grant_qp_proof_t; /* 48 bytes, little-endian host order */
_Static_assert(sizeof(kvp_grant_qp_proof_t) == 48, "a QP proof is 48 bytes");

bool kvp_grant_rdma_key(kvp_grant_mac_t *mac, uint64_t tag, uint8_t out[KVP_GRANT_KEY_LEN]);
/* Fill p->mac from p's other fields under rdma_key. false: not computed. */
bool kvp_grant_qp_proof(const uint8_t *rdma_key, kvp_grant_qp_proof_t *p);

/* The HELLO proof of K_p for challenge, segment and tag. false: could not be computed. */
bool kvp_grant_hello_proof(const uint8_t *conn_key, const uint8_t *challenge, uint64_t segment_id,
                           uint64_t tag, uint8_t out[KVP_GRANT_PROOF_LEN]);

/*
 * Mount proofs (docs/security.md, "A mount's endpoint is proven"): an owner's data server
 * draws a secret as it starts; the owner sends it in its Mount; before answering, the
 * master connects to the advertised tcp endpoint and sends a PROVE frame (the data
 * protocol's 32-byte header with op KVP_PROVE_OP, length 32 + the name's length, then a
 * fresh nonce and the segment's name); a server that serves a segment of that name answers
 * status 0, length 32 and kvp_grant_mount_proof of its secret, any other KVP_ERR_DENIED.
 */
#define KVP_PROVE_MAGIC 0x4450564Bu /* the data protocol's ("KVPD", transport/wire.h) */
#define KVP_PROVE_OP 10
#define KVP_PROVE_SECRET_LEN 32
#define KVP_PROVE_NONCE_LEN 32
#define KVP_PROVE_LEN 32
#define KVP_PROVE_NAME_MAX 255
/* HMAC-SHA256(secret, "kvpool prove" NUL-padded to 16 || nonce || name). false: not
 * computed. */
bool kvp_grant_mount_proof(const uint8_t secret[KVP_PROVE_SECRET_LEN],
                           const uint8_t nonce[KVP_PROVE_NONCE_LEN], const char *name,
                           uint8_t out[KVP_PROVE_LEN]);
/* Constant-time equality of two n-byte strings. */
bool kvp_grant_equal(const void *a, const void *b, size_t n);

/*
 * An owner's side. The keyring holds its segment's key and epoch from the last mount (set
 * by the thread that mounts; a generation counts the changes); each connection's verifier
 * keys its own MAC context from it when the generation moved, so a check takes no lock.
 */
typedef struct kvp_grant_keyring {
    pthread_mutex_t lock;
    _Atomic uint64_t gen; /* 0: never set (grants off) */
    bool on;
    uint8_t key[KVP_GRANT_KEY_LEN];
    uint64_t epoch;
} kvp_grant_keyring_t;

void kvp_grant_keyring_init(kvp_grant_keyring_t *kr);
void kvp_grant_keyring_cleanup(kvp_grant_keyring_t *kr);
/* key NULL (or a length other than KVP_GRANT_KEY_LEN): grants off from now on. */
void kvp_grant_keyring_set(kvp_grant_keyring_t *kr, const uint8_t *key, size_t key_len,
                           uint64_t epoch);

typedef struct kvp_grant_verifier {
    kvp_grant_mac_t *mac;
    uint64_t gen;
    uint64_t epoch;
    bool on;
    /* the connection's last grant set that passed its checks (the header and extents), for
     * the requests that name it again (KVP_DATA_F_GRANT_SAME); set_ok false: none */
    bool set_ok;
    kvp_grant_set_hdr_t set;
    kvp_grant_extent_t *set_ext;
    uint32_t set_cap;   /* extents set_ext has room for (grown, never shrunk) */
    uint64_t expiry_ms; /* the earliest expiry of the grants the last request that passed
                           carried (data_grant.c; rdma windows live no longer) */
} kvp_grant_verifier_t; /* zero-initialised: nothing known yet */

/* Catch up with the keyring (allocates only when its key changed). false: out of memory. */
bool kvp_grant_verifier_sync(kvp_grant_verifier_t *v, kvp_grant_keyring_t *kr);
void kvp_grant_verifier_cleanup(kvp_grant_verifier_t *v);

/* The wall clock in ms, as grants count it. */
uint64_t kvp_grant_now_ms(void);

/* A fresh random key or epoch (the OS's CSPRNG). false: none could be drawn. */
bool kvp_grant_random(void *buf, size_t len);

#endif
