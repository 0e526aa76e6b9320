/*
 * key_pattern.h - the POSIX extended regexes of List and RemoveByRegex, checked before
 * they are compiled and matched in time linear in the key (see key_pattern.c).
 */
#ifndef KVP_MASTER_MATCH_KEY_PATTERN_H
#define KVP_MASTER_MATCH_KEY_PATTERN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "master/match/key_nfa.h"

/* A pattern's limits (docs/security.md, "Key patterns"). */
#define KVP_KEY_PATTERN_MAX 1024u       /* bytes */
#define KVP_KEY_PATTERN_DEPTH_MAX 8u    /* groups inside groups */
#define KVP_KEY_PATTERN_REPEAT_MAX 255u /* a count of {n}, {n,}, {n,m} */
/* The size of the pattern once every repetition is written out (as key_nfa.c compiles
 * it): one per character, class, anchor or operator, a repeated part counted as often as
 * it may occur. A literal pattern of KVP_KEY_PATTERN_MAX bytes stays under it. */
#define KVP_KEY_PATTERN_COST_MAX 2048u
/* The matcher's steps (instructions visited) one key may take: a key that needs more ends
 * its request, refused as KVP_PATTERN_WORK. About 5 ms; an anchored prefix over a key of
 * 4 KiB takes a few; the worst pattern the bounds accept, 8 million. */
#define KVP_KEY_PATTERN_KEY_STEPS_MAX (1u << 20)

/* Why a pattern was refused: the reason label of kvpool_patterns_refused_total. */
typedef enum kvp_key_pattern_refusal {
    KVP_PATTERN_OK = 0,
    KVP_PATTERN_TOO_LONG, /* over KVP_KEY_PATTERN_MAX bytes */
    KVP_PATTERN_SYNTAX,   /* not a regex (our parse, or the NFA's compile: key_nfa.c) */
    KVP_PATTERN_BACKREF,  /* \1 .. \9 */
    KVP_PATTERN_NESTING,  /* groups deeper than KVP_KEY_PATTERN_DEPTH_MAX */
    KVP_PATTERN_REPEAT,   /* a count over KVP_KEY_PATTERN_REPEAT_MAX */
    KVP_PATTERN_COST,     /* written out, over KVP_KEY_PATTERN_COST_MAX */
    KVP_PATTERN_WORK,     /* matching needed more work than the request may do */
    KVP_PATTERN_REFUSALS
} kvp_key_pattern_refusal_t;

/* The label of a refusal ("too_long", "syntax", ...); "" for KVP_PATTERN_OK. */
const char *kvp_key_pattern_reason(kvp_key_pattern_refusal_t why);

/*
 * Check `pattern` (NUL-terminated) without compiling it. KVP_PATTERN_OK: *cost_p is its
 * written-out size (<= KVP_KEY_PATTERN_COST_MAX). Otherwise msg (msg_len bytes, may be 0)
 * says why. Pure; any thread.
 */
kvp_key_pattern_refusal_t kvp_key_pattern_check(const char *pattern, uint32_t *cost_p, char *msg,
                                                size_t msg_len);

/* A checked, compiled pattern and the work it did. Caller's memory. */
typedef struct kvp_key_pattern {
    kvp_nfa_t nfa;
    bool compiled;
    bool key_over;       /* a key needed more than KVP_KEY_PATTERN_KEY_STEPS_MAX steps */
    uint32_t cost;       /* instructions of the program: what one key byte may visit */
    uint64_t work;       /* units charged: per key matched, (its length + 1) * cost */
    uint64_t started_ns; /* when it was compiled (kvp_now_ns) */
} kvp_key_pattern_t;

/*
 * Check and compile `pattern`. KVP_PATTERN_OK: kp is ready (kvp_key_pattern_cleanup it).
 * Otherwise kp holds nothing and msg says why (the pattern quoted, cut at 100 bytes).
 * Thread: any (one kp per thread).
 */
kvp_key_pattern_refusal_t kvp_key_pattern_init(kvp_key_pattern_t *kp, const char *pattern,
                                               char *msg, size_t msg_len);
void kvp_key_pattern_cleanup(kvp_key_pattern_t *kp);

/*
 * Does key (len bytes, no NUL among them) hold a match? Charges kp->work. At most
 * (len + 1) * kp->cost steps, whatever the pattern (key_nfa.c), and never more than
 * KVP_KEY_PATTERN_KEY_STEPS_MAX: a key that needs more sets kp->key_over (false then, and
 * for every later key: the request is to be refused). Allocates nothing.
 */
bool kvp_key_pattern_match(kvp_key_pattern_t *kp, const char *key, size_t len);

/* Has kp charged more than `work` units, run for more than `ms` since it was compiled, or
 * met a key over its steps? (The time is a safety net under the work units.) */
bool kvp_key_pattern_over(const kvp_key_pattern_t *kp, uint64_t work, uint32_t ms);

#endif
