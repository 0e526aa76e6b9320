/*
 * fuzz_json.c - libFuzzer target for common/json.c, the project's one JSON reader (the
 * indexer's bodies and config, tenant quota bodies, etcd's answers).
 *
 * An input is a text: parsed, and on success every token read through every accessor,
 * checking what json.h promises: each token's subtree ends after it and within the array;
 * kvp_json_str with kvp_json_str_cap's size succeeds exactly when it does with more room
 * (the size always suffices); a u64 that fits an int64 is the same i64; keys are found in
 * every object. Everything is freed per input: anything left is a leak.
 *
 * Build: meson -Dfuzz=true with clang (deploy/fuzz.sh). Seeds: tests/fuzz/corpus-json.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"

static void strings(const kvp_json_t *j, uint32_t i)
{
    size_t cap = kvp_json_str_cap(j, i);
    if ((cap == 0) != (j->t[i].type != KVP_J_STRING))
        abort(); /* a size for strings only */
    if (cap == 0)
        return;
    char *a = malloc(cap), *b = malloc(2 * cap + 8);
    if (a == NULL || b == NULL)
        abort();
    bool ok = kvp_json_str(j, i, a, cap);
    if (ok != kvp_json_str(j, i, b, 2 * cap + 8) || (ok && strcmp(a, b) != 0))
        abort(); /* the size the reader gave did not suffice */
    free(a);
    free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvp_json_t j;
    char why[128];
    if (kvp_json_parse(&j, (const char *)data, size, why, sizeof(why)) == KVP_JSON_OK) {
        for (uint32_t i = 0; i < j.n; i++) {
            if (j.t[i].next <= i || j.t[i].next > j.n)
                abort(); /* every token's subtree ends after it, within the array */
            strings(&j, i);
            uint64_t u;
            int64_t s;
            bool is_u = kvp_json_u64(&j, i, &u), is_s = kvp_json_i64(&j, i, &s);
            /* the two readers agree where both apply ("-0" is an i64 only) */
            if (is_u && u <= INT64_MAX && (!is_s || (uint64_t)s != u))
                abort();
            if (is_s && s > 0 && (!is_u || (uint64_t)s != u))
                abort();
            if (j.t[i].type == KVP_J_OBJECT && j.t[i].size > 0) {
                /* its first key is found, at the token after it */
                char key[64];
                if (kvp_json_str(&j, i + 1, key, sizeof(key)) && strchr(key, '\\') == NULL &&
                    memcmp(j.text + j.t[i + 1].start, key, strlen(key)) == 0 &&
                    strlen(key) == j.t[i + 1].end - j.t[i + 1].start &&
                    kvp_json_get(&j, i, key) != (int64_t)i + 2)
                    abort();
                (void)kvp_json_get(&j, i, "kvs");
            }
        }
    }
    kvp_json_free(&j);
    return 0;
}
