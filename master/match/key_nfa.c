/*
 * key_nfa.c - the matcher of key patterns: a Thompson NFA, run as a set of states.
 *
 * A pattern that key_pattern.c has checked (no back-references, bounded nesting, counts
 * and written-out size) is compiled here, in one pass and in time linear in what it builds,
 * into a small program (Thompson 1968; Pike's VM as in Cox, "Regular Expression Matching
 * Can Be Simple And Fast"): BYTE, SET (a 256-bit byte set), ANY, SPLIT, JMP, ASSERT (^ $ \b
 * \B \< \> \` \') and MATCH. The compile also refuses the syntax that the check lets
 * through and glibc's regcomp would refuse (a backwards range, an unknown class, a repeated
 * anchor), in glibc's words; no regex library is called. A key is matched by running every
 * thread at once: at each key position the threads are a set in which an instruction is
 * added at most once, so one key byte costs at most one visit of each instruction, O(key
 * length x program size) in all for every pattern. Nothing backtracks, no DFA cache grows,
 * nothing is allocated per key.
 *
 * Semantics are those of glibc's regexec(REG_EXTENDED | REG_NOSUB) in the C locale without
 * REG_NEWLINE (only the unit tests call glibc, to compare the two on random patterns and
 * keys): a search anywhere in the key (the start thread joins at every position), '.' and
 * [^...] match every byte but NUL (keys hold none), ^ and $ only at the key's ends, \w \W
 * \s \S as GNU has them, and a bracket's classes, ranges, [.c.] and [=c=] in byte order.
 * Only whether a match exists is asked, so threads need no priorities and the first MATCH
 * ends it.
 *
 * x{n,m} is written out as n copies of x, then m - n optional ones (x{n,}: n copies, the
 * last looping), so the program is about as large as the written-out size key_pattern.c
 * bounds. Repetitions stacked on one atom are first composed where that is exact (* + ?
 * compose into one of them; {1} goes; {0} makes the piece empty).
 *
 * Thread: any; one kvp_nfa_t is used by one thread at a time.
 */
#include "master/match/key_nfa.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { OP_BYTE, OP_SET, OP_ANY, OP_SPLIT, OP_JMP, OP_ASSERT, OP_MATCH };
enum { AT_BOL, AT_EOL, AT_WORD_EDGE, AT_NOT_WORD_EDGE, AT_WORD_START, AT_WORD_END };

struct kvp_nfa_inst {
    uint8_t op;
    uint8_t arg;   /* BYTE: the byte; ASSERT: what */
    uint32_t x, y; /* SPLIT: both ways; JMP: x; SET: x, the set */
};

#define NONE UINT32_MAX
#define OPS_MAX 48u /* repetitions stacked on one atom, once composed */

typedef struct comp {
    kvp_nfa_t *nfa;
    const char *s;
    size_t at;
    uint32_t *set_of; /* per byte of s: the set its bracket compiled to, NONE: not yet */
    bool bad;         /* out of memory, over the size, or syntax glibc refuses */
    const char *why;  /* ... which, in glibc's words where it is syntax */
} comp_t;

static void fail(comp_t *c, const char *why)
{
    if (!c->bad)
        c->why = why;
    c->bad = true;
}

#define E_MEMORY "out of memory"
#define E_SIZE "the pattern compiles to too many instructions"
#define E_BRACKET "Unmatched [, [^, [:, [., or [="
#define E_RANGE "Invalid range end"
#define E_COLLATE "Invalid collation character"
#define E_CLASS "Invalid character class name"
#define E_REPEAT "Invalid preceding regular expression"

/* ---- building the program ---- */

static uint32_t emit(comp_t *c, uint8_t op, uint8_t arg, uint32_t x, uint32_t y)
{
    kvp_nfa_t *m = c->nfa;
    if (c->bad)
        return 0;
    if (m->n == m->cap) {
        uint32_t cap = m->cap ? m->cap * 2 : 64;
        if (cap > KVP_NFA_INSTS_MAX) {
            fail(c, E_SIZE);
            return 0;
        }
        kvp_nfa_inst_t *p = realloc(m->prog, cap * sizeof(*p));
        if (p == NULL) {
            fail(c, E_MEMORY);
            return 0;
        }
        m->prog = p;
        m->cap = cap;
    }
    m->prog[m->n] = (kvp_nfa_inst_t){.op = op, .arg = arg, .x = x, .y = y};
    return m->n++;
}

/* A new, empty byte set; NULL (c->bad) when none can be had. */
static uint64_t *new_set(comp_t *c, uint32_t *index_p)
{
    kvp_nfa_t *m = c->nfa;
    if (c->bad)
        return NULL;
    if (m->n_sets == m->sets_cap) {
        uint32_t cap = m->sets_cap ? m->sets_cap * 2 : 8;
        if (cap > KVP_NFA_INSTS_MAX) {
            fail(c, E_SIZE);
            return NULL;
        }
        uint64_t(*p)[4] = realloc(m->sets, cap * sizeof(*p));
        if (p == NULL) {
            fail(c, E_MEMORY);
            return NULL;
        }
        m->sets = p;
        m->sets_cap = cap;
    }
    *index_p = m->n_sets;
    memset(m->sets[m->n_sets], 0, sizeof(m->sets[0]));
    return m->sets[m->n_sets++];
}

static void set_add(uint64_t *set, unsigned b)
{
    set[b >> 6] |= 1ull << (b & 63);
}

static bool set_has(const uint64_t *set, unsigned b)
{
    return (set[b >> 6] >> (b & 63)) & 1u;
}

/* The C locale's classes, on bytes (none above 0x7f is in any). */
static const char *const class_names[] = {"alpha", "upper", "lower", "digit", "xdigit", "alnum",
                                          "space", "blank", "print", "graph", "punct",  "cntrl"};
#define N_CLASSES (sizeof(class_names) / sizeof(class_names[0]))

static bool in_class(size_t which, unsigned b)
{
    bool upper = b >= 'A' && b <= 'Z', lower = b >= 'a' && b <= 'z', digit = b >= '0' && b <= '9';
    bool alpha = upper || lower, print = b >= 0x20 && b < 0x7f;
    switch (which) {
    case 0:
        return alpha;
    case 1:
        return upper;
    case 2:
        return lower;
    case 3:
        return digit;
    case 4:
        return digit || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F');
    case 5:
        return alpha || digit;
    case 6:
        return b == ' ' || (b >= '\t' && b <= '\r');
    case 7:
        return b == ' ' || b == '\t';
    case 8:
        return print;
    case 9:
        return print && b != ' ';
    case 10:
        return print && b != ' ' && !alpha && !digit;
    default:
        return b < 0x20 || b == 0x7f;
    }
}

static bool is_word(unsigned b)
{
    return (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') || (b >= '0' && b <= '9') || b == '_';
}

/* [.c.] or [=c=] at c->at (one byte in the C locale): the byte; -1 (refused) else. */
static int bracket_symbol(comp_t *c)
{
    const char *s = c->s;
    char kind = s[c->at + 1];
    const char *body = s + c->at + 2, *end = NULL;
    for (const char *q = body; *q != '\0'; q++)
        if (q[0] == kind && q[1] == ']' && q > body) {
            end = q;
            break;
        }
    if (end == NULL) {
        fail(c, E_BRACKET);
        return -1;
    }
    if (end - body != 1) {
        fail(c, E_COLLATE);
        return -1;
    }
    c->at = (size_t)(end - s) + 2;
    return (unsigned char)body[0];
}

/* A [:class:] at c->at into bits. */
static void bracket_class(comp_t *c, uint64_t *bits)
{
    const char *name = c->s + c->at + 2, *end = strstr(name, ":]");
    if (end == NULL) {
        fail(c, E_BRACKET);
        return;
    }
    size_t len = (size_t)(end - name), which = 0;
    while (which < N_CLASSES &&
           (strlen(class_names[which]) != len || memcmp(class_names[which], name, len) != 0))
        which++;
    if (which == N_CLASSES)
        fail(c, E_CLASS);
    for (unsigned b = 0; b < 256 && which < N_CLASSES; b++)
        if (in_class(which, b))
            set_add(bits, b);
    c->at = (size_t)(end - c->s) + 2;
}

/* A range's end at c->at: a byte or [.c.]; a class or [=c=] there is refused. */
static int range_end(comp_t *c)
{
    const char *s = c->s;
    if (s[c->at] == '[' && (s[c->at + 1] == ':' || s[c->at + 1] == '=')) {
        fail(c, E_RANGE);
        return -1;
    }
    if (s[c->at] == '[' && s[c->at + 1] == '.')
        return bracket_symbol(c);
    return (unsigned char)s[c->at++];
}

/*
 * A bracket expression from its '[' (c->at) into set (NULL: only skip it), by glibc's
 * rules in the C locale: ']' first is a byte; '-' first, last or as a range's end is a
 * byte and anywhere else starts a range (a class or [=c=] may not be one's end or start,
 * a range may not run backwards); a backslash is a byte.
 */
static void parse_bracket(comp_t *c, uint64_t *set)
{
    const char *s = c->s;
    c->at++;
    bool negate = s[c->at] == '^';
    if (negate)
        c->at++;
    uint64_t bits[4] = {0, 0, 0, 0};
    for (bool first = true; !c->bad; first = false) {
        char ch = s[c->at];
        if (ch == ']' && !first) {
            c->at++;
            break;
        }
        if (ch == '\0') {
            fail(c, E_BRACKET);
            break;
        }
        bool range_after = true; /* may a '-' after it start a range? */
        int lo = -1;
        if (ch == '[' && s[c->at + 1] == ':') {
            bracket_class(c, bits);
            range_after = false;
        } else if (ch == '[' && (s[c->at + 1] == '.' || s[c->at + 1] == '=')) {
            range_after = s[c->at + 1] == '.';
            lo = bracket_symbol(c);
        } else if (ch == '-' && !first && s[c->at + 1] != ']') {
            fail(c, E_RANGE); /* [a-c-e], [ab-c-] */
        } else {
            lo = (unsigned char)ch;
            c->at++;
        }
        if (c->bad)
            break;
        int hi = lo;
        if (s[c->at] == '-' && s[c->at + 1] != ']' && s[c->at + 1] != '\0') {
            if (!range_after) {
                fail(c, E_RANGE);
                break;
            }
            c->at++;
            hi = range_end(c);
            if (!c->bad && hi < lo)
                fail(c, E_RANGE);
        }
        for (int b = lo; b <= hi && b >= 0 && !c->bad; b++)
            set_add(bits, (unsigned)b);
    }
    if (set == NULL)
        return;
    for (unsigned w = 0; w < 4; w++)
        set[w] = negate ? ~bits[w] : bits[w];
    set[0] &= ~1ull; /* NUL: never */
}

static void emit_set_of(comp_t *c, bool (*pred)(unsigned), bool negate)
{
    uint32_t index = 0;
    uint64_t *set = new_set(c, &index);
    if (set == NULL)
        return;
    for (unsigned b = 1; b < 256; b++)
        if (pred(b) != negate)
            set_add(set, b);
    emit(c, OP_SET, 0, index, 0);
}

static bool is_space(unsigned b)
{
    return b == ' ' || (b >= '\t' && b <= '\r');
}

static void compile_alt(comp_t *c, unsigned depth);

/* An escape at c->at ('\\' then one byte). */
static void compile_escape(comp_t *c)
{
    char e = c->s[c->at + 1];
    c->at += 2;
    switch (e) {
    case 'w':
    case 'W':
        emit_set_of(c, is_word, e == 'W');
        break;
    case 's':
    case 'S':
        emit_set_of(c, is_space, e == 'S');
        break;
    case 'b':
        emit(c, OP_ASSERT, AT_WORD_EDGE, 0, 0);
        break;
    case 'B':
        emit(c, OP_ASSERT, AT_NOT_WORD_EDGE, 0, 0);
        break;
    case '<':
        emit(c, OP_ASSERT, AT_WORD_START, 0, 0);
        break;
    case '>':
        emit(c, OP_ASSERT, AT_WORD_END, 0, 0);
        break;
    case '`':
        emit(c, OP_ASSERT, AT_BOL, 0, 0);
        break;
    case '\'':
        emit(c, OP_ASSERT, AT_EOL, 0, 0);
        break;
    case '\0':
        fail(c, "Trailing backslash");
        break;
    default: /* any other escaped byte is itself */
        emit(c, OP_BYTE, (uint8_t)e, 0, 0);
        break;
    }
}

/* One atom at c->at: a group, a bracket, an escape, '.', an anchor or a byte. */
static void compile_atom(comp_t *c, unsigned depth)
{
    const char *s = c->s;
    switch (s[c->at]) {
    case '(':
        c->at++;
        compile_alt(c, depth + 1);
        if (s[c->at] != ')')
            fail(c, "Unmatched ( or \\(");
        else
            c->at++;
        break;
    case '[': { /* the copies of a repeated bracket share its set */
        size_t at = c->at;
        uint32_t index = c->set_of[at];
        if (index == NONE) {
            uint64_t *set = new_set(c, &index);
            parse_bracket(c, set);
            c->set_of[at] = c->bad ? NONE : index;
        } else {
            parse_bracket(c, NULL);
        }
        emit(c, OP_SET, 0, index, 0);
        break;
    }
    case '\\':
        compile_escape(c);
        break;
    case '.':
        c->at++;
        emit(c, OP_ANY, 0, 0, 0);
        break;
    case '^':
        c->at++;
        emit(c, OP_ASSERT, AT_BOL, 0, 0);
        break;
    case '$':
        c->at++;
        emit(c, OP_ASSERT, AT_EOL, 0, 0);
        break;
    default:
        emit(c, OP_BYTE, (uint8_t)s[c->at++], 0, 0);
        break;
    }
}

/* A repetition: at least lo, at most hi (-1: no bound) copies. */
typedef struct rep {
    long lo, hi;
} rep_t;

/* {n}, {n,}, {,m}, {n,m} at c->at (checked already). */
static rep_t parse_interval(comp_t *c)
{
    const char *s = c->s;
    rep_t r = {-1, -1};
    c->at++;
    for (; s[c->at] >= '0' && s[c->at] <= '9'; c->at++)
        r.lo = (r.lo < 0 ? 0 : r.lo) * 10 + (s[c->at] - '0');
    r.hi = r.lo;
    if (s[c->at] == ',') {
        c->at++;
        r.hi = -1;
        for (; s[c->at] >= '0' && s[c->at] <= '9'; c->at++)
            r.hi = (r.hi < 0 ? 0 : r.hi) * 10 + (s[c->at] - '0');
        if (r.lo < 0)
            r.lo = 0;
    }
    if (r.lo < 0 || s[c->at] != '}' || r.lo > 1000 || r.hi > 1000 || (r.hi >= 0 && r.hi < r.lo))
        fail(c, "Invalid content of \\{\\}");
    c->at++;
    return r;
}

/* * + and ? (and the intervals equal to them): they compose into one of them. */
static bool simple(rep_t r)
{
    return (r.lo == 0 && r.hi == 1) || (r.lo <= 1 && r.hi < 0);
}

/* The repetitions after an atom into ops (composed); their count, or -1: one was {0}. */
static int parse_ops(comp_t *c, rep_t *ops)
{
    unsigned n = 0;
    bool empty = false;
    for (;;) {
        char ch = c->s[c->at];
        rep_t r;
        if (ch == '*' || ch == '+' || ch == '?') {
            c->at++;
            r = (rep_t){ch == '+' ? 1 : 0, ch == '?' ? 1 : -1};
        } else if (ch == '{') {
            r = parse_interval(c);
        } else {
            break;
        }
        if (r.lo == 1 && r.hi == 1)
            continue;
        if (r.hi == 0)
            empty = true;
        if (n > 0 && simple(ops[n - 1]) && simple(r)) {
            rep_t *o = &ops[n - 1];
            o->hi = o->hi < 0 || r.hi < 0 ? -1 : o->hi * r.hi;
            o->lo = o->lo * r.lo;
            continue;
        }
        if (n == OPS_MAX) {
            fail(c, E_SIZE);
            break;
        }
        ops[n++] = r;
    }
    return empty ? -1 : (int)n;
}

/* The atom at atom_at with the first k of ops applied to it. */
static void emit_rep(comp_t *c, size_t atom_at, unsigned depth, const rep_t *ops, unsigned k)
{
    if (k == 0) {
        c->at = atom_at;
        compile_atom(c, depth);
        return;
    }
    rep_t r = ops[k - 1];
    uint32_t last = NONE;
    for (long i = 0; i < r.lo && !c->bad; i++) {
        last = c->nfa->n;
        emit_rep(c, atom_at, depth, ops, k - 1);
    }
    if (r.hi < 0) {
        if (last != NONE) { /* x{n,}: the last copy loops */
            emit(c, OP_SPLIT, 0, last, c->nfa->n + 1);
            return;
        }
        uint32_t split = emit(c, OP_SPLIT, 0, c->nfa->n + 1, NONE);
        emit_rep(c, atom_at, depth, ops, k - 1);
        emit(c, OP_JMP, 0, split, 0);
        if (!c->bad)
            c->nfa->prog[split].y = c->nfa->n;
        return;
    }
    /* the optional copies, each a way out to the end: the SPLITs chained through y */
    uint32_t chain = NONE;
    for (long i = r.lo; i < r.hi && !c->bad; i++) {
        chain = emit(c, OP_SPLIT, 0, c->nfa->n + 1, chain);
        emit_rep(c, atom_at, depth, ops, k - 1);
    }
    while (!c->bad && chain != NONE) {
        uint32_t up = c->nfa->prog[chain].y;
        c->nfa->prog[chain].y = c->nfa->n;
        chain = up;
    }
}

static void compile_piece(comp_t *c, unsigned depth)
{
    size_t atom_at = c->at;
    uint32_t n0 = c->nfa->n;
    compile_atom(c, depth);
    char after = c->s[c->at];
    bool op_after = after == '*' || after == '+' || after == '?' || after == '{';
    if (op_after && !c->bad && c->s[atom_at] != '(' && c->nfa->n == n0 + 1 &&
        c->nfa->prog[n0].op == OP_ASSERT) {
        fail(c, E_REPEAT); /* glibc: ^* $+ \b? are refused; (^)* is not */
        return;
    }
    rep_t ops[OPS_MAX];
    int n_ops = parse_ops(c, ops);
    if (n_ops == 0 || c->bad)
        return;
    size_t end = c->at;
    c->nfa->n = n0; /* the single copy goes; the repetition writes its own (sets stay) */
    if (n_ops > 0)
        emit_rep(c, atom_at, depth, ops, (unsigned)n_ops);
    c->at = end;
}

/* Does the branch at c->at end at a '|' (more branches follow)? */
static bool branch_then_bar(comp_t *c, unsigned depth)
{
    size_t at = c->at;
    unsigned open = 0;
    bool bad = c->bad;
    for (;;) {
        char ch = c->s[c->at];
        bool stop = ch == '\0' || (ch == '|' && open == 0) || (ch == ')' && open == 0 && depth > 0);
        if (stop || c->bad) {
            c->at = at;
            c->bad = bad;
            return ch == '|';
        }
        if (ch == '\\' && c->s[c->at + 1] != '\0') {
            c->at += 2;
        } else if (ch == '[') {
            parse_bracket(c, NULL);
        } else {
            open += ch == '(';
            open -= ch == ')' && open > 0;
            c->at++;
        }
    }
}

/* Branches separated by '|', up to the end or (inside a group) its ')'. */
static void compile_alt(comp_t *c, unsigned depth)
{
    uint32_t exits = NONE; /* the JMPs to the end, chained through x */
    for (;;) {
        bool more = branch_then_bar(c, depth);
        uint32_t split = more ? emit(c, OP_SPLIT, 0, c->nfa->n + 1, NONE) : NONE;
        for (;;) {
            char ch = c->s[c->at];
            if (c->bad || ch == '\0' || ch == '|' || (ch == ')' && depth > 0))
                break;
            compile_piece(c, depth);
        }
        if (!more || c->bad)
            break;
        exits = emit(c, OP_JMP, 0, exits, 0);
        c->at++; /* the '|' */
        if (!c->bad)
            c->nfa->prog[split].y = c->nfa->n;
    }
    while (!c->bad && exits != NONE) {
        uint32_t up = c->nfa->prog[exits].x;
        c->nfa->prog[exits].x = c->nfa->n;
        exits = up;
    }
}

bool kvp_nfa_compile(kvp_nfa_t *nfa, const char *pattern, char *why, size_t why_len)
{
    memset(nfa, 0, sizeof(*nfa));
    size_t len = strlen(pattern);
    comp_t c = {.nfa = nfa, .s = pattern, .set_of = malloc((len + 1) * sizeof(uint32_t))};
    if (c.set_of == NULL) {
        if (why_len > 0)
            snprintf(why, why_len, "%s", E_MEMORY);
        return false;
    }
    memset(c.set_of, 0xff, (len + 1) * sizeof(uint32_t)); /* NONE */
    compile_alt(&c, 0);
    if (pattern[c.at] != '\0')
        fail(&c, "Unmatched ) or \\)");
    emit(&c, OP_MATCH, 0, 0, 0);
    free(c.set_of);
    if (!c.bad) {
        size_t n = nfa->n;
        nfa->mark = calloc(n, sizeof(uint32_t));
        nfa->cur = malloc(n * sizeof(uint32_t));
        nfa->next = malloc(n * sizeof(uint32_t));
        nfa->stack = malloc((2 * n + 2) * sizeof(uint32_t));
        if (nfa->mark == NULL || nfa->cur == NULL || nfa->next == NULL || nfa->stack == NULL)
            fail(&c, E_MEMORY);
    }
    if (c.bad) {
        if (why_len > 0)
            snprintf(why, why_len, "%s", c.why);
        kvp_nfa_free(nfa);
        return false;
    }
    return true;
}

void kvp_nfa_free(kvp_nfa_t *nfa)
{
    free(nfa->prog);
    free(nfa->sets);
    free(nfa->mark);
    free(nfa->cur);
    free(nfa->next);
    free(nfa->stack);
    memset(nfa, 0, sizeof(*nfa));
}

/* ---- running it ---- */

static bool holds(uint8_t what, const uint8_t *key, size_t len, size_t i)
{
    bool before = i > 0 && is_word(key[i - 1]), after = i < len && is_word(key[i]);
    switch (what) {
    case AT_BOL:
        return i == 0;
    case AT_EOL:
        return i == len;
    case AT_WORD_EDGE:
        return before != after;
    case AT_NOT_WORD_EDGE:
        return before == after;
    case AT_WORD_START:
        return !before && after;
    default: /* AT_WORD_END */
        return before && !after;
    }
}

/* Add pc and what it reaches without a byte to list, at key position i; true: MATCH. */
static bool add(kvp_nfa_t *m, uint32_t *list, uint32_t *n_p, uint32_t pc, const uint8_t *key,
                size_t len, size_t i)
{
    uint32_t top = 0;
    bool hit = false;
    m->stack[top++] = pc;
    while (top > 0) {
        pc = m->stack[--top];
        if (m->mark[pc] == m->step)
            continue;
        m->mark[pc] = m->step;
        m->visits++;
        const kvp_nfa_inst_t *in = &m->prog[pc];
        switch (in->op) {
        case OP_JMP:
            m->stack[top++] = in->x;
            break;
        case OP_SPLIT:
            m->stack[top++] = in->y;
            m->stack[top++] = in->x;
            break;
        case OP_ASSERT:
            if (holds(in->arg, key, len, i))
                m->stack[top++] = pc + 1;
            break;
        case OP_MATCH:
            hit = true;
            break;
        default:
            list[(*n_p)++] = pc;
            break;
        }
    }
    return hit;
}

static void next_step(kvp_nfa_t *m)
{
    if (++m->step == 0) {
        memset(m->mark, 0, m->n * sizeof(uint32_t));
        m->step = 1;
    }
}

int kvp_nfa_match(kvp_nfa_t *m, const char *key_chars, size_t len, uint64_t max_visits)
{
    const uint8_t *key = (const uint8_t *)key_chars;
    uint32_t *cur = m->cur, *next = m->next, n_cur = 0;
    uint64_t stop = max_visits > UINT64_MAX - m->visits ? UINT64_MAX : m->visits + max_visits;
    next_step(m);
    if (add(m, cur, &n_cur, 0, key, len, 0))
        return 1;
    for (size_t i = 0; i < len; i++) {
        if (m->visits > stop)
            return -1;
        uint8_t b = key[i];
        uint32_t n_next = 0;
        next_step(m);
        for (uint32_t t = 0; t < n_cur; t++) {
            const kvp_nfa_inst_t *in = &m->prog[cur[t]];
            bool ok = in->op == OP_ANY    ? b != 0
                      : in->op == OP_BYTE ? b == in->arg
                                          : set_has(m->sets[in->x], b);
            if (ok && add(m, next, &n_next, cur[t] + 1, key, len, i + 1))
                return 1;
        }
        if (add(m, next, &n_next, 0, key, len, i + 1))
            return 1;
        uint32_t *swap = cur;
        cur = next;
        next = swap;
        n_cur = n_next;
    }
    return 0;
}
