/*
 * limbo.h - what a DRAM segment held when the master dropped it because its owner fell
 * silent (see limbo.c).
 */
#ifndef KVP_MASTER_META_LIMBO_H
#define KVP_MASTER_META_LIMBO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvp_limbo_entry {
    char *key; /* key_len bytes and a NUL */
    size_t key_len;
    uint64_t version;
    uint64_t offset;
    uint64_t size;
    uint32_t crc32c;
    uint32_t pin;
    const char *group; /* its object group's id (after the key's NUL; group_len 0: none) */
    size_t group_len;
} kvp_limbo_entry_t;

/* Whose a dropped segment was: the principal that mounted it (its tag; 0: no ACL) and
 * that principal's tenant, and the tenant the segment was dedicated to, if any. Only a
 * mount by the same principal, of the same tenant and dedication, takes its objects back:
 * the name, host and memory name are in Stat and Heartbeat answers, no proof of anything. */
typedef struct kvp_limbo_owner {
    uint64_t tag;
    uint16_t tenant;
    bool dedicated;
    uint16_t dedicated_to;
} kvp_limbo_owner_t;

/* One dropped segment: who it was (its name, host and the name of its memory, which a
 * restarted owner does not keep; its owner) and its COMPLETE objects' extents, until
 * until_ms. */
typedef struct kvp_limbo {
    struct kvp_limbo *next;
    char *name;
    char *host_id;
    char *shm_path;
    char *tcp_endpoint;  /* and the data endpoints it advertised, held for its owner */
    char *rdma_endpoint; /* ... ("": none) */
    kvp_limbo_owner_t owner;
    uint64_t until_ms;
    kvp_limbo_entry_t *e;
    size_t n, cap;
    bool partial; /* some objects were not kept (out of memory): not the whole segment */
    bool sorted;  /* e is in offset order (kvp_limbo_at) */
} kvp_limbo_t;

/* A new, empty one (NULL: out of memory). */
kvp_limbo_t *kvp_limbo_new(const char *name, const char *host_id, const char *shm_path,
                           const char *tcp_endpoint, const char *rdma_endpoint,
                           const kvp_limbo_owner_t *owner, uint64_t until_ms);
/* Note one object's extent; false: out of memory (the entry is not kept). */
bool kvp_limbo_add(kvp_limbo_t *l, const char *key, size_t key_len, uint64_t version,
                   uint64_t offset, uint64_t size, uint32_t crc32c, uint32_t pin, const char *group,
                   size_t group_len);
/* The entry at offset (extents do not overlap: one at most), or NULL. Sorts the entries
 * by offset at its first call (O(n log n)), then O(log n). */
const kvp_limbo_entry_t *kvp_limbo_at(kvp_limbo_t *l, uint64_t offset);
/* Is this the segment l was (the same name, host and memory, mounted by the same owner)? */
bool kvp_limbo_is(const kvp_limbo_t *l, const char *name, const char *host_id, const char *shm_path,
                  const kvp_limbo_owner_t *owner);
/* Was l's segment mounted by the principal of this tag (0: no ACL, then anyone)? */
bool kvp_limbo_held_by(const kvp_limbo_t *l, uint64_t tag);
void kvp_limbo_free(kvp_limbo_t *l);

#endif
