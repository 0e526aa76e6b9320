/*
 * api.h - what every public call of libkvpool does on its way in and out:
 * kvp_client_last_error's notes (last_error.c). Included by the files that
 * implement the public API (the .c files of client/), never by a lower folder: a lower
 * layer returns a status (and, where words help, a message the API level
 * notes).
 */
#ifndef KVP_CLIENT_API_H
#define KVP_CLIENT_API_H

#include <stddef.h>
#include <stdint.h>

#include "client/include/kvpool.h"

/* Bracket a public call: kvp_api_leave returns rc, and when the outermost call fails with
 * nothing recorded, records "<op>: <status text>". */
void kvp_api_enter(void);
int64_t kvp_api_leave(int64_t rc, const char *op);
/* Note what went wrong, in words, for the calling thread (the first note of a call wins;
 * it becomes kvp_client_last_error() only if the call fails). _key: about that key only. */
void kvp_api_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void kvp_api_fail_key(const char *key, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A batch's first key that finally failed: its note, or "<op> <key>: <status text>". */
void kvp_api_fail_keys(const char *op, const char *const *keys, const int32_t *st, size_t n);

#endif
