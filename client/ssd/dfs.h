/*
 * dfs.h - the DFS tier's client side: the shared directory's id, the shard file a DFS
 * segment's owner mounts there, and the transport that reads and writes DFS replicas in
 * the shard files directly (see dfs.c).
 */
#ifndef KVP_CLIENT_SSD_DFS_H
#define KVP_CLIENT_SSD_DFS_H

#include <stddef.h>

#include "client/transfer/transport.h"
#include "common/status.h"

/* The id file in a DFS directory (32 hex digits and a newline). */
#define KVP_DFS_ID_FILE "kvpool-dfs.id"
#define KVP_DFS_ID_LEN 32
/* A DFS segment's name: "<data host>:<port>/dfs/<directory id>/<shard file>". */
#define KVP_DFS_NAME_TAG "/dfs/"

/*
 * The id of the DFS directory `dir` (id[KVP_DFS_ID_LEN + 1]): read from its id file, or, when
 * there is none yet, drawn and written there (O_EXCL, mode 0600: two processes starting at
 * once agree). First the directory, then every kvpool file in it, must be this user's with
 * no bit for group or others (common/private_path.h). KVP_ERR_INVALID_ARG (not a directory,
 * a damaged id file), KVP_ERR_DENIED (a looser directory or file: the path, what was found
 * and the fix) or KVP_ERR_SYSTEM, why in why.
 */
kvp_status_t kvp_dfs_dir_id(const char *dir, char *id, char *why, size_t why_len);

/* The transport of DFS replicas: takes the peers whose descriptor names a DFS segment of the
 * directory xfer->dfs_dir (the id in its name is that directory's) and moves their bytes
 * with io_uring in the shard file itself; others it leaves to the next transports. */
extern const kvp_transport_ops_t kvp_transport_dfs_ops;

#endif
