/*
 * ssd_owner.h - this client's SSD segment: file, data server, mount and the
 * worker that does the master's tasks (see ssd_owner.c).
 */
#ifndef KVP_CLIENT_SSD_SSD_OWNER_H
#define KVP_CLIENT_SSD_SSD_OWNER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client/control/discovery.h"
#include "client/segment/conn_server.h"
#include "client/transfer/engine.h"
#include "client/transfer/peer_table.h"
#include "common/status.h"
#include "common/tls.h"

typedef struct kvp_ssd_owner kvp_ssd_owner_t;

typedef struct kvp_ssd_owner_params {
    const char *path; /* the file (created, or opened with its objects) */
    uint64_t size;
    bool buffered_io;
    const char *host;    /* the address its data server listens on */
    bool protected_mode; /* its data server takes peers of this host only (conn_server.h) */
    /* its own master connection: the client's master (or leader, through disc) */
    const char *master_host;
    uint16_t master_port;
    kvp_discovery_t *disc; /* NULL: none (borrowed) */
    uint32_t timeout_ms;
    uint64_t client_id;
    kvp_transfer_t *xfer; /* moves the bytes of offloads and promotions (borrowed) */
    kvp_peers_t *peers;   /* the DRAM segments they come from or go to (borrowed) */
    kvp_tls_t *tls;       /* TLS to the master (borrowed); NULL: plain */
    const char *token;    /* Auth on its master connection (copied); NULL: none */
    const char *tenant;   /* the segment is dedicated to this tenant (copied); NULL: shared */
    /* a DFS segment (client/ssd/dfs.h): the file is a shard in the DFS directory whose id
     * this is (KVP_DFS_ID_LEN hex digits), mounted with medium "dfs" under a name that
     * carries the id and the file's name; NULL: an SSD segment */
    const char *dfs_id;
} kvp_ssd_owner_params_t;

/* SsdTask kinds (proto/kvpool.proto). */
#define KVP_SSD_TASK_OFFLOAD 1u
#define KVP_SSD_TASK_RECORD 2u
#define KVP_SSD_TASK_PROMOTE 3u
#define KVP_SSD_TASK_FORGET 4u

/* Open the file, serve it on host, mount it (and bring its objects back), start the worker.
 * On failure, why (why_len bytes) says what failed, in words. */
kvp_status_t kvp_ssd_owner_start(const kvp_ssd_owner_params_t *params, kvp_ssd_owner_t **o_p,
                                 char *why, size_t why_len);
/* Stop the worker, unmount (the file keeps the objects), close. NULL: nothing. */
void kvp_ssd_owner_stop(kvp_ssd_owner_t *o);
/* A new leader: drop its master connection unless it goes there (the next call remounts
 * at the leader). NULL: nothing. */
void kvp_ssd_owner_follow(kvp_ssd_owner_t *o, const char *leader);
const char *kvp_ssd_owner_name(const kvp_ssd_owner_t *o);
/* Fill the SSD fields of a metrics snapshot (served[ssd], ssd I/O, the segment's name and
 * capacity); a DFS segment's owner fills served[dfs] only. Thread: any. */
struct kvp_metrics;
void kvp_ssd_owner_metrics(kvp_ssd_owner_t *o, struct kvp_metrics *m);
/* Adds the connections its data server closed for their limits to *sum, by reason. */
void kvp_ssd_owner_admission(const kvp_ssd_owner_t *o, kvp_conn_refusals_t *sum);

#endif
