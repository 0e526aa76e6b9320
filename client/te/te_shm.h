/*
 * te_shm.h - the transfer engine's one-copy shm path as a transport (transfer/transport.h):
 * a peer of this host, reached on its engine's Unix socket ("@kvpool-te-<port>"), whose
 * bytes the initiator moves itself with process_vm_writev / process_vm_readv (one kernel
 * copy, split over the engine's copy threads: te_copy.h), under the target's standing lease
 * where it grants one (te_lease.h) or asked per batch (TE_CMA, wire.h: the target checks the
 * ranges and lets us at its memory until we say we are done).
 *
 * An engine puts it first in its transfer engine's list (te.c) when KVPOOL_TE_SHM is cma or
 * cma-checked; it takes only "@..." peers (tcp ones go to the tcp transport). A peer it can
 * no longer carry (the kernel refuses: EPERM; the target declines: another principal, its
 * device memory) fails its ops with KVP_ERR_TRANSPORT, and the engine moves that peer to the
 * next transport of the list (tcp: the socket frames on the same Unix socket) and retries
 * them there once.
 *
 * Thread: submit from any thread at once; one batch at a time per peer (its connection).
 */
#ifndef KVP_CLIENT_TE_TE_SHM_H
#define KVP_CLIENT_TE_TE_SHM_H

#include "client/te/te_tp.h"
#include "client/transfer/peer.h"
#include "client/transfer/transport.h"
#include "common/status.h"

/* Ranges one TE_CMA request names at most (IOV_MAX: one process_vm_* call each). */
#define KVP_TE_CMA_VEC_MAX 1024

extern const kvp_transport_ops_t kvp_te_shm_ops;

#endif
