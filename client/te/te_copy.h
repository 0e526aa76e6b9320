/*
 * te_copy.h - the transfer engine's same-host copy (te.c's TE_CMA route): a batch's
 * ranges moved with process_vm_writev / process_vm_readv, split by bytes over the calling
 * thread and a few helper threads of the engine's, each with one call per up to IOV_MAX
 * ranges.
 *
 * Thread: kvp_te_copy_run from any thread; one batch uses the helpers at a time (another
 * caller meanwhile copies on its own thread). create/destroy on the engine's.
 */
#ifndef KVP_CLIENT_TE_TE_COPY_H
#define KVP_CLIENT_TE_TE_COPY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct kvp_te_copy kvp_te_copy_t;

/* A pool of threads - 1 helpers (threads 1: none, every copy on the caller), started at
 * the first batch big enough to split. NULL: no memory. */
kvp_te_copy_t *kvp_te_copy_create(unsigned threads);
void kvp_te_copy_destroy(kvp_te_copy_t *c);

/* Move n ranges (lens[i] bytes between locals[i] and pid's address remotes[i]) to (write)
 * or from pid's memory. Returns 0 when every byte moved, else the errno of the first call
 * that failed (EFAULT for a short copy). */
int kvp_te_copy_run(kvp_te_copy_t *c, pid_t pid, bool write, void *const *locals,
                    const uint64_t *remotes, const uint64_t *lens, size_t n);

#endif
