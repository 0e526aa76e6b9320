/*
 * key_nfa.h - the matcher of List and RemoveByRegex patterns: a Thompson NFA simulated
 * as a set of states, linear in the key for every pattern (see key_nfa.c).
 */
#ifndef KVP_MASTER_MATCH_KEY_NFA_H
#define KVP_MASTER_MATCH_KEY_NFA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Instructions a program may hold: far above what a pattern within
 * KVP_KEY_PATTERN_COST_MAX compiles to (about two per element written out). */
#define KVP_NFA_INSTS_MAX 16384u

typedef struct kvp_nfa_inst kvp_nfa_inst_t;

/* A compiled pattern and the room to run it (no allocation per match). Caller's memory. */
typedef struct kvp_nfa {
    kvp_nfa_inst_t *prog;
    uint32_t n, cap;
    uint64_t (*sets)[4]; /* the 256-bit byte sets of brackets and \w \s */
    uint32_t n_sets, sets_cap;
    uint32_t *mark; /* per instruction: the step it was last added in */
    uint32_t *cur, *next, *stack;
    uint32_t step;
    uint64_t visits; /* instructions visited by every match so far (the cost bound's test) */
} kvp_nfa_t;

/*
 * Compile `pattern`, a POSIX extended regex that key_pattern.c has checked (an unmatched
 * ')' written as "\)"). false (nfa holds nothing, why says why): syntax that glibc's
 * regcomp would refuse too (a backwards range, an unknown class, a repeated anchor, ...),
 * said in glibc's words; out of memory; or over KVP_NFA_INSTS_MAX. Linear in the program
 * it builds; calls no regex library. Thread: any.
 */
bool kvp_nfa_compile(kvp_nfa_t *nfa, const char *pattern, char *why, size_t why_len);
void kvp_nfa_free(kvp_nfa_t *nfa);

/* The instructions of the program (what one key byte may visit at most). */
static inline uint32_t kvp_nfa_size(const kvp_nfa_t *nfa)
{
    return nfa->n;
}

/*
 * Does key (len bytes) hold a match anywhere, as glibc's regexec(REG_EXTENDED | REG_NOSUB)
 * in the C locale would say (1: yes, 0: no)? Each key byte visits each instruction at most
 * once: O(len * size), no allocation. -1: stopped after max_visits visits, no answer. One
 * thread at a time per nfa.
 */
int kvp_nfa_match(kvp_nfa_t *nfa, const char *key, size_t len, uint64_t max_visits);

#endif
