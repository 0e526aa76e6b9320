/*
 * discovery.h - finding the leading kvpool-master through etcd (see
 * discovery.c).
 */
#ifndef KVP_CLIENT_CONTROL_DISCOVERY_H
#define KVP_CLIENT_CONTROL_DISCOVERY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/etcd.h"
#include "common/status.h"

typedef struct kvp_discovery kvp_discovery_t;

/* Called on the watch thread when a new leader is elected: its address (borrowed). */
typedef void (*kvp_discovery_change_cb_t)(void *arg, const char *leader);

/* Is addr of the form etcd://HOST:PORT[,HOST:PORT...]/CLUSTER? */
bool kvp_discovery_is_etcd(const char *addr);
/* Parse addr (KVP_ERR_INVALID_ARG when malformed) and start watching the leader key;
 * cb (may be NULL) runs on every change. security: etcd's TLS and credentials (copied;
 * NULL: plain http, none), which the client reads from KVPOOL_ETCD_CACERT, _CERT, _KEY,
 * _USER, _PASSWORD_FILE (client/env.c). Contacts etcd only from the watch thread. On
 * failure a sentence in err[0..err_len) (may be NULL) says why. */
kvp_status_t kvp_discovery_create(const char *addr, uint32_t timeout_ms,
                                  const kvp_etcd_security_t *security, kvp_discovery_change_cb_t cb,
                                  void *arg, kvp_discovery_t **d_p, char *err, size_t err_len);
/* Stop the watch thread (no callback runs after it returns); resolving still works. */
void kvp_discovery_stop(kvp_discovery_t *d);
void kvp_discovery_destroy(kvp_discovery_t *d);
/* The leader now (one etcd read): KVP_ERR_NOT_FOUND while there is none (an election in
 * progress), KVP_ERR_CONNECT when etcd cannot be reached. Any thread. Its signature is
 * kvp_mconn_resolve_cb_t's. */
kvp_status_t kvp_discovery_leader(void *d, char *host, size_t cap, uint16_t *port_p);
/* Why the last leader read failed, into buf[0..cap) ("" when it did not): etcd's or the
 * TLS library's words, never a secret. Any thread. */
void kvp_discovery_last_error(kvp_discovery_t *d, char *buf, size_t cap);

#endif
