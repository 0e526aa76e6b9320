/*
 * state.c - set-up and teardown of the master's state (state.h).
 *
 * Design: teardown goes leases first (they alone free RETIRED objects, which
 * are in no index), then moves, objects, segments (their allocators).
 *
 * Thread: the loop's (before it starts and after it ends).
 */
#include "master/state.h"

#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/rand.h"

kvp_status_t kvp_master_state_init(kvp_master_state_t *st)
{
    memset(st, 0, sizeof(*st));
    kvp_segment_table_init(&st->segments);
    kvp_master_config_init(&st->config);
    kvp_lease_table_init(&st->leases);
    st->now_ms = kvp_now_ms();
    st->rng = kvp_random_u64();
    return kvp_index_init(&st->index);
}

void kvp_master_state_cleanup(kvp_master_state_t *st)
{
    kvp_lease_table_cleanup(&st->leases); /* first: it frees retired objects only */
    kvp_ghost_cleanup(&st->ghost);
    while (st->moves != NULL) {
        kvp_move_t *mv = st->moves;
        st->moves = mv->next;
        free(mv);
    }
    kvp_index_cleanup(&st->index);
    kvp_segment_table_cleanup(&st->segments);
}
