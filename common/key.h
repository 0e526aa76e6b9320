/*
 * key.h - what a valid object key is.
 *
 * Thread: thread-safe (no state).
 */
#ifndef KVP_COMMON_KEY_H
#define KVP_COMMON_KEY_H

#include <stdbool.h>
#include <stddef.h>

/* A key is 1..4096 bytes of valid UTF-8 with no NUL. */
bool kvp_key_valid(const char *key, size_t len);

#endif
