/*
 * http_guard.c - the HTTP server's connection caps (see http_guard.h).
 *
 * Design: a flat array of slots scanned under one mutex. The server holds at most a few
 * thousand connections, so a pass over the array (a few microseconds) at each accept and
 * each sweep is cheaper and simpler than an index per peer, and it bounds every call.
 * A kicked connection keeps its slot (and is no longer counted against any cap) until the
 * server releases it, so the number of sockets held never passes the slot count.
 *
 * The body budget (kvp_http_budget_*) is the same shape: a flat table of accounts (one per
 * tenant with bodies in flight, KVP_HTTP_BODY_TENANTS of them in the server, 40 KiB) scanned
 * under its own mutex.
 *
 * Thread: any (g->lock, b->lock).
 */
#include "common/http_guard.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct slot {
    bool used;
    bool head;   /* waiting for a request's head (the handshake included) */
    bool kicked; /* closed by the guard, not yet released by the server */
    int fd;
    uint64_t since; /* the head's deadline runs from here */
    kvp_http_peer_t peer;
} slot_t;

struct kvp_http_guard {
    pthread_mutex_t lock;
    slot_t *slots;
    unsigned n, max_conns, per_peer;
    uint64_t head_ns, request_ns;
    void (*kick)(void *arg, int fd);
    void *arg;
    kvp_http_guard_stats_t st;
};

kvp_http_guard_t *kvp_http_guard_create(unsigned slots, unsigned max_conns, unsigned per_peer,
                                        uint64_t head_ns, void (*kick)(void *arg, int fd),
                                        void *arg)
{
    if (slots == 0 || max_conns == 0 || max_conns > slots || per_peer == 0 || kick == NULL)
        return NULL;
    kvp_http_guard_t *g = calloc(1, sizeof(*g));
    if (g == NULL)
        return NULL;
    g->slots = calloc(slots, sizeof(*g->slots));
    if (g->slots == NULL) {
        free(g);
        return NULL;
    }
    pthread_mutex_init(&g->lock, NULL);
    g->n = slots;
    g->max_conns = max_conns;
    g->per_peer = per_peer;
    g->head_ns = head_ns;
    g->kick = kick;
    g->arg = arg;
    return g;
}

void kvp_http_guard_destroy(kvp_http_guard_t *g)
{
    if (g == NULL)
        return;
    pthread_mutex_destroy(&g->lock);
    free(g->slots);
    free(g);
}

static void kick(kvp_http_guard_t *g, slot_t *s)
{
    s->kicked = true;
    g->kick(g->arg, s->fd);
}

/* Make room for one more connection of peer: kick the oldest head-waiting connection of the
 * peer when it is at its cap, then of the pool when that is full. false: no room (counted). */
static bool make_room(kvp_http_guard_t *g, const kvp_http_peer_t *peer)
{
    unsigned all = 0, mine = 0;
    slot_t *oldest = NULL, *oldest_mine = NULL;
    for (unsigned i = 0; i < g->n; i++) {
        slot_t *s = &g->slots[i];
        if (!s->used || s->kicked)
            continue;
        bool same = memcmp(&s->peer, peer, sizeof(*peer)) == 0;
        all++;
        mine += same;
        if (!s->head)
            continue;
        if (oldest == NULL || s->since < oldest->since)
            oldest = s;
        if (same && (oldest_mine == NULL || s->since < oldest_mine->since))
            oldest_mine = s;
    }
    if (mine >= g->per_peer) {
        g->st.peer++;
        if (oldest_mine == NULL)
            return false;
        kick(g, oldest_mine);
        return true; /* one of its own made room in the pool too */
    }
    if (all >= g->max_conns) {
        g->st.pool++;
        if (oldest == NULL)
            return false;
        kick(g, oldest);
    }
    return true;
}

int kvp_http_guard_open(kvp_http_guard_t *g, const kvp_http_peer_t *peer, int fd, uint64_t now)
{
    int slot = -1;
    pthread_mutex_lock(&g->lock);
    if (make_room(g, peer)) {
        for (unsigned i = 0; i < g->n; i++)
            if (!g->slots[i].used) {
                g->slots[i] =
                    (slot_t){.used = true, .head = true, .fd = fd, .since = now, .peer = *peer};
                slot = (int)i;
                g->st.live++;
                break;
            }
        if (slot < 0)
            g->st.pool++; /* every slot held by connections still closing */
    }
    pthread_mutex_unlock(&g->lock);
    return slot;
}

void kvp_http_guard_request_deadline(kvp_http_guard_t *g, uint64_t request_ns)
{
    pthread_mutex_lock(&g->lock);
    g->request_ns = request_ns;
    pthread_mutex_unlock(&g->lock);
}

void kvp_http_guard_request(kvp_http_guard_t *g, int slot, bool in_request, uint64_t now)
{
    if (slot < 0 || (unsigned)slot >= g->n)
        return;
    pthread_mutex_lock(&g->lock);
    slot_t *s = &g->slots[slot];
    if (s->used && s->head == in_request) {
        s->head = !in_request;
        s->since = now;
    }
    pthread_mutex_unlock(&g->lock);
}

void kvp_http_guard_close(kvp_http_guard_t *g, int slot)
{
    if (slot < 0 || (unsigned)slot >= g->n)
        return;
    pthread_mutex_lock(&g->lock);
    if (g->slots[slot].used) {
        g->slots[slot].used = false;
        g->st.live--;
    }
    pthread_mutex_unlock(&g->lock);
}

unsigned kvp_http_guard_sweep(kvp_http_guard_t *g, uint64_t now)
{
    unsigned n = 0;
    pthread_mutex_lock(&g->lock);
    for (unsigned i = 0; i < g->n; i++) {
        slot_t *s = &g->slots[i];
        if (!s->used || s->kicked || now <= s->since)
            continue;
        uint64_t limit = s->head ? g->head_ns : g->request_ns;
        if (limit == 0 || now - s->since <= limit)
            continue;
        kick(g, s);
        if (s->head)
            g->st.head_deadline++;
        else
            g->st.request_deadline++;
        n++;
    }
    pthread_mutex_unlock(&g->lock);
    return n;
}

void kvp_http_guard_stats(kvp_http_guard_t *g, kvp_http_guard_stats_t *st)
{
    pthread_mutex_lock(&g->lock);
    *st = g->st;
    pthread_mutex_unlock(&g->lock);
}

typedef struct account {
    char key[KVP_HTTP_BUDGET_KEY_MAX];
    size_t bytes; /* 0: free */
} account_t;

struct kvp_http_budget {
    pthread_mutex_t lock;
    account_t *a;
    unsigned n;
    size_t per_account, total, total_cap; /* total_cap 0: none but the table's */
};

kvp_http_budget_t *kvp_http_budget_create(unsigned accounts, size_t per_account, size_t total)
{
    if (accounts == 0 || per_account == 0)
        return NULL;
    kvp_http_budget_t *b = calloc(1, sizeof(*b));
    if (b == NULL)
        return NULL;
    b->a = calloc(accounts, sizeof(*b->a));
    if (b->a == NULL) {
        free(b);
        return NULL;
    }
    pthread_mutex_init(&b->lock, NULL);
    b->n = accounts;
    b->per_account = per_account;
    b->total_cap = total;
    return b;
}

void kvp_http_budget_destroy(kvp_http_budget_t *b)
{
    if (b == NULL)
        return;
    pthread_mutex_destroy(&b->lock);
    free(b->a);
    free(b);
}

void kvp_http_budget_set(kvp_http_budget_t *b, size_t per_account)
{
    pthread_mutex_lock(&b->lock);
    b->per_account = per_account;
    pthread_mutex_unlock(&b->lock);
}

size_t kvp_http_budget_per_account(kvp_http_budget_t *b)
{
    pthread_mutex_lock(&b->lock);
    size_t v = b->per_account;
    pthread_mutex_unlock(&b->lock);
    return v;
}

/* The account key holds, else a free one (its key set); -1: none. Under b->lock. */
static int account_of(kvp_http_budget_t *b, const char *key)
{
    int free_one = -1;
    for (unsigned i = 0; i < b->n; i++) {
        if (b->a[i].bytes == 0) {
            if (free_one < 0)
                free_one = (int)i;
        } else if (strncmp(b->a[i].key, key, sizeof(b->a[i].key) - 1) == 0) {
            return (int)i;
        }
    }
    if (free_one >= 0)
        snprintf(b->a[free_one].key, sizeof(b->a[free_one].key), "%s", key);
    return free_one;
}

kvp_http_budget_result_t kvp_http_budget_reserve(kvp_http_budget_t *b, const char *key,
                                                 int *account_p, size_t n)
{
    kvp_http_budget_result_t res = KVP_HTTP_BUDGET_OK;
    pthread_mutex_lock(&b->lock);
    int i = *account_p;
    if (i < 0 || (unsigned)i >= b->n)
        i = account_of(b, key);
    size_t cap = b->total_cap > b->per_account ? b->total_cap : b->per_account;
    if (i < 0) {
        res = KVP_HTTP_BUDGET_ACCOUNTS;
    } else if (n > b->per_account || b->a[i].bytes > b->per_account - n) {
        res = KVP_HTTP_BUDGET_TENANT;
    } else if (b->total_cap != 0 && (n > cap || b->total > cap - n)) {
        res = KVP_HTTP_BUDGET_FULL;
    } else {
        b->a[i].bytes += n;
        b->total += n;
        *account_p = i;
    }
    pthread_mutex_unlock(&b->lock);
    return res;
}

void kvp_http_budget_release(kvp_http_budget_t *b, int account, size_t n)
{
    if (account < 0 || (unsigned)account >= b->n)
        return;
    pthread_mutex_lock(&b->lock);
    size_t take = n < b->a[account].bytes ? n : b->a[account].bytes;
    b->a[account].bytes -= take;
    b->total -= take;
    pthread_mutex_unlock(&b->lock);
}

size_t kvp_http_budget_bytes(kvp_http_budget_t *b)
{
    pthread_mutex_lock(&b->lock);
    size_t v = b->total;
    pthread_mutex_unlock(&b->lock);
    return v;
}
