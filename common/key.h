/*
 * key.h - what a valid object key is.
 *
 * Thread: thread-safe (no state).
 */
#ifndef KVP_COMMON_KEY_H
#define KVP_COMMON_KEY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A key is 1..4096 bytes of valid UTF-8 with no NUL. */
bool kvp_key_valid(const char *key, size_t len);

/* FNV-1a of a key's len bytes: the clients' tables of keys (not the master's index, whose
 * hash is seeded: master/meta/object_index.h). */
static inline uint64_t kvp_key_hash(const char *k, size_t len)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++)
        h = (h ^ (uint8_t)k[i]) * 1099511628211ull;
    return h;
}

#endif
