/*
 * events_curve.h - who may subscribe to the KV events: ZeroMQ CURVE with an
 * allow-list of subscriber keys, each naming the tenant whose events it gets
 * (see events_curve.c; the wire and the streams are in events.h).
 *
 * Files (docs/security.md, "KV events: CURVE"):
 *   --kv-events-curve-secret FILE  the master's CURVE secret key: 40 Z85
 *       characters (one line); FILE must not be readable by group or others.
 *   --kv-events-curve-allow FILE   one subscriber a line: "Z85-PUBLIC-KEY TENANT"
 *       or "Z85-PUBLIC-KEY *" (every tenant); '#' starts a comment; FILE must
 *       not be writable by group or others. SIGHUP reloads it.
 *
 * Thread: create/destroy/reload from the master's loop (create before the
 * publisher thread starts, destroy after it is joined); secure() before the
 * socket is bound (from create, or from the publisher thread when it
 * replaces a socket), seal() once every socket is secured; poll_items/serve
 * from the publisher thread; stats from any thread.
 */
#ifndef KVP_MASTER_OBS_EVENTS_CURVE_H
#define KVP_MASTER_OBS_EVENTS_CURVE_H

#include <stddef.h>
#include <stdint.h>

#include <zmq.h>

#include "common/status.h"

#define KVP_EVENTS_TENANT_MAX 63 /* a tenant's name: [A-Za-z0-9._-]{1,63} */
#define KVP_EVENTS_CURVE_ITEMS 3 /* poll items of kvp_events_curve_poll_items */

typedef struct kvp_events_curve kvp_events_curve_t;

/* Read the secret key and the allow-list and bind the ZAP handler
 * (inproc://zeromq.zap.01) in zctx. KVP_ERR_INVALID_ARG (a file unsafe or
 * malformed, no CURVE in libzmq) or KVP_ERR_SYSTEM, with a sentence in err
 * that never holds a key. Paths are copied. */
kvp_status_t kvp_events_curve_create(void *zctx, const char *secret_path, const char *allow_path,
                                     kvp_events_curve_t **cv_p, char *err, size_t err_len);
/* Close the ZAP and monitor sockets (before zmq_ctx_term). NULL is fine. */
void kvp_events_curve_destroy(kvp_events_curve_t *cv);

/* Make sock (not bound yet) a CURVE server whose peers the ZAP handler
 * checks, and watch its failed handshakes; name: "pub" or "replay" (two
 * names at most). like NULL: the key read at create (before the seal);
 * else a socket secured before under the same name, which sock replaces:
 * sock gets its key (from libzmq) and its watch (like's monitor stops;
 * close like afterwards). Borrowed: sock, like. */
kvp_status_t kvp_events_curve_secure(kvp_events_curve_t *cv, void *sock, void *like,
                                     const char *name, char *err, size_t err_len);

/* Wipe the secret key (libzmq keeps its own copy in each socket secured). */
void kvp_events_curve_seal(kvp_events_curve_t *cv);

/* The master's public key, Z85 (logged at start: subscribers need it). */
const char *kvp_events_curve_public(const kvp_events_curve_t *cv);

/* Read the allow-list again; on error the old one stays (logged either way).
 * The list is asked at each handshake: a connection let in stays in. Returns
 * the keys of the old list that the new one lacks or gives another tenant
 * (0: none, or the reload failed): when not 0 the caller closes the sockets
 * (kvp_events_reload), so their connections shake hands again. */
unsigned kvp_events_curve_reload(kvp_events_curve_t *cv);

/* Fill items[0..) for zmq_poll with the sockets serve reads (the ZAP
 * handler, the monitors): their number, KVP_EVENTS_CURVE_ITEMS at most. */
int kvp_events_curve_poll_items(kvp_events_curve_t *cv, zmq_pollitem_t *items);
/* Answer what waits: ZAP requests, failed handshakes. Never blocks. */
void kvp_events_curve_serve(kvp_events_curve_t *cv);

/* Handshakes refused: without CURVE or with a failed one (curve), with a
 * key not in the allow-list (key). */
void kvp_events_curve_stats(kvp_events_curve_t *cv, uint64_t *refused_curve, uint64_t *refused_key);

#endif
