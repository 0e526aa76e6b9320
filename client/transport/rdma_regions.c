/*
 * rdma_regions.c - a transfer engine's ranges served on the rdma transport (rdma_regions.h;
 * docs/architecture.md, "Transfer engine").
 *
 * Every registered range is a memory region of its own on the transport's device (remote
 * READ+WRITE over that range only), shared with the transport's table of local regions
 * (kvp_rdma_ctx_mr_share) so that the engine's own batches use it as their local side; the
 * table of (addr, len, rkey) is handed to admitted peers with a one-time token, and the
 * transport's accept thread lets a queue pair in only for a token handed out here (gate).
 *
 * Thread: any; the regions under lock (a rwlock: the answer copies the table out under the
 * read side and sends it without it), the tokens under tok_lock (the accept thread's gate
 * takes it too).
 */
#include "client/transport/rdma_regions.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include "client/transport/rdma_ctx.h"
#include "client/transport/rdma_status.h"
#include "client/transport/rdma_verbs.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/sock.h"

#define TOKENS_MAX 256

typedef struct token {
    uint8_t token[16];
    uint64_t expiry_ms; /* 0: free */
} token_t;

struct kvp_rdma_regions {
    kvp_transfer_t *xfer;
    void *ctx; /* the rdma transport's */
    kvp_rdma_dev_t *dev;
    char ipv4[16];
    uint16_t port;
    char where[96];
    void (*tick)(void *);
    void *tick_arg;
    /* the regions: wire entries (rkeys) and their memory regions, sorted by addr, disjoint */
    pthread_rwlock_t lock;
    kvp_data_te_rdma_region_t *ents;
    kvp_rdma_mr_t **mrs;
    size_t n, cap;
    /* tokens handed out */
    pthread_mutex_t tok_lock;
    token_t tokens[TOKENS_MAX];
};

/* A reply with no payload (status). */
static bool reply(int fd, kvp_status_t status)
{
    kvp_data_resp_t r = {.magic = KVP_DATA_MAGIC, .status = status, .length = 0};
    return kvp_send_all(fd, &r, sizeof(r)) == KVP_OK;
}

bool kvp_rdma_present(void)
{
    return kvp_rdma_devices_present();
}

/* The transport's accept gate: a token handed out and not expired, once. */
static int gate(void *ext, const void *pdata, size_t len)
{
    kvp_rdma_regions_t *rr = ext;
    kvp_rdma_token_pdata_t cp;
    int ok = -1;
    if (pdata != NULL && len >= sizeof(cp)) {
        memcpy(&cp, pdata, sizeof(cp));
        if (cp.magic == KVP_RDMA_TOKEN_MAGIC && cp.version == KVP_RDMA_TOKEN_VERSION) {
            uint64_t now = kvp_now_ms();
            pthread_mutex_lock(&rr->tok_lock);
            for (size_t i = 0; i < TOKENS_MAX && ok != 0; i++) {
                token_t *t = &rr->tokens[i];
                if (t->expiry_ms != 0 && now < t->expiry_ms &&
                    CRYPTO_memcmp(t->token, cp.token, sizeof(cp.token)) == 0) {
                    t->expiry_ms = 0; /* once */
                    ok = 0;
                }
            }
            pthread_mutex_unlock(&rr->tok_lock);
        }
        OPENSSL_cleanse(&cp, sizeof(cp));
    }
    if (ok != 0) {
        atomic_fetch_add_explicit(&rr->xfer->serve_refused, 1, memory_order_relaxed);
        KVP_LOG_WARN_LIMITED("transfer engine: an rdma connect with no valid token; refused");
    }
    return ok;
}

static void tick(void *ext)
{
    kvp_rdma_regions_t *rr = ext;
    if (rr->tick != NULL)
        rr->tick(rr->tick_arg);
}

/* At the transport's cleanup, its accept thread stopped: every region goes. */
static void regions_free(void *ext)
{
    kvp_rdma_regions_t *rr = ext;
    for (size_t i = 0; i < rr->n; i++) {
        kvp_rdma_ctx_mr_unshare(rr->ctx, (void *)(uintptr_t)rr->ents[i].addr);
        kvp_rdma_mr_dereg(rr->mrs[i]);
    }
    free(rr->ents);
    free(rr->mrs);
    pthread_rwlock_destroy(&rr->lock);
    pthread_mutex_destroy(&rr->tok_lock);
    OPENSSL_cleanse(rr->tokens, sizeof(rr->tokens));
    free(rr);
}

kvp_status_t kvp_rdma_regions_serve(kvp_transfer_t *xfer, void (*tick_fn)(void *), void *tick_arg,
                                    kvp_rdma_regions_t **rr_p)
{
    *rr_p = NULL;
    void *ctx = kvp_rdma_ctx_of(xfer);
    if (ctx == NULL)
        return KVP_ERR_NOT_FOUND;
    kvp_rdma_regions_t *rr = calloc(1, sizeof(*rr));
    if (rr == NULL)
        return KVP_ERR_NOMEM;
    rr->xfer = xfer;
    rr->ctx = ctx;
    rr->dev = kvp_rdma_ctx_dev(ctx);
    rr->tick = tick_fn;
    rr->tick_arg = tick_arg;
    pthread_rwlock_init(&rr->lock, NULL);
    pthread_mutex_init(&rr->tok_lock, NULL);
    kvp_status_t st = kvp_rdma_ctx_listen(ctx, gate, tick, rr, regions_free, rr->ipv4,
                                          sizeof(rr->ipv4), &rr->port);
    if (st != KVP_OK) {
        regions_free(rr);
        return st;
    }
    snprintf(rr->where, sizeof(rr->where), "%s %s:%u", kvp_rdma_dev_info(rr->dev)->name, rr->ipv4,
             rr->port);
    *rr_p = rr;
    return KVP_OK;
}

const char *kvp_rdma_regions_where(const kvp_rdma_regions_t *rr)
{
    return rr->where;
}

kvp_status_t kvp_rdma_regions_add(kvp_rdma_regions_t *rr, void *addr, size_t len)
{
    kvp_rdma_mr_t *mr;
    int rc = kvp_rdma_mr_reg(rr->dev, addr, len, true, &mr);
    if (rc != 0) {
        KVP_LOG_ERROR("transfer engine: cannot register [%p, +%zu) with %s: %s", addr, len,
                      kvp_rdma_dev_info(rr->dev)->name, kvp_rdma_last_error());
        return rc == -ENOMEM ? KVP_ERR_NOMEM : KVP_ERR_TRANSPORT;
    }
    uintptr_t a = (uintptr_t)addr;
    kvp_status_t st = KVP_OK;
    pthread_rwlock_wrlock(&rr->lock);
    if (rr->n == rr->cap) {
        size_t cap = rr->cap ? rr->cap * 2 : 16;
        kvp_data_te_rdma_region_t *e = realloc(rr->ents, cap * sizeof(*e));
        if (e != NULL)
            rr->ents = e;
        kvp_rdma_mr_t **m = e != NULL ? realloc(rr->mrs, cap * sizeof(*m)) : NULL;
        if (m != NULL) {
            rr->mrs = m;
            rr->cap = cap;
        } else
            st = KVP_ERR_NOMEM;
    }
    /* the transport's batches find it (the engine's own local side) */
    if (st == KVP_OK)
        st = kvp_rdma_ctx_mr_share(rr->ctx, addr, len, mr);
    if (st == KVP_OK) {
        size_t i = 0;
        while (i < rr->n && rr->ents[i].addr < a)
            i++;
        memmove(&rr->ents[i + 1], &rr->ents[i], (rr->n - i) * sizeof(rr->ents[0]));
        memmove(&rr->mrs[i + 1], &rr->mrs[i], (rr->n - i) * sizeof(rr->mrs[0]));
        rr->ents[i] = (kvp_data_te_rdma_region_t){.addr = a, .len = len, .rkey = mr->rkey};
        rr->mrs[i] = mr;
        rr->n++;
    }
    pthread_rwlock_unlock(&rr->lock);
    if (st != KVP_OK)
        kvp_rdma_mr_dereg(mr);
    return st;
}

void kvp_rdma_regions_remove(kvp_rdma_regions_t *rr, void *addr)
{
    kvp_rdma_mr_t *mr = NULL;
    pthread_rwlock_wrlock(&rr->lock);
    for (size_t i = 0; i < rr->n; i++)
        if (rr->ents[i].addr == (uintptr_t)addr) {
            mr = rr->mrs[i];
            memmove(&rr->ents[i], &rr->ents[i + 1], (rr->n - i - 1) * sizeof(rr->ents[0]));
            memmove(&rr->mrs[i], &rr->mrs[i + 1], (rr->n - i - 1) * sizeof(rr->mrs[0]));
            rr->n--;
            break;
        }
    pthread_rwlock_unlock(&rr->lock);
    if (mr != NULL) {
        kvp_rdma_ctx_mr_unshare(rr->ctx, addr); /* no new batch of ours takes it */
        kvp_rdma_mr_dereg(mr);                  /* the NIC refuses the range from now on */
    }
}

bool kvp_rdma_regions_answer(kvp_rdma_regions_t *rr, int fd)
{
    kvp_data_te_rdma_t info = {.port = rr->port};
    memcpy(info.ipv4, rr->ipv4, sizeof(info.ipv4));
    if (RAND_bytes(info.token, sizeof(info.token)) != 1)
        return reply(fd, KVP_ERR_SYSTEM);
    /* the token: a free (or expired) slot, else the one that expires first */
    uint64_t now = kvp_now_ms();
    pthread_mutex_lock(&rr->tok_lock);
    token_t *slot = &rr->tokens[0];
    for (size_t i = 0; i < TOKENS_MAX; i++) {
        token_t *t = &rr->tokens[i];
        if (t->expiry_ms <= now) {
            slot = t;
            break;
        }
        if (t->expiry_ms < slot->expiry_ms)
            slot = t;
    }
    memcpy(slot->token, info.token, sizeof(info.token));
    slot->expiry_ms = now + KVP_DATA_TE_RDMA_TOKEN_MS;
    pthread_mutex_unlock(&rr->tok_lock);
    /* the table copied out under the lock and sent without it: a peer that does not read
     * holds up no registration */
    kvp_data_te_rdma_region_t *copy = NULL;
    pthread_rwlock_rdlock(&rr->lock);
    size_t n = rr->n < KVP_DATA_REGIONS_MAX ? rr->n : KVP_DATA_REGIONS_MAX;
    if (n > 0 && (copy = malloc(n * sizeof(*copy))) != NULL)
        memcpy(copy, rr->ents, n * sizeof(*copy));
    pthread_rwlock_unlock(&rr->lock);
    if (n > 0 && copy == NULL) {
        OPENSSL_cleanse(&info, sizeof(info));
        return reply(fd, KVP_ERR_NOMEM);
    }
    info.n = (uint32_t)n;
    kvp_data_resp_t h = {
        .magic = KVP_DATA_MAGIC, .status = 0, .length = sizeof(info) + n * sizeof(copy[0])};
    struct iovec iov[3] = {{.iov_base = &h, .iov_len = sizeof(h)},
                           {.iov_base = &info, .iov_len = sizeof(info)},
                           {.iov_base = copy, .iov_len = n * sizeof(copy[0])}};
    bool ok = kvp_sendv_all(fd, iov, n > 0 ? 3 : 2) == KVP_OK;
    OPENSSL_cleanse(&info, sizeof(info));
    free(copy);
    return ok;
}

void kvp_rdma_regions_cut(kvp_rdma_regions_t *rr)
{
    pthread_mutex_lock(&rr->tok_lock);
    for (size_t i = 0; i < TOKENS_MAX; i++)
        rr->tokens[i].expiry_ms = 0;
    pthread_mutex_unlock(&rr->tok_lock);
    unsigned cut = kvp_rdma_ctx_cut(rr->ctx);
    if (cut > 0)
        KVP_LOG_WARN("transfer engine: %u rdma queue pair(s) of peers cut off (KVPOOL_TE_ACL "
                     "took a role away): each peer connects again through the new roles",
                     cut);
}

kvp_status_t kvp_rdma_regions_ask(int fd, kvp_rdma_offer_t *offer)
{
    *offer = (kvp_rdma_offer_t){.tab = NULL};
    kvp_data_req_t req = {
        .magic = KVP_DATA_MAGIC, .op = KVP_DATA_TE_RDMA, .segment_id = KVP_TE_SEGMENT_ID};
    kvp_data_resp_t h;
    kvp_data_te_rdma_t info;
    kvp_data_te_rdma_region_t *tab = NULL;
    kvp_status_t st = kvp_send_all(fd, &req, sizeof(req));
    if (st == KVP_OK)
        st = kvp_recv_all(fd, &h, sizeof(h));
    if (st == KVP_OK && h.magic != KVP_DATA_MAGIC)
        st = KVP_ERR_PROTOCOL;
    if (st == KVP_OK && h.status != 0)
        st = kvp_status_from_wire(h.status);
    /* an engine of an older version answers the unknown frame by closing: no rdma there */
    if (st == KVP_ERR_IO || st == KVP_ERR_CONNECT)
        st = KVP_ERR_UNSUPPORTED;
    if (st == KVP_OK &&
        (h.length < sizeof(info) || (h.length - sizeof(info)) % sizeof(tab[0]) != 0 ||
         (h.length - sizeof(info)) / sizeof(tab[0]) > KVP_DATA_REGIONS_MAX))
        st = KVP_ERR_PROTOCOL;
    if (st == KVP_OK)
        st = kvp_recv_all(fd, &info, sizeof(info));
    size_t n = st == KVP_OK ? (size_t)(h.length - sizeof(info)) / sizeof(tab[0]) : 0;
    if (st == KVP_OK && (info.n != n || memchr(info.ipv4, '\0', sizeof(info.ipv4)) == NULL))
        st = KVP_ERR_PROTOCOL;
    if (st == KVP_OK && n > 0 && (tab = malloc(n * sizeof(tab[0]))) == NULL)
        st = KVP_ERR_NOMEM;
    if (st == KVP_OK && n > 0)
        st = kvp_recv_all(fd, tab, n * sizeof(tab[0]));
    for (size_t i = 1; st == KVP_OK && i < n; i++)
        if (tab[i].addr < tab[i - 1].addr + tab[i - 1].len)
            st = KVP_ERR_PROTOCOL; /* not sorted, or overlapping: not a table we search */
    if (st != KVP_OK) {
        free(tab);
        return st;
    }
    memcpy(offer->ipv4, info.ipv4, sizeof(offer->ipv4));
    offer->port = info.port;
    memcpy(offer->token, info.token, sizeof(offer->token));
    OPENSSL_cleanse(&info, sizeof(info));
    offer->tab = tab;
    offer->n = n;
    return KVP_OK;
}
