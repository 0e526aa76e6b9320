/*
 * reply.h - the response builder every RPC handler answers through (see reply.c).
 */
#ifndef KVP_MASTER_RPC_REPLY_H
#define KVP_MASTER_RPC_REPLY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "master/rpc/call.h"

/* Room for a response's message, the NUL included (the longest any method keeps). */
#define KVP_REPLY_TEXT_MAX 400u
/* Arrays one response may point into (kvp_reply_alloc, kvp_reply_calloc). */
#define KVP_REPLY_ARRAYS_MAX 8u

typedef struct kvp_reply kvp_reply_t;

/*
 * Called once the response is packed (rc KVP_OK: the answer goes out) or is not (rc
 * KVP_ERR_NOMEM: kvp_reply_abort, or no memory to pack): the handler keeps or undoes what
 * only the answer would have told the caller of (moves recorded, leases granted, objects
 * created). The response and its arrays are still there.
 */
typedef void (*kvp_reply_end_cb_t)(kvp_reply_t *r, kvp_status_t rc, void *arg);

/*
 * A response under construction: the handler's own protobuf-c message (on its stack, of
 * the method's response type), the arrays and segment descriptors it points into, and its
 * `message` text. All of it lives until kvp_reply_send, kvp_reply_fail, kvp_reply_deny or
 * kvp_reply_abort, which end the reply and release what it holds. A handler that answers
 * later (a request held: no answer now) may leave a reply that holds nothing without ending
 * it. Thread: master loop only.
 */
struct kvp_reply {
    kvp_call_t *call;
    ProtobufCMessage *resp;
    kvp_seg_set_t segs; /* the segments the response's replicas name (kvp_call_add_replicas) */
    size_t text_max;    /* room the method gives its message, the NUL included; 0: none */
    /* the message: kvp_reply_fail writes it, or the handler does (up to text_max); sent
     * when not empty, in the response's `message` field */
    char text[KVP_REPLY_TEXT_MAX];
    void *arrays[KVP_REPLY_ARRAYS_MAX];
    unsigned n_arrays;
    kvp_reply_end_cb_t end_cb;
    void *end_arg;
};

/*
 * Start answering call with resp (initialised by its __INIT; borrowed until the reply
 * ends). text_max: the room of its message (at most KVP_REPLY_TEXT_MAX; a longer one is
 * cut there), 0 for a response type without one.
 */
void kvp_reply_init(kvp_reply_t *r, kvp_call_t *call, ProtobufCMessage *resp, size_t text_max);

/* Run cb (with arg) when the reply ends (see kvp_reply_end_cb_t). */
void kvp_reply_on_end(kvp_reply_t *r, kvp_reply_end_cb_t cb, void *arg);

/*
 * An array of n elements of `size` bytes (room for one at least) for the response to
 * point into, released when the reply ends; NULL: out of memory. kvp_reply_alloc leaves
 * it uninitialised (the handler writes each element it uses: a large calloc costs page
 * faults on every call), kvp_reply_calloc zeroes it.
 */
void *kvp_reply_alloc(kvp_reply_t *r, size_t n, size_t size);
void *kvp_reply_calloc(kvp_reply_t *r, size_t n, size_t size);

/*
 * The response's per-key `statuses` (a StatusesResponse's, an AdoptResponse's): n of them
 * for the handler to write, released when the reply ends; NULL: out of memory.
 */
int32_t *kvp_reply_statuses(kvp_reply_t *r, size_t n);

/*
 * The segments r->segs collected become the response's `segments`, each with what the
 * caller needs to reach it under data grants (kvp_seg_set_conn_keys). false: out of
 * memory (then kvp_reply_abort).
 */
bool kvp_reply_segments(kvp_reply_t *r);

/* Pack the response into the call, end the reply. KVP_ERR_NOMEM: no answer. */
kvp_status_t kvp_reply_send(kvp_reply_t *r);

/*
 * Answer with a whole-request status and why (fmt NULL: the message as the handler wrote
 * it in r->text, if any), before any per-key result is built.
 */
kvp_status_t kvp_reply_fail(kvp_reply_t *r, int32_t status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* kvp_reply_fail with KVP_ERR_DENIED, counted as a refusal by role (/metrics). */
kvp_status_t kvp_reply_deny(kvp_reply_t *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* No answer after all (out of memory): end the reply; returns KVP_ERR_NOMEM, the frame-level
 * status the caller gets instead. */
kvp_status_t kvp_reply_abort(kvp_reply_t *r);

#endif
