/*
 * harness_pool.c - a master, its segments and a client for the integration tests
 * (see harness_pool.h).
 */
#include "tests/harness_pool.h"

#include <signal.h>
#include <stdio.h>

bool kvp_test_pool_start(kvp_test_pool_t *p, char *const master_args[], int n_seg,
                         const char *seg_size, const char *transport)
{
    char *none[] = {NULL};
    if (n_seg > KVP_TEST_POOL_MAX_SEGS ||
        !kvp_start_master_args(&p->master, master_args != NULL ? master_args : none))
        return false;
    for (p->n_seg = 0; p->n_seg < n_seg; p->n_seg++)
        if (!kvp_start_segment(&p->seg[p->n_seg], p->master.ready, seg_size, NULL))
            return false;
    kvp_client_params_t params;
    kvp_client_params_init(&params);
    params.master_addr = p->master.ready;
    params.transport = transport;
    return kvp_client_create(&params, &p->client) == KVP_OK;
}

int kvp_test_pool_stop(kvp_test_pool_t *p)
{
    kvp_client_destroy(p->client);
    p->client = NULL;
    int rc = 0;
    for (int i = 0; i < p->n_seg; i++) {
        int st = kvp_proc_stop(&p->seg[i], SIGTERM, 10000);
        if (st != 0) {
            fprintf(stderr, "segment server %d exited with %d\n", i, st);
            rc = -1;
        }
    }
    int st = kvp_proc_stop(&p->master, SIGTERM, 10000); /* 0 for one never started */
    if (st != 0) {
        fprintf(stderr, "master exited with %d\n", st);
        rc = -1;
    }
    return rc;
}
