/*
 * key_pattern.c - the regexes of List and RemoveByRegex, made harmless to the master.
 *
 * A caller's pattern is a POSIX extended regex (as glibc reads it in the C locale), run
 * over keys on the master's loop thread, so what it may cost is bounded before and while
 * it runs:
 *
 * - Before anything is compiled, our own parse of the ERE syntax refuses back-references
 *   (\1..\9: no linear-time matcher can run them), groups nested deeper than
 *   KVP_KEY_PATTERN_DEPTH_MAX, a count {n,m} over KVP_KEY_PATTERN_REPEAT_MAX, and a
 *   pattern whose written-out size passes KVP_KEY_PATTERN_COST_MAX. The written-out size
 *   follows what a compiler builds: x{n,m} is max(m, 1) copies of x (x{n,}: n + 1, x+:
 *   two), so nested counts multiply; groups, alternatives and operators are one each.
 * - The pattern is then compiled into a Thompson NFA (key_nfa.c), in time linear in the
 *   program it builds, which refuses the rest of what glibc's regcomp refuses (a backwards
 *   range, an unknown class, a repeated anchor), with glibc's words: the patterns accepted
 *   are glibc's, and the unit tests compare both on random patterns. glibc itself is not
 *   used: its regcomp took seconds on some patterns of a few dozen bytes that pass every
 *   bound above (the property test's grammar found [a]??{50}(){0,1}{5,}), and its
 *   regexec's cost per key is not bounded by the pattern's size (it builds DFA states as
 *   it goes, microseconds each, and caches them without limit).
 * - The NFA runs every thread at once: one key byte visits each of its instructions at
 *   most once, so a key costs at most (its length + 1) * the program's size, whatever
 *   the pattern. Each key matched charges that to kp->work; the handlers stop a request
 *   at a budget of those units, or of time since the compile (admin_calls.c).
 *
 * Thread: any; a kvp_key_pattern_t is used by one thread at a time (the master loop).
 */
#include "master/match/key_pattern.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/clock.h"

static const char *const reasons[KVP_PATTERN_REFUSALS] = {
    [KVP_PATTERN_OK] = "",
    [KVP_PATTERN_TOO_LONG] = "too_long",
    [KVP_PATTERN_SYNTAX] = "syntax",
    [KVP_PATTERN_BACKREF] = "backref",
    [KVP_PATTERN_NESTING] = "nesting",
    [KVP_PATTERN_REPEAT] = "repeat",
    [KVP_PATTERN_COST] = "cost",
    [KVP_PATTERN_WORK] = "work",
};

const char *kvp_key_pattern_reason(kvp_key_pattern_refusal_t why)
{
    return (unsigned)why < KVP_PATTERN_REFUSALS ? reasons[why] : "";
}

/* The parse: recursive descent over the ERE grammar, depth bounded by the nesting limit. */
typedef struct parse {
    const char *s;
    size_t at;
    kvp_key_pattern_refusal_t why;
    char *msg;
    size_t msg_len;
    char *out; /* the pattern as compiled (unmatched ')' escaped), or NULL */
    size_t out_len;
} parse_t;

/* Costs are held at COST_CAP at most, so products never overflow. */
#define COST_CAP ((uint64_t)KVP_KEY_PATTERN_COST_MAX + 1)
/* The largest part that may match nothing which a repetition may copy: (a?) and (a*) are
 * 4, ((a?){0,2}) is 12. (This bound and the next one came from glibc's regcomp, which
 * compiled patterns before key_nfa.c did; the NFA compiles such parts in linear time, but
 * the bounds stay so that the patterns accepted do not change.) */
#define NULLABLE_COPY_MAX 4u
/* The most optional copies ({n,m}: m - n) a repetition may make of a part that may match
 * nothing: with glibc's regcomp, (.*){2,34} compiled in about a millisecond, (.*){2,128} in
 * 50, (.*){2,246} in 700. */
#define NULLABLE_OPTIONAL_MAX 32u

static uint64_t cap_cost(uint64_t c)
{
    return c > COST_CAP ? COST_CAP : c;
}

__attribute__((format(printf, 3, 4))) static void refuse(parse_t *p, kvp_key_pattern_refusal_t why,
                                                         const char *fmt, ...)
{
    if (p->why != KVP_PATTERN_OK)
        return;
    p->why = why;
    if (p->msg_len == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->msg, p->msg_len, fmt, ap);
    va_end(ap);
}

static void emit(parse_t *p, char c)
{
    if (p->out != NULL)
        p->out[p->out_len++] = c;
}

/* Copy s[from, to) to the output. */
static void emit_span(parse_t *p, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++)
        emit(p, p->s[i]);
}

static uint64_t parse_alt(parse_t *p, unsigned depth, bool *nullable_p);

/* A bracket expression from its '[' (p->at): [^]...], [:class:], [.c.], [=c=]. */
static void parse_bracket(parse_t *p)
{
    size_t from = p->at++;
    const char *s = p->s;
    if (s[p->at] == '^')
        p->at++;
    if (s[p->at] == ']')
        p->at++; /* a ']' first is a literal */
    for (;;) {
        char c = s[p->at];
        if (c == '\0') {
            refuse(p, KVP_PATTERN_SYNTAX, "unmatched [ at byte %zu", from);
            return;
        }
        if (c == ']') {
            p->at++;
            break;
        }
        if (c == '[' && (s[p->at + 1] == ':' || s[p->at + 1] == '.' || s[p->at + 1] == '=')) {
            char kind = s[p->at + 1];
            const char *end = NULL;
            for (const char *q = s + p->at + 2; *q != '\0'; q++)
                if (q[0] == kind && q[1] == ']') {
                    end = q;
                    break;
                }
            if (end == NULL) {
                refuse(p, KVP_PATTERN_SYNTAX, "unterminated [%c at byte %zu", kind, p->at);
                return;
            }
            p->at = (size_t)(end - s) + 2;
            continue;
        }
        p->at++; /* a backslash is a literal inside brackets */
    }
    emit_span(p, from, p->at);
}

/* A count: digits (none: -1), at most the cap plus one. */
static long parse_count(parse_t *p)
{
    long n = -1;
    while (p->s[p->at] >= '0' && p->s[p->at] <= '9') {
        n = (n < 0 ? 0 : n) * 10 + (p->s[p->at] - '0');
        if (n > (long)KVP_KEY_PATTERN_REPEAT_MAX)
            n = (long)KVP_KEY_PATTERN_REPEAT_MAX + 1;
        p->at++;
    }
    return n;
}

/* {n}, {n,}, {,m}, {n,m} from its '{' (p->at): how many copies of the repeated part the
 * written-out size counts, and in *optional_p how many of them are optional (m - n; {n,}:
 * one). 0 with p->why set: refused. */
static uint64_t parse_interval(parse_t *p, uint64_t *optional_p)
{
    size_t from = p->at++;
    long lo = parse_count(p), hi = lo;
    bool comma = p->s[p->at] == ',';
    if (comma) {
        p->at++;
        hi = parse_count(p); /* -1: no upper bound */
        if (lo < 0)
            lo = 0; /* {,m} is {0,m} */
    }
    if (lo < 0 || p->s[p->at] != '}') {
        refuse(p, KVP_PATTERN_SYNTAX, "bad repetition count at byte %zu (want {n}, {n,} or {n,m})",
               from);
        return 0;
    }
    p->at++;
    if (lo > (long)KVP_KEY_PATTERN_REPEAT_MAX || hi > (long)KVP_KEY_PATTERN_REPEAT_MAX) {
        refuse(p, KVP_PATTERN_REPEAT, "repetition count at byte %zu is over %u", from,
               KVP_KEY_PATTERN_REPEAT_MAX);
        return 0;
    }
    if (hi >= 0 && lo > hi) {
        refuse(p, KVP_PATTERN_SYNTAX, "repetition {%ld,%ld} at byte %zu has min over max", lo, hi,
               from);
        return 0;
    }
    emit_span(p, from, p->at);
    *optional_p = hi < 0 ? 1 : (uint64_t)(hi - lo);
    if (hi < 0)
        return (uint64_t)lo + 1;
    return hi > 0 ? (uint64_t)hi : 1;
}

/* An atom and the repetitions after it. */
/* An escape that matches no character (a GNU anchor): \b \B \< \> \` \'. */
static bool zero_width_escape(char c)
{
    return c == 'b' || c == 'B' || c == '<' || c == '>' || c == '`' || c == '\'';
}

static uint64_t parse_piece(parse_t *p, unsigned depth, bool *nullable_p)
{
    bool nullable = false; /* may it match the empty string? */
    const char *s = p->s;
    char c = s[p->at];
    uint64_t cost = 1;
    switch (c) {
    case '*':
    case '+':
    case '?':
    case '{':
        refuse(p, KVP_PATTERN_SYNTAX, "'%c' at byte %zu has nothing to repeat", c, p->at);
        return 0;
    case '(':
        if (depth + 1 > KVP_KEY_PATTERN_DEPTH_MAX) {
            refuse(p, KVP_PATTERN_NESTING, "groups nested deeper than %u (at byte %zu)",
                   KVP_KEY_PATTERN_DEPTH_MAX, p->at);
            return 0;
        }
        {
            size_t open = p->at++;
            emit(p, '(');
            cost = parse_alt(p, depth + 1, &nullable) + 2;
            if (p->why != KVP_PATTERN_OK)
                return 0;
            if (s[p->at] != ')') {
                refuse(p, KVP_PATTERN_SYNTAX, "unmatched ( at byte %zu", open);
                return 0;
            }
            p->at++;
            emit(p, ')');
        }
        break;
    case ')': /* only at the top (a group's end stops parse_alt): a literal, as in glibc */
        p->at++;
        emit(p, '\\');
        emit(p, ')');
        break;
    case '[':
        parse_bracket(p);
        break;
    case '\\':
        if (s[p->at + 1] == '\0') {
            refuse(p, KVP_PATTERN_SYNTAX, "trailing backslash");
            return 0;
        }
        if (s[p->at + 1] >= '1' && s[p->at + 1] <= '9') {
            refuse(p, KVP_PATTERN_BACKREF,
                   "back-reference \\%c at byte %zu: back-references are not allowed", s[p->at + 1],
                   p->at);
            return 0;
        }
        nullable = zero_width_escape(s[p->at + 1]);
        emit_span(p, p->at, p->at + 2);
        p->at += 2;
        break;
    default: /* a character, '.', '^', '$' */
        nullable = c == '^' || c == '$';
        emit(p, c);
        p->at++;
        break;
    }
    if (p->why != KVP_PATTERN_OK)
        return 0;
    /* repetitions, stacked ones multiplying: the part is copied for each count */
    for (;;) {
        c = s[p->at];
        uint64_t copies, optional = 1;
        size_t at = p->at;
        bool may_skip; /* the repetition may match nothing */
        if (c == '*' || c == '?') {
            emit(p, c);
            p->at++;
            copies = 1;
            may_skip = true;
        } else if (c == '+') {
            emit(p, c);
            p->at++;
            copies = 2; /* x+ is x x* */
            may_skip = false;
        } else if (c == '{') {
            may_skip = p->s[p->at + 1] == '0' || p->s[p->at + 1] == ',';
            copies = parse_interval(p, &optional);
            if (p->why != KVP_PATTERN_OK)
                return 0;
        } else {
            break;
        }
        /* refused since glibc compiled patterns (NULLABLE_COPY_MAX): its compile time
         * exploded (minutes) when a part that may match nothing and holds repetitions of its
         * own was copied: ((a?){0,2}){100,} */
        if (copies > 1 && nullable && cost > NULLABLE_COPY_MAX) {
            refuse(p, KVP_PATTERN_COST,
                   "repetition at byte %zu copies a part that may match nothing and holds "
                   "repetitions of its own; make the part match something",
                   at);
            return 0;
        }
        /* ... and, whatever the part holds, when many of its copies were optional: glibc
         * nested them, x{2,246} being x x (x (x ...)?)?, and (.*){2,246} took 0.7 s of the
         * loop, (a*){0,246} and a*{2,246} as long (NULLABLE_OPTIONAL_MAX) */
        if (nullable && optional > NULLABLE_OPTIONAL_MAX) {
            refuse(p, KVP_PATTERN_COST,
                   "repetition at byte %zu makes %llu optional copies of a part that may match "
                   "nothing (at most %u); make the part match something, or the count exact",
                   at, (unsigned long long)optional, NULLABLE_OPTIONAL_MAX);
            return 0;
        }
        nullable |= may_skip;
        cost = cap_cost(copies * (cost + 1));
    }
    *nullable_p = nullable;
    return cost;
}

/* Branches separated by '|', up to the end or (inside a group) its ')'. *nullable_p: may
 * one of them match the empty string? */
static uint64_t parse_alt(parse_t *p, unsigned depth, bool *nullable_p)
{
    uint64_t cost = 0;
    bool branch_nullable = true; /* every piece of the branch so far may match nothing */
    *nullable_p = false;
    for (;;) {
        char c = p->s[p->at];
        if (c == '\0' || (c == ')' && depth > 0) || c == '|')
            *nullable_p |= branch_nullable;
        if (c == '\0' || (c == ')' && depth > 0))
            return cost;
        if (c == '|') {
            emit(p, '|');
            p->at++;
            cost = cap_cost(cost + 1);
            branch_nullable = true;
            continue;
        }
        bool piece_nullable = false;
        cost = cap_cost(cost + parse_piece(p, depth, &piece_nullable));
        if (p->why != KVP_PATTERN_OK)
            return 0;
        branch_nullable &= piece_nullable;
    }
}

/* Parse `pattern`; out (room for twice its length plus 1) gets it as compiled, or NULL. */
static kvp_key_pattern_refusal_t check(const char *pattern, uint32_t *cost_p, char *msg,
                                       size_t msg_len, char *out)
{
    if (msg_len > 0)
        msg[0] = '\0';
    size_t len = strnlen(pattern, KVP_KEY_PATTERN_MAX + 1);
    if (len > KVP_KEY_PATTERN_MAX) {
        if (msg_len > 0)
            snprintf(msg, msg_len, "pattern longer than %u bytes", KVP_KEY_PATTERN_MAX);
        return KVP_PATTERN_TOO_LONG;
    }
    parse_t p = {.s = pattern, .msg = msg, .msg_len = msg_len, .out = out};
    bool nullable;
    uint64_t cost = parse_alt(&p, 0, &nullable);
    if (p.why == KVP_PATTERN_OK && cost > KVP_KEY_PATTERN_COST_MAX)
        refuse(&p, KVP_PATTERN_COST,
               "pattern too costly: written out (each repeated part as often as it may "
               "occur) it is over %u elements; use fewer or smaller repetition counts",
               KVP_KEY_PATTERN_COST_MAX);
    if (p.why != KVP_PATTERN_OK)
        return p.why;
    if (out != NULL)
        out[p.out_len] = '\0';
    *cost_p = (uint32_t)cost;
    return KVP_PATTERN_OK;
}

kvp_key_pattern_refusal_t kvp_key_pattern_check(const char *pattern, uint32_t *cost_p, char *msg,
                                                size_t msg_len)
{
    return check(pattern, cost_p, msg, msg_len, NULL);
}

kvp_key_pattern_refusal_t kvp_key_pattern_init(kvp_key_pattern_t *kp, const char *pattern,
                                               char *msg, size_t msg_len)
{
    memset(kp, 0, sizeof(*kp));
    char why[200] = "";
    char checked[KVP_KEY_PATTERN_MAX * 2 + 8];
    uint32_t cost = 0;
    kvp_key_pattern_refusal_t rc = check(pattern, &cost, why, sizeof(why), checked);
    if (rc == KVP_PATTERN_OK && !kvp_nfa_compile(&kp->nfa, checked, why, sizeof(why)))
        rc = KVP_PATTERN_SYNTAX;
    if (rc != KVP_PATTERN_OK) {
        if (msg_len > 0)
            snprintf(msg, msg_len, "bad regular expression '%.100s%s': %s", pattern,
                     strlen(pattern) > 100 ? "..." : "", why);
        return rc;
    }
    kp->compiled = true;
    kp->started_ns = kvp_now_ns();
    kp->cost = kvp_nfa_size(&kp->nfa);
    return KVP_PATTERN_OK;
}

void kvp_key_pattern_cleanup(kvp_key_pattern_t *kp)
{
    if (kp->compiled)
        kvp_nfa_free(&kp->nfa);
    kp->compiled = false;
}

bool kvp_key_pattern_match(kvp_key_pattern_t *kp, const char *key, size_t len)
{
    kp->work += ((uint64_t)len + 1) * kp->cost;
    if (!kp->compiled || kp->key_over)
        return false;
    int hit = kvp_nfa_match(&kp->nfa, key, len, KVP_KEY_PATTERN_KEY_STEPS_MAX);
    kp->key_over = hit < 0;
    return hit > 0;
}

bool kvp_key_pattern_over(const kvp_key_pattern_t *kp, uint64_t work, uint32_t ms)
{
    return kp->work > work || kp->key_over ||
           kvp_now_ns() - kp->started_ns > (uint64_t)ms * 1000000u;
}
