/*
 * seg_record.c - a DRAM segment owner's record of the objects on its segment.
 *
 * Design (docs/architecture.md, "Metadata that survives the master"). The
 * master streams every change to a segment's objects to its owner (an
 * object became COMPLETE at an extent: ADD; an extent stopped being an
 * object's: DEL; master/meta/record.c), and the owner keeps them here, in
 * its own memory, next to the bytes they describe. When the master
 * restarts (or a new leader takes over) the owner mounts the segment again
 * and offers this record (control/record.c); the master adopts what is
 * still valid. Entries are kept by extent offset: a DEL names only the
 * offset, and a later ADD at an offset replaces what was there.
 *
 * An object ended without its bytes (docs/security.md, "An object ended unwritten"): the
 * master takes a put's word that it wrote its extent, and an extent is not cleared between
 * objects, so a principal that ends a put without writing (or writing part of it) could
 * read, through its own object, what another tenant's removed object left there. Once the
 * record has seen objects of two tenants (their keys' prefixes, master/meta/tenant.h), each
 * ADD is checked against the bytes at its extent (CRC32C, the one its writer declared):
 * one that does not match is kept as bad (no read or write grant passes at it, and it is
 * not offered back to a master) and its extent is zeroed, so a wrong guess of what lies
 * there wipes it. A read waits (kvp_seg_record_wait) for its object's ADD once any
 * tenant's key was seen, so it cannot slip in before the check; DELs leave a tombstone for
 * a while, so a read of an object removed meanwhile does not wait for nothing.
 *
 * Thread: any; one mutex (the record thread applies, a remount snapshots), and a condition
 * that each apply signals (readers waiting for an ADD).
 */
#include "client/segment/seg_record.h"

#include "client/segment/data_grant.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/crc32c.h"
#include "common/log.h"

#define ADD 1u
#define DEL 2u
#define ADD_GROUPED 3u /* ADD, then u16 group_len and the object's group id */
#define ADD_FIXED (1 + 8 + 8 + 8 + 4 + 1 + 2)

typedef struct ent {
    struct ent *next;
    uint64_t offset;
    uint64_t size;
    uint64_t version;
    uint32_t crc32c;
    uint8_t pin;
    bool bad; /* ended without the bytes its CRC says: never served (see above) */
    uint16_t key_len;
    uint16_t group_len; /* its object group's id, after the key (0: none) */
    char key[];
} ent_t;

/* DELs remembered (offset, the version removed), so a read of a removed object does not
 * wait for an ADD that came and went. */
#define TOMBSTONES 4096u
/* The longest a read waits for its object's ADD. */
#define WAIT_ADD_MS 500u
/* The longest tenant name a key's prefix is compared by (longer ones: their first bytes). */
#define TENANT_MAX 64u

struct kvp_seg_record {
    pthread_mutex_t lock;
    ent_t **buckets;
    size_t n_buckets; /* power of two */
    size_t count;
    size_t key_bytes;
    uint64_t segment_id;
    kvp_data_pending_t *pending; /* the data server's begun puts (or NULL) */
    pthread_cond_t applied;      /* broadcast after each apply */
    const uint8_t *base;         /* the segment's bytes (NULL: not checked) */
    uint64_t size;
    bool tenants; /* a key with a tenant's prefix was seen: reads wait for their ADD */
    bool mixed;   /* ... of two tenants: every ADD is checked */
    uint8_t first_len;
    char first[TENANT_MAX];
    struct {
        uint64_t offset, version;
    } tomb[TOMBSTONES];
    uint32_t tomb_next;
    uint64_t n_bad; /* ADDs found without their bytes */
};

kvp_status_t kvp_seg_record_create(kvp_seg_record_t **r_p)
{
    kvp_seg_record_t *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return KVP_ERR_NOMEM;
    r->n_buckets = 1024;
    r->buckets = calloc(r->n_buckets, sizeof(*r->buckets));
    if (r->buckets == NULL) {
        free(r);
        return KVP_ERR_NOMEM;
    }
    pthread_mutex_init(&r->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->applied, &ca);
    pthread_condattr_destroy(&ca);
    *r_p = r;
    return KVP_OK;
}

static void clear_locked(kvp_seg_record_t *r)
{
    for (size_t b = 0; b < r->n_buckets; b++) {
        while (r->buckets[b] != NULL) {
            ent_t *e = r->buckets[b];
            r->buckets[b] = e->next;
            free(e);
        }
    }
    r->count = 0;
    r->key_bytes = 0;
}

void kvp_seg_record_destroy(kvp_seg_record_t *r)
{
    if (r == NULL)
        return;
    clear_locked(r);
    free(r->buckets);
    pthread_cond_destroy(&r->applied);
    pthread_mutex_destroy(&r->lock);
    free(r);
}

static size_t bucket(const kvp_seg_record_t *r, uint64_t offset)
{
    uint64_t h = (offset >> 6) * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 20) & (r->n_buckets - 1);
}

static void grow(kvp_seg_record_t *r)
{
    size_t n = r->n_buckets * 2;
    ent_t **nb = calloc(n, sizeof(*nb));
    if (nb == NULL)
        return; /* longer chains, still correct */
    ent_t **old = r->buckets;
    size_t old_n = r->n_buckets;
    r->buckets = nb;
    r->n_buckets = n;
    for (size_t b = 0; b < old_n; b++) {
        while (old[b] != NULL) {
            ent_t *e = old[b];
            old[b] = e->next;
            size_t k = bucket(r, e->offset);
            e->next = nb[k];
            nb[k] = e;
        }
    }
    free(old);
}

/* Unlink and free the entry at offset (and, when version != 0, only with that version):
 * the version it had, 0 when none was there. */
static uint64_t del_locked(kvp_seg_record_t *r, uint64_t offset, uint64_t version)
{
    for (ent_t **pp = &r->buckets[bucket(r, offset)]; *pp != NULL; pp = &(*pp)->next) {
        ent_t *e = *pp;
        if (e->offset == offset) {
            if (version != 0 && e->version != version)
                return 0;
            uint64_t had = e->version;
            *pp = e->next;
            r->count--;
            r->key_bytes -= e->key_len + e->group_len;
            free(e);
            return had;
        }
    }
    return 0;
}

/* Note the tenant of a key (its prefix up to 0x1f; none: tenants are off). */
static void see_tenant(kvp_seg_record_t *r, const char *key, size_t len)
{
    const char *sep = memchr(key, 0x1f, len);
    if (sep == NULL)
        return;
    size_t n = (size_t)(sep - key) < TENANT_MAX ? (size_t)(sep - key) : TENANT_MAX;
    if (!r->tenants) {
        r->tenants = true;
        r->first_len = (uint8_t)n;
        memcpy(r->first, key, n);
    } else if (!r->mixed && (n != r->first_len || memcmp(r->first, key, n) != 0)) {
        r->mixed = true;
    }
}

/* Once two tenants' objects were seen: do e's extent's bytes have the CRC its writer
 * declared? If not, e is bad and the extent zeroed (what lay there is gone). */
static void check_bytes(kvp_seg_record_t *r, ent_t *e)
{
    if (!r->mixed || r->base == NULL || e->size > r->size || e->offset > r->size - e->size)
        return;
    uint8_t *at = (uint8_t *)r->base + e->offset;
    if (kvp_crc32c(0, at, e->size) == e->crc32c)
        return;
    /* The record applies its stream behind the writers: by now the master may have removed
     * this object and placed a later one on its extent, whose writer the data server has
     * let in (noted) and whose bytes are what the CRC read. Then the bytes are not this
     * object's to judge (it is gone: its DEL is on the stream behind this ADD, and a read
     * of it is refused by that note), and zeroing would wipe the later object's. */
    if (r->pending != NULL && kvp_data_pending_later(r->pending, e->offset, e->size, e->version)) {
        KVP_LOG_DEBUG("segment %llu: the object at offset %llu (version %llu) ended before a "
                      "later put wrote over its extent: not checked",
                      (unsigned long long)r->segment_id, (unsigned long long)e->offset,
                      (unsigned long long)e->version);
        return;
    }
    e->bad = true;
    memset(at, 0, e->size);
    r->n_bad++;
    KVP_LOG_WARN_LIMITED("segment %llu: the object at offset %llu (%llu bytes, version %llu) "
                         "ended without the bytes its writer declared (CRC mismatch): never "
                         "served, its extent zeroed",
                         (unsigned long long)r->segment_id, (unsigned long long)e->offset,
                         (unsigned long long)e->size, (unsigned long long)e->version);
}

static uint64_t get(const uint8_t *p, size_t n)
{
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

void kvp_seg_record_bind(kvp_seg_record_t *r, uint64_t segment_id)
{
    pthread_mutex_lock(&r->lock);
    r->segment_id = segment_id;
    pthread_mutex_unlock(&r->lock);
}

kvp_status_t kvp_seg_record_apply(kvp_seg_record_t *r, uint64_t segment_id, const uint8_t *buf,
                                  size_t len)
{
    kvp_status_t st = KVP_OK;
    pthread_mutex_lock(&r->lock);
    if (segment_id != r->segment_id)
        goto out; /* an earlier mount's: the remount's offer did without them */
    size_t at = 0;
    while (at < len) {
        if (len - at < 9 || (buf[at] != ADD && buf[at] != DEL && buf[at] != ADD_GROUPED)) {
            st = KVP_ERR_PROTOCOL;
            break;
        }
        uint64_t offset = get(buf + at + 1, 8);
        if (buf[at] == DEL) {
            uint64_t had = del_locked(r, offset, 0);
            if (had != 0) {
                r->tomb[r->tomb_next].offset = offset;
                r->tomb[r->tomb_next].version = had;
                r->tomb_next = (r->tomb_next + 1) % TOMBSTONES;
            }
            at += 9;
            continue;
        }
        if (len - at < ADD_FIXED) {
            st = KVP_ERR_PROTOCOL;
            break;
        }
        const uint8_t *p = buf + at;
        uint16_t key_len = (uint16_t)get(p + 1 + 8 + 8 + 8 + 4 + 1, 2);
        if (len - at - ADD_FIXED < key_len || key_len == 0) {
            st = KVP_ERR_PROTOCOL;
            break;
        }
        uint16_t group_len = 0;
        size_t gx = 0; /* the group's length field and bytes */
        if (p[0] == ADD_GROUPED) {
            if (len - at - ADD_FIXED - key_len < 2 ||
                (group_len = (uint16_t)get(p + ADD_FIXED + key_len, 2)) == 0 ||
                len - at - ADD_FIXED - key_len - 2 < group_len) {
                st = KVP_ERR_PROTOCOL;
                break;
            }
            gx = 2u + group_len;
        }
        ent_t *e = malloc(sizeof(*e) + key_len + group_len);
        if (e == NULL) {
            st = KVP_ERR_NOMEM;
            break;
        }
        e->offset = offset;
        e->size = get(p + 9, 8);
        e->version = get(p + 17, 8);
        e->crc32c = (uint32_t)get(p + 25, 4);
        e->pin = p[29];
        e->bad = false;
        e->key_len = key_len;
        e->group_len = group_len;
        memcpy(e->key, p + ADD_FIXED, key_len);
        memcpy(e->key + key_len, p + ADD_FIXED + key_len + 2, group_len);
        see_tenant(r, e->key, key_len);
        check_bytes(r, e);
        del_locked(r, offset, 0);
        if (r->count >= r->n_buckets)
            grow(r);
        size_t b = bucket(r, offset);
        e->next = r->buckets[b];
        r->buckets[b] = e;
        r->count++;
        r->key_bytes += key_len + group_len;
        if (r->pending != NULL)
            kvp_data_pending_forget(r->pending, offset, e->version);
        at += ADD_FIXED + key_len + gx;
    }
    if (st != KVP_OK)
        clear_locked(r); /* no longer in step with the master: trust none of it */
out:
    pthread_cond_broadcast(&r->applied);
    pthread_mutex_unlock(&r->lock);
    return st;
}

void kvp_seg_record_clear(kvp_seg_record_t *r)
{
    pthread_mutex_lock(&r->lock);
    clear_locked(r);
    pthread_mutex_unlock(&r->lock);
}

void kvp_seg_record_set_pending(kvp_seg_record_t *r, kvp_data_pending_t *p)
{
    pthread_mutex_lock(&r->lock);
    r->pending = p;
    pthread_mutex_unlock(&r->lock);
}

void kvp_seg_record_forget(kvp_seg_record_t *r, uint64_t offset, uint64_t version)
{
    pthread_mutex_lock(&r->lock);
    del_locked(r, offset, version);
    pthread_mutex_unlock(&r->lock);
}

/* The version recorded at offset (0: none; UINT64_MAX: a bad object, which no grant
 * passes: later than any read's, ended for any write's). */
static uint64_t version_at_locked(const kvp_seg_record_t *r, uint64_t offset)
{
    if (r->n_buckets > 0)
        for (const ent_t *e = r->buckets[bucket(r, offset)]; e != NULL; e = e->next)
            if (e->offset == offset)
                return e->bad ? UINT64_MAX : e->version;
    return 0;
}

/* Is the object (offset, version) recorded, or recorded and removed since? */
static bool recorded_locked(const kvp_seg_record_t *r, uint64_t offset, uint64_t version)
{
    if (version_at_locked(r, offset) >= version)
        return true;
    for (uint32_t i = 0; i < TOMBSTONES; i++)
        if (r->tomb[i].offset == offset && r->tomb[i].version >= version)
            return true;
    return false;
}

bool kvp_seg_record_wait(kvp_seg_record_t *r, const uint64_t *offsets, const uint64_t *versions,
                         size_t n)
{
    struct timespec until = kvp_deadline_ms(WAIT_ADD_MS);
    pthread_mutex_lock(&r->lock);
    bool all = true;
    for (size_t i = 0; i < n && r->tenants; i++) {
        while (!(all = recorded_locked(r, offsets[i], versions[i])))
            if (pthread_cond_timedwait(&r->applied, &r->lock, &until) == ETIMEDOUT) {
                all = recorded_locked(r, offsets[i], versions[i]);
                break;
            }
        if (!all)
            break;
    }
    pthread_mutex_unlock(&r->lock);
    return all;
}

void kvp_seg_record_set_memory(kvp_seg_record_t *r, const void *base, uint64_t size)
{
    pthread_mutex_lock(&r->lock);
    r->base = base;
    r->size = size;
    pthread_mutex_unlock(&r->lock);
}

uint64_t kvp_seg_record_bad(kvp_seg_record_t *r)
{
    pthread_mutex_lock(&r->lock);
    uint64_t n = r->n_bad;
    pthread_mutex_unlock(&r->lock);
    return n;
}

uint64_t kvp_seg_record_version_at(kvp_seg_record_t *r, uint64_t offset)
{
    pthread_mutex_lock(&r->lock);
    uint64_t v = version_at_locked(r, offset);
    pthread_mutex_unlock(&r->lock);
    return v;
}

void kvp_seg_record_versions_at(kvp_seg_record_t *r, const uint64_t *offsets, uint64_t *versions,
                                size_t n)
{
    pthread_mutex_lock(&r->lock);
    for (size_t i = 0; i < n; i++)
        versions[i] = i > 0 && offsets[i] == offsets[i - 1] ? versions[i - 1]
                                                            : version_at_locked(r, offsets[i]);
    pthread_mutex_unlock(&r->lock);
}

size_t kvp_seg_record_count(kvp_seg_record_t *r)
{
    pthread_mutex_lock(&r->lock);
    size_t n = r->count;
    pthread_mutex_unlock(&r->lock);
    return n;
}

static int newest_first(const void *a, const void *b)
{
    const kvp_record_entry_t *x = a, *y = b;
    return x->version < y->version ? 1 : x->version > y->version ? -1 : 0;
}

kvp_status_t kvp_seg_record_snapshot(kvp_seg_record_t *r, kvp_record_entry_t **e_p, size_t *n_p)
{
    pthread_mutex_lock(&r->lock);
    size_t n = r->count;
    kvp_record_entry_t *out = malloc(n * sizeof(*out) + r->key_bytes + 1);
    if (out == NULL) {
        pthread_mutex_unlock(&r->lock);
        return KVP_ERR_NOMEM;
    }
    char *keys = (char *)(out + n);
    size_t i = 0;
    for (size_t b = 0; b < r->n_buckets; b++) {
        for (const ent_t *e = r->buckets[b]; e != NULL; e = e->next) {
            if (e->bad)
                continue; /* not offered back: no master is to hand it out */
            memcpy(keys, e->key, (size_t)e->key_len + e->group_len);
            out[i++] = (kvp_record_entry_t){.key = keys,
                                            .key_len = e->key_len,
                                            .version = e->version,
                                            .offset = e->offset,
                                            .size = e->size,
                                            .crc32c = e->crc32c,
                                            .pin = e->pin,
                                            .group = keys + e->key_len,
                                            .group_len = e->group_len};
            keys += (size_t)e->key_len + e->group_len;
        }
    }
    pthread_mutex_unlock(&r->lock);
    n = i;
    qsort(out, n, sizeof(*out), newest_first);
    *e_p = out;
    *n_p = n;
    return KVP_OK;
}
