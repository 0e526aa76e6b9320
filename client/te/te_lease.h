/*
 * te_lease.h - the transfer engine's standing lease of the one-copy shm path (te.c's TE_CMA
 * route, wire.h's TE_CMA with KVP_DATA_TE_CMA_LEASE).
 *
 * Per batch, TE_CMA asks the target to check the ranges and waits for its go: a round trip
 * through two sleeping threads before any byte moves (55-65 us on the 2-vCPU VMs the
 * benchmarks run on, where the copy of 64 KiB takes 3). Where the kernel already lets the
 * peer at all of the target's memory (the same user, a dumpable target, no Yama
 * restriction: a peer that wanted to could write anywhere in it without asking), the target
 * grants a lease instead: two memfds, its registered host ranges (read-only to the peer)
 * and a slot of the peer's own. The peer checks its ranges against the list, marks its slot
 * busy, copies and unmarks; the target, before an unregister returns, waits until no slot is
 * busy under the list of before. Nothing of the target runs per batch.
 *
 * The protocol (all atomics sequentially consistent; the memfds' layouts are wire.h's):
 *   target, on a change of its ranges: gen += 1 (odd: being written), write the ranges,
 *     gen += 1 (even: G; its own count, the shared one only a copy); on an unregister, then
 *     wait until every slot's state is not busy, or busy under a generation >= G, or its
 *     process is gone (a pidfd taken at the grant).
 *   peer, per batch: state = checked << 1 | 1; read revoked (set: unmark, the lease is
 *     over); read gen: another than checked, unmark, read the ranges again (a seqlock
 *     read), retry; else every range inside one of them: copy, then state = checked << 1.
 *   target, when the lease's connection closes: revoked = 1, then the slot is freed once
 *     its state is not busy or its process is gone.
 * Each side writes its word before it reads the other's: either the peer sees the new
 * generation (or the revocation) and does not copy under the old list, or the target sees
 * the mark and waits for the copy.
 *
 * Thread: a host's publish (begin/end) under the engine's regions write lock, the rest from
 * any thread; a lease (the peer's side) is used by one batch at a time (te_shm.c's per-peer lock).
 */
#ifndef KVP_CLIENT_TE_TE_LEASE_H
#define KVP_CLIENT_TE_TE_LEASE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/status.h"

/* Leases one engine grants at a time (more peers ask per batch). */
#define KVP_TE_LEASE_SLOTS 64

/* ---- the target's side ---- */

typedef struct kvp_te_lease_host kvp_te_lease_host_t;

/* The regions memfd (no ranges yet) and no slot taken. */
kvp_status_t kvp_te_lease_host_create(kvp_te_lease_host_t **h_p);
void kvp_te_lease_host_destroy(kvp_te_lease_host_t *h);
/* A slot for the peer of process pid: its index, and fds[0] the regions' memfd, fds[1] the
 * slot's, to send (still ours); -1 when all are taken or out of memory. */
int kvp_te_lease_host_take(kvp_te_lease_host_t *h, pid_t pid, int fds[2]);
/* The connection of slot ended: the lease revoked, the slot freed once the peer is not
 * copying (at once, or later), what it moved kept in the totals. */
void kvp_te_lease_host_give(kvp_te_lease_host_t *h, int slot);
/* Publishing the ranges: begin returns the shared array and its capacity (gen odd until
 * end); the caller writes n <= capacity (address, length) pairs, lowest address first; end
 * makes them the leased peers' (gen even) and returns that generation. */
uint64_t *kvp_te_lease_host_begin(kvp_te_lease_host_t *h, size_t *cap_p);
uint64_t kvp_te_lease_host_end(kvp_te_lease_host_t *h, size_t n);
/* Wait until no peer copies under ranges older than generation g (an unregister's, after
 * its end). */
void kvp_te_lease_host_wait(kvp_te_lease_host_t *h, uint64_t g);
/* Ranges and bytes the leased peers moved ([KVP_TE_READ], [KVP_TE_WRITE]), ended leases
 * included, and how many leases are held now. */
void kvp_te_lease_host_moved(kvp_te_lease_host_t *h, uint64_t moved[2], uint64_t bytes[2],
                             uint64_t *held_p);
/* May a lease be granted in this process? Not when Yama restricts ptrace
 * (kernel.yama.ptrace_scope above 0: each batch then names its peer as our ptracer for its
 * length) or we are not dumpable (the kernel refuses peers our memory). */
bool kvp_te_lease_allowed(void);
/* Does a shm peer's copy need us to name it our ptracer (PR_SET_PTRACER) for its length?
 * Yama's ptrace_scope 1 only (0 or no Yama: the kernel lets a peer of our user in anyway;
 * 2 and 3: naming does not help, the copy is refused and the peer falls back). Read once
 * per engine. */
bool kvp_te_ptracer_window(void);

/* ---- the peer's side ---- */

typedef struct kvp_te_lease kvp_te_lease_t;

/* The lease of the regions' memfd and the slot's (both taken: closed here).
 * KVP_ERR_PROTOCOL: not a lease's memfds, or not sealed as wire.h says. */
kvp_status_t kvp_te_lease_map(int regions_fd, int slot_fd, kvp_te_lease_t **l_p);
void kvp_te_lease_unmap(kvp_te_lease_t *l);

typedef enum kvp_te_lease_go {
    KVP_TE_LEASE_GO,      /* every range inside: marked busy, copy then kvp_te_lease_end */
    KVP_TE_LEASE_ASK,     /* some range is not (nothing marked): ask the target per batch */
    KVP_TE_LEASE_REVOKED, /* the target ended the lease (nothing marked): drop it */
} kvp_te_lease_go_t;
/* Before a batch of n ranges [remotes[i], +lens[i]) in the target's memory. */
kvp_te_lease_go_t kvp_te_lease_begin(kvp_te_lease_t *l, const uint64_t *remotes,
                                     const uint64_t *lens, size_t n);
/* After a GO's copy: the mark dropped; n ranges of bytes counted in the slot if moved. */
void kvp_te_lease_end(kvp_te_lease_t *l, bool moved, int opcode, size_t n, uint64_t bytes);

#endif
