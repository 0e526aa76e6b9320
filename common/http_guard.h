/*
 * http_guard.h - the HTTP server's connection caps (http_guard.c): connections in all, per
 * peer address, and a deadline on each request's head (the TLS handshake and the header
 * lines) that a client trickling bytes does not reset.
 *
 * A table of slots, one per connection the server holds. A new connection that meets a cap
 * takes the place of the oldest connection that is still waiting for its head (of the same
 * peer for the per-peer cap, of anyone for the pool), which is closed: so a flood of
 * unfinished heads, from one peer or many, always leaves room for a client that sends its
 * request at once (a liveness probe's /health). Only when every connection of that peer (or
 * of the pool) is inside a request is the new one refused. A connection is closed through
 * the kick function (the server's: shutdown(2) of its socket, which the server's threads
 * then see and close), always under the guard's lock, so that a socket is never kicked
 * after its slot was released.
 *
 * The work of each call is one pass over the slots (bounded by the slot count).
 *
 * With it, the budget of request bodies being received, per tenant (kvp_http_budget_*).
 *
 * Thread: every function may be called on any thread (one mutex).
 */
#ifndef KVP_COMMON_HTTP_GUARD_H
#define KVP_COMMON_HTTP_GUARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvp_http_guard kvp_http_guard_t;

/* A peer's address, as the guard compares it (IPv4 mapped into IPv6). */
typedef struct kvp_http_peer {
    uint8_t addr[16];
} kvp_http_peer_t;

/* What the caps did, since the start. */
typedef struct kvp_http_guard_stats {
    uint64_t peer;             /* connections closed or refused for the per-peer cap */
    uint64_t pool;             /* ... for the cap on connections in all */
    uint64_t head_deadline;    /* connections closed: their request head came too slowly */
    uint64_t request_deadline; /* ... their request (its body, its answer) went on too long */
    uint64_t live;             /* connections held now */
} kvp_http_guard_stats_t;

/* slots: the most connections held at once (those closed but not yet released included);
 * max_conns <= slots: the cap on connections in all; per_peer: per peer address; head_ns:
 * the deadline of a request's head, from the connection's accept or its previous request's
 * end. kick(arg, fd): close that connection (called under the guard's lock). NULL: out of
 * memory. */
kvp_http_guard_t *kvp_http_guard_create(unsigned slots, unsigned max_conns, unsigned per_peer,
                                        uint64_t head_ns, void (*kick)(void *arg, int fd),
                                        void *arg);
void kvp_http_guard_destroy(kvp_http_guard_t *g);

/* A connection accepted at now (ns): its slot, or -1: refused (counted; the caller closes
 * it). May kick an older connection to make room. */
int kvp_http_guard_open(kvp_http_guard_t *g, const kvp_http_peer_t *peer, int fd, uint64_t now);
/* The deadline of a whole request from its head (its body read, its answer sent); 0 (the
 * default): none. */
void kvp_http_guard_request_deadline(kvp_http_guard_t *g, uint64_t request_ns);
/* The connection in slot has its request's head (in_request true), or its request ended at
 * now and the next head's deadline starts (false). slot < 0: nothing. */
void kvp_http_guard_request(kvp_http_guard_t *g, int slot, bool in_request, uint64_t now);
/* The connection in slot is gone (before its socket is closed). slot < 0: nothing. */
void kvp_http_guard_close(kvp_http_guard_t *g, int slot);
/* Kick every connection whose head, or request, is past its deadline at now; how many. */
unsigned kvp_http_guard_sweep(kvp_http_guard_t *g, uint64_t now);
void kvp_http_guard_stats(kvp_http_guard_t *g, kvp_http_guard_stats_t *st);

/*
 * The budget of bodies being received, per tenant: a fixed table of accounts, each keyed by
 * the string the server charges a body to (the admit check's tenant, kvp_http_charge) and
 * holding at most per_account bytes. An account is taken by the first reservation of its key
 * and is free again once its bytes are all released, so the table bounds the tenants with
 * bodies in flight at once, and the bytes in all (total). Each call is one
 * pass over the accounts under a mutex, with no allocation.
 */
#define KVP_HTTP_BUDGET_KEY_MAX 160 /* a key's bytes, its NUL included (longer: truncated) */

typedef struct kvp_http_budget kvp_http_budget_t;

typedef enum kvp_http_budget_result {
    KVP_HTTP_BUDGET_OK,
    KVP_HTTP_BUDGET_TENANT,   /* over the key's per_account bytes */
    KVP_HTTP_BUDGET_ACCOUNTS, /* every account is held by other keys */
    KVP_HTTP_BUDGET_FULL,     /* the bytes of all accounts at the table's total */
} kvp_http_budget_result_t;

/* total: the bytes of all accounts together at most (never less than one account's;
 * 0: accounts x per_account). NULL: out of memory, or accounts or per_account 0. */
kvp_http_budget_t *kvp_http_budget_create(unsigned accounts, size_t per_account, size_t total);
void kvp_http_budget_destroy(kvp_http_budget_t *b);
/* Change the bytes an account may hold (reservations made stay). */
void kvp_http_budget_set(kvp_http_budget_t *b, size_t per_account);
size_t kvp_http_budget_per_account(kvp_http_budget_t *b);
/* Reserve n more bytes for key: from the account in *account_p, or (*account_p < 0) the one
 * key holds, or a free one, whose index *account_p then gets. Nothing is reserved unless OK. */
kvp_http_budget_result_t kvp_http_budget_reserve(kvp_http_budget_t *b, const char *key,
                                                 int *account_p, size_t n);
/* Give back n bytes of account (what reserve gave it; account < 0: nothing). */
void kvp_http_budget_release(kvp_http_budget_t *b, int account, size_t n);
/* The bytes reserved in all, now. */
size_t kvp_http_budget_bytes(kvp_http_budget_t *b);

#endif
