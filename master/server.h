/*
 * server.h - the master's network loop (see server.c).
 */
#ifndef KVP_MASTER_SERVER_H
#define KVP_MASTER_SERVER_H

#include <stdint.h>

#include "common/election.h"
#include "master/core/config.h"
#include "common/status.h"

typedef struct kvp_master_server kvp_master_server_t;

/* Listen on host:port (0: any free port) and block SIGTERM/SIGINT for the signalfd. */
/* config may be NULL (defaults); it is copied. */
kvp_status_t kvp_master_server_create(const char *host, uint16_t port,
                                      const kvp_master_config_t *config,
                                      kvp_master_server_t **srv_p, uint16_t *bound_port_p);
/*
 * High availability: campaign for leadership through etcd (common/election.h). Until it
 * leads, and whenever it is not sure of its lease, the master answers every request with
 * KVP_ERR_NOT_LEADER; each new epoch starts from an empty index (the owners remount and
 * offer their records); a leader that lost for good drops everything. Call before run.
 */
kvp_status_t kvp_master_server_elect(kvp_master_server_t *srv, const kvp_election_params_t *p);
/* Serve until SIGTERM or SIGINT. Runs on the calling thread. */
kvp_status_t kvp_master_server_run(kvp_master_server_t *srv);
/* Close every connection and free all metadata. */
void kvp_master_server_destroy(kvp_master_server_t *srv);

#endif
