/*
 * mount_proof.h - the master's prover of mounts (docs/security.md, "A mount's endpoint
 * is proven"): before a Mount is answered, the server at the tcp endpoint it advertises
 * must prove that it serves the segment, with the secret its owner sent in the Mount
 * (common/grant.h, the PROVE frame). The probes run on worker threads of their own (a
 * black-hole endpoint holds a worker for the timeout, never the loop); the loop submits
 * jobs into a bounded queue and takes the results when the eventfd is readable.
 *
 * Thread: submit, take and the fd: the master's loop; the probes: the workers.
 */
#ifndef KVP_MASTER_AUTH_MOUNT_PROOF_H
#define KVP_MASTER_AUTH_MOUNT_PROOF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/grant.h"
#include "common/status.h"

typedef struct kvp_prover kvp_prover_t;

/* One probe: the server at host:port must prove it serves segment `name` with secret. */
typedef struct kvp_proof_job {
    uint64_t id;  /* the caller's, handed back with the result */
    uint64_t tag; /* whose mount (a principal's tag; 0: none): per_tag of them run at once */
    char host[256];
    uint16_t port;
    char name[KVP_PROVE_NAME_MAX + 1];
    uint8_t secret[KVP_PROVE_SECRET_LEN];
} kvp_proof_job_t;

typedef struct kvp_proof_result {
    uint64_t id;
    bool ok;       /* proven */
    char why[400]; /* not proven: why (never the secret) */
    uint32_t ms;   /* how long the probe took */
} kvp_proof_result_t;

/* threads workers (1..64), at most per_tag of them on one principal's probes, at most
 * queue_max jobs waiting; each probe given timeout_ms from its start (connect, send and
 * answer together). */
kvp_status_t kvp_prover_create(unsigned threads, unsigned per_tag, unsigned queue_max,
                               uint32_t timeout_ms, kvp_prover_t **p);
/* Readable (an eventfd) when results wait. */
int kvp_prover_fd(const kvp_prover_t *p);
/* Queue a probe (the job is copied, the caller's copy may be wiped). false: the queue is
 * full. */
bool kvp_prover_submit(kvp_prover_t *p, const kvp_proof_job_t *job);
/* Up to max results (the eventfd is read first). */
size_t kvp_prover_take(kvp_prover_t *p, kvp_proof_result_t *out, size_t max);
/* Probes waiting or running now. */
unsigned kvp_prover_busy(const kvp_prover_t *p);
/* Stop the workers (a probe under way ends within its timeout) and free. NULL: nothing. */
void kvp_prover_destroy(kvp_prover_t *p);

#endif
