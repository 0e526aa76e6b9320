/*
 * json.h - the project's one JSON reader (json.c): a strict tokenizer. It reads the
 * indexer's HTTP bodies and config, the master's tenant quota bodies and etcd's JSON
 * gateway answers (common/etcd.c).
 *
 * Why not a tree library such as cJSON: a seq hash or an etcd revision is a 64-bit
 * integer, and cJSON keeps numbers as doubles (exact to 2^53 only); and a body of a
 * million small values would cost cJSON a node of ~64 bytes each. Here a text becomes one
 * array of tokens (20 bytes each, at most KVP_JSON_TOKENS_MAX), numbers are read from their
 * text exactly, and nesting is bounded. The tokens point into the text: it must outlive
 * the kvp_json_t.
 *
 * Thread: any; a parse is its caller's.
 */
#ifndef KVP_COMMON_JSON_H
#define KVP_COMMON_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVP_JSON_TOKENS_MAX ((1u << 20) + 64) /* values in one body */
#define KVP_JSON_DEPTH_MAX 32

typedef enum {
    KVP_J_OBJECT,
    KVP_J_ARRAY,
    KVP_J_STRING,
    KVP_J_NUMBER,
    KVP_J_TRUE,
    KVP_J_FALSE,
    KVP_J_NULL
} kvp_json_type_t;

typedef struct kvp_json_tok {
    uint8_t type;
    uint32_t start, end; /* the text (a string's without its quotes) */
    uint32_t size;       /* an array's elements, an object's keys */
    uint32_t next;       /* the token after this value and all it holds */
} kvp_json_tok_t;

typedef struct kvp_json {
    const char *text;
    kvp_json_tok_t *t;
    uint32_t n;
} kvp_json_t;

typedef enum { KVP_JSON_OK, KVP_JSON_BAD, KVP_JSON_TOO_BIG, KVP_JSON_NOMEM } kvp_json_rc_t;

/* Parse text[0..len) (one value, whitespace around it); why: where it went wrong. */
kvp_json_rc_t kvp_json_parse(kvp_json_t *j, const char *text, size_t len, char *why,
                             size_t why_len);
void kvp_json_free(kvp_json_t *j);

/* The value of key in object token obj, or -1 (absent, or obj not an object). */
int64_t kvp_json_get(const kvp_json_t *j, uint32_t obj, const char *key);
/* A string token unescaped into out[0..cap) (NUL-terminated); false: not a string, too
 * long, or a \u0000. */
bool kvp_json_str(const kvp_json_t *j, uint32_t tok, char *out, size_t cap);
/* The bytes a buffer needs to hold string token tok unescaped by kvp_json_str, whatever
 * it holds (its text's length + 1: unescaped, a string is never longer); 0: not a string. */
size_t kvp_json_str_cap(const kvp_json_t *j, uint32_t tok);
/* A number token that is an integer in 0..UINT64_MAX (no fraction, no exponent). */
bool kvp_json_u64(const kvp_json_t *j, uint32_t tok, uint64_t *v);
/* A number token that is an integer in INT64_MIN..INT64_MAX (no fraction, no exponent). */
bool kvp_json_i64(const kvp_json_t *j, uint32_t tok, int64_t *v);

#endif
