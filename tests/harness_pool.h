/*
 * harness_pool.h - what most integration tests start with: a real kvpool-master,
 * n real `kvpool serve` segments and one client of the library (see harness.h for
 * the processes themselves).
 */
#ifndef KVP_TESTS_HARNESS_POOL_H
#define KVP_TESTS_HARNESS_POOL_H

#include <stdbool.h>

#include "client/include/kvpool.h"
#include "tests/harness.h"

#define KVP_TEST_POOL_MAX_SEGS 4

typedef struct kvp_test_pool {
    kvp_proc_t master;
    kvp_proc_t seg[KVP_TEST_POOL_MAX_SEGS];
    int n_seg;
    kvp_client_t *client;
} kvp_test_pool_t;

/*
 * Start the master with master_args (NULL-terminated, added to the harness's
 * defaults; NULL: none), n_seg segments of seg_size, and a client on transport
 * (NULL: auto). false on any failure (what started is left for kvp_test_pool_stop).
 */
bool kvp_test_pool_start(kvp_test_pool_t *p, char *const master_args[], int n_seg,
                         const char *seg_size, const char *transport);
/* Destroy the client, then SIGTERM the segments and the master and reap them: 0 when
 * every process exited 0 (under ASan: no leak), else -1 with the culprit on stderr. */
int kvp_test_pool_stop(kvp_test_pool_t *p);

#endif
