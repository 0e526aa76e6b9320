/*
 * te_registry.c - this process's transfer engines, summed for the client's metrics
 * (te_registry.h).
 *
 * Design: a list of the live engines under one mutex, and the counters of the destroyed
 * ones added into one struct as each leaves, so a sum never goes down. A snapshot reads
 * every live engine's counters (relaxed atomics, kvp_te_get_counters) under the mutex: a
 * destroy waits for it, never the data path.
 *
 * Thread: any.
 */
#include "client/te_registry.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct te_entry {
    struct te_entry *next;
    kvp_te_t *te;
    kvp_te_registry_read_fn read;
} te_entry_t;

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static te_entry_t *reg_live;
static kvp_te_counters_t reg_gone; /* the destroyed engines' counters, added up */

static void add_counters(kvp_te_counters_t *sum, const kvp_te_counters_t *c)
{
    /* every field is a uint64_t (kvpool_te.h) */
    _Static_assert(sizeof(*c) % sizeof(uint64_t) == 0, "kvp_te_counters_t: uint64_t only");
    uint64_t *s = (uint64_t *)sum;
    const uint64_t *v = (const uint64_t *)c;
    for (size_t i = 0; i < sizeof(*c) / sizeof(uint64_t); i++)
        s[i] += v[i];
}

kvp_status_t kvp_te_registry_add(kvp_te_t *te, kvp_te_registry_read_fn read)
{
    te_entry_t *e = malloc(sizeof(*e));
    if (e == NULL)
        return KVP_ERR_NOMEM;
    e->te = te;
    e->read = read;
    pthread_mutex_lock(&reg_lock);
    e->next = reg_live;
    reg_live = e;
    pthread_mutex_unlock(&reg_lock);
    return KVP_OK;
}

void kvp_te_registry_remove(kvp_te_t *te)
{
    pthread_mutex_lock(&reg_lock);
    for (te_entry_t **p = &reg_live; *p != NULL; p = &(*p)->next)
        if ((*p)->te == te) {
            te_entry_t *e = *p;
            *p = e->next;
            kvp_te_counters_t c;
            e->read(te, &c);
            add_counters(&reg_gone, &c);
            free(e);
            break;
        }
    pthread_mutex_unlock(&reg_lock);
}

void kvp_te_registry_sum(kvp_te_counters_t *sum)
{
    pthread_mutex_lock(&reg_lock);
    *sum = reg_gone;
    for (te_entry_t *e = reg_live; e != NULL; e = e->next) {
        kvp_te_counters_t c;
        e->read(e->te, &c);
        add_counters(sum, &c);
    }
    pthread_mutex_unlock(&reg_lock);
}
