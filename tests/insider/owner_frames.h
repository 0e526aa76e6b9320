/*
 * owner_frames.h - the insider fuzzer against a segment owner's data plane (owner_frames.c):
 * its tcp data port and its shm socket, with the grants the master hands tenant B.
 */
#ifndef KVP_TESTS_INSIDER_OWNER_FRAMES_H
#define KVP_TESTS_INSIDER_OWNER_FRAMES_H

#include <stdbool.h>
#include <stddef.h>

#include "tests/insider/fuzz.h"

/* The owner's data port (HOST:PORT) and shm socket (its abstract name, NULL: none); grants:
 * the owner checks data grants (a master with TLS), so no byte of tenant A's may reach the
 * fuzzer. unwritten: a quarter of tenant B's puts are ended without a byte written (an
 * open finding, docs/security.md: what the extent held before, of any tenant, is then
 * read back with a real read grant). false: a bad address. */
bool owner_init(const char *data_addr, const char *shm_name, bool grants, bool unwritten);
/* One round against the owner as principal `who` (c: its master connection, for grants;
 * NULL: a stranger, who has only what others left behind): a data connection, a HELLO and
 * a few frames, mutated. */
void owner_fuzz_one(rng_t *r, conn_t *c, const char *who);
/* The round's tallies for the summary line, from "requests (" on: the characters written. */
size_t owner_report(char *out, size_t cap);

#endif
