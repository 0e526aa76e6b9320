/*
 * segment.h - this client's own DRAM segment as an object (segment.c): its
 * memory (a memfd, mapped and faulted in), its tcp data server, its serving on
 * the transports that serve (rdma), its record of objects (seg_record.c), and
 * its state at the master: mounted as which id, draining, drained, and the
 * record offer a mount waits for.
 *
 * The control plane (control/) takes the segment it needs: the session mounts
 * it (kvp_segment_describe, kvp_segment_mounted), the drain moves its objects
 * away (kvp_segment_drain_begin, kvp_segment_extent), the record thread offers
 * its record after each mount (kvp_segment_offer_take, kvp_segment_set_open).
 *
 * Thread: create/destroy on the thread creating/destroying the client; the
 * rest from any thread. The state and id are atomics; kvp_segment_state_lock
 * orders a remount against a drain's change of state (never held across a
 * call that may itself remount).
 */
#ifndef KVP_CLIENT_SEGMENT_SEGMENT_H
#define KVP_CLIENT_SEGMENT_SEGMENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client/segment/seg_record.h"
#include "common/grant.h"
#include "client/segment/segment_server.h"
#include "client/transfer/engine.h"
#include "common/status.h"
#include "kvpool.pb-c.h"

/* Its state at the master. */
#define KVP_SEG_NONE 0     /* mounts nothing */
#define KVP_SEG_MOUNTED 1  /* mounted (or to be remounted after a reconnect) */
#define KVP_SEG_DRAINING 2 /* moving its objects away */
#define KVP_SEG_DRAINED 3  /* unmounted for good; memory kept until destroy */

typedef struct kvp_segment kvp_segment_t;

typedef struct kvp_segment_params {
    uint64_t size;
    const char *name;      /* NULL: its tcp endpoint */
    const char *data_host; /* the address its data server listens on; NULL: 127.0.0.1 */
    uint16_t data_port;    /* 0: any */
    bool protected_mode;   /* its data server takes peers of this host only (conn_server.h) */
    uint64_t client_id;    /* its owner's (this client's) */
    kvp_transfer_t *xfer;  /* serves it on the transports that serve; host id (borrowed) */
    /* Map [file_offset, file_offset + size) of this file (MAP_SHARED) instead of a memfd: a
     * regular file of this user's, mode 0600 or narrower (its permissions are the segment's),
     * file_offset a multiple of the page size. Handed to same-host peers (shm) only when it is
     * the whole file. NULL: a memfd. */
    const char *file;
    uint64_t file_offset;
    bool keep_dumpable; /* with data grants, stay dumpable (KVPOOL_KEEP_DUMPABLE=1) */
    char *err;          /* why create failed, for the caller's last error ("" when not known) */
    size_t err_len;
} kvp_segment_params_t;

/* Create the memory, the record, the data server, serve it on the transports; its state is
 * KVP_SEG_MOUNTED (to be mounted by the next connection). The strings are copied. */
kvp_status_t kvp_segment_create(const kvp_segment_params_t *params, kvp_segment_t **seg_p);
/* Stop its data server (no peer reads or writes it from now on). Before the engine that
 * serves it is cleaned up; idempotent. */
void kvp_segment_stop(kvp_segment_t *seg);
/* Stop it if not yet, unmap and free it. The engine must no longer hold it registered
 * (kvp_transfer_cleanup first). NULL: nothing. */
void kvp_segment_destroy(kvp_segment_t *seg);

void *kvp_segment_base(const kvp_segment_t *seg);
uint64_t kvp_segment_size(const kvp_segment_t *seg);
const char *kvp_segment_name(const kvp_segment_t *seg);
/* Its id at the master (0 before the first mount). */
uint64_t kvp_segment_id(const kvp_segment_t *seg);
/* KVP_SEG_*; KVP_SEG_NONE for NULL. */
int kvp_segment_state(const kvp_segment_t *seg);
struct kvp_seg_record *kvp_segment_record(const kvp_segment_t *seg);
/* Its data server's counters (live); valid until destroy. */
const kvp_served_stats_t *kvp_segment_served(const kvp_segment_t *seg);
/* Connections of other hosts its data server refused in protected mode. */
uint64_t kvp_segment_refused(const kvp_segment_t *seg);
/* Its bytes [offset, offset+length), or NULL when that is not inside it. */
void *kvp_segment_extent(const kvp_segment_t *seg, uint64_t offset, uint64_t length);

/* The secret of its data server's mount proofs (data_server.h, kvp_data_server_proof),
 * answered for its name from now on: for the Mount request only. */
void kvp_segment_proof_secret(kvp_segment_t *seg, uint8_t secret[KVP_PROVE_SECRET_LEN]);
/* Fill a descriptor for its mount (strings point into the segment: valid until destroy). */
void kvp_segment_describe(const kvp_segment_t *seg, Kvpool__SegmentDesc *d);
/* Orders a remount (held around it) against a drain's change of state. */
void kvp_segment_state_lock(kvp_segment_t *seg);
void kvp_segment_state_unlock(kvp_segment_t *seg);
/* The master mounted it as seg_id (state lock held). adopting: its record is to be offered
 * (kvp_segment_offer_take), flagged before the id changes so a reader sees both. grant_key
 * (grant_key_len bytes; NULL or empty: none) and grant_epoch: the mount's data grants, which
 * its data server asks of every request from now on (common/grant.h). */
void kvp_segment_mounted(kvp_segment_t *seg, uint64_t seg_id, bool adopting,
                         const uint8_t *grant_key, size_t grant_key_len, uint64_t grant_epoch);
/* Requests its data server refused for a missing or bad grant. */
uint64_t kvp_segment_grants_refused(const kvp_segment_t *seg);
/* Requests for its memory (shm hand-off) refused. */
uint64_t kvp_segment_shm_refused(const kvp_segment_t *seg);
/* Adds the connections its data server closed for their limits to *sum, by reason. */
void kvp_segment_admission(const kvp_segment_t *seg, kvp_conn_refusals_t *sum);

/* Begin a drain (MOUNTED -> DRAINING, under the state lock, so no remount slips a new id in
 * between): the id to drain in *seg_id_p. KVP_ERR_PENDING: a drain is under way;
 * KVP_ERR_INVALID_ARG: not mounted. */
kvp_status_t kvp_segment_drain_begin(kvp_segment_t *seg, uint64_t *seg_id_p);
/* DRAINING -> MOUNTED (the master it drained to forgot it: it is to be mounted and offered
 * again, then drained anew); false when it was not draining. */
bool kvp_segment_drain_abort(kvp_segment_t *seg);
/* Unmounted for good (a drain ended, or destroy): KVP_SEG_DRAINED. Returns the state it
 * was in. */
int kvp_segment_set_drained(kvp_segment_t *seg);

/* The record offer a mount asked for: the id it was mounted as (taken: 0 from then on
 * until the next mount), or 0. */
uint64_t kvp_segment_offer_take(kvp_segment_t *seg);
/* Is a mount's offer waiting to be taken? */
bool kvp_segment_offer_waiting(const kvp_segment_t *seg);
/* The offer for mount seg_id ended: the segment takes new replicas. */
void kvp_segment_set_open(kvp_segment_t *seg, uint64_t seg_id);
/* Has the current mount's offer ended? */
bool kvp_segment_is_open(const kvp_segment_t *seg);

#endif
