/*
 * te_registry.h - this process's transfer engines (kvpool_te.h), summed for the client's
 * metrics (client/metrics.c): what every engine moved and refused, live ones and those
 * destroyed, so a store's /metrics shows a stranger's refusals by an engine of its process.
 *
 * Thread: any; one mutex, taken at an engine's create and destroy and at a snapshot.
 */
#ifndef KVP_CLIENT_TE_REGISTRY_H
#define KVP_CLIENT_TE_REGISTRY_H

#include "client/include/kvpool_te.h"

/* An engine joins at its create (KVP_ERR_NOMEM: it is not counted) and leaves at its
 * destroy, its counters then kept in the sum of the destroyed ones; read gives them (the
 * engine's kvp_te_get_counters: the registry, below the engine, calls it only so). */
typedef void (*kvp_te_registry_read_fn)(kvp_te_t *te, kvp_te_counters_t *out);
kvp_status_t kvp_te_registry_add(kvp_te_t *te, kvp_te_registry_read_fn read);
void kvp_te_registry_remove(kvp_te_t *te);
/* The counters of every engine this process made, added up (peers' per-target stats not). */
void kvp_te_registry_sum(kvp_te_counters_t *sum);

#endif
