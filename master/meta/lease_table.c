/*
 * lease_table.c - set-up and teardown of the lease slots and their grants
 * (lease_table.h).
 *
 * Design: slots and grant records grow by doubling in policy/lease.c; a
 * free slot is on the free list, a live one on the expiry list; a live
 * grant record on its slot's list, a free one on the free grant list. At
 * teardown a slot may still hold a RETIRED object (removed while being
 * read): nothing else points to it, so it is freed here.
 *
 * Thread: master loop only.
 */
#include "master/meta/lease_table.h"

#include <stdlib.h>
#include <string.h>

void kvp_lease_table_init(kvp_lease_table_t *t)
{
    memset(t, 0, sizeof(*t));
    t->free_head = t->head = t->tail = KVP_LEASE_NIL;
    t->free_grant = KVP_LEASE_NIL;
}

void kvp_lease_table_cleanup(kvp_lease_table_t *t)
{
    for (uint32_t i = 0; i < t->n_slots; i++)
        if (t->slots[i].obj != NULL && t->slots[i].obj->state == KVP_OBJ_RETIRED)
            free(t->slots[i].obj);
    free(t->slots);
    free(t->grants);
    kvp_lease_table_init(t); /* the unused random tags are wiped with the rest */
}
