/*
 * mconn.h - one connection to kvpool-master shared by every thread of a
 * client: requests from many threads in flight together, replies matched
 * to their callers by request id, no lock held while waiting on the network.
 *
 * It knows frames (common/rpc.h), not protobuf: the client packs bodies.
 * See mconn.c for the design.
 */
#ifndef KVP_CLIENT_CONTROL_MCONN_H
#define KVP_CLIENT_CONTROL_MCONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "common/tls.h"

typedef struct kvp_mconn kvp_mconn_t;

/*
 * Runs on the thread that opened a new connection, before any call can use it:
 * it may talk on `ch` itself with kvp_mconn_ready_call / kvp_mconn_ready_send (e.g.
 * mount the client's segment again, hand back queued leases). `first`: the first
 * connection (kvp_mconn_connect). Non-OK: the connection is closed, and the calls
 * that waited for it fail with that status.
 */
typedef kvp_status_t (*kvp_mconn_ready_cb_t)(void *arg, kvp_mconn_t *m, kvp_chan_t *ch, bool first);

/* Where the master is now (high availability: the leader, found in etcd). */
typedef kvp_status_t (*kvp_mconn_resolve_cb_t)(void *arg, char *host, size_t cap, uint16_t *port_p);

typedef struct kvp_mconn_params {
    const char *host; /* copied */
    uint16_t port;
    uint32_t timeout_ms;           /* per call, connecting included */
    kvp_mconn_ready_cb_t on_ready; /* may be NULL */
    void *arg;
    /* NULL: host:port is the master. Else called before each connect for the leader's
     * address, and a call made while there is none, or answered by a master that is not
     * the leader (KVP_ERR_NOT_LEADER), waits and tries again until its timeout: a failover
     * delays calls instead of failing them. */
    kvp_mconn_resolve_cb_t resolve;
    void *resolve_arg;
    /* Security (docs/security.md): tls, borrowed until destroy, makes every connection
     * TLS 1.3 (NULL: plain); token, copied (and wiped at destroy), is sent in an Auth
     * request first on each connection; only over TLS. */
    kvp_tls_t *tls;
    const char *token;
} kvp_mconn_params_t;

/* Create, without connecting. */
kvp_status_t kvp_mconn_create(const kvp_mconn_params_t *params, kvp_mconn_t **m_p);
/* Close the connection and free. No call may be in progress or start. */
void kvp_mconn_destroy(kvp_mconn_t *m);

/* Open the first connection (on_ready gets first = true). */
kvp_status_t kvp_mconn_connect(kvp_mconn_t *m);

/*
 * Send a request and wait for its reply; any thread, many at once. Opens a
 * connection when there is none (one thread connects, the others wait for it);
 * a connection that breaks under the call is replaced and the call sent again
 * once. On KVP_OK *resp_p is the reply body, *resp_len_p bytes (NUL-terminated), in
 * a buffer of the calling thread's that the next kvp_mconn_call on this thread
 * reuses: unpack it before calling again; never free it. No allocation per call
 * once the buffer has grown to the largest reply. A frame-level error in the reply
 * is the status.
 * KVP_ERR_TIMEOUT after timeout_ms; when nothing at all arrived on the
 * connection meanwhile, the connection is judged dead and closed (the master
 * then revokes what was bound to it). A reply that comes after its call timed
 * out is dropped.
 */
kvp_status_t kvp_mconn_call(kvp_mconn_t *m, uint16_t method, const void *body, size_t len,
                            uint8_t **resp_p, size_t *resp_len_p);

/* Was the calling thread's last kvp_mconn_call sent a second time, on a new connection,
 * after the connection it first went on broke? Then the first may have reached the master
 * and taken effect, its answer lost: a call that must not take effect twice (PUT_COMMIT,
 * PUT_END) reads the second answer with that in mind. */
bool kvp_mconn_call_sent_again(void);

/* One-way frame on the current connection. KVP_ERR_CONNECT when there is none (nothing
 * is sent, no connection is opened for it); other errors: the connection broke. */
kvp_status_t kvp_mconn_send(kvp_mconn_t *m, uint16_t method, const void *body, size_t len);

/* Inside on_ready only: a blocking call / one-way send on the new connection
 * (ready_call's *resp_p is malloc'd: the caller frees it). */
kvp_status_t kvp_mconn_ready_call(kvp_mconn_t *m, kvp_chan_t *ch, uint16_t method, const void *body,
                                  size_t len, uint8_t **resp_p, size_t *resp_len_p);
kvp_status_t kvp_mconn_ready_send(kvp_mconn_t *m, kvp_chan_t *ch, uint16_t method, const void *body,
                                  size_t len);

/*
 * A connection of the caller's own to the master the current one goes to (or would):
 * TLS and Auth as for every connection, no on_ready. For a stream that one thread reads
 * and writes (record_sync.c). The caller closes it (kvp_chan_close).
 */
kvp_status_t kvp_mconn_dial(kvp_mconn_t *m, kvp_chan_t **ch_p);

/* Why the last connection attempt failed ("" if none did): a TLS refusal, a wrong token. */
void kvp_mconn_last_error(kvp_mconn_t *m, char *buf, size_t len);

/* The master's address the current (or last) connection went to. */
void kvp_mconn_addr(kvp_mconn_t *m, char *host, size_t cap, uint16_t *port_p);
/* The largest leader epoch seen in a reply (replies from an older one are refused). */
uint64_t kvp_mconn_epoch(kvp_mconn_t *m);

/* A new leader at `leader` ("host:port"): drop the current connection unless it goes
 * there (the next call connects to the leader). */
void kvp_mconn_follow(kvp_mconn_t *m, const char *leader);

/* Is a connection open now? */
bool kvp_mconn_connected(kvp_mconn_t *m);
/* Close the current connection (the next call opens another). */
void kvp_mconn_disconnect(kvp_mconn_t *m);

/* The current connection's generation (*gen_p: kvp_mconn_stats' connects when it opened; 0:
 * none), and whether a frame came on it within the last max_age_ms: a master that answered
 * that recently was alive then (false: none, broken, or quiet). */
bool kvp_mconn_fresh(kvp_mconn_t *m, uint64_t max_age_ms, uint64_t *gen_p);

/* Counters, for tests and stat: connections opened, replies dropped (their call had
 * timed out), calls in flight now. */
typedef struct kvp_mconn_stats {
    uint64_t connects;
    uint64_t late_replies;
    uint64_t in_flight;
} kvp_mconn_stats_t;
void kvp_mconn_stats(kvp_mconn_t *m, kvp_mconn_stats_t *out);

/* The calls of one method so far (kvp_mconn_call and kvp_mconn_send; kvp_metrics_rpc_t's
 * fields): made, failed, and their summed wait in ns. Zeros for a method out of range.
 * Thread: any (relaxed atomics, no lock). */
void kvp_mconn_rpc_stats(kvp_mconn_t *m, unsigned method, uint64_t *calls, uint64_t *failed,
                         uint64_t *wait_ns);

#endif
