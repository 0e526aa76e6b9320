/*
 * limbo.c - what a DRAM segment held when its owner fell silent.
 *
 * A segment is bound to the control connection that mounted it; when the master closes
 * that connection because nothing came on it for --client-ttl (or it broke), the
 * segment is unmounted and its objects leave the index. The owner may only have been cut
 * off from the master: its memory is intact and it mounts again once it gets through,
 * offering its record. But the record is the master's stream of changes, and the
 * changes the master queued while the owner was cut off never arrived: the puts
 * acknowledged in that window are in the owner's memory and in no record. So the master
 * keeps, for --segment-grace, the dropped segment's COMPLETE objects (key, version,
 * extent, size, CRC, pin); when the same segment (name, host, and the name of its memory,
 * which a restarted owner does not keep) mounts again and its offer ends, each is taken
 * back through the same checks as an offered one (rpc/record_calls.c, ha/rebuild.c) and
 * streamed to the owner's record.
 *
 * The limbo is the master's whole view of the segment when it was dropped, newer than
 * the owner's record wherever the two differ (the changes that did not arrive: an object
 * evicted, upserted or removed, an extent used again). So while a segment's offer runs
 * against a whole limbo (not `partial`), an offered entry is adopted only if the limbo
 * holds the same object at the same extent (key, version, size, CRC): a stale one is
 * refused rather than adopted over the newer object the limbo then takes back
 * (rpc/record_calls.c). A limbo is kept for an empty segment too, for that check; one
 * that may lack objects is `partial` (out of memory, or made while an offer after a
 * master restart ran: rpc/segment_calls.c) and checks nothing.
 *
 * Those three names are no secret (Stat and Heartbeat answers carry them, or carried them
 * before a principal was checked): with an ACL, the limbo also keeps who mounted the
 * segment (its principal, that principal's tenant, the tenant the segment was dedicated
 * to), and only a mount by the same principal, tenant and dedication takes the objects
 * back. Another principal's mount of that name, or of one of the data endpoints the
 * segment advertised, is refused while the limbo lasts (rpc/segment_calls.c), so it can
 * neither take them, nor make the master forget them, nor squat where the owner comes back.
 *
 * Thread: master loop only.
 */
#include "master/meta/limbo.h"

#include <stdlib.h>
#include <string.h>

kvp_limbo_t *kvp_limbo_new(const char *name, const char *host_id, const char *shm_path,
                           const char *tcp_endpoint, const char *rdma_endpoint,
                           const kvp_limbo_owner_t *owner, uint64_t until_ms)
{
    kvp_limbo_t *l = calloc(1, sizeof(*l));
    if (l == NULL)
        return NULL;
    l->owner = *owner;
    l->name = strdup(name);
    l->host_id = strdup(host_id);
    l->shm_path = strdup(shm_path);
    l->tcp_endpoint = strdup(tcp_endpoint);
    l->rdma_endpoint = strdup(rdma_endpoint);
    l->until_ms = until_ms;
    if (l->name == NULL || l->host_id == NULL || l->shm_path == NULL || l->tcp_endpoint == NULL ||
        l->rdma_endpoint == NULL) {
        kvp_limbo_free(l);
        return NULL;
    }
    return l;
}

bool kvp_limbo_add(kvp_limbo_t *l, const char *key, size_t key_len, uint64_t version,
                   uint64_t offset, uint64_t size, uint32_t crc32c, uint32_t pin, const char *group,
                   size_t group_len)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 256;
        kvp_limbo_entry_t *e = realloc(l->e, cap * sizeof(*e));
        if (e == NULL)
            return false;
        l->e = e;
        l->cap = cap;
    }
    char *k = malloc(key_len + 1 + group_len);
    if (k == NULL)
        return false;
    memcpy(k, key, key_len);
    k[key_len] = '\0';
    if (group_len > 0)
        memcpy(k + key_len + 1, group, group_len);
    l->sorted = false;
    l->e[l->n++] = (kvp_limbo_entry_t){.key = k,
                                       .key_len = key_len,
                                       .version = version,
                                       .offset = offset,
                                       .size = size,
                                       .crc32c = crc32c,
                                       .pin = pin,
                                       .group = k + key_len + 1,
                                       .group_len = group_len};
    return true;
}

static int by_offset(const void *a, const void *b)
{
    uint64_t x = ((const kvp_limbo_entry_t *)a)->offset, y = ((const kvp_limbo_entry_t *)b)->offset;
    return x < y ? -1 : x > y;
}

const kvp_limbo_entry_t *kvp_limbo_at(kvp_limbo_t *l, uint64_t offset)
{
    if (!l->sorted) {
        if (l->n > 1)
            qsort(l->e, l->n, sizeof(l->e[0]), by_offset);
        l->sorted = true;
    }
    size_t lo = 0, hi = l->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (l->e[mid].offset < offset)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < l->n && l->e[lo].offset == offset ? &l->e[lo] : NULL;
}

bool kvp_limbo_is(const kvp_limbo_t *l, const char *name, const char *host_id, const char *shm_path,
                  const kvp_limbo_owner_t *owner)
{
    return strcmp(l->name, name) == 0 && strcmp(l->host_id, host_id) == 0 &&
           strcmp(l->shm_path, shm_path) == 0 && shm_path[0] != '\0' &&
           l->owner.tag == owner->tag && l->owner.tenant == owner->tenant &&
           l->owner.dedicated == owner->dedicated &&
           (!owner->dedicated || l->owner.dedicated_to == owner->dedicated_to);
}

bool kvp_limbo_held_by(const kvp_limbo_t *l, uint64_t tag)
{
    return l->owner.tag == tag;
}

void kvp_limbo_free(kvp_limbo_t *l)
{
    if (l == NULL)
        return;
    for (size_t i = 0; i < l->n; i++)
        free(l->e[i].key);
    free(l->e);
    free(l->name);
    free(l->host_id);
    free(l->shm_path);
    free(l->tcp_endpoint);
    free(l->rdma_endpoint);
    free(l);
}
