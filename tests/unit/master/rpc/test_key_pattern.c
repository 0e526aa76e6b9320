/*
 * test_key_pattern.c - unit tests for master/rpc/key_pattern.c: which patterns are
 * accepted and which refused (and why), a property test of the cost bound (random
 * patterns of a small grammar: every accepted one is within the budget and compiles in
 * bounded time), the same answers as glibc's own search for every accepted one, and a
 * pattern with many DFA states fed many keys keeps the master's memory bounded.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <regex.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "master/rpc/key_pattern.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static kvp_key_pattern_refusal_t check(const char *pattern, char *msg, size_t len)
{
    uint32_t cost = 0;
    kvp_key_pattern_refusal_t why = kvp_key_pattern_check(pattern, &cost, msg, len);
    if (why == KVP_PATTERN_OK)
        assert_true(cost <= KVP_KEY_PATTERN_COST_MAX);
    return why;
}

/* ---- the accept / refuse table ---- */

/* What users and the test suites send: each is accepted and compiles. */
static const char *const accepted[] = {
    "^a/",
    "^a/[0-4]$",
    "^ra/[01]$",
    "target|default-key",
    "^[ab]@team-",
    "^shared@blk-1$",
    "^pfx\\-1\\.x\\ y\\#z\\&\\~", /* Python's re.escape */
    ".*",
    "a.*b",
    "a{3}",
    "a{2,}",
    "a{,3}",
    "a{0}",
    "a{1,100}",
    "a{255}",
    "[[:alpha:]]+[[:digit:]]*",
    "[]a]",
    "[^]a]x",
    "[a\\]",
    "a)",
    "a)b)",
    "(a|b)*c",
    "(a|)",
    "a||b",
    "()",
    "\\w+\\.\\s",
    "(a+)+",
    "((a+)+)+",
    "((((((((a))))))))", /* 8 levels */
    "(x?){255}",
    "(abcdefg){200}",
    "[.].[=a=][[=a=]][[.a.]][[:space:]]",
    "^.*(a|b)*a(a|b){20}$",
};

static const char *const sample_keys[] = {
    "",      "a",      "a/1",         "a/7",          "b@team-x",
    "ra/0",  "target", "default-key", "shared@blk-1", "pfx-1.x y#z&~",
    "xaaab", "a)",     ")(",          "w/1",          "aaa",
    "c",     "abcabc", "a.b",         "word. x",      "\x80\xff\n",
    "[",     "]a",     "=",
};

struct refused {
    const char *pattern;
    kvp_key_pattern_refusal_t why;
    const char *says; /* a part of the message */
};

static const struct refused refused[] = {
    {"(a|aa)*\\1$", KVP_PATTERN_BACKREF, "back-reference"},
    {"(a)\\9", KVP_PATTERN_BACKREF, "back-reference"},
    {"((a{1,100}){1,100}){1,100}", KVP_PATTERN_COST, "too costly"},
    {"(((a{1,100}){1,100}){1,100}){1,100}", KVP_PATTERN_COST, "too costly"},
    {"(a{1,100}){1,100}", KVP_PATTERN_COST, "too costly"},
    {"a{10}{10}{10}{10}", KVP_PATTERN_COST, "too costly"},
    {"(((a+)+)+){200}", KVP_PATTERN_COST, "too costly"},
    /* glibc takes minutes to compile copies of a part that may match nothing */
    {"((a?){0,2}){100,}", KVP_PATTERN_COST, "may match nothing"},
    {"(\\w?{2,52}){2,}", KVP_PATTERN_COST, "may match nothing"},
    {"([[:alpha:]]{4,5}|[[:alpha:]]{10,}/{2,7}|\\w?{2,52}){2,}", KVP_PATTERN_COST,
     "may match nothing"},
    {"((^){0,3}){100,}", KVP_PATTERN_COST, "may match nothing"},
    {"((a?){0,40})+", KVP_PATTERN_COST, "may match nothing"},
    /* many optional copies of such a part, nested by glibc: 0.6-0.7 s each (found by the
     * insider fuzzer, tests/insider/insider_fuzz.c) */
    {"(.*){2,246}", KVP_PATTERN_COST, "optional copies"},
    {"(.*){0,246}", KVP_PATTERN_COST, "optional copies"},
    {"(a|){2,246}", KVP_PATTERN_COST, "optional copies"},
    {"a*{2,246}", KVP_PATTERN_COST, "optional copies"},
    {"(a?){2,40}", KVP_PATTERN_COST, "optional copies"},
    {"(((((((((a)))))))))", KVP_PATTERN_NESTING, "nested deeper"},
    {"a{256}", KVP_PATTERN_REPEAT, "over 255"},
    {"a{1,1000}", KVP_PATTERN_REPEAT, "over 255"},
    {"a{99999999999999999999}", KVP_PATTERN_REPEAT, "over 255"},
    {"(", KVP_PATTERN_SYNTAX, "unmatched ("},
    {"[", KVP_PATTERN_SYNTAX, "unmatched ["},
    {"a[", KVP_PATTERN_SYNTAX, "unmatched ["},
    {"[[:alpha:", KVP_PATTERN_SYNTAX, "unterminated"},
    {"*a", KVP_PATTERN_SYNTAX, "nothing to repeat"},
    {"a|+b", KVP_PATTERN_SYNTAX, "nothing to repeat"},
    {"(?:a)", KVP_PATTERN_SYNTAX, "nothing to repeat"},
    {"{1}", KVP_PATTERN_SYNTAX, "nothing to repeat"},
    {"a{x}", KVP_PATTERN_SYNTAX, "bad repetition"},
    {"a{", KVP_PATTERN_SYNTAX, "bad repetition"},
    {"a{}", KVP_PATTERN_SYNTAX, "bad repetition"},
    {"a{3,2}", KVP_PATTERN_SYNTAX, "min over max"},
    {"ab\\", KVP_PATTERN_SYNTAX, "trailing backslash"},
};

static void test_accepted(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(accepted) / sizeof(accepted[0]); i++) {
        char msg[256];
        kvp_key_pattern_refusal_t why = check(accepted[i], msg, sizeof(msg));
        if (why != KVP_PATTERN_OK)
            fail_msg("'%s' refused: %s", accepted[i], msg);
        kvp_key_pattern_t kp;
        why = kvp_key_pattern_init(&kp, accepted[i], msg, sizeof(msg));
        if (why != KVP_PATTERN_OK)
            fail_msg("'%s' does not compile: %s", accepted[i], msg);
        /* as compiled (^.*(P), an unmatched ')' escaped) it matches what P matches */
        regex_t raw;
        assert_int_equal(regcomp(&raw, accepted[i], REG_EXTENDED | REG_NOSUB), 0);
        for (size_t k = 0; k < sizeof(sample_keys) / sizeof(sample_keys[0]); k++) {
            const char *key = sample_keys[k];
            bool want = regexec(&raw, key, 0, NULL, 0) == 0;
            if (kvp_key_pattern_match(&kp, key, strlen(key)) != want)
                fail_msg("'%s' on '%s': glibc says %d", accepted[i], key, want);
        }
        regfree(&raw);
        kvp_key_pattern_cleanup(&kp);
    }
    /* a literal of the longest length allowed */
    char *lit = malloc(KVP_KEY_PATTERN_MAX + 2);
    assert_non_null(lit);
    memset(lit, 'k', KVP_KEY_PATTERN_MAX);
    lit[0] = '^';
    lit[KVP_KEY_PATTERN_MAX - 1] = '$';
    lit[KVP_KEY_PATTERN_MAX] = '\0';
    assert_int_equal(check(lit, NULL, 0), KVP_PATTERN_OK);
    /* one byte more */
    lit[KVP_KEY_PATTERN_MAX] = 'k';
    lit[KVP_KEY_PATTERN_MAX + 1] = '\0';
    char msg[256];
    assert_int_equal(check(lit, msg, sizeof(msg)), KVP_PATTERN_TOO_LONG);
    assert_non_null(strstr(msg, "longer than 1024"));
    free(lit);
}

static void test_refused(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        const struct refused *r = &refused[i];
        char msg[256] = "";
        kvp_key_pattern_refusal_t why = check(r->pattern, msg, sizeof(msg));
        if (why != r->why || strstr(msg, r->says) == NULL)
            fail_msg("'%s': refused as %s ('%s'), want %s ('%s')", r->pattern,
                     kvp_key_pattern_reason(why), msg, kvp_key_pattern_reason(r->why), r->says);
        /* init says the same, the pattern quoted */
        kvp_key_pattern_t kp;
        char msg2[400];
        assert_int_equal(kvp_key_pattern_init(&kp, r->pattern, msg2, sizeof(msg2)), r->why);
        assert_non_null(strstr(msg2, r->says));
        assert_non_null(strstr(msg2, "bad regular expression '"));
    }
    /* regcomp's own refusals come back as syntax */
    kvp_key_pattern_t kp;
    char msg[400];
    assert_int_equal(kvp_key_pattern_init(&kp, "[z-a]", msg, sizeof(msg)), KVP_PATTERN_SYNTAX);
    assert_int_equal(kvp_key_pattern_init(&kp, "^*", msg, sizeof(msg)), KVP_PATTERN_SYNTAX);
    assert_string_equal(kvp_key_pattern_reason(KVP_PATTERN_BACKREF), "backref");
    assert_string_equal(kvp_key_pattern_reason(KVP_PATTERN_WORK), "work");
}

/* ---- a property test of the cost bound ---- */

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(uint32_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

typedef struct gen {
    char *s;
    size_t len, cap;
} gen_t;

static void put(gen_t *g, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(g->s + g->len, g->cap - g->len, fmt, ap);
    va_end(ap);
    if (n > 0)
        g->len = g->len + (size_t)n < g->cap ? g->len + (size_t)n : g->cap - 1;
}

/* A count: mostly small, sometimes near or over the caps. */
static unsigned count(void)
{
    static const unsigned big[] = {0, 1, 2, 3, 5, 10, 20, 50, 100, 200, 255, 256, 1000};
    return rnd(3) == 0 ? big[rnd(sizeof(big) / sizeof(big[0]))] : rnd(6);
}

/* A pattern of the grammar: alternatives of pieces; pieces are characters of a small
 * alphabet, '.', a class, or a group, followed by none or several of * + ? {n} {n,}
 * {n,m}; now and then a back-reference. */
static void gen_alt(gen_t *g, unsigned depth);

static void gen_piece(gen_t *g, unsigned depth)
{
    static const char *const atoms[] = {"a",    "b",    "c",           "/",   ".",
                                        "[ab]", "[^a]", "[[:alpha:]]", "\\-", "\\w"};
    if (depth < 11 && rnd(3) == 0) {
        put(g, "(");
        gen_alt(g, depth + 1);
        put(g, ")");
    } else if (rnd(40) == 0) {
        put(g, "\\%u", 1 + rnd(9));
    } else {
        put(g, "%s", atoms[rnd(sizeof(atoms) / sizeof(atoms[0]))]);
    }
    unsigned ops = rnd(4) == 0 ? rnd(4) : (rnd(2) ? 1 : 0);
    for (unsigned i = 0; i < ops; i++) {
        switch (rnd(6)) {
        case 0:
            put(g, "*");
            break;
        case 1:
            put(g, "+");
            break;
        case 2:
            put(g, "?");
            break;
        case 3:
            put(g, "{%u}", count());
            break;
        case 4:
            put(g, "{%u,}", count());
            break;
        default: {
            unsigned lo = count(), hi = lo + count();
            put(g, "{%u,%u}", lo, hi);
        }
        }
    }
}

static void gen_alt(gen_t *g, unsigned depth)
{
    unsigned branches = 1 + (rnd(4) == 0 ? rnd(3) : 0);
    for (unsigned b = 0; b < branches; b++) {
        if (b > 0)
            put(g, "|");
        unsigned pieces = 1 + rnd(depth == 0 ? 6 : 3);
        for (unsigned i = 0; i < pieces; i++)
            gen_piece(g, depth);
    }
}

#define PROPERTY_PATTERNS 3000
#define PROPERTY_KEYS 24
/* regcomp of any accepted pattern: far under this (milliseconds); the refused ones of row
 * 2 of the issue took seconds and more than a GiB */
#define COMPILE_BOUND_S 0.25

static void random_key(char *key, size_t *len_p)
{
    static const char alphabet[] = "abc/-x";
    size_t len = rnd(40);
    for (size_t i = 0; i < len; i++)
        key[i] = alphabet[rnd(sizeof(alphabet) - 1)];
    key[len] = '\0';
    *len_p = len;
}

static void test_cost_bound_property(void **state)
{
    (void)state;
    char buf[KVP_KEY_PATTERN_MAX + 64];
    unsigned n_accepted = 0, n_by[KVP_PATTERN_REFUSALS] = {0};
    double worst = 0;
    uint32_t worst_cost = 0;
    char worst_pattern[KVP_KEY_PATTERN_MAX + 64] = "";
    for (unsigned t = 0; t < PROPERTY_PATTERNS; t++) {
        gen_t g = {.s = buf, .cap = sizeof(buf)};
        buf[0] = '\0';
        gen_alt(&g, 0);
        uint32_t cost = 0;
        char msg[256];
        kvp_key_pattern_refusal_t why = kvp_key_pattern_check(buf, &cost, msg, sizeof(msg));
        n_by[why]++;
        if (why != KVP_PATTERN_OK) {
            assert_true(msg[0] != '\0');
            continue;
        }
        n_accepted++;
        assert_true(cost <= KVP_KEY_PATTERN_COST_MAX);
        /* no back-reference passes */
        for (const char *p = buf; *p; p++) {
            if (p[0] != '\\')
                continue;
            assert_false(p[1] >= '1' && p[1] <= '9');
            p++;
        }
        kvp_key_pattern_t kp;
        double t0 = now_s();
        why = kvp_key_pattern_init(&kp, buf, msg, sizeof(msg));
        double dt = now_s() - t0;
        if (why != KVP_PATTERN_OK)
            fail_msg("accepted '%s' does not compile: %s", buf, msg);
        if (dt > worst) {
            worst = dt;
            worst_cost = cost;
            snprintf(worst_pattern, sizeof(worst_pattern), "%s", buf);
        }
        if (dt > COMPILE_BOUND_S)
            fail_msg("accepted '%s' (cost %u) took %.3f s to compile", buf, cost, dt);
        /* the search as compiled (^.*(P), unmatched ')' escaped) answers as glibc's own
         * search of P does */
        regex_t raw;
        assert_int_equal(regcomp(&raw, buf, REG_EXTENDED | REG_NOSUB), 0);
        for (unsigned k = 0; k < PROPERTY_KEYS; k++) {
            char key[64];
            size_t len;
            random_key(key, &len);
            bool want = regexec(&raw, key, 0, NULL, 0) == 0;
            if (kvp_key_pattern_match(&kp, key, len) != want)
                fail_msg("'%s' on '%s': glibc says %d", buf, key, want);
        }
        regfree(&raw);
        assert_true(kp.work > 0);
        kvp_key_pattern_cleanup(&kp);
    }
    print_message("%u of %u accepted (refused: syntax %u, backref %u, nesting %u, repeat %u, "
                  "cost %u); slowest compile %.4f s, cost %u: %.80s\n",
                  n_accepted, PROPERTY_PATTERNS, n_by[KVP_PATTERN_SYNTAX],
                  n_by[KVP_PATTERN_BACKREF], n_by[KVP_PATTERN_NESTING], n_by[KVP_PATTERN_REPEAT],
                  n_by[KVP_PATTERN_COST], worst, worst_cost, worst_pattern);
    /* the grammar reaches every side of the bound */
    assert_true(n_accepted > PROPERTY_PATTERNS / 4);
    assert_true(n_by[KVP_PATTERN_COST] > 0);
    assert_true(n_by[KVP_PATTERN_REPEAT] > 0);
    assert_true(n_by[KVP_PATTERN_BACKREF] > 0);
}

/* Patterns at the edge of the budget, built to be slow to compile: each within the bound. */
static void test_costly_but_accepted_compile_fast(void **state)
{
    (void)state;
    static const char *const edge[] = {
        "(x?){255}",
        "((a?){15}){15}",
        "((a*b*){15}){15}",
        "(((a|b)?){8}){25}",
        "(a|b|c|d|e|f|g|h){200}",
        "([[:alpha:]]*[[:digit:]]?){250}",
        "((((a+)+)+)+){100}",
        "(.*){2,34}",
        "(.*){246,}",
        "(.*){200,232}",
        "(ab){0,255}",
        "[a-z]{0,255}",
    };
    for (size_t i = 0; i < sizeof(edge) / sizeof(edge[0]); i++) {
        uint32_t cost = 0;
        char msg[256];
        kvp_key_pattern_refusal_t why = kvp_key_pattern_check(edge[i], &cost, msg, sizeof(msg));
        if (why != KVP_PATTERN_OK)
            continue; /* over the bound: refused, fine */
        kvp_key_pattern_t kp;
        double t0 = now_s();
        assert_int_equal(kvp_key_pattern_init(&kp, edge[i], msg, sizeof(msg)), KVP_PATTERN_OK);
        double dt = now_s() - t0;
        print_message("'%s': cost %u, compiled in %.4f s\n", edge[i], cost, dt);
        assert_true(dt < COMPILE_BOUND_S);
        kvp_key_pattern_cleanup(&kp);
    }
}

#if defined(__SANITIZE_ADDRESS__)
/* AddressSanitizer keeps freed memory in a quarantine (256 MiB by default), so the RSS of
 * test_dfa_cache_bounded would count what the pattern freed at each flush as held: without
 * the quarantine the bound measures what the matcher keeps, as in a normal build. */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "quarantine_size_mb=0";
}
#endif

/* Many DFA states (a count after a loop) fed many different keys: the cache is dropped
 * every kp.flush key bytes, so the process does not grow by more than a bound. */
#define DFA_KEYS 400
#define DFA_KEY_LEN 400

static long maxrss_kib(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

static void test_dfa_cache_bounded(void **state)
{
    (void)state;
    kvp_key_pattern_t kp;
    char msg[256];
    assert_int_equal(kvp_key_pattern_init(&kp, "a[ab]{18}c", msg, sizeof(msg)), KVP_PATTERN_OK);
    long before = maxrss_kib();
    char key[DFA_KEY_LEN];
    unsigned hits = 0;
    double t0 = now_s();
    for (unsigned k = 0; k < DFA_KEYS; k++) {
        for (size_t i = 0; i < sizeof(key); i++)
            key[i] = rnd(2) ? 'a' : 'b';
        hits += kvp_key_pattern_match(&kp, key, sizeof(key));
    }
    double dt = now_s() - t0;
    long grown = maxrss_kib() - before;
    print_message("%u keys of %u bytes: %.3f s, max RSS grew %ld KiB (flush every %llu bytes)\n",
                  DFA_KEYS, DFA_KEY_LEN, dt, grown, (unsigned long long)kp.flush);
    assert_int_equal(hits, 0);
    assert_false(kp.failed);
    assert_true(grown < 256 * 1024);
    assert_int_equal(kp.work, (uint64_t)DFA_KEYS * (DFA_KEY_LEN + 1) * kp.cost);
    kvp_key_pattern_cleanup(&kp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accepted),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_cost_bound_property),
        cmocka_unit_test(test_costly_but_accepted_compile_fast),
        cmocka_unit_test(test_dfa_cache_bounded),
    };
    return cmocka_run_group_tests_name("key_pattern", tests, NULL, NULL);
}
