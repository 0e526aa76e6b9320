/*
 * index.c - the prefix index of kvpool-indexer (index.h; docs/indexer.md).
 *
 * Design. A block is a node of 24 bytes: its standard seq hash, the engine hash mapped to it
 * (below), and a word of its scope (tenant, model, LoRA, block size, salt: interned, an
 * id), a used bit and its holder count; then its holders, each a u32 naming (registration,
 * publisher slot of that registration, medium) - one inline, more in an array of their own
 * (idx->ext). Nodes live in one array (stable indices, a free list) and are found through
 * an open-addressing table of u64 slots, (hash's high 32 bits << 32) | node index, probed
 * linearly and deleted by backward shift; the hash is a keyed mix of (seq, scope) under a
 * key drawn at start, so a publisher that picks its hashes cannot pile them on one probe
 * run. Each tenant has a budget of nodes (--max-blocks-per-tenant, else a fair share of
 * --max-blocks) and a clock of its own, a circular list of its nodes (idx->links): past its
 * budget, or past --max-blocks while over its share, the clock (the used bit, set by a
 * store, cleared as the hand passes) evicts one of its nodes not stored since the hand last
 * passed it: about the tenant's least recently stored. Per (registration, publisher) a held
 * list names the nodes it holds, so that a clear, a resync or an unregister costs what it
 * holds. A batch is applied in slices: the write lock is let go between them (slice_point).
 * An unregister only takes the registration out (reg_kill: no answer or batch sees it); the
 * subscriber thread purges its held lists afterwards, in slices too (kvp_idx_reap).
 *
 * Engine hashes. An engine that hashes otherwise sends token ids; the standard hashes made
 * from them are remembered engine hash -> block, in the block's node, found through a
 * second table of the same kind keyed by (scope, engine hash). A map never says anything
 * false (it is a function of the tokens), so it outlives its block: a node whose last
 * holder goes stays while an engine hash names it (a kvpool master's event naming the
 * engine hash after the engine removed the block - an offload that ends after the eviction;
 * two publishers' batches come in no common order - still finds it), with its used bit
 * clear, so that the clock takes such nodes first. A second engine hash of one block
 * (engines of two hashings stored it) goes to an overflow table of maps, at most
 * --max-blocks of them, with a clock of its own.
 *
 * Queries walk the prompt's hashes in order, one table lookup per block, and fold each
 * node's holders into per-registration medium masks, from which the runs of docs/indexer.md
 * are advanced; the walk stops at the first block no candidate holds, or when no run is
 * still going.
 *
 * Thread: one rwlock (index.h); counters that HTTP threads bump are atomics.
 */
#include "indexer/index.h"

#include <ctype.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>

#include <xxhash.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/macros.h"
#include "common/rand.h"

#define HOLDER(reg, pub, m) (((uint32_t)(reg) << 7) | ((uint32_t)(pub) << 3) | (uint32_t)(m))
#define HOLDER_REG(h) ((h) >> 7)
#define HOLDER_PUB(h) (((h) >> 3) & 15u)
#define HOLDER_MEDIUM(h) ((h)&7u)
#define NODES_MAX (1u << 31)
#define SCOPES_MAX 4096
#define SCOPES_TENANT_MAX (SCOPES_MAX / 4) /* one tenant's share of them */
_Static_assert(SCOPES_MAX < 0x2000, "a scope id fits NODE_SCOPE's 13 bits");
#define SUBS_MAX KVP_IDX_SUBS_MAX
#define TYPE_MAX 32

typedef struct node {
    uint64_t seq;    /* its standard hash */
    uint64_t engine; /* the engine hash mapped to it (in the engine table); seq: none */
    uint32_t meta;   /* NODE_USED | scope << 16 | holders; 0: a free node */
    uint32_t h;      /* one holder: it; more: the index of their array in idx->ext; a free
                      * node: the next free one */
} node_t;
#define NODE_USED 0x80000000u
#define NODE_SCOPE(n) (((n)->meta >> 16) & 0x1fffu)
#define NODE_N(n) ((n)->meta & 0xffffu)
#define NODE_META(scope, n) (((uint32_t)(scope) << 16) | (uint32_t)(n))
#define NODE_MARK 0x40000000u /* set only while a held list is compacted (held_compact) */
#define HOLDERS_MAX 32768u

/* A node's place in its tenant's clock, a circular list (parallel to idx->nodes). Its
 * tenant is its scope's (scope_t.tenant, fixed while the scope has nodes). */
typedef struct tlink {
    uint32_t prev, next;
} tlink_t;

/* A tenant of the blocks: its clock (the hand: the node it looks at next; 0: no node), how
 * many nodes it has and how many of them were evicted. */
#define TENANTS_MAX (2u * SCOPES_MAX) /* past it, tenant slot 0 takes the others' blocks */
#define CLOCK_STEPS_MAX 4096u         /* an eviction passes at most this many used nodes */
typedef struct tenant {
    char name[KVP_IDX_NAME_MAX];
    uint32_t hand;
    uint64_t nodes, evicted;
} tenant_t;

/* The nodes one (registration, publisher slot) holds a block on, so that a clear or a resync
 * costs what it holds: appended when it first holds a node, entries that no longer name a
 * node it holds (removed blocks, freed nodes) are dropped by the purges that walk them and by
 * a compaction when they outnumber its holders. */
typedef struct held {
    uint32_t *ids;
    uint32_t n, cap;
} held_t;

/* A batch is applied in slices of about this much work (blocks, holders, clock steps): the
 * write lock is let go between them, so that a query never waits for more than one. While a
 * query (or another writer) waits for the lock, a slice ends after SLICE_WAITED: the wait is
 * a fraction of a millisecond even where memory is slow, and with nobody waiting a batch
 * keeps the lock for the longer slice (each let-go costs the batch a wake-up). */
#define SLICE_WORK 8192u
#define SLICE_WAITED 1024u
#define SLICE_QUERIED 128u /* while a query is being answered: it parses meanwhile */
#define TABLE_FIRST 65536u /* a table's first slots */

typedef struct map {
    uint64_t engine, std;
    uint32_t scope; /* 0: free */
    uint32_t used;  /* looked up or set since the clock's hand last passed; free: the next
                     * free map */
} map_t;

/* An open-addressing table of u32 indices (nodes or maps) tagged with their hash. */
typedef struct table {
    uint64_t *slots;
    uint32_t mask, count;
} table_t;

typedef struct scope {
    char tenant[KVP_IDX_NAME_MAX], model[KVP_IDX_NAME_MAX], lora[KVP_IDX_NAME_MAX],
        salt[KVP_IDX_NAME_MAX];
    uint32_t block_size, refs; /* refs: registrations naming it */
    uint32_t nodes;            /* nodes naming it (blocks, and those kept for their engine
                                * hash): the slot is free when refs and nodes are 0, so that
                                * a node's scope never names another one */
    uint32_t t;                /* its nodes' tenant slot: fixed while it has nodes (a node's
                                * tenant is read from here) */
} scope_t;

typedef struct pub {
    uint32_t sub;
    char type[TYPE_MAX];
    bool pool; /* kvpool or Mooncake: its blocks count for the registration's rank */
} pub_t;

typedef struct reg {
    bool live;
    uint32_t gen; /* changes when its registration goes: a purge that let the lock go stops */
    bool dying;   /* unregistered (not live), its blocks not yet purged (kvp_idx_reap): the
                   * slot is not taken again until they are */
    char instance[KVP_IDX_NAME_MAX];
    uint32_t rank, scope, n_pubs;
    uint32_t inst_id; /* the same for every registration of its (instance, scope): the index
                       * of one of them */
    pub_t pubs[KVP_IDX_PUBS_MAX];
    uint64_t holders;
    uint64_t by_medium[KVP_IDX_MEDIA_MAX]; /* its holders on each medium */
} reg_t;

typedef struct sub {
    bool live, has_seq, connected;
    char tenant[KVP_IDX_NAME_MAX]; /* its owner: only this tenant's registrations name it, and
                                    * only they change its replay endpoint and key */
    char endpoint[KVP_IDX_ENDPOINT_MAX], replay[KVP_IDX_ENDPOINT_MAX];
    char curve[KVP_IDX_CURVE_KEY_LEN + 1]; /* the publisher's CURVE public key; "": none */
    uint64_t gen, last_seq, resyncs;
    uint64_t last_ms; /* its last batch (0: none yet; then since it was subscribed) */
    uint64_t since_ms;
    uint32_t refs;
    bool open_failed;  /* the subscriber thread could not make its socket (kvp_idx_sub_open) */
    uint32_t *targets; /* (reg << 4) | publisher slot, for every registration naming it */
    uint32_t n_targets, cap_targets;
} sub_t;

struct kvp_idx {
    pthread_rwlock_t lock;
    uint64_t wgen; /* bumped by every taking of the write lock (grow_ahead's check) */
    bool w_held;   /* the write lock is held (since w_since_ns): its holds are measured */
    uint64_t w_since_ns, w_hold_max_ns, w_holds_over_ms;
    uint64_t seed, tseed, max_blocks;
    uint32_t ttl_ms;
    node_t *nodes;
    uint32_t n_nodes_cap, n_nodes_used, free_nodes, node_hand;
    uint32_t n_nodes;  /* not free: blocks, and removed ones kept for their engine hash */
    tlink_t *links;    /* each node's tenant and place in its clock */
    tenant_t *tenants; /* [0]: the overflow slot */
    uint32_t n_tenants, cap_tenants, active_tenants, tenant_cursor;
    uint64_t max_per_tenant; /* 0: the fair share */
    held_t **held;           /* per registration: per publisher slot */
    uint32_t *snap;          /* a batch's targets, as it started */
    uint32_t cap_snap;
    uint64_t purge_visits, slices, grown_aside, grown_inside;
    uint32_t work;            /* since a batch last let the write lock go (slice_point) */
    _Atomic uint32_t waiting; /* threads blocked taking the lock (kvp_idx_rdlock, _wrlock) */
    /* queries first (yield_to_queries): queries being answered, the applying thread waiting
     * for them, and what its waits took */
    _Atomic uint32_t querying, yielding;
    pthread_mutex_t q_mu;
    pthread_cond_t q_cond;
    int64_t yield_credit_ns; /* (the applying thread's: kvp_idx_yield) */
    uint64_t yield_last_ns;
    _Atomic uint64_t yields, yielded_ns;
    uint32_t live_nodes; /* blocks: nodes with a holder */
    table_t blocks;      /* (scope, seq) -> node */
    table_t engines;     /* (scope, engine hash) -> node, for nodes with one */
    uint32_t **ext;      /* holder arrays of nodes with more than one */
    uint32_t *ext_free;
    uint32_t n_ext, cap_ext, n_ext_free;
    map_t *maps;
    uint32_t n_maps_cap, n_maps_used, free_maps, hand;
    table_t map_table;
    scope_t *scopes;
    uint32_t n_scopes;
    reg_t **regs;
    uint32_t n_regs;  /* slots used (live or not) */
    uint32_t n_dying; /* registrations unregistered, their blocks not yet purged */
    sub_t *subs;
    uint32_t n_subs;
    uint64_t sub_gen;
    uint32_t tenant_regs_max, tenant_subs_max; /* per tenant; 0: no cap but the global ones */
    char media[KVP_IDX_MEDIA_MAX][TYPE_MAX];
    unsigned n_media;
    /* scratch of the writer (write lock) */
    uint64_t *hbuf, *sbuf;
    uint32_t *tbuf;
    size_t hcap, tcap;
    /* counters */
    uint64_t holders, evicted, unplaced, media_dropped, stored_ev, removed_ev, cleared_ev,
        resync_gap, resync_restart, resync_malformed, maps_live, maps_evicted;
    _Atomic uint64_t batches, replayed, q_tokens, q_hashes, refused_json, refused_body,
        refused_method, refused_field, refused_path, refused_peer, refused_unauth, refused_role,
        refused_tenant;
};

/* ---- hashing ---- */

void kvp_idx_hash_tokens(uint64_t seed, const uint32_t *tokens, size_t n, uint32_t bs,
                         bool has_parent, uint64_t parent, uint64_t *seq)
{
    uint64_t prev = parent;
    for (size_t i = 0; i < n; i++) {
        const uint32_t *t = tokens + i * bs;
        uint64_t local;
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        local = XXH3_64bits_withSeed(t, (size_t)bs * 4, seed);
#else
#error "kvpool-indexer hashes tokens as little-endian u32: a big-endian build must swap them"
#endif
        if (i == 0 && !has_parent) {
            prev = local;
        } else {
            uint64_t two[2] = {prev, local};
            prev = XXH3_64bits_withSeed(two, sizeof(two), seed);
        }
        seq[i] = prev;
    }
}

/* The tables' hash of (scope, v): a keyed mix (the key drawn at start), so that a
 * publisher that picks its hashes cannot aim them at one probe run; cheaper than XXH3,
 * which the blocks' own hashes have been through already. */
static inline uint64_t key_hash(const kvp_idx_t *idx, uint32_t scope, uint64_t v)
{
    uint64_t x = (v ^ idx->tseed) + (uint64_t)scope * 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* ---- big arrays ---- */

/* The arrays that grow to hundreds of MiB (the tables, the nodes and their clock links, the
 * held lists) are mapped on their own from BIG_BYTES up and grown by mremap, which moves
 * their pages rather than copying them: a copy, under the write lock, would hold every
 * query for as long (malloc's realloc may copy whatever the size, from its heap). The size
 * an array was made with says which kind it is. */
#define BIG_BYTES (256u * 1024u)

/* An array of `bytes`, zeroed; NULL: out of memory. */
static void *big_alloc(size_t bytes)
{
    if (bytes < BIG_BYTES)
        return calloc(1, bytes);
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void big_free(void *a, size_t bytes)
{
    if (a == NULL)
        return;
    if (bytes >= BIG_BYTES)
        munmap(a, bytes);
    else
        free(a);
}

/* a from `old` bytes to `bytes`, what fits of it kept, what is new not zeroed; NULL: out of
 * memory (a unchanged). */
static void *big_grow(void *a, size_t old, size_t bytes)
{
    if (bytes < BIG_BYTES && old < BIG_BYTES)
        return realloc(a, bytes);
    if (bytes >= BIG_BYTES && old >= BIG_BYTES) {
        void *p = mremap(a, old, bytes, MREMAP_MAYMOVE);
        return p == MAP_FAILED ? NULL : p;
    }
    void *p = bytes >= BIG_BYTES ? big_alloc(bytes) : malloc(bytes);
    if (p != NULL && old > 0) {
        memcpy(p, a, KVP_MIN(old, bytes));
        big_free(a, old);
    }
    return p;
}

/* ---- tables ---- */

static size_t table_bytes(const table_t *t)
{
    return ((size_t)t->mask + 1) * sizeof(*t->slots);
}

static bool table_init(table_t *t, uint32_t cap)
{
    t->slots = big_alloc(cap * sizeof(*t->slots));
    t->mask = cap - 1;
    t->count = 0;
    return t->slots != NULL;
}

/* Does t have room for `more` entries? Grown at 3/4 full: linear probing with a well-mixed
 * hash stays short there (about 2.5 slots for a hit, 8.5 for a miss), and a slot per entry is
 * 11-21 bytes, not 16-32. */
static bool table_fits(const table_t *t, uint32_t more)
{
    return ((uint64_t)t->count + more) * 4 <= ((uint64_t)t->mask + 1) * 3;
}

/* t's entries in a table of twice its slots (t is only read: a read lock will do); NULL
 * when out of memory or at the largest size. */
static uint64_t *table_doubled(const table_t *t)
{
    uint64_t cap = ((uint64_t)t->mask + 1) * 2;
    if (cap > (1ull << 32))
        return NULL;
    uint64_t *slots = big_alloc(cap * sizeof(*slots));
    if (slots == NULL)
        return NULL;
    uint32_t mask = (uint32_t)(cap - 1);
    for (uint64_t i = 0; i <= t->mask; i++) {
        uint64_t s = t->slots[i];
        if (s == 0)
            continue;
        uint32_t j = (uint32_t)(s >> 32) & mask;
        while (slots[j] != 0)
            j = (j + 1) & mask;
        slots[j] = s;
    }
    return slots;
}

/* The doubled slots in; the old ones returned (to be freed with their size: twice less than
 * t's now). */
static uint64_t *table_swap(table_t *t, uint64_t *slots)
{
    uint64_t *old = t->slots;
    t->slots = slots;
    t->mask = t->mask * 2 + 1;
    return old;
}

/* Room for one more; false: out of memory (the table is unchanged). A batch grows its tables
 * ahead, off the write lock (grow_ahead): this is the fallback, under it. */
static bool table_reserve(kvp_idx_t *idx, table_t *t)
{
    if (table_fits(t, 1))
        return true;
    uint64_t *slots = table_doubled(t);
    if (slots == NULL)
        return false;
    big_free(table_swap(t, slots), table_bytes(t) / 2);
    idx->grown_inside++;
    return true;
}

static void table_put(table_t *t, uint64_t h, uint32_t v)
{
    uint32_t tag = (uint32_t)(h >> 32), i = tag & t->mask;
    while (t->slots[i] != 0)
        i = (i + 1) & t->mask;
    t->slots[i] = ((uint64_t)tag << 32) | v;
    t->count++;
}

/* Remove the slot holding v (found by its hash h). */
static void table_del(table_t *t, uint64_t h, uint32_t v)
{
    uint32_t i = (uint32_t)(h >> 32) & t->mask;
    while ((uint32_t)t->slots[i] != v) {
        if (t->slots[i] == 0)
            return; /* not there: nothing to do */
        i = (i + 1) & t->mask;
    }
    for (uint32_t j = (i + 1) & t->mask; t->slots[j] != 0; j = (j + 1) & t->mask) {
        uint32_t k = (uint32_t)(t->slots[j] >> 32) & t->mask; /* its home */
        bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
        if (!stays) {
            t->slots[i] = t->slots[j];
            i = j;
        }
    }
    t->slots[i] = 0;
    t->count--;
}

/* The index of table t holding the entry that key (scope, v) names (0: none); is_it reads
 * an index's key. Inlined with its is_it: the probe of both tables. */
static inline uint32_t probe(const kvp_idx_t *idx, const table_t *t, uint32_t scope, uint64_t v,
                             bool (*is_it)(const kvp_idx_t *, uint32_t, uint32_t, uint64_t))
{
    uint64_t h = key_hash(idx, scope, v);
    uint32_t tag = (uint32_t)(h >> 32);
    for (uint32_t i = tag & t->mask;; i = (i + 1) & t->mask) {
        uint64_t s = t->slots[i];
        if (s == 0)
            return 0;
        if ((uint32_t)(s >> 32) == tag && is_it(idx, (uint32_t)s, scope, v))
            return (uint32_t)s;
    }
}

static bool node_is(const kvp_idx_t *idx, uint32_t i, uint32_t scope, uint64_t seq)
{
    return idx->nodes[i].seq == seq && NODE_SCOPE(&idx->nodes[i]) == scope;
}

static bool engine_is(const kvp_idx_t *idx, uint32_t i, uint32_t scope, uint64_t engine)
{
    return idx->nodes[i].engine == engine && NODE_SCOPE(&idx->nodes[i]) == scope;
}

static bool map_is(const kvp_idx_t *idx, uint32_t i, uint32_t scope, uint64_t engine)
{
    return idx->maps[i].engine == engine && idx->maps[i].scope == scope;
}

/* The node of (scope, seq), live or kept for its engine hash; 0: none. */
static uint32_t node_find(const kvp_idx_t *idx, uint32_t scope, uint64_t seq)
{
    return probe(idx, &idx->blocks, scope, seq, node_is);
}

/* The node an engine hash of scope is mapped to in the node itself; 0: none. */
static uint32_t engine_find(const kvp_idx_t *idx, uint32_t scope, uint64_t engine)
{
    return probe(idx, &idx->engines, scope, engine, engine_is);
}

static uint32_t map_find(const kvp_idx_t *idx, uint32_t scope, uint64_t engine)
{
    return probe(idx, &idx->map_table, scope, engine, map_is);
}

/* Prefetch the slot of (scope, v) in table t: a batch's blocks are looked up in order, and
 * asking for the slot of the block PREFETCH_AHEAD later hides most of the cache miss each
 * lookup otherwise waits for (the tables outgrow the caches). */
#define PREFETCH_AHEAD 8
static inline void prefetch_slot(const kvp_idx_t *idx, const table_t *t, uint32_t scope, uint64_t v)
{
    const uint64_t *slot = &t->slots[(uint32_t)(key_hash(idx, scope, v) >> 32) & t->mask];
#if defined(__x86_64__)
    /* (GCC 12 at -O2 drops __builtin_prefetch here as dead code) */
    __asm__ volatile("prefetcht0 %0" : : "m"(*slot));
#else
    __builtin_prefetch(slot);
#endif
}

/* The standard hash an engine hash stands for in scope: *std_p, true; false: none known.
 * The node it names is marked used (the write lock: only apply looks engine hashes up). */
static bool map_lookup(kvp_idx_t *idx, uint32_t scope, uint64_t engine, uint64_t *std_p)
{
    uint32_t i = engine_find(idx, scope, engine);
    if (i != 0) {
        idx->nodes[i].meta |= NODE_USED;
        *std_p = idx->nodes[i].seq;
        return true;
    }
    uint32_t m = idx->maps_live != 0 ? map_find(idx, scope, engine) : 0;
    if (m == 0)
        return false;
    idx->maps[m].used = 1;
    *std_p = idx->maps[m].std;
    return true;
}

/* ---- nodes ---- */

/* Node n's holders (NODE_N of them). */
static uint32_t *holders_of(const kvp_idx_t *idx, node_t *n)
{
    return NODE_N(n) <= 1 ? &n->h : idx->ext[n->h] + 1;
}

/* A holder array of room for cap (its first u32: cap): its index in idx->ext; UINT32_MAX:
 * out of memory. */
static uint32_t ext_new(kvp_idx_t *idx, uint32_t cap)
{
    uint32_t *a = malloc((cap + 1) * sizeof(*a));
    if (a == NULL)
        return UINT32_MAX;
    a[0] = cap;
    if (idx->n_ext_free > 0) {
        uint32_t id = idx->ext_free[--idx->n_ext_free];
        idx->ext[id] = a;
        return id;
    }
    if (idx->n_ext == idx->cap_ext) {
        uint32_t ncap = idx->cap_ext != 0 ? idx->cap_ext * 2 : 1024;
        uint32_t **e = ncap > idx->cap_ext ? realloc(idx->ext, ncap * sizeof(*e)) : NULL;
        uint32_t *f = e != NULL ? realloc(idx->ext_free, ncap * sizeof(*f)) : NULL;
        if (e != NULL)
            idx->ext = e;
        if (f == NULL) {
            free(a);
            return UINT32_MAX;
        }
        idx->ext_free = f;
        idx->cap_ext = ncap;
    }
    idx->ext[idx->n_ext] = a;
    return idx->n_ext++;
}

static void ext_release(kvp_idx_t *idx, uint32_t id)
{
    free(idx->ext[id]);
    idx->ext[id] = NULL;
    idx->ext_free[idx->n_ext_free++] = id;
}

/* ---- queries first ---- */

/* A query's CPU time is the indexer's latency; a batch's is only how far the index lags its
 * publisher. On a machine of few cores the thread applying batches takes CPU from the thread
 * answering a query even while it does not hold the lock, so at each point where it lets the
 * write lock go (and before it decodes a batch) it waits for the queries being answered: at
 * most YIELD_MAX_NS a wait, YIELD_CREDIT_NS of waits in a row, then 3/4 of its time, so that
 * a stream of queries (a hostile tenant's too) slows the batches and never stops them. */
#define YIELD_MAX_NS 2000000ll
#define YIELD_CREDIT_NS                                                                            \
    6000000ll /* waits in a row at most; then 3 ns of waiting per ns of work                       \
               */

void kvp_idx_query_begin(kvp_idx_t *idx)
{
    atomic_fetch_add(&idx->querying, 1);
}

void kvp_idx_query_end(kvp_idx_t *idx)
{
    if (atomic_fetch_sub(&idx->querying, 1) == 1 && atomic_load(&idx->yielding) != 0) {
        pthread_mutex_lock(&idx->q_mu);
        pthread_cond_broadcast(&idx->q_cond);
        pthread_mutex_unlock(&idx->q_mu);
    }
}

void kvp_idx_yield(kvp_idx_t *idx)
{
    if (atomic_load(&idx->querying) == 0)
        return;
    uint64_t now = kvp_now_ns();
    if (idx->yield_last_ns == 0)
        idx->yield_credit_ns = YIELD_CREDIT_NS;
    else /* 3 ns of waiting earned by each ns of work since the last wait */
        idx->yield_credit_ns = KVP_MIN(
            YIELD_CREDIT_NS, idx->yield_credit_ns + 3 * (int64_t)(now - idx->yield_last_ns));
    if (idx->yield_credit_ns <= 0) {
        idx->yield_last_ns = now;
        return;
    }
    int64_t max = KVP_MIN(YIELD_MAX_NS, idx->yield_credit_ns);
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_nsec += (long)max;
    dl.tv_sec += dl.tv_nsec / 1000000000L;
    dl.tv_nsec %= 1000000000L;
    atomic_fetch_add(&idx->yielding, 1); /* before querying is read again: (query_end) */
    pthread_mutex_lock(&idx->q_mu);
    while (atomic_load(&idx->querying) != 0 &&
           pthread_cond_timedwait(&idx->q_cond, &idx->q_mu, &dl) == 0)
        ;
    pthread_mutex_unlock(&idx->q_mu);
    atomic_fetch_sub(&idx->yielding, 1);
    idx->yield_last_ns = kvp_now_ns();
    uint64_t took = idx->yield_last_ns - now;
    idx->yield_credit_ns -= (int64_t)took; /* (below 0 past an overshoot: repaid by work) */
    atomic_fetch_add_explicit(&idx->yields, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&idx->yielded_ns, took, memory_order_relaxed);
}

/* ---- slices: a batch lets the write lock go between them ---- */

/* The index this thread applies a batch of in slices (kvp_idx_apply, kvp_idx_resync), or
 * purges unregistered registrations of in slices (kvp_idx_reap). Other writers never let the
 * lock go: they are not the thread that set it. The work since the lock was last let go is
 * idx->work (any writer's, under the write lock). */
static _Thread_local kvp_idx_t *slicing;

static void write_taken(kvp_idx_t *idx)
{
    idx->wgen++;
    idx->w_held = true;
    idx->w_since_ns = kvp_now_ns();
}

/* (under the write lock, just before it is let go) */
static void write_released(kvp_idx_t *idx)
{
    uint64_t held = kvp_now_ns() - idx->w_since_ns;
    idx->w_held = false;
    idx->w_hold_max_ns = KVP_MAX(idx->w_hold_max_ns, held);
    idx->w_holds_over_ms += held > 1000000;
}

/* Let the write lock go and take it again, giving the tables room for the next slice on the
 * way: a table doubled under the write lock would hold every query for as long as its copy
 * takes (20-100 ms at millions of blocks), so each one short of room for a slice's inserts is
 * copied under a read lock (queries go on meanwhile), then swapped in under the write lock
 * when no other writer came in between (idx->wgen); else the copy is dropped, and
 * table_reserve grows it under the lock if it must. */
static bool tables_short(const kvp_idx_t *idx)
{
    return !table_fits(&idx->blocks, 2 * SLICE_WORK) ||
           !table_fits(&idx->engines, 2 * SLICE_WORK) ||
           !table_fits(&idx->map_table, 2 * SLICE_WORK);
}

static void grow_ahead(kvp_idx_t *idx)
{
    table_t *tabs[] = {&idx->blocks, &idx->engines, &idx->map_table};
    uint64_t *grown[3] = {NULL, NULL, NULL};
    bool short_of_room = tables_short(idx);
    write_released(idx);
    pthread_rwlock_unlock(&idx->lock);
    kvp_idx_yield(idx);
    if (!short_of_room) {
        pthread_rwlock_wrlock(&idx->lock);
        write_taken(idx);
        return;
    }
    pthread_rwlock_rdlock(&idx->lock);
    uint64_t gen = idx->wgen;
    size_t bytes[3] = {0, 0, 0}; /* each table's size when copied */
    for (unsigned k = 0; k < 3; k++)
        if (!table_fits(tabs[k], 2 * SLICE_WORK) && (grown[k] = table_doubled(tabs[k])) != NULL)
            bytes[k] = table_bytes(tabs[k]);
    pthread_rwlock_unlock(&idx->lock);
    pthread_rwlock_wrlock(&idx->lock);
    bool same = idx->wgen == gen;
    write_taken(idx);
    /* what goes: the old slots swapped out, or the copies when another writer came in (the
     * tables may have changed, even grown, since) */
    size_t gone_bytes[3] = {0, 0, 0};
    for (unsigned k = 0; k < 3; k++) {
        if (grown[k] == NULL)
            continue;
        if (!same) {
            gone_bytes[k] = 2 * bytes[k];
            continue;
        }
        grown[k] = table_swap(tabs[k], grown[k]);
        gone_bytes[k] = bytes[k];
        idx->grown_aside++;
    }
    if (grown[0] == NULL && grown[1] == NULL && grown[2] == NULL)
        return;
    /* unmapped with the lock let go once more (tens of ms at hundreds of MiB) */
    write_released(idx);
    pthread_rwlock_unlock(&idx->lock);
    for (unsigned k = 0; k < 3; k++)
        big_free(grown[k], gone_bytes[k]);
    pthread_rwlock_wrlock(&idx->lock);
    write_taken(idx);
}

/* Past a slice's work, let the write lock go and take it again: the readers waiting get in
 * first (glibc hands a released write lock to the readers queued on it). true: it was let
 * go (the caller checks again what another writer may have changed meanwhile). */
static bool slice_point(kvp_idx_t *idx)
{
    bool queried = atomic_load_explicit(&idx->querying, memory_order_relaxed) != 0;
    if (idx->work < (queried ? SLICE_QUERIED : SLICE_WAITED) ||
        (idx->work < SLICE_WORK && !queried &&
         atomic_load_explicit(&idx->waiting, memory_order_relaxed) == 0))
        return false;
    idx->work = 0;
    if (slicing != idx)
        return false;
    idx->slices++;
    grow_ahead(idx);
    return true;
}

/* ---- tenants: each has a budget of nodes and a clock of its own ---- */

static bool tenants_grow(kvp_idx_t *idx)
{
    uint32_t cap = idx->cap_tenants * 2;
    if (idx->cap_tenants >= TENANTS_MAX + 1)
        return false;
    if (cap > TENANTS_MAX + 1)
        cap = TENANTS_MAX + 1;
    tenant_t *t = realloc(idx->tenants, cap * sizeof(*t));
    if (t == NULL)
        return false;
    memset(t + idx->cap_tenants, 0, (cap - idx->cap_tenants) * sizeof(*t));
    idx->tenants = t;
    idx->cap_tenants = cap;
    return true;
}

/* The tenant of scope's blocks, interned (a slot of a tenant with no node is taken again
 * only when all are in use); 0, the overflow slot, when none is left. While the scope has
 * nodes it is the one they joined the clock of, whatever slots have freed since. */
static uint32_t tenant_of(kvp_idx_t *idx, uint32_t scope)
{
    scope_t *sc = &idx->scopes[scope - 1];
    uint32_t t = sc->t, spare = 0;
    if (sc->nodes > 0 ||
        (t != 0 && t < idx->n_tenants && strcmp(idx->tenants[t].name, sc->tenant) == 0))
        return t;
    for (t = 1; t < idx->n_tenants; t++) {
        if (strcmp(idx->tenants[t].name, sc->tenant) == 0)
            return sc->t = t;
        if (spare == 0 && idx->tenants[t].nodes == 0)
            spare = t;
    }
    if (idx->n_tenants < idx->cap_tenants || tenants_grow(idx))
        t = idx->n_tenants++;
    else if ((t = spare) == 0)
        return sc->t = 0;
    tenant_t *tn = &idx->tenants[t];
    snprintf(tn->name, sizeof(tn->name), "%s", sc->tenant);
    tn->evicted = 0;
    return sc->t = t;
}

/* Node i joins tenant t's clock, just behind its hand (the last it reaches). */
static void tlist_add(kvp_idx_t *idx, uint32_t t, uint32_t i)
{
    tenant_t *tn = &idx->tenants[t];
    tlink_t *l = idx->links;
    if (tn->hand == 0) {
        l[i].prev = l[i].next = i;
        tn->hand = i;
        idx->active_tenants++;
    } else {
        uint32_t h = tn->hand, p = l[h].prev;
        l[i].prev = p;
        l[i].next = h;
        l[p].next = i;
        l[h].prev = i;
    }
    tn->nodes++;
}

static void tlist_del(kvp_idx_t *idx, uint32_t i)
{
    tenant_t *tn = &idx->tenants[idx->scopes[NODE_SCOPE(&idx->nodes[i]) - 1].t];
    tlink_t *l = idx->links;
    if (l[i].next == i) {
        tn->hand = 0;
        idx->active_tenants--;
    } else {
        l[l[i].prev].next = l[i].next;
        l[l[i].next].prev = l[i].prev;
        if (tn->hand == i)
            tn->hand = l[i].next;
    }
    tn->nodes--;
}

/* --max-blocks over the tenants holding nodes, t counted among them. */
static uint64_t fair_share(const kvp_idx_t *idx, uint32_t t)
{
    uint64_t n = idx->active_tenants + (idx->tenants[t].nodes == 0);
    uint64_t share = idx->max_blocks / (n != 0 ? n : 1);
    return share != 0 ? share : 1;
}

/* A tenant over share (the one found last time while it still is: the others are looked
 * at in turn); none: the one with most nodes. */
static uint32_t tenant_over(kvp_idx_t *idx, uint64_t share)
{
    uint32_t best = 0;
    for (uint32_t k = 0; k < idx->n_tenants; k++) {
        uint32_t t = (idx->tenant_cursor + k) % idx->n_tenants;
        if (idx->tenants[t].nodes > share) {
            idx->tenant_cursor = t;
            return t;
        }
        if (idx->tenants[t].nodes > idx->tenants[best].nodes)
            best = t;
    }
    return best;
}

/* ---- held lists: what a (registration, publisher) holds ---- */

/* Does node i have a holder of registration r's publisher slot p, on any medium? */
static bool node_holds(const kvp_idx_t *idx, uint32_t i, uint32_t r, uint32_t p)
{
    const node_t *n = &idx->nodes[i];
    const uint32_t *h = NODE_N(n) <= 1 ? &n->h : idx->ext[n->h] + 1;
    uint32_t want = (r << 4) | p;
    for (unsigned k = 0; k < NODE_N(n); k++)
        if ((h[k] >> 3) == want)
            return true;
    return false;
}

/* Keep the entries of hl that name a node (r, p) holds, each once (marked while kept). */
static void held_compact(kvp_idx_t *idx, held_t *hl, uint32_t r, uint32_t p)
{
    /* in slices, as a batch (a list of millions of entries is a walk of tens of ms). While
     * the lock is let go the HTTP threads may kill the registration (gen: the walk stops, its
     * list left for the reap) or drop a publisher that was just added (its own list, never
     * this one); queries do not read the mark. */
    uint32_t w = 0, k = 0, gen = idx->regs[r]->gen;
    for (; k < hl->n; k++) {
        uint32_t i = hl->ids[k];
        if (++idx->work >= SLICE_QUERIED && slice_point(idx) && idx->regs[r]->gen != gen)
            break;
        if ((idx->nodes[i].meta & NODE_MARK) || !node_holds(idx, i, r, p))
            continue;
        idx->nodes[i].meta |= NODE_MARK;
        hl->ids[w++] = i;
    }
    for (uint32_t j = 0; j < w; j++) { /* (the list is this thread's: it goes on whatever) */
        idx->nodes[hl->ids[j]].meta &= ~NODE_MARK;
        if (++idx->work >= SLICE_QUERIED)
            (void)slice_point(idx);
    }
    memmove(hl->ids + w, hl->ids + k, (size_t)(hl->n - k) * sizeof(*hl->ids)); /* not walked */
    hl->n = w + (hl->n - k);
}

/* Node i is one (r, p) holds now: into its list (compacted when full of entries that no
 * longer count, amortized O(1)). false: out of memory. */
static bool held_push(kvp_idx_t *idx, uint32_t r, uint32_t p, uint32_t i)
{
    if (idx->held[r] == NULL &&
        (idx->held[r] = calloc(KVP_IDX_PUBS_MAX, sizeof(*idx->held[r]))) == NULL)
        return false;
    held_t *hl = &idx->held[r][p];
    if (hl->n == hl->cap && (uint64_t)hl->n > 2 * idx->regs[r]->holders + 64)
        held_compact(idx, hl, r, p);
    if (hl->n == hl->cap) {
        uint64_t cap = hl->cap != 0 ? 2 * (uint64_t)hl->cap : 16;
        uint32_t *ids = cap < (1ull << 32)
                            ? big_grow(hl->ids, (size_t)hl->cap * sizeof(*ids), cap * sizeof(*ids))
                            : NULL;
        if (ids == NULL)
            return false;
        hl->ids = ids;
        hl->cap = (uint32_t)cap;
    }
    hl->ids[hl->n++] = i;
    return true;
}

/* Free node i (its holders already counted off): out of both tables. */
static void node_free(kvp_idx_t *idx, uint32_t i)
{
    node_t *n = &idx->nodes[i];
    uint32_t scope = NODE_SCOPE(n);
    tlist_del(idx, i);
    table_del(&idx->blocks, key_hash(idx, scope, n->seq), i);
    if (n->engine != n->seq)
        table_del(&idx->engines, key_hash(idx, scope, n->engine), i);
    if (NODE_N(n) > 1)
        ext_release(idx, n->h);
    if (NODE_N(n) > 0)
        idx->live_nodes--;
    memset(n, 0, sizeof(*n));
    n->h = idx->free_nodes;
    idx->free_nodes = i;
    idx->n_nodes--;
    idx->scopes[scope - 1].nodes--;
}

/* Drop node i, all its holders and its engine hash (eviction). */
static void node_drop(kvp_idx_t *idx, uint32_t i)
{
    node_t *n = &idx->nodes[i];
    uint32_t *h = holders_of(idx, n);
    unsigned nh = NODE_N(n);
    for (unsigned k = 0; k < nh; k++) {
        reg_t *r = idx->regs[HOLDER_REG(h[k])];
        if (r != NULL)
            r->holders--, r->by_medium[HOLDER_MEDIUM(h[k])]--;
    }
    idx->holders -= nh;
    if (nh > 0)
        idx->evicted++;
    if (n->engine != n->seq)
        idx->maps_evicted++;
    node_free(idx, i);
}

/* Evict one node of tenant t: the first its clock's hand finds not used since it last
 * passed (the hand clears the bit of those it passes that were), or the one it stands at
 * after CLOCK_STEPS_MAX used ones: about t's least recently stored block, or a removed block
 * kept for its engine hash (kept with the bit clear, so that it goes first). */
static void node_evict(kvp_idx_t *idx, uint32_t t)
{
    tenant_t *tn = &idx->tenants[t];
    for (uint32_t steps = 0; tn->hand != 0; steps++) {
        uint32_t i = tn->hand;
        node_t *n = &idx->nodes[i];
        idx->work++;
        tn->hand = idx->links[i].next;
        if ((n->meta & NODE_USED) && steps < CLOCK_STEPS_MAX) {
            n->meta &= ~NODE_USED;
            continue;
        }
        tn->evicted += NODE_N(n) > 0;
        node_drop(idx, i);
        return;
    }
}

/* Room for a node of tenant t: past its budget (--max-blocks-per-tenant, else its fair
 * share) its own go, two at most (a tenant over it after the share shrank comes down one a
 * store); past --max-blocks one of a tenant over its fair share goes, t's own when t is. */
static void make_room(kvp_idx_t *idx, uint32_t t)
{
    uint64_t share = fair_share(idx, t);
    uint64_t budget = idx->max_per_tenant != 0 ? idx->max_per_tenant : share;
    for (int k = 0; k < 2 && idx->tenants[t].nodes >= budget && idx->tenants[t].hand != 0; k++)
        node_evict(idx, t);
    while (idx->n_nodes >= idx->max_blocks && idx->n_nodes > 0) {
        bool own = idx->tenants[t].nodes >= share && idx->tenants[t].hand != 0;
        node_evict(idx, own ? t : tenant_over(idx, share));
    }
}

/* The node of (scope, seq), marked used, made when absent (one not used lately evicted past
 * --max-blocks); 0 when out of memory. */
static uint32_t node_get(kvp_idx_t *idx, uint32_t scope, uint64_t seq)
{
    uint32_t i = node_find(idx, scope, seq);
    if (i != 0) {
        idx->nodes[i].meta |= NODE_USED;
        return i;
    }
    uint32_t t = tenant_of(idx, scope);
    make_room(idx, t);
    if (!table_reserve(idx, &idx->blocks))
        return 0;
    if (idx->free_nodes != 0) {
        i = idx->free_nodes;
        idx->free_nodes = idx->nodes[i].h;
    } else {
        if (idx->n_nodes_used == idx->n_nodes_cap) {
            uint64_t cap = (uint64_t)idx->n_nodes_cap * 2;
            if (cap > NODES_MAX)
                return 0;
            size_t had = idx->n_nodes_cap;
            node_t *nodes = big_grow(idx->nodes, had * sizeof(*nodes), cap * sizeof(*nodes));
            if (nodes == NULL)
                return 0;
            idx->nodes = nodes;
            tlink_t *links = big_grow(idx->links, had * sizeof(*links), cap * sizeof(*links));
            if (links == NULL) { /* the nodes' array back to its size (a shrink: it holds) */
                nodes = big_grow(idx->nodes, cap * sizeof(*nodes), had * sizeof(*nodes));
                idx->nodes = nodes != NULL ? nodes : idx->nodes;
                return 0;
            }
            idx->links = links;
            idx->n_nodes_cap = (uint32_t)cap;
        }
        i = idx->n_nodes_used++;
    }
    node_t *n = &idx->nodes[i];
    n->seq = seq;
    n->engine = seq;
    n->meta = NODE_META(scope, 0) | NODE_USED;
    n->h = 0;
    table_put(&idx->blocks, key_hash(idx, scope, seq), i);
    tlist_add(idx, t, i);
    idx->scopes[scope - 1].nodes++;
    idx->n_nodes++;
    return i;
}

/* A node with no holder: kept while an engine hash names it, else freed. */
static void node_emptied(kvp_idx_t *idx, uint32_t i)
{
    node_t *n = &idx->nodes[i];
    if (n->engine == n->seq) {
        node_free(idx, i);
        return;
    }
    n->meta &= ~NODE_USED; /* the clock's next pass takes it */
}

static bool holder_add(kvp_idx_t *idx, uint32_t i, uint32_t holder)
{
    node_t *n = &idx->nodes[i];
    unsigned nh = NODE_N(n);
    uint32_t *h = holders_of(idx, n);
    bool had = false; /* its (registration, publisher) holds it on another medium already */
    for (unsigned k = 0; k < nh; k++) {
        if (h[k] == holder)
            return true;
        had |= (h[k] >> 3) == (holder >> 3);
    }
    if (!had && !held_push(idx, HOLDER_REG(holder), HOLDER_PUB(holder), i))
        return false;
    if (nh == 0) {
        n->h = holder;
        idx->live_nodes++;
    } else if (nh == 1) {
        uint32_t id = ext_new(idx, 4);
        if (id == UINT32_MAX)
            return false;
        idx->ext[id][1] = n->h;
        idx->ext[id][2] = holder;
        n->h = id;
    } else {
        uint32_t *a = idx->ext[n->h];
        if (nh == a[0]) {
            if (nh >= HOLDERS_MAX)
                return false;
            uint32_t *b = realloc(a, (2 * (size_t)nh + 1) * sizeof(*b));
            if (b == NULL)
                return false;
            b[0] = 2 * nh;
            idx->ext[n->h] = a = b;
        }
        a[1 + nh] = holder;
    }
    n->meta++;
    idx->holders++;
    idx->regs[HOLDER_REG(holder)]->holders++;
    idx->regs[HOLDER_REG(holder)]->by_medium[HOLDER_MEDIUM(holder)]++;
    return true;
}

/* Remove the holders of node i that match (reg, pub, and medium unless any_medium); with
 * none left the block is gone (node_emptied). */
static void holder_del(kvp_idx_t *idx, uint32_t i, uint32_t reg, uint32_t pub, bool any_pub,
                       uint32_t medium, bool any_medium)
{
    node_t *n = &idx->nodes[i];
    unsigned nh = NODE_N(n), was = nh;
    if (nh == 0)
        return;
    uint32_t *h = holders_of(idx, n);
    for (unsigned k = 0; k < nh;) {
        uint32_t x = h[k];
        if (HOLDER_REG(x) == reg && (any_pub || HOLDER_PUB(x) == pub) &&
            (any_medium || HOLDER_MEDIUM(x) == medium)) {
            h[k] = h[--nh];
            idx->holders--;
            idx->regs[reg]->holders--;
            idx->regs[reg]->by_medium[HOLDER_MEDIUM(x)]--;
            continue;
        }
        k++;
    }
    if (nh == was)
        return;
    if (was > 1 && nh <= 1) { /* back inline */
        uint32_t id = n->h;
        n->h = nh == 1 ? h[0] : 0;
        ext_release(idx, id);
    }
    n->meta = (n->meta & ~0xffffu) | nh;
    if (nh == 0) {
        idx->live_nodes--;
        node_emptied(idx, i);
    }
}

/* Remove the holders of (reg, pub) on medium (any_medium: on every one) from the nodes its
 * held list names: O(what it holds). Walked from the end: [c, n) are the entries done and
 * kept. A slicing thread lets the lock go between slices: when the registration went
 * meanwhile (its gen moved: an unregister purges it itself) the walk stops; what another
 * writer purged meanwhile is not walked again. */
static void purge_one(kvp_idx_t *idx, uint32_t reg, uint32_t gen, uint32_t pub, uint32_t medium,
                      bool any_medium)
{
    if (idx->held[reg] == NULL)
        return;
    held_t *hl = &idx->held[reg][pub];
    for (uint32_t c = hl->n; c > 0;) {
        uint32_t i = hl->ids[--c];
        holder_del(idx, i, reg, pub, false, medium, any_medium);
        if (any_medium || !node_holds(idx, i, reg, pub))
            hl->ids[c] = hl->ids[--hl->n];
        idx->purge_visits++;
        idx->work++;
        if (slice_point(idx)) {
            if (idx->regs[reg]->gen != gen)
                return; /* hl may be gone: the registration's own purge walks it */
            c = c > hl->n ? hl->n : c;
        }
    }
    if (hl->n == 0) {
        big_free(hl->ids, (size_t)hl->cap * sizeof(*hl->ids));
        hl->ids = NULL;
        hl->cap = 0;
    }
}

/* Remove the holders of registration reg matching (pub unless any_pub, medium unless
 * any_medium), as holder_del. O(what it holds). */
static void purge(kvp_idx_t *idx, uint32_t reg, uint32_t pub, bool any_pub, uint32_t medium,
                  bool any_medium)
{
    if (idx->regs[reg] == NULL)
        return;
    uint32_t gen = idx->regs[reg]->gen;
    for (uint32_t p = any_pub ? 0 : pub;
         p < (any_pub ? KVP_IDX_PUBS_MAX : pub + 1) && idx->regs[reg]->gen == gen; p++)
        purge_one(idx, reg, gen, p, medium, any_medium);
}

/* ---- create ---- */

/* The index's arrays and itself (NULL ones are fine). */
static void free_all(kvp_idx_t *idx)
{
    big_free(idx->blocks.slots, table_bytes(&idx->blocks));
    big_free(idx->engines.slots, table_bytes(&idx->engines));
    big_free(idx->map_table.slots, table_bytes(&idx->map_table));
    free(idx->ext);
    free(idx->ext_free);
    big_free(idx->nodes, (size_t)idx->n_nodes_cap * sizeof(*idx->nodes));
    big_free(idx->links, (size_t)idx->n_nodes_cap * sizeof(*idx->links));
    free(idx->tenants);
    free(idx->held);
    free(idx->snap);
    free(idx->maps);
    free(idx->scopes);
    free(idx->regs);
    free(idx->subs);
    free(idx->hbuf);
    free(idx->sbuf);
    free(idx->tbuf);
    free(idx);
}

kvp_status_t kvp_idx_create(const kvp_idx_params_t *p, kvp_idx_t **idx_p)
{
    kvp_idx_t *idx = calloc(1, sizeof(*idx));
    if (idx == NULL)
        return KVP_ERR_NOMEM;
    idx->seed = p->seed;
    idx->max_blocks = p->max_blocks != 0 ? p->max_blocks : NODES_MAX - 1;
    idx->tseed = kvp_random_u64();
    idx->ttl_ms = p->ttl_ms;
    idx->n_nodes_cap = 1024;
    idx->nodes = big_alloc(idx->n_nodes_cap * sizeof(*idx->nodes));
    idx->links = big_alloc(idx->n_nodes_cap * sizeof(*idx->links));
    idx->n_nodes_used = 1; /* node 0: none */
    idx->max_per_tenant = p->max_blocks_per_tenant;
    idx->cap_tenants = 16;
    idx->n_tenants = 1; /* tenant 0: the overflow slot */
    idx->tenants = calloc(idx->cap_tenants, sizeof(*idx->tenants));
    idx->held = calloc(KVP_IDX_REGS_MAX, sizeof(*idx->held));
    idx->n_maps_cap = 1024;
    idx->maps = calloc(idx->n_maps_cap, sizeof(*idx->maps));
    idx->n_maps_used = 1;
    idx->scopes = calloc(SCOPES_MAX, sizeof(*idx->scopes));
    idx->regs = calloc(KVP_IDX_REGS_MAX, sizeof(*idx->regs));
    idx->subs = calloc(SUBS_MAX, sizeof(*idx->subs));
    static const char *media[] = {"GPU", "CPU", "DISK"};
    for (unsigned m = 0; m < 3; m++)
        snprintf(idx->media[m], TYPE_MAX, "%s", media[m]);
    idx->n_media = 3;
    /* 65 536 slots (512 KiB, its pages touched as used): room for a batch's first slices
     * (grow_ahead keeps two slices' room from then on) */
    bool tables = table_init(&idx->blocks, TABLE_FIRST) && table_init(&idx->engines, TABLE_FIRST) &&
                  table_init(&idx->map_table, TABLE_FIRST);
    if (idx->nodes == NULL || idx->links == NULL || idx->tenants == NULL || idx->held == NULL ||
        idx->maps == NULL || idx->scopes == NULL || idx->regs == NULL || idx->subs == NULL ||
        !tables || pthread_rwlock_init(&idx->lock, NULL) != 0) {
        free_all(idx);
        return KVP_ERR_NOMEM;
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&idx->q_cond, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&idx->q_mu, NULL);
    *idx_p = idx;
    return KVP_OK;
}

void kvp_idx_destroy(kvp_idx_t *idx)
{
    if (idx == NULL)
        return;
    for (uint32_t i = 0; i < idx->n_ext; i++)
        free(idx->ext[i]);
    for (uint32_t r = 0; r < idx->n_regs; r++)
        free(idx->regs[r]);
    for (uint32_t r = 0; r < KVP_IDX_REGS_MAX; r++) {
        for (uint32_t p = 0; idx->held[r] != NULL && p < KVP_IDX_PUBS_MAX; p++)
            big_free(idx->held[r][p].ids, (size_t)idx->held[r][p].cap * sizeof(uint32_t));
        free(idx->held[r]);
    }
    for (uint32_t s = 0; s < idx->n_subs; s++)
        free(idx->subs[s].targets);
    pthread_rwlock_destroy(&idx->lock);
    pthread_cond_destroy(&idx->q_cond);
    pthread_mutex_destroy(&idx->q_mu);
    free_all(idx);
}

void kvp_idx_rdlock(kvp_idx_t *idx)
{
    if (pthread_rwlock_tryrdlock(&idx->lock) == 0)
        return;
    atomic_fetch_add_explicit(&idx->waiting, 1, memory_order_relaxed); /* (slice_point) */
    pthread_rwlock_rdlock(&idx->lock);
    atomic_fetch_sub_explicit(&idx->waiting, 1, memory_order_relaxed);
}

void kvp_idx_wrlock(kvp_idx_t *idx)
{
    if (pthread_rwlock_trywrlock(&idx->lock) != 0) {
        atomic_fetch_add_explicit(&idx->waiting, 1, memory_order_relaxed);
        pthread_rwlock_wrlock(&idx->lock);
        atomic_fetch_sub_explicit(&idx->waiting, 1, memory_order_relaxed);
    }
    write_taken(idx);
}

void kvp_idx_unlock(kvp_idx_t *idx)
{
    if (idx->w_held) /* (a reader never sees it set: no writer holds the lock with it) */
        write_released(idx);
    pthread_rwlock_unlock(&idx->lock);
}

/* ---- scopes, registrations, subscriptions ---- */

static uint32_t scope_find(const kvp_idx_t *idx, const char *tenant, const char *model,
                           const char *lora, uint32_t bs, const char *salt)
{
    for (uint32_t s = 0; s < idx->n_scopes; s++) {
        const scope_t *sc = &idx->scopes[s];
        if ((sc->refs != 0 || sc->nodes != 0) && sc->block_size == bs &&
            strcmp(sc->tenant, tenant) == 0 && strcmp(sc->model, model) == 0 &&
            strcmp(sc->lora, lora) == 0 && strcmp(sc->salt, salt) == 0)
            return s + 1;
    }
    return 0;
}

/* The scope of p's registration, referenced; 0: none left (*tenant_full: of p's tenant's
 * share). A slot is held while registrations or nodes name it: a tenant that registers
 * scopes and goes, leaving blocks kept for their engine hash, holds them until its clock
 * takes those, so one tenant holds at most SCOPES_TENANT_MAX of them. */
static uint32_t scope_get(kvp_idx_t *idx, const kvp_idx_reg_params_t *p, bool *tenant_full)
{
    uint32_t s = scope_find(idx, p->tenant, p->model, p->lora, p->block_size, p->salt);
    *tenant_full = false;
    if (s != 0) {
        idx->scopes[s - 1].refs++;
        return s;
    }
    uint32_t free_slot = idx->n_scopes, mine = 0;
    for (uint32_t k = 0; k < idx->n_scopes; k++) {
        const scope_t *sc = &idx->scopes[k];
        if (sc->refs == 0 && sc->nodes == 0) {
            free_slot = KVP_MIN(free_slot, k);
            continue;
        }
        mine += strcmp(sc->tenant, p->tenant) == 0;
    }
    if (mine >= SCOPES_TENANT_MAX)
        *tenant_full = true;
    if (free_slot == SCOPES_MAX || *tenant_full)
        return 0;
    scope_t *sc = &idx->scopes[free_slot];
    snprintf(sc->tenant, sizeof(sc->tenant), "%s", p->tenant);
    snprintf(sc->model, sizeof(sc->model), "%s", p->model);
    snprintf(sc->lora, sizeof(sc->lora), "%s", p->lora);
    snprintf(sc->salt, sizeof(sc->salt), "%s", p->salt);
    sc->block_size = p->block_size;
    sc->refs = 1;
    sc->t = 0;
    if (free_slot == idx->n_scopes)
        idx->n_scopes++;
    return free_slot + 1;
}

static const char *curve_of(const kvp_idx_reg_params_t *p)
{
    return p->curve_server_key != NULL ? p->curve_server_key : "";
}

/* A publisher's replay endpoint and CURVE key, when given and new: its sockets are made
 * again (gen). Only its own tenant's registrations reach here (sub_get). */
static void sub_update(kvp_idx_t *idx, sub_t *sb, const char *replay, const char *curve)
{
    bool changed = false;
    if (replay[0] != '\0' && strcmp(sb->replay, replay) != 0) {
        snprintf(sb->replay, sizeof(sb->replay), "%s", replay);
        changed = true;
    }
    if (curve[0] != '\0' && strcmp(sb->curve, curve) != 0) {
        snprintf(sb->curve, sizeof(sb->curve), "%s", curve);
        changed = true;
    }
    if (changed)
        sb->gen = ++idx->sub_gen;
}

/* The subscription of p's tenant to p's endpoint, made when it has none (a reference
 * taken). A subscription belongs to one tenant: another tenant naming the same endpoint
 * gets one of its own (its own sockets, replay endpoint and key), so that it can neither
 * change this one's nor have its events applied to this tenant's registrations.
 * UINT32_MAX: a cap reached (err, *reason_p say which). */
static uint32_t sub_get(kvp_idx_t *idx, const kvp_idx_reg_params_t *p, char *err, size_t err_len,
                        const char **reason_p)
{
    const char *endpoint = p->endpoint, *replay = p->replay_endpoint, *curve = curve_of(p);
    uint32_t free_slot = idx->n_subs, mine = 0;
    for (uint32_t s = 0; s < idx->n_subs; s++) {
        sub_t *sb = &idx->subs[s];
        if (!sb->live) {
            if (free_slot == idx->n_subs)
                free_slot = s;
            continue;
        }
        if (strcmp(sb->tenant, p->tenant) != 0)
            continue;
        mine++;
        if (strcmp(sb->endpoint, endpoint) == 0) {
            sub_update(idx, sb, replay, curve);
            sb->refs++;
            return s;
        }
    }
    if (idx->tenant_subs_max != 0 && mine >= idx->tenant_subs_max) {
        snprintf(err, err_len,
                 "tenant %.63s has %u publisher subscriptions already "
                 "(--max-subscriptions-per-tenant)",
                 p->tenant, mine);
        *reason_p = "tenant_subscriptions";
        return UINT32_MAX;
    }
    if (free_slot == SUBS_MAX) {
        snprintf(err, err_len, "%u publisher subscriptions already (all tenants)", SUBS_MAX);
        *reason_p = "subscriptions";
        return UINT32_MAX;
    }
    sub_t *sb = &idx->subs[free_slot];
    uint32_t *targets = sb->targets;
    uint32_t cap = sb->cap_targets;
    memset(sb, 0, sizeof(*sb));
    sb->targets = targets;
    sb->cap_targets = cap;
    sb->live = true;
    snprintf(sb->tenant, sizeof(sb->tenant), "%s", p->tenant);
    snprintf(sb->endpoint, sizeof(sb->endpoint), "%s", endpoint);
    snprintf(sb->replay, sizeof(sb->replay), "%s", replay);
    snprintf(sb->curve, sizeof(sb->curve), "%s", curve);
    sb->gen = ++idx->sub_gen;
    sb->refs = 1;
    sb->since_ms = kvp_now_ms();
    if (free_slot == idx->n_subs)
        idx->n_subs++;
    return free_slot;
}

static void sub_put(kvp_idx_t *idx, uint32_t s)
{
    sub_t *sb = &idx->subs[s];
    if (--sb->refs == 0) {
        sb->live = false;
        sb->n_targets = 0;
    }
}

/* Every subscription's registrations, made again (after a change of registrations). */
static void targets_rebuild(kvp_idx_t *idx)
{
    for (uint32_t s = 0; s < idx->n_subs; s++)
        idx->subs[s].n_targets = 0;
    for (uint32_t r = 0; r < idx->n_regs; r++) {
        reg_t *rg = idx->regs[r];
        if (rg == NULL || !rg->live)
            continue;
        for (uint32_t p = 0; p < rg->n_pubs; p++) {
            sub_t *sb = &idx->subs[rg->pubs[p].sub];
            if (strcmp(sb->tenant, idx->scopes[rg->scope - 1].tenant) != 0)
                continue; /* never: sub_get gives a registration its tenant's only */
            if (sb->n_targets == sb->cap_targets) {
                uint32_t cap = sb->cap_targets ? sb->cap_targets * 2 : 8;
                uint32_t *t = realloc(sb->targets, cap * sizeof(*t));
                if (t == NULL)
                    continue; /* out of memory: this publisher feeds it nothing */
                sb->targets = t;
                sb->cap_targets = cap;
            }
            sb->targets[sb->n_targets++] = (r << 4) | p;
        }
    }
}

static reg_t *reg_find(const kvp_idx_t *idx, const char *instance, const char *tenant,
                       uint32_t rank, uint32_t *id_p)
{
    for (uint32_t r = 0; r < idx->n_regs; r++) {
        reg_t *rg = idx->regs[r];
        if (rg != NULL && rg->live && rg->rank == rank && strcmp(rg->instance, instance) == 0 &&
            strcmp(idx->scopes[rg->scope - 1].tenant, tenant) == 0) {
            *id_p = r;
            return rg;
        }
    }
    return NULL;
}

/* Take registration r out (write lock): from now on no query, batch or name finds it (its
 * name is free), its subscriptions' references go; its blocks, its scope's reference, its
 * slot and its place in its tenant's cap stay until kvp_idx_reap has purged them. O(its
 * publishers + registrations), whatever it holds. */
static void reg_kill(kvp_idx_t *idx, uint32_t r)
{
    reg_t *rg = idx->regs[r];
    for (uint32_t p = 0; p < rg->n_pubs; p++)
        sub_put(idx, rg->pubs[p].sub);
    rg->live = false;
    rg->n_pubs = 0;
    rg->gen++;
    rg->dying = true;
    idx->n_dying++;
    uint32_t heir = UINT32_MAX; /* its instance's ids named it: they name another now */
    for (uint32_t o = 0; o < idx->n_regs; o++) {
        reg_t *og = idx->regs[o];
        if (og == NULL || !og->live || og->inst_id != r)
            continue;
        if (heir == UINT32_MAX)
            heir = o;
        og->inst_id = heir;
    }
}

void kvp_idx_reap(kvp_idx_t *idx)
{
    if (idx->n_dying == 0)
        return;
    kvp_idx_t *was = slicing;
    slicing = idx;
    idx->work = 0;
    for (uint32_t r = 0; r < idx->n_regs && idx->n_dying > 0; r++) {
        reg_t *rg = idx->regs[r];
        if (rg == NULL || !rg->dying)
            continue;
        purge(idx, r, 0, true, 0, true); /* lets the lock go between slices */
        idx->scopes[rg->scope - 1].refs--;
        rg->dying = false;
        idx->n_dying--;
    }
    slicing = was;
}

static bool is_pool(const char *type)
{
    return strcasecmp(type, "kvpool") == 0 || strcasecmp(type, "mooncake") == 0;
}

/* Registrations of tenant's, live or unregistered with blocks not yet purged (so that a
 * tenant unregistering in a loop holds at most its cap of slots and scopes). */
static uint32_t tenant_regs(const kvp_idx_t *idx, const char *tenant)
{
    uint32_t n = 0;
    for (uint32_t r = 0; r < idx->n_regs; r++) {
        const reg_t *rg = idx->regs[r];
        n += rg != NULL && (rg->live || rg->dying) &&
             strcmp(idx->scopes[rg->scope - 1].tenant, tenant) == 0;
    }
    return n;
}

void kvp_idx_set_tenant_caps(kvp_idx_t *idx, uint32_t regs, uint32_t subs)
{
    idx->tenant_regs_max = regs;
    idx->tenant_subs_max = subs;
}

/* A free registration slot into *r_p (one being purged is not): KVP_OK, or refused past the
 * limits (all tenants', the tenant's). */
static kvp_status_t reg_slot(kvp_idx_t *idx, const kvp_idx_reg_params_t *p, uint32_t *r_p,
                             char *err, size_t err_len, const char **reason_p)
{
    uint32_t r = 0;
    while (r < idx->n_regs && idx->regs[r] != NULL && (idx->regs[r]->live || idx->regs[r]->dying))
        r++;
    if (r == KVP_IDX_REGS_MAX) {
        snprintf(err, err_len, "%u registrations already (all tenants)", KVP_IDX_REGS_MAX);
        *reason_p = "registrations";
        return KVP_ERR_TOO_MANY;
    }
    uint32_t mine = tenant_regs(idx, p->tenant);
    if (idx->tenant_regs_max != 0 && mine >= idx->tenant_regs_max) {
        snprintf(err, err_len,
                 "tenant %.63s has %u registrations already, unregistered ones whose blocks "
                 "are still being dropped included (--max-registrations-per-tenant)",
                 p->tenant, mine);
        *reason_p = "tenant_registrations";
        return KVP_ERR_TOO_MANY;
    }
    if (idx->regs[r] == NULL && (idx->regs[r] = calloc(1, sizeof(reg_t))) == NULL)
        return KVP_ERR_NOMEM;
    if (r == idx->n_regs)
        idx->n_regs++;
    *r_p = r;
    return KVP_OK;
}

/* Register p (kvp_idx_register). A registration it replaces (another scope) is taken out,
 * its blocks left to kvp_idx_reap. */
static kvp_status_t reg_add(kvp_idx_t *idx, const kvp_idx_reg_params_t *p, bool *changed_p,
                            char *err, size_t err_len, const char **reason_p)
{
    *changed_p = false;
    uint32_t r;
    reg_t *rg = reg_find(idx, p->instance, p->tenant, p->dp_rank, &r);
    if (rg != NULL) {
        const scope_t *sc = &idx->scopes[rg->scope - 1];
        bool same_scope = sc->block_size == p->block_size && strcmp(sc->model, p->model) == 0 &&
                          strcmp(sc->lora, p->lora) == 0 && strcmp(sc->salt, p->salt) == 0;
        if (same_scope) {
            for (uint32_t k = 0; k < rg->n_pubs; k++) {
                sub_t *sb = &idx->subs[rg->pubs[k].sub];
                if (strcmp(sb->endpoint, p->endpoint) != 0)
                    continue;
                /* the same publisher again: its replay endpoint, key and type */
                uint64_t gen = sb->gen;
                sub_update(idx, sb, p->replay_endpoint, curve_of(p));
                *changed_p = sb->gen != gen;
                snprintf(rg->pubs[k].type, TYPE_MAX, "%s", p->type);
                rg->pubs[k].pool = is_pool(p->type);
                return KVP_OK;
            }
            if (rg->n_pubs == KVP_IDX_PUBS_MAX) {
                snprintf(err, err_len, "registration %s|%s|%u has %u publishers already",
                         p->instance, p->tenant, p->dp_rank, KVP_IDX_PUBS_MAX);
                *reason_p = "publishers";
                return KVP_ERR_TOO_MANY;
            }
            uint32_t s = sub_get(idx, p, err, err_len, reason_p);
            if (s == UINT32_MAX)
                return KVP_ERR_TOO_MANY;
            pub_t *pb = &rg->pubs[rg->n_pubs++];
            pb->sub = s;
            snprintf(pb->type, TYPE_MAX, "%s", p->type);
            pb->pool = is_pool(p->type);
            targets_rebuild(idx);
            *changed_p = true;
            return KVP_OK;
        }
        /* another scope: made anew, in another slot (the old one's blocks go after) */
        reg_kill(idx, r);
        targets_rebuild(idx);
        *changed_p = true;
    }
    kvp_status_t st = reg_slot(idx, p, &r, err, err_len, reason_p);
    if (st != KVP_OK)
        return st;
    rg = idx->regs[r];
    bool tenant_full;
    uint32_t scope = scope_get(idx, p, &tenant_full);
    if (scope == 0 && tenant_full) {
        snprintf(err, err_len,
                 "tenant %.63s has %u scopes (model, LoRA, block size, salt) already, those "
                 "kept by blocks it left included",
                 p->tenant, SCOPES_TENANT_MAX);
        *reason_p = "tenant_scopes";
        return KVP_ERR_TOO_MANY;
    }
    if (scope == 0) {
        snprintf(err, err_len, "%u scopes (tenant, model, LoRA, block size, salt) already",
                 SCOPES_MAX);
        *reason_p = "scopes";
        return KVP_ERR_TOO_MANY;
    }
    uint32_t s = sub_get(idx, p, err, err_len, reason_p);
    if (s == UINT32_MAX) {
        idx->scopes[scope - 1].refs--;
        return KVP_ERR_TOO_MANY;
    }
    uint32_t gen = rg->gen; /* kept: a purge of the slot's last registration checks it */
    memset(rg, 0, sizeof(*rg));
    rg->gen = gen + 1;
    rg->live = true;
    snprintf(rg->instance, sizeof(rg->instance), "%s", p->instance);
    rg->rank = p->dp_rank;
    rg->scope = scope;
    rg->inst_id = r;
    for (uint32_t o = 0; o < idx->n_regs; o++) { /* its instance's other ranks */
        const reg_t *og = idx->regs[o];
        if (o != r && og != NULL && og->live && og->scope == scope &&
            strcmp(og->instance, p->instance) == 0) {
            rg->inst_id = og->inst_id;
            break;
        }
    }
    rg->n_pubs = 1;
    rg->pubs[0].sub = s;
    snprintf(rg->pubs[0].type, TYPE_MAX, "%s", p->type);
    rg->pubs[0].pool = is_pool(p->type);
    targets_rebuild(idx);
    *changed_p = true;
    return KVP_OK;
}

kvp_status_t kvp_idx_register(kvp_idx_t *idx, const kvp_idx_reg_params_t *p, bool *changed_p,
                              char *err, size_t err_len)
{
    const char *reason = "field";
    kvp_status_t st = reg_add(idx, p, changed_p, err, err_len, &reason);
    if (st != KVP_OK && p->reason_p != NULL)
        *p->reason_p = reason;
    return st;
}

kvp_status_t kvp_idx_unregister(kvp_idx_t *idx, const char *instance, const char *tenant,
                                bool all_ranks, uint32_t rank,
                                void (*cb)(void *arg, const char *name), void *arg)
{
    bool any = false;
    for (uint32_t r = 0; r < idx->n_regs; r++) {
        reg_t *rg = idx->regs[r];
        if (rg == NULL || !rg->live || strcmp(rg->instance, instance) != 0 ||
            strcmp(idx->scopes[rg->scope - 1].tenant, tenant) != 0 ||
            (!all_ranks && rg->rank != rank))
            continue;
        char name[3 * KVP_IDX_NAME_MAX];
        snprintf(name, sizeof(name), "%s|%s|%u", rg->instance, tenant, rg->rank);
        reg_kill(idx, r);
        cb(arg, name);
        any = true;
    }
    if (!any)
        return KVP_ERR_NOT_FOUND;
    targets_rebuild(idx); /* gone from every answer from here; the blocks: kvp_idx_reap */
    return KVP_OK;
}

size_t kvp_idx_subs(kvp_idx_t *idx, kvp_idx_sub_info_t *out, size_t max)
{
    size_t n = 0;
    for (uint32_t s = 0; s < idx->n_subs; s++) {
        const sub_t *sb = &idx->subs[s];
        if (!sb->live)
            continue;
        if (n < max) {
            out[n].id = s;
            out[n].gen = sb->gen;
            memcpy(out[n].tenant, sb->tenant, sizeof(out[n].tenant));
            memcpy(out[n].endpoint, sb->endpoint, sizeof(out[n].endpoint));
            memcpy(out[n].replay, sb->replay, sizeof(out[n].replay));
            memcpy(out[n].curve, sb->curve, sizeof(out[n].curve));
            out[n].topic_replay = false;
            for (uint32_t t = 0; t < sb->n_targets; t++) {
                const pub_t *pb = &idx->regs[sb->targets[t] >> 4]->pubs[sb->targets[t] & 15u];
                out[n].topic_replay |= strcasecmp(pb->type, "kvpool") == 0;
            }
        }
        n++;
    }
    return n;
}

void kvp_idx_sub_open(kvp_idx_t *idx, uint32_t sub, uint64_t gen, bool ok)
{
    if (sub < idx->n_subs && idx->subs[sub].live && idx->subs[sub].gen == gen)
        idx->subs[sub].open_failed = !ok;
}

bool kvp_idx_sub_failed(kvp_idx_t *idx, const char *tenant, const char *endpoint)
{
    for (uint32_t s = 0; s < idx->n_subs; s++) {
        const sub_t *sb = &idx->subs[s];
        if (sb->live && strcmp(sb->tenant, tenant) == 0 && strcmp(sb->endpoint, endpoint) == 0)
            return sb->open_failed;
    }
    return false;
}

kvp_status_t kvp_idx_drop_publisher(kvp_idx_t *idx, const char *instance, const char *tenant,
                                    uint32_t rank, const char *endpoint)
{
    uint32_t r;
    reg_t *rg = reg_find(idx, instance, tenant, rank, &r);
    if (rg == NULL || rg->n_pubs == 0)
        return KVP_ERR_NOT_FOUND;
    uint32_t k = rg->n_pubs - 1; /* holders name publishers by slot: only the last can go */
    if (strcmp(idx->subs[rg->pubs[k].sub].endpoint, endpoint) != 0)
        return KVP_ERR_NOT_FOUND;
    if (rg->n_pubs == 1) {
        reg_kill(idx, r);
        targets_rebuild(idx);
        return KVP_OK;
    }
    purge(idx, r, k, false, 0, true);
    sub_put(idx, rg->pubs[k].sub);
    rg->n_pubs--;
    targets_rebuild(idx);
    return KVP_OK;
}

/* ---- events ---- */

/* The index of a medium name (NULL: GPU), interned; KVP_IDX_MEDIA_MAX: no room. */
static unsigned medium_of(kvp_idx_t *idx, const char *name, size_t len)
{
    if (name == NULL)
        return KVP_IDX_MEDIUM_GPU;
    char up[TYPE_MAX];
    if (len == 0 || len >= sizeof(up))
        return KVP_IDX_MEDIA_MAX;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)name[i];
        if (c < 0x21 || c > 0x7e || c == '"' || c == '\\')
            return KVP_IDX_MEDIA_MAX; /* printable, and safe in JSON and labels */
        up[i] = (char)toupper(c);
    }
    up[len] = '\0';
    for (unsigned m = 0; m < idx->n_media; m++)
        if (strcmp(idx->media[m], up) == 0)
            return m;
    if (idx->n_media == KVP_IDX_MEDIA_MAX)
        return KVP_IDX_MEDIA_MAX;
    memcpy(idx->media[idx->n_media], up, len + 1);
    return idx->n_media++;
}

static bool scratch(kvp_idx_t *idx, size_t nh, size_t nt)
{
    if (nh > idx->hcap) {
        uint64_t *h = realloc(idx->hbuf, nh * sizeof(*h));
        uint64_t *s = realloc(idx->sbuf, nh * sizeof(*s));
        if (h != NULL)
            idx->hbuf = h;
        if (s != NULL)
            idx->sbuf = s;
        if (h == NULL || s == NULL)
            return false;
        idx->hcap = nh;
    }
    if (nt > idx->tcap) {
        uint32_t *t = realloc(idx->tbuf, nt * sizeof(*t));
        if (t == NULL)
            return false;
        idx->tbuf = t;
        idx->tcap = nt;
    }
    return true;
}

/* The overflow maps: an engine hash of a block whose node names another engine hash already
 * (engines of two hashings stored it), at most --max-blocks of them. */

static void map_del(kvp_idx_t *idx, uint32_t m)
{
    map_t *mp = &idx->maps[m];
    table_del(&idx->map_table, key_hash(idx, mp->scope, mp->engine), m);
    mp->scope = 0;
    mp->used = idx->free_maps;
    idx->free_maps = m;
    idx->maps_live--;
}

/* Drop one map the clock finds unused since its hand last passed (at most two turns). */
static void map_evict(kvp_idx_t *idx)
{
    for (uint64_t steps = 0; steps < 2ull * idx->n_maps_used; steps++) {
        if (++idx->hand >= idx->n_maps_used)
            idx->hand = 1;
        map_t *m = &idx->maps[idx->hand];
        if (m->scope == 0)
            continue;
        if (m->used) {
            m->used = 0;
            continue;
        }
        map_del(idx, idx->hand);
        idx->maps_evicted++;
        return;
    }
}

/* Remember engine -> std (scope). */
static void map_add(kvp_idx_t *idx, uint32_t scope, uint64_t engine, uint64_t std)
{
    uint32_t m = map_find(idx, scope, engine);
    if (m != 0) {
        idx->maps[m].std = std;
        idx->maps[m].used = 1;
        return;
    }
    if (idx->maps_live >= idx->max_blocks)
        map_evict(idx);
    if (!table_reserve(idx, &idx->map_table))
        return;
    if (idx->free_maps != 0) {
        m = idx->free_maps;
        idx->free_maps = idx->maps[m].used;
    } else {
        if (idx->n_maps_used == idx->n_maps_cap) {
            uint64_t cap = (uint64_t)idx->n_maps_cap * 2;
            map_t *maps = cap < (1ull << 31) ? realloc(idx->maps, cap * sizeof(*maps)) : NULL;
            if (maps == NULL)
                return;
            idx->maps = maps;
            idx->n_maps_cap = (uint32_t)cap;
        }
        m = idx->n_maps_used++;
    }
    map_t *mp = &idx->maps[m];
    mp->engine = engine;
    mp->std = std;
    mp->scope = scope;
    mp->used = 1;
    table_put(&idx->map_table, key_hash(idx, scope, engine), m);
    idx->maps_live++;
}

/* Map engine hash `engine` of scope to node i's block: in the node when it has no engine
 * hash yet, else in the overflow maps. A map names one block: one that named another
 * until now (an engine's hash of other tokens) is moved. */
static void engine_set(kvp_idx_t *idx, uint32_t scope, uint32_t i, uint64_t engine)
{
    node_t *n = &idx->nodes[i];
    if (n->engine == engine)
        return;
    uint32_t k = engine_find(idx, scope, engine);
    if (k != 0) {
        node_t *o = &idx->nodes[k];
        table_del(&idx->engines, key_hash(idx, scope, engine), k);
        o->engine = o->seq;
        if (NODE_N(o) == 0)
            node_free(idx, k); /* kept only for that map */
    } else if (idx->maps_live != 0) {
        uint32_t m = map_find(idx, scope, engine);
        if (m != 0 && n->engine != n->seq) {
            idx->maps[m].std = n->seq;
            idx->maps[m].used = 1;
            return;
        }
        if (m != 0)
            map_del(idx, m); /* into the node, below */
    }
    if (n->engine != n->seq) {
        map_add(idx, scope, engine, n->seq);
        return;
    }
    if (!table_reserve(idx, &idx->engines))
        return;
    n->engine = engine;
    table_put(&idx->engines, key_hash(idx, scope, engine), i);
}

/* The standard hashes of a stored or removed op's blocks in scope (idx->sbuf; the raw
 * hashes in idx->hbuf); false when they cannot be placed (counted). */
static bool std_hashes(kvp_idx_t *idx, const kvp_idx_batch_t *b, const kvp_idx_op_t *op,
                       uint32_t scope, bool envelope)
{
    size_t n = op->n_hashes;
    const uint64_t *h = idx->hbuf;
    uint64_t *s = idx->sbuf;
    uint32_t bs = idx->scopes[scope - 1].block_size;
    if (op->kind == KVP_IDX_STORED && op->has_tokens && op->n_tokens > 0) {
        if (op->n_tokens != n * (size_t)bs) { /* not whole blocks of this scope's size */
            idx->unplaced += n;
            return false;
        }
        bool has_parent = false;
        uint64_t parent = 0;
        if (op->has_base && op->base == 0) {
            has_parent = false;
        } else if (op->has_parent) {
            has_parent = true;
            if (!map_lookup(idx, scope, op->parent, &parent)) {
                if (!envelope) { /* an engine's parent we never mapped */
                    idx->unplaced += n;
                    return false;
                }
                parent = op->parent; /* the contract's parent_hash: a standard hash */
            }
        } else if (envelope && op->has_base && op->base > 0) {
            idx->unplaced += n; /* a depth, but no parent to continue from */
            return false;
        }
        b->tokens(b->arg, op, idx->tbuf);
        kvp_idx_hash_tokens(idx->seed, idx->tbuf, n, bs, has_parent, parent, s);
        return true;
    }
    for (size_t i = 0; i < n; i++) {
        if (i + PREFETCH_AHEAD < n)
            prefetch_slot(idx, &idx->engines, scope, h[i + PREFETCH_AHEAD]);
        if (!map_lookup(idx, scope, h[i], &s[i]))
            s[i] = h[i];
    }
    return true;
}

/* Should target (r, p) of subscription sub take a batch of DP rank `rank`? */
static bool rank_takes(const kvp_idx_t *idx, const sub_t *sb, const reg_t *rg, const pub_t *pb,
                       bool has_rank, uint32_t rank)
{
    if (!has_rank || pb->pool || rg->rank == rank)
        return true;
    /* an engine's batch of another rank: not for this registration when the same publisher
     * is registered under that rank for the instance */
    for (uint32_t t = 0; t < sb->n_targets; t++) {
        const reg_t *o = idx->regs[sb->targets[t] >> 4];
        if (o->rank == rank && strcmp(o->instance, rg->instance) == 0 && o->scope == rg->scope)
            return false;
    }
    return true;
}

/* A batch applied in slices (or a resync): what it checks when it has the lock again. */
typedef struct apply_ctx {
    uint32_t sub, n_snap; /* its targets as it started: idx->snap[0..n_snap) */
    uint64_t slices;      /* idx->slices when it last looked */
    bool gone;            /* its subscription went while the lock was let go */
    char tenant[KVP_IDX_NAME_MAX], endpoint[KVP_IDX_ENDPOINT_MAX];
} apply_ctx_t;

/* Start applying to subscription sub's registrations (write lock): its targets kept (those a
 * registration added meanwhile miss the rest of the batch: never a block it no longer holds),
 * this thread set slicing. false: no such subscription. */
static bool apply_begin(kvp_idx_t *idx, uint32_t sub, apply_ctx_t *a)
{
    if (sub >= idx->n_subs || !idx->subs[sub].live)
        return false;
    const sub_t *sb = &idx->subs[sub];
    if (sb->n_targets > idx->cap_snap) {
        uint32_t *snap = realloc(idx->snap, sb->n_targets * sizeof(*snap));
        if (snap == NULL)
            return false;
        idx->snap = snap;
        idx->cap_snap = sb->n_targets;
    }
    if (sb->n_targets > 0)
        memcpy(idx->snap, sb->targets, sb->n_targets * sizeof(*idx->snap));
    a->sub = sub;
    a->n_snap = sb->n_targets;
    a->slices = idx->slices;
    a->gone = false;
    memcpy(a->tenant, sb->tenant, sizeof(a->tenant));
    memcpy(a->endpoint, sb->endpoint, sizeof(a->endpoint));
    slicing = idx;
    idx->work = 0;
    return true;
}

/* After the lock was let go (idx->slices moved): is the subscription still the publisher it
 * was (live, of the same tenant and endpoint)? a->gone when not. */
static bool apply_resumed(const kvp_idx_t *idx, apply_ctx_t *a)
{
    if (a->slices == idx->slices)
        return true;
    a->slices = idx->slices;
    const sub_t *sb = &idx->subs[a->sub];
    a->gone =
        !sb->live || strcmp(sb->tenant, a->tenant) != 0 || strcmp(sb->endpoint, a->endpoint) != 0;
    return !a->gone;
}

/* Does target (r, p) still name subscription sub (in scope, unless 0)? */
static bool target_same(const kvp_idx_t *idx, uint32_t sub, uint32_t r, uint32_t p, uint32_t scope)
{
    const reg_t *rg = r < idx->n_regs ? idx->regs[r] : NULL;
    return rg != NULL && rg->live && p < rg->n_pubs && rg->pubs[p].sub == sub &&
           (scope == 0 || rg->scope == scope);
}

/* op's blocks (standard hashes in idx->sbuf, raw in idx->hbuf) stored or removed for target
 * (r, p) on medium m, letting the lock go between slices. */
static void apply_blocks(kvp_idx_t *idx, apply_ctx_t *a, const kvp_idx_op_t *op, uint32_t r,
                         uint32_t p, unsigned m)
{
    uint32_t scope = idx->regs[r]->scope;
    for (size_t i = 0; i < op->n_hashes; i++) {
        if (++idx->work >= SLICE_QUERIED && slice_point(idx) &&
            (!apply_resumed(idx, a) || !target_same(idx, a->sub, r, p, scope)))
            return;
        uint64_t seq = idx->sbuf[i];
        if (i + PREFETCH_AHEAD < op->n_hashes) {
            size_t f = i + PREFETCH_AHEAD;
            prefetch_slot(idx, &idx->blocks, scope, idx->sbuf[f]);
            if (op->kind == KVP_IDX_STORED && idx->hbuf[f] != idx->sbuf[f])
                prefetch_slot(idx, &idx->engines, scope, idx->hbuf[f]);
        }
        if (op->kind == KVP_IDX_STORED) {
            uint32_t nd = node_get(idx, scope, seq);
            if (nd == 0 || !holder_add(idx, nd, HOLDER(r, p, m))) {
                idx->unplaced++;
                continue;
            }
            if (idx->hbuf[i] != seq)
                engine_set(idx, scope, nd, idx->hbuf[i]);
        } else {
            uint32_t nd = node_find(idx, scope, seq);
            if (nd != 0)
                holder_del(idx, nd, r, p, false, m, false);
        }
    }
}

/* One op of a batch, to each of the batch's targets it is for. */
static void apply_op(kvp_idx_t *idx, apply_ctx_t *a, const kvp_idx_batch_t *b,
                     const kvp_idx_op_t *op)
{
    unsigned m = medium_of(idx, op->medium, op->medium_len);
    if (op->kind == KVP_IDX_STORED)
        idx->stored_ev++;
    else if (op->kind == KVP_IDX_REMOVED)
        idx->removed_ev++;
    else
        idx->cleared_ev++;
    if (m == KVP_IDX_MEDIA_MAX && !(op->kind == KVP_IDX_CLEARED && op->all_media)) {
        idx->media_dropped++;
        return;
    }
    if (op->kind != KVP_IDX_CLEARED) {
        if (!scratch(idx, op->n_hashes, op->has_tokens ? op->n_tokens : 0)) {
            idx->unplaced += op->n_hashes;
            return;
        }
        b->hashes(b->arg, op, idx->hbuf);
    }
    bool has_rank = op->has_rank || b->has_rank;
    uint32_t rank = op->has_rank ? op->rank : b->rank;
    uint32_t done_scope = 0; /* the scope idx->sbuf holds the hashes of */
    for (uint32_t t = 0; t < a->n_snap; t++) {
        if (!apply_resumed(idx, a))
            return;
        uint32_t r = idx->snap[t] >> 4, p = idx->snap[t] & 15u;
        if (!target_same(idx, a->sub, r, p, 0))
            continue;
        const reg_t *rg = idx->regs[r];
        const scope_t *sc = &idx->scopes[rg->scope - 1];
        if (op->tenant != NULL && (strlen(sc->tenant) != op->tenant_len ||
                                   memcmp(sc->tenant, op->tenant, op->tenant_len) != 0))
            continue;
        if (!rank_takes(idx, &idx->subs[a->sub], rg, &rg->pubs[p], has_rank, rank))
            continue;
        if (op->kind == KVP_IDX_CLEARED) {
            purge(idx, r, p, false, m, op->all_media);
            continue;
        }
        if (done_scope != rg->scope) {
            if (!std_hashes(idx, b, op, rg->scope, op->envelope)) {
                done_scope = 0;
                continue;
            }
            done_scope = rg->scope;
        }
        apply_blocks(idx, a, op, r, p, m);
    }
}

void kvp_idx_apply(kvp_idx_t *idx, uint32_t sub, const kvp_idx_batch_t *b)
{
    apply_ctx_t a;
    if (!apply_begin(idx, sub, &a))
        return;
    for (size_t k = 0; k < b->n_ops && !a.gone; k++) {
        idx->work++;
        slice_point(idx);
        if (apply_resumed(idx, &a))
            apply_op(idx, &a, b, &b->ops[k]);
    }
    if (tables_short(idx))
        grow_ahead(idx); /* the next batch starts with room for a slice */
    slicing = NULL;
}

void kvp_idx_resync(kvp_idx_t *idx, uint32_t sub, const char *reason)
{
    apply_ctx_t a;
    if (!apply_begin(idx, sub, &a))
        return;
    for (uint32_t t = 0; t < a.n_snap && apply_resumed(idx, &a); t++) {
        uint32_t r = idx->snap[t] >> 4, p = idx->snap[t] & 15u;
        if (target_same(idx, sub, r, p, 0))
            purge(idx, r, p, false, 0, true);
    }
    slicing = NULL;
    sub_t *sb = &idx->subs[sub];
    if (!a.gone)
        sb->resyncs++;
    if (strcmp(reason, "gap") == 0)
        idx->resync_gap++;
    else if (strcmp(reason, "restart") == 0)
        idx->resync_restart++;
    else
        idx->resync_malformed++;
    KVP_LOG_WARN("publisher %s: resynchronized (%s): its blocks were dropped", a.endpoint, reason);
}

void kvp_idx_sub_seen(kvp_idx_t *idx, uint32_t sub, uint64_t seq, bool connected)
{
    if (sub >= idx->n_subs || !idx->subs[sub].live)
        return;
    sub_t *sb = &idx->subs[sub];
    sb->last_seq = seq;
    sb->has_seq = true;
    sb->last_ms = kvp_now_ms();
    sb->connected = connected;
}

void kvp_idx_count_batch(kvp_idx_t *idx, bool replayed)
{
    atomic_fetch_add_explicit(replayed ? &idx->replayed : &idx->batches, 1, memory_order_relaxed);
}

void kvp_idx_count_query(kvp_idx_t *idx, bool by_hash)
{
    atomic_fetch_add_explicit(by_hash ? &idx->q_hashes : &idx->q_tokens, 1, memory_order_relaxed);
}

void kvp_idx_count_refused(kvp_idx_t *idx, const char *reason)
{
    _Atomic uint64_t *c = strcmp(reason, "json") == 0              ? &idx->refused_json
                          : strcmp(reason, "body") == 0            ? &idx->refused_body
                          : strcmp(reason, "method") == 0          ? &idx->refused_method
                          : strcmp(reason, "path") == 0            ? &idx->refused_path
                          : strcmp(reason, "peer") == 0            ? &idx->refused_peer
                          : strcmp(reason, "unauthenticated") == 0 ? &idx->refused_unauth
                          : strcmp(reason, "role") == 0            ? &idx->refused_role
                          : strcmp(reason, "tenant") == 0          ? &idx->refused_tenant
                                                                   : &idx->refused_field;
    atomic_fetch_add_explicit(c, 1, memory_order_relaxed);
}

/* ---- queries ---- */

/* A JSON string (quotes included) through put. */
static void put_json_str(void (*put)(void *, const char *, size_t), void *arg, const char *s)
{
    char buf[2 * KVP_IDX_NAME_MAX + 8];
    size_t n = 0;
    buf[n++] = '"';
    for (; *s != '\0' && n < sizeof(buf) - 8; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            buf[n++] = '\\';
            buf[n++] = (char)c;
        } else if (c < 0x20) {
            n += (size_t)snprintf(buf + n, sizeof(buf) - n, "\\u%04x", c);
        } else {
            buf[n++] = (char)c;
        }
    }
    buf[n++] = '"';
    put(arg, buf, n);
}

#define PUTF(...)                                                                                  \
    do {                                                                                           \
        char b_[256];                                                                              \
        int n_ = snprintf(b_, sizeof(b_), __VA_ARGS__);                                            \
        put(arg, b_, (size_t)KVP_MIN(n_, (int)sizeof(b_) - 1));                                    \
    } while (0)

/* A candidate registration of a query and its runs. */
typedef struct qreg {
    uint32_t reg, inst; /* its instance: an index into the query's instances */
    uint32_t stamp;     /* the block its mask is of (+1) */
    uint8_t mask;       /* media holding that block */
    bool dp_alive, tier_alive;
    uint8_t tier; /* the walk's current tier: 0 GPU, 1 CPU, 2 DISK */
    uint64_t dp, tiers[3];
} qreg_t;

typedef struct qinst {
    uint32_t first; /* its first qreg */
    uint32_t stamp;
    uint8_t mask, alive_media;
    bool any_alive;
    uint64_t any, media[KVP_IDX_MEDIA_MAX];
} qinst_t;

/* A query's arrays, per HTTP thread, grown to the registrations and kept (a query allocates
 * nothing once its thread has answered one as large): slot and islot all zero between
 * queries. */
typedef struct qscratch {
    qreg_t *qr;
    qinst_t *qi;
    uint32_t *slot;  /* reg id -> qreg index + 1 */
    uint32_t *islot; /* inst_id -> qinst index + 1 */
    uint32_t *alive; /* the qregs, then the qinsts, with a run still going */
    size_t cap;
} qscratch_t;

static pthread_key_t qscratch_key;
static pthread_once_t qscratch_once = PTHREAD_ONCE_INIT;

static void qscratch_free(void *arg)
{
    qscratch_t *x = arg;
    free(x->qr);
    free(x->qi);
    free(x->slot);
    free(x->islot);
    free(x->alive);
    free(x);
}

static void qscratch_key_make(void)
{
    if (pthread_key_create(&qscratch_key, qscratch_free) != 0)
        abort(); /* only out of keys: at start, and never */
}

/* The calling thread's scratch with room for n registrations; NULL: out of memory. */
static qscratch_t *qscratch_get(size_t n)
{
    pthread_once(&qscratch_once, qscratch_key_make);
    qscratch_t *x = pthread_getspecific(qscratch_key);
    if (x == NULL) {
        if ((x = calloc(1, sizeof(*x))) == NULL || pthread_setspecific(qscratch_key, x) != 0) {
            free(x);
            return NULL;
        }
    }
    if (x->cap >= n)
        return x;
    size_t cap = n < 64 ? 64 : n + n / 2;
    qreg_t *qr = realloc(x->qr, cap * sizeof(*qr));
    if (qr != NULL)
        x->qr = qr;
    qinst_t *qi = realloc(x->qi, cap * sizeof(*qi));
    if (qi != NULL)
        x->qi = qi;
    uint32_t *alive = realloc(x->alive, 2 * cap * sizeof(*alive));
    if (alive != NULL)
        x->alive = alive;
    uint32_t *slot = calloc(cap, sizeof(*slot)), *islot = calloc(cap, sizeof(*islot));
    if (qr == NULL || qi == NULL || alive == NULL || slot == NULL || islot == NULL) {
        free(slot);
        free(islot);
        return NULL;
    }
    free(x->slot);
    free(x->islot);
    x->slot = slot;
    x->islot = islot;
    x->cap = cap;
    return x;
}

/* A query's answer, in Conductor's form, from its walk: per instance (qi[0..ni)) its
 * longest run and per medium, and per registration (qr[0..nq)) its DP and tier runs. */
static void query_answer(const kvp_idx_t *idx, const kvp_idx_query_t *q, const qreg_t *qr,
                         uint32_t nq, const qinst_t *qi, uint32_t ni,
                         void (*put)(void *arg, const char *s, size_t len), void *arg)
{
    uint64_t bs = q->block_size;
    put(arg, "{", 1);
    put_json_str(put, arg, q->tenant);
    put(arg, ":{", 2);
    for (uint32_t i = 0; i < ni; i++) {
        const qinst_t *x = &qi[i];
        if (i > 0)
            put(arg, ",", 1);
        put_json_str(put, arg, idx->regs[qr[x->first].reg]->instance);
        PUTF(":{\"longest_matched\":%" PRIu64, x->any * bs);
        uint8_t held = 0; /* the media the instance holds any block on */
        for (uint32_t k = x->first; k < nq; k++)
            for (unsigned m = 0; qr[k].inst == i && m < idx->n_media; m++)
                held |= (uint8_t)(idx->regs[qr[k].reg]->by_medium[m] > 0) << m;
        for (unsigned m = 0; m < idx->n_media; m++) {
            if (m >= 3 && !(held & (1u << m))) /* beyond the three: named when it holds any */
                continue;
            PUTF(",\"%s\":%" PRIu64, idx->media[m], x->media[m] * bs);
        }
        put(arg, ",\"DP\":{", 7);
        bool first = true;
        for (uint32_t k = x->first; k < nq; k++) {
            if (qr[k].inst != i)
                continue;
            PUTF("%s\"%u\":%" PRIu64, first ? "" : ",", idx->regs[qr[k].reg]->rank, qr[k].dp * bs);
            first = false;
        }
        put(arg, "},\"rank_matches\":{", 18);
        first = true;
        for (uint32_t k = x->first; k < nq; k++) {
            if (qr[k].inst != i)
                continue;
            const qreg_t *y = &qr[k];
            uint64_t g = y->tiers[0] * bs, c = g + y->tiers[1] * bs, d = c + y->tiers[2] * bs;
            PUTF("%s\"%u\":{\"gpu\":%" PRIu64 ",\"cpu\":%" PRIu64 ",\"disk\":%" PRIu64 "}",
                 first ? "" : ",", idx->regs[y->reg]->rank, g, c, d);
            first = false;
        }
        put(arg, "}}", 2);
    }
    put(arg, "}}", 2);
}

kvp_status_t kvp_idx_query(kvp_idx_t *idx, const kvp_idx_query_t *q,
                           void (*put)(void *arg, const char *s, size_t len), void *arg)
{
    uint32_t scope = scope_find(idx, q->tenant, q->model, q->lora, q->block_size, q->salt);
    uint32_t nq = 0, ni = 0;
    qreg_t *qr = NULL;
    qinst_t *qi = NULL;
    uint32_t *slot = NULL, *islot = NULL, *alive = NULL;
    if (scope != 0) {
        qscratch_t *x = qscratch_get((size_t)idx->n_regs + 1);
        if (x == NULL)
            return KVP_ERR_NOMEM;
        qr = x->qr;
        qi = x->qi;
        slot = x->slot;
        islot = x->islot;
        alive = x->alive;
        for (uint32_t r = 0; r < idx->n_regs; r++) {
            const reg_t *rg = idx->regs[r];
            if (rg == NULL || !rg->live || rg->scope != scope ||
                (q->instance != NULL && strcmp(rg->instance, q->instance) != 0))
                continue;
            uint32_t i = islot[rg->inst_id];
            if (i == 0) {
                qi[ni] = (qinst_t){.first = nq,
                                   .any_alive = true,
                                   .alive_media = (uint8_t)((1u << idx->n_media) - 1)};
                i = islot[rg->inst_id] = ++ni;
            }
            qr[nq] = (qreg_t){.reg = r, .inst = i - 1, .dp_alive = true, .tier_alive = true};
            slot[r] = ++nq;
        }
        for (uint32_t k = 0; k < nq; k++) /* all zero again (slot: after the walk) */
            islot[idx->regs[qr[k].reg]->inst_id] = 0;
    }
    /* walk the blocks: each folds its holders into the masks of their registrations and
     * instances (stamped with the block), then only the runs still going are advanced, so
     * a block costs its holders and the candidates still matching, not every candidate */
    uint32_t *ar = alive, *ai = alive + nq, n_ar = nq, n_ai = ni;
    for (uint32_t k = 0; k < nq; k++)
        ar[k] = k;
    for (uint32_t k = 0; k < ni; k++)
        ai[k] = k;
    for (size_t b = 0; b < q->n && b < PREFETCH_AHEAD; b++)
        prefetch_slot(idx, &idx->blocks, scope, q->hashes[b]);
    for (size_t b = 0; b < q->n && (n_ar > 0 || n_ai > 0); b++) {
        if (b + PREFETCH_AHEAD < q->n) /* (the slots' misses overlap: the hashes are known) */
            prefetch_slot(idx, &idx->blocks, scope, q->hashes[b + PREFETCH_AHEAD]);
        uint32_t nd = node_find(idx, scope, q->hashes[b]);
        if (nd == 0 || NODE_N(&idx->nodes[nd]) == 0)
            break;
        uint32_t stamp = (uint32_t)b + 1;
        node_t *n = &idx->nodes[nd];
        uint32_t *h = holders_of(idx, n);
        unsigned nh = NODE_N(n);
        for (unsigned k = 0; k < nh; k++) {
            uint32_t r = HOLDER_REG(h[k]);
            if (r >= idx->n_regs || slot[r] == 0)
                continue;
            qreg_t *x = &qr[slot[r] - 1];
            qinst_t *y = &qi[x->inst];
            uint8_t bit = (uint8_t)(1u << HOLDER_MEDIUM(h[k]));
            if (x->stamp != stamp)
                x->stamp = stamp, x->mask = 0;
            if (y->stamp != stamp)
                y->stamp = stamp, y->mask = 0;
            x->mask |= bit;
            y->mask |= bit;
        }
        for (uint32_t a = 0; a < n_ar;) {
            qreg_t *x = &qr[ar[a]];
            uint8_t mask = x->stamp == stamp ? x->mask : 0;
            if (x->dp_alive && mask != 0)
                x->dp++;
            else
                x->dp_alive = false;
            if (x->tier_alive) {
                uint8_t t = x->tier;
                while (t < 3 && !(mask & (1u << t)))
                    t++;
                if (t < 3) {
                    x->tier = t;
                    x->tiers[t]++;
                } else {
                    x->tier_alive = false;
                }
            }
            if (x->dp_alive || x->tier_alive)
                a++;
            else
                ar[a] = ar[--n_ar];
        }
        for (uint32_t a = 0; a < n_ai;) {
            qinst_t *x = &qi[ai[a]];
            uint8_t mask = x->stamp == stamp ? x->mask : 0;
            if (x->any_alive && mask != 0)
                x->any++;
            else
                x->any_alive = false;
            x->alive_media &= mask;
            for (uint8_t m = x->alive_media; m != 0; m &= (uint8_t)(m - 1))
                x->media[__builtin_ctz(m)]++;
            if (x->any_alive || x->alive_media != 0)
                a++;
            else
                ai[a] = ai[--n_ai];
        }
    }
    query_answer(idx, q, qr, nq, qi, ni, put, arg);
    for (uint32_t k = 0; k < nq; k++)
        slot[qr[k].reg] = 0;
    return KVP_OK;
}

/* ---- views ---- */

/* Has sub's publisher been silent past --instance-ttl? */
static bool stale(const kvp_idx_t *idx, const sub_t *sb, uint64_t now)
{
    uint64_t last = sb->last_ms != 0 ? sb->last_ms : sb->since_ms;
    return idx->ttl_ms != 0 && now - last > idx->ttl_ms;
}

void kvp_idx_registrations_json(kvp_idx_t *idx, void (*put)(void *arg, const char *s, size_t len),
                                void *arg)
{
    put(arg, "{\"kvevent_instance\":{", 21);
    unsigned k = 0;
    for (uint32_t r = 0; r < idx->n_regs; r++) {
        const reg_t *rg = idx->regs[r];
        if (rg == NULL || !rg->live)
            continue;
        const scope_t *sc = &idx->scopes[rg->scope - 1];
        for (uint32_t p = 0; p < rg->n_pubs; p++) {
            const sub_t *sb = &idx->subs[rg->pubs[p].sub];
            unsigned name = k++;
            PUTF("%s\"%u\":{\"endpoint\":", name > 0 ? ",\n" : "\n", name);
            put_json_str(put, arg, sb->endpoint);
            put(arg, ",\"replay_endpoint\":", 19);
            put_json_str(put, arg, sb->replay);
            put(arg, ",\"type\":", 8);
            put_json_str(put, arg, rg->pubs[p].type);
            put(arg, ",\"modelname\":", 13);
            put_json_str(put, arg, sc->model);
            put(arg, ",\"lora_name\":", 13);
            put_json_str(put, arg, sc->lora);
            put(arg, ",\"tenant_id\":", 13);
            put_json_str(put, arg, sc->tenant);
            put(arg, ",\"instance_id\":", 15);
            put_json_str(put, arg, rg->instance);
            PUTF(",\"block_size\":%u,\"dp_rank\":%u,\"additionalsalt\":", sc->block_size, rg->rank);
            put_json_str(put, arg, sc->salt);
            if (sb->curve[0] != '\0') {
                put(arg, ",\"curve_server_key\":", 20);
                put_json_str(put, arg, sb->curve);
            }
            put(arg, "}", 1);
        }
    }
    put(arg, "\n}}\n", 4);
}

void kvp_idx_instances_json(kvp_idx_t *idx, const char *tenant,
                            void (*put)(void *arg, const char *s, size_t len), void *arg)
{
    kvp_idx_rdlock(idx);
    uint64_t now = kvp_now_ms();
    put(arg, "{\"instances\":[", 14);
    bool first = true;
    for (uint32_t r = 0; r < idx->n_regs; r++) {
        const reg_t *rg = idx->regs[r];
        if (rg == NULL || !rg->live)
            continue;
        const scope_t *sc = &idx->scopes[rg->scope - 1];
        if (tenant != NULL && strcmp(sc->tenant, tenant) != 0)
            continue;
        put(arg, first ? "{\"instance_id\":" : ",{\"instance_id\":", first ? 15 : 16);
        first = false;
        put_json_str(put, arg, rg->instance);
        put(arg, ",\"tenant_id\":", 13);
        put_json_str(put, arg, sc->tenant);
        PUTF(",\"dp_rank\":%u,\"block_size\":%u,\"modelname\":", rg->rank, sc->block_size);
        put_json_str(put, arg, sc->model);
        put(arg, ",\"lora_name\":", 13);
        put_json_str(put, arg, sc->lora);
        put(arg, ",\"additionalsalt\":", 18);
        put_json_str(put, arg, sc->salt);
        PUTF(",\"blocks\":%" PRIu64 ",\"publishers\":[", rg->holders);
        for (uint32_t p = 0; p < rg->n_pubs; p++) {
            const sub_t *sb = &idx->subs[rg->pubs[p].sub];
            put(arg, p == 0 ? "{\"endpoint\":" : ",{\"endpoint\":", p == 0 ? 12 : 13);
            put_json_str(put, arg, sb->endpoint);
            put(arg, ",\"replay_endpoint\":", 19);
            put_json_str(put, arg, sb->replay);
            put(arg, ",\"type\":", 8);
            put_json_str(put, arg, rg->pubs[p].type);
            if (sb->has_seq)
                PUTF(",\"seq\":%" PRIu64, sb->last_seq);
            else
                put(arg, ",\"seq\":null", 11);
            PUTF(",\"connected\":%s,\"stale\":%s,\"resyncs\":%" PRIu64 "}",
                 sb->connected ? "true" : "false", stale(idx, sb, now) ? "true" : "false",
                 sb->resyncs);
        }
        put(arg, "]}", 2);
    }
    put(arg, "]}", 2);
    kvp_idx_unlock(idx);
}

/* A Prometheus label value (quotes included): names hold no control characters. */
static void put_label(void (*put)(void *, const char *, size_t), void *arg, const char *s)
{
    char buf[2 * KVP_IDX_NAME_MAX + 4];
    size_t n = 0;
    buf[n++] = '"';
    for (; *s != '\0' && n < sizeof(buf) - 4; s++) {
        if (*s == '"' || *s == '\\')
            buf[n++] = '\\';
        buf[n++] = *s;
    }
    buf[n++] = '"';
    put(arg, buf, n);
}

void kvp_idx_metrics_tenants(kvp_idx_t *idx, void (*put)(void *arg, const char *s, size_t len),
                             void *arg)
{
    kvp_idx_rdlock(idx);
    PUTF("# HELP kvpool_indexer_tenant_blocks Blocks indexed for a tenant (removed ones kept "
         "for their engine hash included).\n# TYPE kvpool_indexer_tenant_blocks gauge\n");
    for (uint32_t t = 0; t < idx->n_tenants; t++) {
        if (idx->tenants[t].nodes == 0)
            continue;
        put(arg, "kvpool_indexer_tenant_blocks{tenant=", 36);
        put_label(put, arg, t == 0 ? "(overflow)" : idx->tenants[t].name);
        PUTF("} %" PRIu64 "\n", idx->tenants[t].nodes);
    }
    PUTF("# HELP kvpool_indexer_tenant_evicted_blocks_total Blocks of a tenant evicted: past "
         "its budget, or past --max-blocks while it held more than its fair share.\n"
         "# TYPE kvpool_indexer_tenant_evicted_blocks_total counter\n");
    for (uint32_t t = 0; t < idx->n_tenants; t++) {
        if (idx->tenants[t].evicted == 0)
            continue;
        put(arg, "kvpool_indexer_tenant_evicted_blocks_total{tenant=", 50);
        put_label(put, arg, t == 0 ? "(overflow)" : idx->tenants[t].name);
        PUTF("} %" PRIu64 "\n", idx->tenants[t].evicted);
    }
    kvp_idx_unlock(idx);
}

/* The budgets' metrics that name no tenant: the budget, the purges' work, the slices batches
 * and purges were made in, the registrations still being purged (read lock). */
static void metrics_budgets(kvp_idx_t *idx, void (*put)(void *arg, const char *s, size_t len),
                            void *arg)
{
    uint64_t n = idx->active_tenants > 0 ? idx->active_tenants : 1;
    PUTF("# HELP kvpool_indexer_tenant_block_budget Blocks one tenant keeps at most "
         "(--max-blocks-per-tenant, or --max-blocks over the tenants holding blocks).\n"
         "# TYPE kvpool_indexer_tenant_block_budget gauge\n"
         "kvpool_indexer_tenant_block_budget %" PRIu64 "\n",
         idx->max_per_tenant != 0 ? idx->max_per_tenant : idx->max_blocks / n);
    PUTF("# HELP kvpool_indexer_purge_visits_total Held-list entries that clears, resyncs and "
         "unregisters looked at.\n# TYPE kvpool_indexer_purge_visits_total counter\n"
         "kvpool_indexer_purge_visits_total %" PRIu64 "\n",
         idx->purge_visits);
    PUTF("# HELP kvpool_indexer_write_slices_total Times a batch, or the purge of unregistered "
         "blocks, let the write lock go for the queries waiting.\n"
         "# TYPE kvpool_indexer_write_slices_total counter\n"
         "kvpool_indexer_write_slices_total %" PRIu64 "\n",
         idx->slices);
    PUTF("# HELP kvpool_indexer_table_grows_total Hash tables doubled: aside (copied under the "
         "read lock, queries going on) or under the write lock (the fallback).\n"
         "# TYPE kvpool_indexer_table_grows_total counter\n");
    PUTF("kvpool_indexer_table_grows_total{where=\"aside\"} %" PRIu64 "\n"
         "kvpool_indexer_table_grows_total{where=\"write_lock\"} %" PRIu64 "\n",
         idx->grown_aside, idx->grown_inside);
    PUTF("# HELP kvpool_indexer_write_hold_max_seconds The longest the write lock was held at "
         "once: a query waits for one such hold at a time.\n"
         "# TYPE kvpool_indexer_write_hold_max_seconds gauge\n"
         "kvpool_indexer_write_hold_max_seconds %.6f\n",
         (double)idx->w_hold_max_ns / 1e9);
    PUTF("# HELP kvpool_indexer_write_holds_over_1ms_total Times the write lock was held for "
         "more than a millisecond at once.\n"
         "# TYPE kvpool_indexer_write_holds_over_1ms_total counter\n"
         "kvpool_indexer_write_holds_over_1ms_total %" PRIu64 "\n",
         idx->w_holds_over_ms);
    PUTF("# HELP kvpool_indexer_query_yields_total Times the thread applying batches waited "
         "for the queries being answered (queries first).\n"
         "# TYPE kvpool_indexer_query_yields_total counter\n"
         "kvpool_indexer_query_yields_total %" PRIu64 "\n",
         (uint64_t)atomic_load(&idx->yields));
    PUTF("# HELP kvpool_indexer_query_yield_seconds_total What those waits took.\n"
         "# TYPE kvpool_indexer_query_yield_seconds_total counter\n"
         "kvpool_indexer_query_yield_seconds_total %.6f\n",
         (double)atomic_load(&idx->yielded_ns) / 1e9);
    PUTF("# HELP kvpool_indexer_registrations_unregistering Registrations unregistered whose "
         "blocks are still being purged.\n"
         "# TYPE kvpool_indexer_registrations_unregistering gauge\n"
         "kvpool_indexer_registrations_unregistering %u\n",
         idx->n_dying);
}

void kvp_idx_metrics(kvp_idx_t *idx, void (*put)(void *arg, const char *s, size_t len), void *arg)
{
    kvp_idx_rdlock(idx);
    uint32_t regs = 0, subs = 0, stales = 0;
    uint64_t now = kvp_now_ms();
    for (uint32_t r = 0; r < idx->n_regs; r++)
        regs += idx->regs[r] != NULL && idx->regs[r]->live;
    for (uint32_t s = 0; s < idx->n_subs; s++) {
        subs += idx->subs[s].live;
        stales += idx->subs[s].live && stale(idx, &idx->subs[s], now);
    }
    PUTF("# HELP kvpool_indexer_blocks Blocks indexed.\n# TYPE kvpool_indexer_blocks gauge\n"
         "kvpool_indexer_blocks %u\n",
         idx->live_nodes);
    PUTF("# HELP kvpool_indexer_block_holders (block, registration, publisher, medium) "
         "entries.\n# TYPE kvpool_indexer_block_holders gauge\nkvpool_indexer_block_holders "
         "%" PRIu64 "\n",
         idx->holders);
    PUTF("# HELP kvpool_indexer_engine_hashes Engine hashes mapped to standard ones.\n"
         "# TYPE kvpool_indexer_engine_hashes gauge\nkvpool_indexer_engine_hashes %" PRIu64 "\n",
         (uint64_t)idx->engines.count + idx->maps_live);
    PUTF("# HELP kvpool_indexer_engine_hashes_evicted_total Engine hash maps dropped past "
         "--max-blocks (least recently used).\n"
         "# TYPE kvpool_indexer_engine_hashes_evicted_total counter\n"
         "kvpool_indexer_engine_hashes_evicted_total %" PRIu64 "\n",
         idx->maps_evicted);
    PUTF("# HELP kvpool_indexer_registrations Registrations.\n"
         "# TYPE kvpool_indexer_registrations gauge\nkvpool_indexer_registrations %u\n",
         regs);
    PUTF("# HELP kvpool_indexer_subscriptions Publisher endpoints subscribed to.\n"
         "# TYPE kvpool_indexer_subscriptions gauge\nkvpool_indexer_subscriptions %u\n",
         subs);
    PUTF("# HELP kvpool_indexer_stale_publishers Publishers silent past --instance-ttl.\n"
         "# TYPE kvpool_indexer_stale_publishers gauge\nkvpool_indexer_stale_publishers %u\n",
         stales);
    PUTF("# HELP kvpool_indexer_batches_total Event batches applied.\n"
         "# TYPE kvpool_indexer_batches_total counter\nkvpool_indexer_batches_total %" PRIu64 "\n",
         atomic_load(&idx->batches));
    PUTF("# HELP kvpool_indexer_replayed_batches_total Batches applied from a replay.\n"
         "# TYPE kvpool_indexer_replayed_batches_total counter\n"
         "kvpool_indexer_replayed_batches_total %" PRIu64 "\n",
         atomic_load(&idx->replayed));
    PUTF("# HELP kvpool_indexer_events_total Events applied, by type.\n"
         "# TYPE kvpool_indexer_events_total counter\n");
    PUTF("kvpool_indexer_events_total{type=\"stored\"} %" PRIu64 "\n", idx->stored_ev);
    PUTF("kvpool_indexer_events_total{type=\"removed\"} %" PRIu64 "\n", idx->removed_ev);
    PUTF("kvpool_indexer_events_total{type=\"cleared\"} %" PRIu64 "\n", idx->cleared_ev);
    PUTF("# HELP kvpool_indexer_resyncs_total Publishers whose blocks were dropped, by reason.\n"
         "# TYPE kvpool_indexer_resyncs_total counter\n");
    PUTF("kvpool_indexer_resyncs_total{reason=\"gap\"} %" PRIu64 "\n", idx->resync_gap);
    PUTF("kvpool_indexer_resyncs_total{reason=\"restart\"} %" PRIu64 "\n", idx->resync_restart);
    PUTF("kvpool_indexer_resyncs_total{reason=\"malformed\"} %" PRIu64 "\n", idx->resync_malformed);
    PUTF("# HELP kvpool_indexer_unplaced_blocks_total Stored blocks that could not be placed "
         "(an unknown parent, token ids of another block size).\n"
         "# TYPE kvpool_indexer_unplaced_blocks_total counter\n"
         "kvpool_indexer_unplaced_blocks_total %" PRIu64 "\n",
         idx->unplaced);
    PUTF("# HELP kvpool_indexer_media_dropped_total Events naming a medium past the %u kept.\n"
         "# TYPE kvpool_indexer_media_dropped_total counter\n"
         "kvpool_indexer_media_dropped_total %" PRIu64 "\n",
         KVP_IDX_MEDIA_MAX, idx->media_dropped);
    PUTF("# HELP kvpool_indexer_evicted_blocks_total Blocks dropped past --max-blocks.\n"
         "# TYPE kvpool_indexer_evicted_blocks_total counter\n"
         "kvpool_indexer_evicted_blocks_total %" PRIu64 "\n",
         idx->evicted);
    PUTF("# HELP kvpool_indexer_queries_total Queries answered, by kind.\n"
         "# TYPE kvpool_indexer_queries_total counter\n");
    PUTF("kvpool_indexer_queries_total{kind=\"tokens\"} %" PRIu64 "\n",
         atomic_load(&idx->q_tokens));
    PUTF("kvpool_indexer_queries_total{kind=\"hashes\"} %" PRIu64 "\n",
         atomic_load(&idx->q_hashes));
    PUTF("# HELP kvpool_indexer_http_refused_total HTTP requests refused, by reason.\n"
         "# TYPE kvpool_indexer_http_refused_total counter\n");
    static const char *reasons[] = {"json", "field",           "body", "method", "path",
                                    "peer", "unauthenticated", "role", "tenant"};
    _Atomic uint64_t *counts[] = {&idx->refused_json,   &idx->refused_field, &idx->refused_body,
                                  &idx->refused_method, &idx->refused_path,  &idx->refused_peer,
                                  &idx->refused_unauth, &idx->refused_role,  &idx->refused_tenant};
    for (size_t i = 0; i < KVP_ARRAY_SIZE(reasons); i++)
        PUTF("kvpool_indexer_http_refused_total{reason=\"%s\"} %" PRIu64 "\n", reasons[i],
             atomic_load(counts[i]));
    metrics_budgets(idx, put, arg);
    kvp_idx_unlock(idx);
}
