/*
 * xfer_sessions.h - the client's transfer sessions (xfer_sessions.c): the get and put
 * sessions open on this client, keyed by object key. The public calls are in kvpool.h
 * (kvp_batch_get_session_start ... kvp_batch_put_session_revoke).
 *
 * Thread: create and destroy with no call in progress; the calls from any thread.
 */
#ifndef KVP_CLIENT_XFER_SESSIONS_H
#define KVP_CLIENT_XFER_SESSIONS_H

typedef struct kvp_xsessions kvp_xsessions_t;

/* Empty tables; NULL: no memory. */
kvp_xsessions_t *kvp_xsessions_create(void);
/* Every session dropped (the master ends their leases and PENDING puts with the client's
 * connection). NULL: nothing. */
void kvp_xsessions_destroy(kvp_xsessions_t *xs);

#endif
