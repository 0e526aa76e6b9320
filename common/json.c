/*
 * json.c - a strict JSON tokenizer (json.h): RFC 8259 values, iteratively (an explicit
 * stack of at most KVP_JSON_DEPTH_MAX open containers), into one token array. Strings
 * are checked (escapes, no control characters) when parsed and unescaped only when read;
 * numbers are checked against the grammar and read from their text, never as doubles.
 *
 * Thread: any.
 */
#include "common/json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/parse.h"

typedef struct parser {
    const char *s;
    size_t len, at;
    kvp_json_t *j;
    uint32_t cap;
} parser_t;

static void ws(parser_t *p)
{
    while (p->at < p->len && (p->s[p->at] == ' ' || p->s[p->at] == '\t' || p->s[p->at] == '\n' ||
                              p->s[p->at] == '\r'))
        p->at++;
}

/* A string at p->at (its opening quote): its body's bounds. */
static bool string(parser_t *p, uint32_t *start, uint32_t *end)
{
    p->at++;
    *start = (uint32_t)p->at;
    while (p->at < p->len) {
        unsigned char c = (unsigned char)p->s[p->at];
        if (c == '"') {
            *end = (uint32_t)p->at;
            p->at++;
            return true;
        }
        if (c < 0x20)
            return false;
        if (c == '\\') {
            if (p->at + 1 >= p->len)
                return false;
            char e = p->s[p->at + 1];
            if (e == 'u') {
                if (p->at + 5 >= p->len)
                    return false;
                for (int i = 2; i < 6; i++)
                    if (kvp_parse_hex_digit(p->s[p->at + i]) < 0)
                        return false;
                p->at += 6;
                continue;
            }
            if (strchr("\"\\/bfnrt", e) == NULL || e == '\0')
                return false;
            p->at += 2;
            continue;
        }
        p->at++;
    }
    return false;
}

static bool number(parser_t *p)
{
    size_t a = p->at;
    if (p->at < p->len && p->s[p->at] == '-')
        p->at++;
    if (p->at >= p->len)
        return false;
    if (p->s[p->at] == '0') {
        p->at++;
    } else if (p->s[p->at] >= '1' && p->s[p->at] <= '9') {
        while (p->at < p->len && p->s[p->at] >= '0' && p->s[p->at] <= '9')
            p->at++;
    } else {
        return false;
    }
    if (p->at < p->len && p->s[p->at] == '.') {
        p->at++;
        size_t d = p->at;
        while (p->at < p->len && p->s[p->at] >= '0' && p->s[p->at] <= '9')
            p->at++;
        if (p->at == d)
            return false;
    }
    if (p->at < p->len && (p->s[p->at] == 'e' || p->s[p->at] == 'E')) {
        p->at++;
        if (p->at < p->len && (p->s[p->at] == '+' || p->s[p->at] == '-'))
            p->at++;
        size_t d = p->at;
        while (p->at < p->len && p->s[p->at] >= '0' && p->s[p->at] <= '9')
            p->at++;
        if (p->at == d)
            return false;
    }
    return p->at > a;
}

static bool is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* After a number in an array: the numbers that follow it (", 12, 7"), each a token, in a
 * loop of their own (a body of token ids holds tens of thousands of them, and the main
 * loop's bookkeeping per value cost more than reading them). It stops before anything
 * else (a ']', a value that is no number, a malformed one, the token array full), at the
 * ',' it did not take: the main loop goes on from there, and says what is wrong. */
static void number_run(parser_t *p, kvp_json_tok_t *open)
{
    kvp_json_t *j = p->j;
    const char *s = p->s;
    for (;;) {
        size_t at = p->at;
        while (at < p->len && is_ws(s[at]))
            at++;
        if (at >= p->len || s[at] != ',')
            return;
        at++;
        while (at < p->len && is_ws(s[at]))
            at++;
        if (at >= p->len || !(s[at] == '-' || (s[at] >= '0' && s[at] <= '9')) || j->n == p->cap)
            return;
        size_t before = p->at;
        p->at = at;
        if (!number(p)) {
            p->at = before;
            return;
        }
        kvp_json_tok_t *t = &j->t[j->n];
        *t = (kvp_json_tok_t){
            .type = KVP_J_NUMBER, .start = (uint32_t)at, .end = (uint32_t)p->at, .next = j->n + 1};
        j->n++;
        open->size++;
    }
}

static bool lit(parser_t *p, const char *w)
{
    size_t n = strlen(w);
    if (p->len - p->at < n || memcmp(p->s + p->at, w, n) != 0)
        return false;
    p->at += n;
    return true;
}

/* A value that is no container at p->at (its first character c) into t (start set). */
static bool scalar(parser_t *p, char c, kvp_json_tok_t *t)
{
    if (c == '"') {
        t->type = KVP_J_STRING;
        return string(p, &t->start, &t->end); /* the body's bounds, without the quotes */
    }
    if (c == 't' && lit(p, "true"))
        t->type = KVP_J_TRUE;
    else if (c == 'f' && lit(p, "false"))
        t->type = KVP_J_FALSE;
    else if (c == 'n' && lit(p, "null"))
        t->type = KVP_J_NULL;
    else if (number(p))
        t->type = KVP_J_NUMBER;
    else
        return false;
    t->end = (uint32_t)p->at;
    return true;
}

kvp_json_rc_t kvp_json_parse(kvp_json_t *j, const char *text, size_t len, char *why, size_t why_len)
{
    memset(j, 0, sizeof(*j));
    j->text = text;
    if (len >= UINT32_MAX) {
        snprintf(why, why_len, "the body is too long");
        return KVP_JSON_TOO_BIG;
    }
    /* every value but the first has a byte before it that is not its own (a ',', a ':',
     * its container's opening bracket) and a byte of its own: v values take 2v - 1 bytes
     * at least, so no more than len / 2 + 1 tokens */
    uint32_t most = (uint32_t)(len / 2 + 2);
    uint32_t cap = most < KVP_JSON_TOKENS_MAX ? most : KVP_JSON_TOKENS_MAX;
    j->t = malloc((size_t)cap * sizeof(*j->t));
    if (j->t == NULL) {
        snprintf(why, why_len, "out of memory");
        return KVP_JSON_NOMEM;
    }
    parser_t p = {.s = text, .len = len, .j = j, .cap = cap};
    uint32_t stack[KVP_JSON_DEPTH_MAX];
    unsigned depth = 0;
    bool want_value = true; /* else: a ',' or a closing bracket */
    bool want_key = false;  /* in an object, before its ':' */
    for (;;) {
        ws(&p);
        if (want_value) {
            if (p.at >= p.len)
                goto bad;
            char c = text[p.at];
            if (depth > 0 && !want_key && j->t[stack[depth - 1]].type == KVP_J_OBJECT && c == '}' &&
                j->t[stack[depth - 1]].size == 0) {
                want_value = false; /* "{}" */
                continue;
            }
            if (depth > 0 && j->t[stack[depth - 1]].type == KVP_J_ARRAY && c == ']' &&
                j->t[stack[depth - 1]].size == 0) {
                want_value = false; /* "[]" */
                continue;
            }
            if (j->n == cap) {
                snprintf(why, why_len, "more than %u values", KVP_JSON_TOKENS_MAX);
                return KVP_JSON_TOO_BIG;
            }
            kvp_json_tok_t *t = &j->t[j->n];
            memset(t, 0, sizeof(*t));
            t->start = (uint32_t)p.at;
            if (want_key) {
                if (c != '"' || !string(&p, &t->start, &t->end))
                    goto bad;
                t->type = KVP_J_STRING;
                t->next = ++j->n;
                ws(&p);
                if (p.at >= p.len || text[p.at] != ':')
                    goto bad;
                p.at++;
                want_key = false;
                continue; /* its value */
            }
            if (depth > 0)
                j->t[stack[depth - 1]].size += j->t[stack[depth - 1]].type == KVP_J_ARRAY;
            if (c == '{' || c == '[') {
                if (depth == KVP_JSON_DEPTH_MAX) {
                    snprintf(why, why_len, "nested deeper than %u", KVP_JSON_DEPTH_MAX);
                    return KVP_JSON_TOO_BIG;
                }
                t->type = c == '{' ? KVP_J_OBJECT : KVP_J_ARRAY;
                p.at++;
                stack[depth++] = j->n++;
                want_key = c == '{';
                if (want_key) { /* "{}" or a first key */
                    ws(&p);
                    if (p.at < p.len && text[p.at] == '}') {
                        want_key = false;
                        want_value = false;
                    } else {
                        t->size++;
                    }
                }
                continue;
            }
            if (!scalar(&p, c, t))
                goto bad;
            t->next = ++j->n;
            want_value = false;
            if (depth == 0)
                break;
            if (t->type == KVP_J_NUMBER && j->t[stack[depth - 1]].type == KVP_J_ARRAY)
                number_run(&p, &j->t[stack[depth - 1]]);
            continue;
        }
        /* after a value: ',' or the container's end */
        if (depth == 0)
            break;
        if (p.at >= p.len)
            goto bad;
        kvp_json_tok_t *open = &j->t[stack[depth - 1]];
        char c = text[p.at++];
        if (c == ',') {
            want_value = true;
            if (open->type == KVP_J_OBJECT) {
                want_key = true;
                open->size++;
            }
            continue;
        }
        if ((open->type == KVP_J_OBJECT && c != '}') || (open->type == KVP_J_ARRAY && c != ']'))
            goto bad;
        open->end = (uint32_t)p.at;
        open->next = j->n;
        depth--;
        if (depth == 0)
            break;
    }
    ws(&p);
    if (p.at != p.len)
        goto bad;
    return KVP_JSON_OK;
bad:
    snprintf(why, why_len, "malformed JSON at byte %zu", p.at);
    return KVP_JSON_BAD;
}

void kvp_json_free(kvp_json_t *j)
{
    free(j->t);
    memset(j, 0, sizeof(*j));
}

int64_t kvp_json_get(const kvp_json_t *j, uint32_t obj, const char *key)
{
    if (obj >= j->n || j->t[obj].type != KVP_J_OBJECT)
        return -1;
    size_t klen = strlen(key);
    uint32_t k = obj + 1;
    for (uint32_t i = 0; i < j->t[obj].size && k < j->n; i++) {
        const kvp_json_tok_t *kt = &j->t[k];
        uint32_t v = kt->next;
        if (v >= j->n)
            return -1;
        if (kt->end - kt->start == klen && memcmp(j->text + kt->start, key, klen) == 0)
            return v;
        k = j->t[v].next;
    }
    return -1;
}

bool kvp_json_str(const kvp_json_t *j, uint32_t tok, char *out, size_t cap)
{
    if (tok >= j->n || j->t[tok].type != KVP_J_STRING || cap == 0)
        return false;
    const char *s = j->text + j->t[tok].start, *e = j->text + j->t[tok].end;
    size_t n = 0;
    while (s < e) {
        unsigned cp;
        if (*s != '\\') {
            cp = (unsigned char)*s++;
            if (n + 1 >= cap)
                return false;
            out[n++] = (char)cp;
            continue;
        }
        char x = s[1];
        s += 2;
        if (x == 'u') {
            cp = 0;
            for (int i = 0; i < 4; i++)
                cp = (cp << 4) | (unsigned)kvp_parse_hex_digit(s[i]);
            s += 4;
            if (cp >= 0xd800 && cp <= 0xdbff && e - s >= 6 && s[0] == '\\' && s[1] == 'u') {
                unsigned lo = 0;
                for (int i = 0; i < 4; i++)
                    lo = (lo << 4) | (unsigned)kvp_parse_hex_digit(s[2 + i]);
                if (lo >= 0xdc00 && lo <= 0xdfff) {
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                    s += 6;
                }
            }
            if (cp == 0 || (cp >= 0xd800 && cp <= 0xdfff))
                return false;
        } else {
            cp = x == 'b'   ? '\b'
                 : x == 'f' ? '\f'
                 : x == 'n' ? '\n'
                 : x == 'r' ? '\r'
                 : x == 't' ? '\t'
                            : (unsigned char)x;
        }
        char buf[4];
        size_t k;
        if (cp < 0x80) {
            buf[0] = (char)cp;
            k = 1;
        } else if (cp < 0x800) {
            buf[0] = (char)(0xc0 | (cp >> 6));
            buf[1] = (char)(0x80 | (cp & 0x3f));
            k = 2;
        } else if (cp < 0x10000) {
            buf[0] = (char)(0xe0 | (cp >> 12));
            buf[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
            buf[2] = (char)(0x80 | (cp & 0x3f));
            k = 3;
        } else {
            buf[0] = (char)(0xf0 | (cp >> 18));
            buf[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
            buf[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
            buf[3] = (char)(0x80 | (cp & 0x3f));
            k = 4;
        }
        if (n + k >= cap)
            return false;
        memcpy(out + n, buf, k);
        n += k;
    }
    out[n] = '\0';
    return true;
}

/* The digits s[0..e) as an integer of at most max: false when empty, not all digits (a
 * fraction or an exponent) or over max. */
static bool digits(const char *s, const char *e, uint64_t max, uint64_t *x_p)
{
    if (s == e)
        return false;
    uint64_t x = 0;
    if (e - s <= 19) { /* 10^19 - 1 < 2^64: no overflow to watch for on the way */
        for (; s < e; s++) {
            unsigned d = (unsigned)(unsigned char)*s - '0';
            if (d > 9)
                return false;
            x = x * 10 + d;
        }
        if (x > max)
            return false;
        *x_p = x;
        return true;
    }
    for (; s < e; s++) {
        if (*s < '0' || *s > '9')
            return false;
        unsigned d = (unsigned)(*s - '0');
        if (x > (max - d) / 10)
            return false;
        x = x * 10 + d;
    }
    *x_p = x;
    return true;
}

bool kvp_json_u64(const kvp_json_t *j, uint32_t tok, uint64_t *v)
{
    if (tok >= j->n || j->t[tok].type != KVP_J_NUMBER)
        return false;
    const char *s = j->text + j->t[tok].start, *e = j->text + j->t[tok].end;
    return (s == e || *s != '-') && digits(s, e, UINT64_MAX, v);
}

size_t kvp_json_str_cap(const kvp_json_t *j, uint32_t tok)
{
    if (tok >= j->n || j->t[tok].type != KVP_J_STRING)
        return 0;
    /* \n is 1 byte of 2, \uXXXX at most 3 of 6, a surrogate pair 4 of 12 */
    return (size_t)(j->t[tok].end - j->t[tok].start) + 1;
}

bool kvp_json_i64(const kvp_json_t *j, uint32_t tok, int64_t *v)
{
    if (tok >= j->n || j->t[tok].type != KVP_J_NUMBER)
        return false;
    const char *s = j->text + j->t[tok].start, *e = j->text + j->t[tok].end;
    bool neg = s < e && *s == '-';
    s += neg;
    uint64_t x;
    if (!digits(s, e, neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX, &x))
        return false;
    *v = !neg ? (int64_t)x : x > (uint64_t)INT64_MAX ? INT64_MIN : -(int64_t)x;
    return true;
}
