/*
 * data_grant.h - the data servers' gate for data grants (common/grant.h): the
 * one request loop (data_server.c), over a DRAM segment's memory or an SSD
 * segment's file, calls it after reading a request's header and entries, before any byte of
 * the segment is read or written.
 */
#ifndef KVP_CLIENT_SEGMENT_DATA_GRANT_H
#define KVP_CLIENT_SEGMENT_DATA_GRANT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client/transport/wire.h"
#include "common/grant.h"

/*
 * The puts whose writes a data server has let in, by extent offset: the object's version
 * (the write grant's), until its record or file holds that object or a later one. From a
 * put's first write on, an older grant of the same extent (a reader's whose object was
 * removed, a writer's whose put was revoked) is refused, not only from the put's end.
 * Open addressing; grown up to KVP_DATA_PENDING_MAX entries, never per request after
 * that; emptied when the grant key changes (a remount, a new epoch: every older grant is
 * refused then anyway). Full (that many puts begun and never recorded in the last
 * minute): a write is let in without a note (counted in dropped, logged).
 */
#define KVP_DATA_PENDING_MAX (1u << 18)
typedef struct kvp_data_pending_ent kvp_data_pending_ent_t;
typedef struct kvp_data_pending {
    pthread_mutex_t lock;
    kvp_data_pending_ent_t *ents;
    uint32_t cap; /* a power of 2, or 0 */
    uint32_t count;
    uint64_t gen;      /* the grant key generation it was filled under */
    uint64_t swept_ms; /* the last sweep of a full table (one a second at most) */
    _Atomic uint64_t dropped;
} kvp_data_pending_t;

void kvp_data_pending_init(kvp_data_pending_t *p);
void kvp_data_pending_cleanup(kvp_data_pending_t *p);
/*
 * The version of the put that wrote last at offset (0: none); a note the record has
 * reached (rec: the version the record or file holds there) is forgotten. note (a write
 * being let in: its object's version; 0: a read): noted unless a later put is, so that an
 * older grant of the extent is refused from now on. gen: the grant key's generation (a
 * new one empties the table). now: ms, for the sweep of a full table.
 */
uint64_t kvp_data_pending_at(kvp_data_pending_t *p, uint64_t gen, uint64_t offset, uint64_t rec,
                             uint64_t note, uint64_t now);
/* kvp_data_pending_at for a request's n entries under one lock, in order (notes: their
 * versions when write, else none): the first entry a later put's note refuses (its
 * version below that note's), or n. */
size_t kvp_data_pending_check(kvp_data_pending_t *p, uint64_t gen, const uint64_t *offsets,
                              const uint64_t *lengths, const uint64_t *versions,
                              const uint64_t *recs, size_t n, bool write, uint64_t now);
/* Has a put later than `version` (its object's) been let write into [offset, offset +
 * length)? Then the master gave that room to a later object: whatever had it before was
 * removed, whether or not the record has seen so yet. lengths above: each note's extent
 * (NULL: the offset alone). One pass over the table: for the rare caller (seg_record.c's
 * check of an object that ended without its bytes). */
bool kvp_data_pending_later(kvp_data_pending_t *p, uint64_t offset, uint64_t length,
                            uint64_t version);
/* The record or file now holds the object of this version at offset: a note of it (or of
 * an earlier put) is done with. Keeps the table to the puts in flight. */
void kvp_data_pending_forget(kvp_data_pending_t *p, uint64_t offset, uint64_t version);

/* What a data server knows of ended puts: the versions of the objects its record or file
 * holds at n extents' offsets (versions[i], 0: none; one lock for them all); wait_recorded
 * (or NULL): wait until n objects a read names are recorded (seg_record.h,
 * kvp_seg_record_wait); pending: the server's begun puts (or NULL). */
typedef struct kvp_data_ended {
    void (*versions_at)(void *arg, const uint64_t *offsets, uint64_t *versions, size_t n);
    bool (*wait_recorded)(void *arg, const uint64_t *offsets, const uint64_t *versions, size_t n);
    void *arg;
    kvp_data_pending_t *pending;
} kvp_data_ended_t;

/* The extents (offset, object version) of the last request whose grants passed
 * (kvp_data_grants_check, data grants on): what kvp_data_extents_recheck looks at again. */
typedef struct kvp_data_checked {
    uint64_t offset[KVP_DATA_VEC_MAX];
    uint64_t version[KVP_DATA_VEC_MAX];
    size_t n;
} kvp_data_checked_t;

/* The checked extents again, as a read's (nothing noted): NULL while no later object is
 * recorded at any of them and no later put has written there since; else why not. For an
 * rdma window, whose access outlives its check: bound, then checked again, so a put let
 * in between the two is seen by one or the other (data_server.c, serve_windows). */
const char *kvp_data_extents_recheck(const kvp_data_ended_t *ended, uint64_t gen,
                                     const kvp_data_checked_t *c);

/*
 * Read what follows a request's header up to its payload: its n vector entries into vec
 * (vec_on_wire: a READV/WRITEV; else vec holds the header's one extent), and the grants it
 * carries (n, one per entry, KVP_DATA_F_GRANT; a grant set and n indices,
 * KVP_DATA_F_GRANT_SET; n indices, KVP_DATA_F_GRANT_SAME), in one read where the sizes are
 * known from the header (a set: two, its count first); and, when the keyring holds a key,
 * check entry i against its grant: the
 * MAC, op (a READ(V)'s READ, a WRITE(V)'s WRITE, a MAP's MAP), segment (segment_id: the
 * server's), range, epoch and expiry. KVP_OK: serve it
 * (grants off: always, a grant sent is read and ignored). KVP_ERR_DENIED: refused; counted
 * in *refused and logged (rate-limited, with the peer's address and the failed check, never
 * a key); the caller replies KVP_ERR_DENIED and closes. KVP_ERR_SEGMENT_GONE: an entry
 * names another segment than this server's (segment_id): a client whose descriptor is
 * from before this segment mounted again (a master restart or failover, its owner's
 * session lost and remounted), whose grants were sealed with the key of that earlier
 * mount; nothing is read or written, it is not counted as a refusal, and the caller
 * answers KVP_ERR_SEGMENT_GONE, what a server without grants answers (a read's connection
 * stays in step and may go on; a write's payload follows, so it closes).
 * KVP_ERR_IO: the stream broke.
 * conn_tag: the principal the connection proved in its HELLO (0: none); a grant sealed
 * for another principal is refused. ended (a DRAM segment's record, an SSD segment's file,
 * or NULL): a write grant whose object version (its nonce) it already has at the extent,
 * or a later one, is refused: its put ended; so is one of an older version than a put
 * that has written there since (ended->pending). A read grant is refused once a later
 * object is recorded at its extent, or a later put has written there. checked (may be
 * NULL): on KVP_OK, the extents and versions the grants named (n 0: none, grants off).
 */
kvp_status_t kvp_data_grants_check(kvp_grant_keyring_t *kr, kvp_grant_verifier_t *v,
                                   _Atomic uint64_t *refused, const char *server, int fd,
                                   const kvp_data_req_t *req, kvp_data_vec_t *vec, uint64_t n,
                                   bool vec_on_wire, uint64_t segment_id, uint64_t conn_tag,
                                   const kvp_data_ended_t *ended, kvp_data_checked_t *checked);

/*
 * A HELLO (req, wire.h): with grants on, challenge the peer and check its proof of the
 * connection key of the tag it names; KVP_OK: *conn_tag_p is now that principal's tag, and
 * only grants sealed for it pass on this connection. A proof that passes is not answered:
 * the client sends its first requests right behind it, and they are served after it (grants
 * off: answered with no challenge, nothing proven). A HELLO naming another segment than this
 * server's: KVP_ERR_SEGMENT_GONE replied, not counted (a client's descriptor from before a
 * remount); close it. Anything else: refused (counted, logged, replied where possible), close it.
 */
kvp_status_t kvp_data_hello(kvp_grant_keyring_t *kr, kvp_grant_verifier_t *v,
                            _Atomic uint64_t *refused, const char *server, int fd,
                            const kvp_data_req_t *req, uint64_t segment_id, uint64_t *conn_tag_p);

#endif
