/*
 * ssd_owner.h - this client's SSD segment: file, data server, mount and the
 * worker that does the master's tasks (see ssd_owner.c).
 */
#ifndef KVP_CLIENT_SSD_SSD_OWNER_H
#define KVP_CLIENT_SSD_SSD_OWNER_H

#include "common/status.h"

struct kvp_client;
typedef struct kvp_ssd_owner kvp_ssd_owner_t;

/* SsdTask kinds (proto/kvpool.proto). */
#define KVP_SSD_TASK_OFFLOAD 1u
#define KVP_SSD_TASK_RECORD 2u
#define KVP_SSD_TASK_PROMOTE 3u
#define KVP_SSD_TASK_FORGET 4u

/* Open c->params.ssd_path, serve it on host, mount it (and bring its objects back), start
 * the worker. The client's master address and transfer engine must be set up. */
kvp_status_t kvp_ssd_owner_start(struct kvp_client *c, const char *host, kvp_ssd_owner_t **o_p);
/* Stop the worker, unmount (the file keeps the objects), close. NULL: nothing. */
void kvp_ssd_owner_stop(kvp_ssd_owner_t *o);
/* A new leader: drop its master connection unless it goes there (the next call remounts
 * at the leader). NULL: nothing. */
void kvp_ssd_owner_follow(kvp_ssd_owner_t *o, const char *leader);
const char *kvp_ssd_owner_name(const kvp_ssd_owner_t *o);
/* Fill the SSD fields of a metrics snapshot (served[ssd], ssd I/O, the segment's name and
 * capacity). Thread: any. */
struct kvp_metrics;
void kvp_ssd_owner_metrics(kvp_ssd_owner_t *o, struct kvp_metrics *m);

#endif
