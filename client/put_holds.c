/*
 * put_holds.c - the client's holds (put_holds.h): room placed ahead by the master.
 *
 * Design: holds of up to HOLD_CLASSES sizes, each size a ring in arrival order (the oldest
 * first out: they reach their time first). A take looks at every key's size first and takes
 * only when each has one, so a batch is all held or all two-round-trip. What is dropped
 * here is not given back to the master: it frees a hold at its put timeout or when the
 * connection closes, so what a client drops is held at most that long.
 *
 * Cost: a take is O(keys + holds expired); the lock is held for copies only.
 */
#include "client/put_holds.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/grant.h"
#include "common/macros.h"

#define HOLD_CLASSES 4
#define HOLD_GONE_MAX 1024

typedef struct hold_class {
    uint64_t size; /* 0: unused */
    kvp_hold_t *ring;
    size_t cap, head, n;
} hold_class_t;

struct kvp_holds {
    pthread_mutex_t lock;
    uint32_t max_holds;
    uint64_t max_bytes;
    bool off;
    uint64_t fp, gen; /* what the holds kept were placed for, and their connection */
    hold_class_t cls[HOLD_CLASSES];
    size_t n;       /* holds kept, all classes */
    uint64_t bytes; /* their room */
    uint64_t taken, dropped;
    /* holds of connection gen dropped unwritten, to give back with the next commit (more:
     * freed at the master's put timeout) */
    uint64_t gone[HOLD_GONE_MAX];
    size_t n_gone;
};

static kvp_hold_t *at(hold_class_t *c, size_t i);

/* ---- grant sets: one reference per hold value that names one ---- */

static void hold_ref(const kvp_hold_t *x)
{
    for (uint32_t q = 0; q < x->n_replicas; q++)
        if (x->reps[q].set != NULL)
            atomic_fetch_add_explicit(&x->reps[q].set->refs, 1, memory_order_relaxed);
}

static void set_unref(kvp_hold_set_t *set)
{
    if (set != NULL && atomic_fetch_sub_explicit(&set->refs, 1, memory_order_acq_rel) == 1)
        free(set);
}

static void hold_unref(kvp_hold_t *x)
{
    for (uint32_t q = 0; q < x->n_replicas; q++) {
        set_unref(x->reps[q].set);
        x->reps[q].set = NULL;
    }
}

void kvp_holds_release(kvp_hold_t *hs, size_t n)
{
    for (size_t i = 0; hs != NULL && i < n; i++)
        hold_unref(&hs[i]);
}

kvp_holds_t *kvp_holds_create(uint32_t max_holds, uint64_t max_bytes)
{
    kvp_holds_t *h = calloc(1, sizeof(*h));
    if (h == NULL)
        return NULL;
    pthread_mutex_init(&h->lock, NULL);
    h->max_holds = max_holds;
    h->max_bytes = max_bytes;
    h->off = max_holds == 0;
    return h;
}

void kvp_holds_destroy(kvp_holds_t *h)
{
    if (h == NULL)
        return;
    for (size_t c = 0; c < HOLD_CLASSES; c++) {
        for (size_t i = 0; i < h->cls[c].n; i++)
            hold_unref(at(&h->cls[c], i));
        free(h->cls[c].ring);
    }
    pthread_mutex_destroy(&h->lock);
    free(h);
}

bool kvp_holds_on(kvp_holds_t *h)
{
    pthread_mutex_lock(&h->lock);
    bool on = !h->off;
    pthread_mutex_unlock(&h->lock);
    return on;
}

void kvp_holds_off(kvp_holds_t *h)
{
    pthread_mutex_lock(&h->lock);
    h->off = true;
    pthread_mutex_unlock(&h->lock);
}

static kvp_hold_t *at(hold_class_t *c, size_t i)
{
    return &c->ring[(c->head + i) % c->cap];
}

/* Hold id dropped unwritten: given back with the next commit, while there is room. */
static void note_gone(kvp_holds_t *h, uint64_t id)
{
    h->dropped++;
    if (h->n_gone < HOLD_GONE_MAX)
        h->gone[h->n_gone++] = id;
}

/* c emptied; give: its holds are given back (else their connection is gone with them). */
static void class_clear(kvp_holds_t *h, hold_class_t *c, bool give)
{
    for (size_t i = 0; i < c->n; i++) {
        if (give)
            note_gone(h, at(c, i)->id);
        hold_unref(at(c, i));
    }
    if (!give)
        h->dropped += c->n;
    h->n -= c->n;
    h->bytes -= c->n * c->size;
    c->n = 0;
    c->head = 0;
    c->size = 0;
}

/* Everything dropped when the holds asked for are for another placement or connection. */
static void bind_locked(kvp_holds_t *h, uint64_t fp, uint64_t gen)
{
    if (h->fp == fp && h->gen == gen)
        return;
    if (h->gen != gen)
        h->n_gone = 0; /* (the master freed those with their connection) */
    for (size_t c = 0; c < HOLD_CLASSES; c++)
        class_clear(h, &h->cls[c], h->gen == gen);
    h->fp = fp;
    h->gen = gen;
}

static hold_class_t *class_of(kvp_holds_t *h, uint64_t size)
{
    for (size_t c = 0; c < HOLD_CLASSES; c++)
        if (h->cls[c].size == size && size != 0)
            return &h->cls[c];
    return NULL;
}

/* The class for size, made (a class of no holds taken over, else the one of fewest
 * dropped) when there is none. */
static hold_class_t *class_make(kvp_holds_t *h, uint64_t size)
{
    hold_class_t *c = class_of(h, size), *few = NULL;
    if (c != NULL)
        return c;
    for (size_t k = 0; k < HOLD_CLASSES; k++)
        if (few == NULL || h->cls[k].n < few->n)
            few = &h->cls[k];
    class_clear(h, few, true);
    few->size = size;
    return few;
}

/* Room for one more in c; false: no memory. */
static bool class_room(hold_class_t *c)
{
    if (c->n < c->cap)
        return true;
    size_t cap = c->cap ? c->cap * 2 : 64;
    kvp_hold_t *r = malloc(cap * sizeof(*r));
    if (r == NULL)
        return false;
    for (size_t i = 0; i < c->n; i++)
        r[i] = *at(c, i);
    free(c->ring);
    c->ring = r;
    c->cap = cap;
    c->head = 0;
    return true;
}

static void push_locked(kvp_holds_t *h, const kvp_hold_t *hold)
{
    hold_class_t *c = class_make(h, hold->size);
    if (h->n >= h->max_holds || h->bytes + hold->size > h->max_bytes || !class_room(c)) {
        note_gone(h, hold->id);
        return;
    }
    hold_ref(hold); /* (the caller's copy keeps its own) */
    *at(c, c->n++) = *hold;
    h->n++;
    h->bytes += hold->size;
}

/* The oldest holds of c past their time, dropped. */
static void expire(kvp_holds_t *h, hold_class_t *c, uint64_t now)
{
    while (c->n > 0 && at(c, 0)->usable_until_ms <= now) {
        note_gone(h, at(c, 0)->id);
        hold_unref(at(c, 0));
        c->head = (c->head + 1) % c->cap;
        c->n--;
        h->n--;
        h->bytes -= c->size;
    }
}

bool kvp_holds_take(kvp_holds_t *h, uint64_t fp, uint64_t gen, const uint64_t *szs, size_t m,
                    kvp_hold_t *out)
{
    if (m == 0)
        return false;
    uint64_t now = kvp_now_ms();
    pthread_mutex_lock(&h->lock);
    bind_locked(h, fp, gen);
    size_t need[HOLD_CLASSES] = {0};
    bool ok = !h->off && m <= h->n;
    for (size_t j = 0; ok && j < m; j++) {
        hold_class_t *c = class_of(h, szs[j]);
        if (c == NULL) {
            ok = false;
            break;
        }
        size_t k = (size_t)(c - h->cls);
        if (need[k]++ == 0)
            expire(h, c, now);
        ok = need[k] <= c->n;
    }
    for (size_t j = 0; ok && j < m; j++) {
        hold_class_t *c = class_of(h, szs[j]);
        out[j] = *at(c, 0);
        c->head = (c->head + 1) % c->cap;
        c->n--;
        h->n--;
        h->bytes -= c->size;
    }
    if (ok)
        h->taken += m;
    pthread_mutex_unlock(&h->lock);
    return ok;
}

void kvp_holds_put_back(kvp_holds_t *h, uint64_t fp, uint64_t gen, const kvp_hold_t *hs, size_t n)
{
    pthread_mutex_lock(&h->lock);
    for (size_t i = 0; i < n; i++) {
        if (h->fp == fp && h->gen == gen)
            push_locked(h, &hs[i]);
        else if (h->gen == gen)
            note_gone(h, hs[i].id);
        else
            h->dropped++;
    }
    pthread_mutex_unlock(&h->lock);
}

/* Descriptor d's grant set (1-based, as a replica names it) as a kept copy, made at its first
 * use (sets[d - 1]; one reference: the answer's, let go of by kvp_holds_add); NULL: none or
 * not a well-formed set (that replica is not held). */
static kvp_hold_set_t *answer_set(Kvpool__SegmentDesc *const *segs, size_t n_segs,
                                  kvp_hold_set_t **sets, uint32_t d, uint32_t index)
{
    if (d == 0 || d > n_segs || segs[d - 1] == NULL)
        return NULL;
    if (sets[d - 1] == NULL) {
        const ProtobufCBinaryData *b = &segs[d - 1]->grant_set;
        uint32_t count = kvp_grant_set_count(b->data, b->len);
        kvp_hold_set_t *set = count > 0 ? malloc(sizeof(*set) + b->len) : NULL;
        if (set == NULL)
            return NULL;
        atomic_init(&set->refs, 1);
        set->count = count;
        memcpy(set->data, b->data, b->len);
        sets[d - 1] = set;
    }
    return index < sets[d - 1]->count ? sets[d - 1] : NULL;
}

/* w as a hold kept here (its grant sets named, not referenced yet); false: malformed. */
static bool hold_from(const Kvpool__Hold *w, Kvpool__SegmentDesc *const *segs, size_t n_segs,
                      kvp_hold_set_t **sets, uint64_t until, kvp_hold_t *hold)
{
    if (w == NULL || w->id == 0 || w->size == 0 || w->n_replicas == 0 ||
        w->n_replicas > KVP_HOLD_REPLICAS_MAX)
        return false;
    *hold = (kvp_hold_t){.id = w->id, .size = w->size, .usable_until_ms = until};
    hold->n_replicas = (uint32_t)w->n_replicas;
    for (size_t q = 0; q < w->n_replicas; q++) {
        const Kvpool__Replica *r = w->replicas[q];
        if (r == NULL || r->length != w->size ||
            (r->grant.len != 0 && r->grant.len != KVP_HOLD_GRANT_LEN))
            return false;
        hold->reps[q].segment_id = r->segment_id;
        hold->reps[q].offset = r->offset;
        hold->reps[q].grant_len = (uint32_t)r->grant.len;
        if (r->grant.len > 0) {
            memcpy(hold->reps[q].grant, r->grant.data, r->grant.len);
        } else if (r->grant_set != 0) {
            hold->reps[q].set = answer_set(segs, n_segs, sets, r->grant_set, r->grant_index);
            hold->reps[q].set_index = r->grant_index;
            if (hold->reps[q].set == NULL)
                return false;
        }
    }
    return true;
}

void kvp_holds_add(kvp_holds_t *h, uint64_t fp, uint64_t gen, Kvpool__Hold *const *holds, size_t n,
                   Kvpool__SegmentDesc *const *segs, size_t n_segs, uint32_t put_timeout_ms)
{
    uint64_t until = kvp_now_ms() + put_timeout_ms / 2;
    kvp_hold_set_t *small[16] = {0}, **sets = small;
    if (n_segs > KVP_ARRAY_SIZE(small) && (sets = calloc(n_segs, sizeof(*sets))) == NULL)
        n_segs = 0; /* (no memory: holds whose grants are in sets are dropped) */
    pthread_mutex_lock(&h->lock);
    bind_locked(h, fp, gen);
    for (size_t i = 0; i < n; i++) {
        kvp_hold_t hold;
        if (hold_from(holds[i], segs, n_segs, sets, until, &hold))
            push_locked(h, &hold); /* (takes its references) */
        else
            h->dropped++;
    }
    pthread_mutex_unlock(&h->lock);
    for (size_t d = 0; d < n_segs; d++)
        set_unref(sets[d]); /* the answer's reference */
    if (sets != small)
        free(sets);
}

void kvp_holds_drop_segment(kvp_holds_t *h, uint64_t segment_id)
{
    pthread_mutex_lock(&h->lock);
    for (size_t k = 0; k < HOLD_CLASSES; k++) {
        hold_class_t *c = &h->cls[k];
        size_t w = 0, n = c->n;
        for (size_t i = 0; i < n; i++) {
            kvp_hold_t *x = at(c, i);
            bool on = false;
            for (uint32_t q = 0; q < x->n_replicas; q++)
                on |= x->reps[q].segment_id == segment_id;
            if (on) {
                note_gone(h, x->id);
                hold_unref(x);
                h->n--;
                h->bytes -= c->size;
                continue;
            }
            if (w != i)
                *at(c, w) = *x;
            w++;
        }
        c->n = w;
    }
    pthread_mutex_unlock(&h->lock);
}

uint32_t kvp_holds_want(kvp_holds_t *h, uint64_t fp, uint64_t size, size_t used)
{
    if (size == 0)
        return 0;
    pthread_mutex_lock(&h->lock);
    uint32_t want = 0;
    if (!h->off) {
        hold_class_t *c = h->fp == fp ? class_of(h, size) : NULL;
        size_t have = c != NULL ? c->n : 0;
        size_t held = h->fp == fp ? h->n : 0;
        uint64_t bytes = h->fp == fp ? h->bytes : 0;
        size_t room = held < h->max_holds ? h->max_holds - held : 0;
        uint64_t broom = bytes < h->max_bytes ? (h->max_bytes - bytes) / size : 0;
        size_t w = used > have ? used - have : 0;
        w = KVP_MIN(w, room);
        w = (size_t)KVP_MIN((uint64_t)w, broom);
        want = (uint32_t)KVP_MIN(w, (size_t)1024);
    }
    pthread_mutex_unlock(&h->lock);
    return want;
}

size_t kvp_holds_give_all(kvp_holds_t *h, uint64_t gen)
{
    pthread_mutex_lock(&h->lock);
    if (h->gen == gen)
        for (size_t c = 0; c < HOLD_CLASSES; c++)
            class_clear(h, &h->cls[c], true);
    size_t n = h->gen == gen ? h->n_gone : 0;
    pthread_mutex_unlock(&h->lock);
    return n;
}

size_t kvp_holds_gone(kvp_holds_t *h, uint64_t gen, uint64_t *ids, size_t cap)
{
    pthread_mutex_lock(&h->lock);
    size_t n = 0;
    if (h->gen == gen) {
        n = KVP_MIN(cap, h->n_gone);
        h->n_gone -= n;
        memcpy(ids, h->gone + h->n_gone, n * sizeof(*ids));
    }
    pthread_mutex_unlock(&h->lock);
    return n;
}

void kvp_holds_counts(kvp_holds_t *h, uint64_t *taken, uint64_t *dropped)
{
    pthread_mutex_lock(&h->lock);
    *taken = h->taken;
    *dropped = h->dropped;
    pthread_mutex_unlock(&h->lock);
}
