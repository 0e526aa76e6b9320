/*
 * insider_fuzz.c - an insider fuzzer of the master (issue 45): a principal of tenant B,
 * each of its principals (roles) in turn, sends every method of the master's table with
 * mutated bodies for a bounded time, while a canary client of tenant A works and checks.
 *
 *   insider_fuzz --master HOST:PORT --ca CA.crt --pid MASTER_PID --canary TOKEN_FILE
 *                --principal NAME=TOKEN_FILE [--principal ...] [--seconds 60] [--seed N]
 *                [--latency-ms 1000] [--rss-max-mib 256] [--fds-max 256] [--dump FILE]
 *                [--no-fuzz 1]
 *                [--owner HOST:PORT --owner-shm NAME --owner-pid PID [--owner-rss-max-mib 256]
 *                 [--owner-fds-max 512] [--unwritten-puts 1]]
 *
 * --owner: the same run against a segment owner's data plane instead of the master's
 * methods (owner_frames.c); the canary then works on the owner's shared segment, and the
 * monitor samples the owner too. Without --ca the master is plain (no ACL): a principal
 * NAME=- has no token, and --canary - too. NAME=none is a stranger: no master connection.
 *
 * The master runs with TLS 1.3 and an ACL (tests/python/test_insider_fuzz.py starts one,
 * with a segment dedicated to tenant A); every principal here is named by a token, read
 * from a file (never from argv).
 *
 * The fuzzer (tenant B). Its principals take turns, a slice of the run each, on a TLS
 * connection of their own (Auth first, dialled again whenever the master closes it). Each
 * request is one method of master/dispatch.c's table (tests/insider/methods.c) with a body
 * built from the method's protobuf-c descriptor, so every field of every request type is
 * reached without code per method:
 *   - scalars: 0, 1, extremes, random, ids seen in earlier answers and ids next to them
 *     (the generation bumped, +-1); sizes 0, 4096, 1 GiB, 2^64-1 ...;
 *   - keys: tenant A's form (a/..., team-a 0x1f a/..., default 0x1f ...), its own, empty,
 *     4096 and 4097 bytes, NUL inside, bad UTF-8; List patterns from a small regex grammar
 *     (groups, alternation, counts, classes, anchors, back-references);
 *   - names, endpoints, host ids, shm paths, tenants, media: those seen, near ones, junk;
 *   - repeated fields mostly short, sometimes thousands long; unknown fields; a singular
 *     sub-message repeated (protobuf merges); nesting to depth 3;
 * and then, now and then, the body garbled (bits flipped, cut, extended, doubled), or the
 * frame (an unknown method, a response bit, a bad version, a length that lies, a frame
 * cut and the connection closed). Every answer's body is decoded to learn ids and names.
 *
 * The canary (tenant A, libkvpool): puts objects under keys with a random marker the
 * fuzzer never learns (in their values too, every 256 bytes), reads them back
 * byte-exact, checks that they exist and that its listing shows them, removes old ones,
 * every call timed (a call over 250 ms is reported as it happens, the first 20, with
 * where its time went: the master's calls by method, the transfers). Meanwhile the
 * master's VmRSS and open descriptors are sampled every 50 ms. --no-fuzz 1: the canary
 * and the sampling only (a baseline).
 *
 * A violation: a canary call failing or slower than --latency-ms, wrong bytes or a
 * missing object, the canary's marker in anything the fuzzer received (an answer, an
 * error text, a stream), the master's RSS or descriptors past their bounds, the master
 * gone, or a well-formed request of the fuzzer (not SegRecord's stream, not one-way)
 * unanswered for 5 s on an open connection. The run ends at --seconds (or at the first
 * violation) with one summary line
 *   insider_fuzz: seed S, N s: R requests (...per method...), answers {status: count},
 *   canary P puts G gets ... worst L ms, master RSS max M MiB, fds max F, V violations
 * and, on a violation, the seed and the last requests sent (method, principal, size, the
 * first bytes), all of them in --dump (frames as sent, each after a line naming its
 * principal). Exit status 0: no violation; 1: violations; 2: could not start.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/rpc.h"
#include "common/sock.h"
#include "common/tls.h"
#include "kvpool.h"
#include "tests/harness.h"
#include "tests/insider/fuzz.h"
#include "tests/insider/methods.h"
#include "tests/insider/owner_frames.h"

#define MAX_METHODS 64
#define MAX_PRINCIPALS 16
#define RING 64  /* last requests kept for the report */
#define SEEN 256 /* ids / names learned from answers */
#define ANSWER_WAIT_MS 5000
#define STATUS_MIN (-64) /* statuses counted: STATUS_MIN..0, and "closed" */
#define BODY_CAP (4u << 20)
#define BIG_BODY_CAP (24u << 20)

/* ---- the run's settings and results ---- */

typedef struct principal {
    char name[64];
    char token[256];
    size_t token_len; /* 0: none (a master without an ACL) */
    bool stranger;    /* no master connection at all (--owner: the data plane only) */
} principal_t;

static struct {
    const char *master, *ca, *dump;
    char host[256];
    uint16_t port;
    pid_t pid;
    principal_t p[MAX_PRINCIPALS];
    size_t n_p;
    char canary_token[256];
    unsigned seconds;
    uint64_t seed;
    unsigned latency_ms;
    unsigned rss_max_mib, fds_max;
    bool no_fuzz; /* the canary and the monitor only: a baseline */
    /* --owner: the owner's data plane is fuzzed instead of the master's methods */
    const char *owner, *owner_shm;
    pid_t owner_pid;
    unsigned owner_rss_max_mib, owner_fds_max;
    bool unwritten_puts;
} cfg = {.seconds = 60,
         .latency_ms = 1000,
         .rss_max_mib = 256,
         .fds_max = 256,
         .owner_rss_max_mib = 256,
         .owner_fds_max = 512};

static insider_method_t methods[MAX_METHODS];
static size_t n_methods;

static atomic_bool stop;
static atomic_uint violations;
static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;

/* the canary's key marker: never handed to the fuzzer's generators */
static char marker[40];

static struct {
    atomic_ulong puts, gets, exists, lists, removes, worst_us, slow;
    char worst_op[32];
} canary;
static atomic_long rss_max_kib, fds_max_seen, owner_rss_kib, owner_fds_seen;

uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

void violation(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&out_lock);
    fprintf(stderr, "insider_fuzz: VIOLATION: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    pthread_mutex_unlock(&out_lock);
    va_end(ap);
    atomic_fetch_add(&violations, 1);
    atomic_store(&stop, true);
}

/* ---- what the fuzzer learned from answers ---- */

static struct {
    uint64_t ids[SEEN];
    size_t n_ids;
    char names[SEEN][128];
    size_t n_names;
} seen;

static void learn_id(uint64_t v)
{
    if (v == 0 || v == 1)
        return;
    seen.ids[seen.n_ids++ % SEEN] = v;
}

static void learn_name(const char *s)
{
    if (s == NULL || s[0] == 0 || strlen(s) >= sizeof(seen.names[0]))
        return;
    snprintf(seen.names[seen.n_names++ % SEEN], sizeof(seen.names[0]), "%s", s);
}

static void learn(const ProtobufCMessage *m, unsigned depth)
{
    if (m == NULL || depth > 4)
        return;
    const ProtobufCMessageDescriptor *d = m->descriptor;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        const char *base = (const char *)m + f->offset;
        size_t n = 1;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            n = *(const size_t *)((const char *)m + f->quantifier_offset);
            base = *(const char *const *)base;
        }
        for (size_t k = 0; k < n && k < 64 && base != NULL; k++) {
            switch (f->type) {
            case PROTOBUF_C_TYPE_UINT64:
            case PROTOBUF_C_TYPE_FIXED64:
                learn_id(((const uint64_t *)base)[k]);
                break;
            case PROTOBUF_C_TYPE_STRING:
                learn_name(((char *const *)base)[k]);
                break;
            case PROTOBUF_C_TYPE_MESSAGE:
                learn(((ProtobufCMessage *const *)base)[k], depth + 1);
                break;
            default:
                break;
            }
        }
    }
}

/* ---- a body from a descriptor ---- */

typedef struct buf {
    uint8_t *b;
    size_t len, cap;
    bool full;
} buf_t;

static void put(buf_t *o, const void *p, size_t n)
{
    if (o->full || o->len + n > o->cap) {
        o->full = true;
        return;
    }
    memcpy(o->b + o->len, p, n);
    o->len += n;
}

static void put_varint(buf_t *o, uint64_t v)
{
    uint8_t t[10];
    size_t n = 0;
    do {
        t[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v != 0);
    put(o, t, n);
}

static void put_tag(buf_t *o, uint32_t field, unsigned wt)
{
    put_varint(o, (uint64_t)field << 3 | wt);
}

static void put_len(buf_t *o, uint32_t field, const void *p, size_t n)
{
    put_tag(o, field, 2);
    put_varint(o, n);
    put(o, p, n);
}

static uint64_t gen_id(rng_t *r)
{
    static const uint64_t fixed[] = {0,
                                     1,
                                     2,
                                     3,
                                     0xffffffffull,
                                     1ull << 32,
                                     (1ull << 32) | 1,
                                     (2ull << 32) | 0,
                                     UINT64_MAX,
                                     UINT64_MAX - 1,
                                     1ull << 63,
                                     (1ull << 63) - 1};
    switch (below(r, 6)) {
    case 0:
        return fixed[below(r, sizeof(fixed) / sizeof(fixed[0]))];
    case 1:
        return rnd(r);
    case 2:
        return below(r, 100);
    default: {
        if (seen.n_ids == 0)
            return below(r, 10);
        uint64_t v = seen.ids[below(r, seen.n_ids < SEEN ? seen.n_ids : SEEN)];
        switch (below(r, 5)) {
        case 0:
            return v + 1;
        case 1:
            return v - 1;
        case 2:
            return v + (1ull << 32); /* the next generation of a slot */
        case 3:
            return v ^ (1ull << below(r, 64));
        default:
            return v;
        }
    }
    }
}

static uint64_t gen_size(rng_t *r)
{
    static const uint64_t fixed[] = {
        0,          1,          4095,       4096,           65536,         1ull << 20,
        1ull << 30, 1ull << 40, UINT64_MAX, UINT64_MAX / 2, 0xffffffffull, 0x100000000ull};
    return chance(r, 3) ? rnd(r) >> below(r, 64) : fixed[below(r, sizeof(fixed) / 8)];
}

static size_t gen_key(rng_t *r, uint8_t *k, size_t cap)
{
    char hex[17];
    snprintf(hex, sizeof(hex), "%016" PRIx64, rnd(r));
    int n;
    switch (below(r, 14)) {
    case 0: /* tenant A's form, not its marker */
        n = snprintf((char *)k, cap, "a/cnry%.8s/%u", hex, (unsigned)below(r, 50));
        break;
    case 1:
        n = snprintf((char *)k, cap,
                     "team-a\x1f"
                     "a/%s",
                     hex);
        break;
    case 2:
        n = snprintf((char *)k, cap,
                     "default\x1f"
                     "a/%s",
                     hex);
        break;
    case 3:
        n = snprintf((char *)k, cap, "team-a\x1f");
        break;
    case 4:
        return 0;
    case 5: { /* 4096 or 4097 bytes */
        size_t l = 4096 + below(r, 2);
        if (l > cap)
            l = cap;
        memset(k, 'k', l);
        return l;
    }
    case 6:
        n = snprintf((char *)k, cap, "b/%sX", hex);
        k[2] = 0; /* a NUL inside */
        break;
    case 7:
        k[0] = 0xff;
        k[1] = 0xfe;
        k[2] = 'a';
        return 3; /* not UTF-8 */
    case 8:
        n = snprintf((char *)k, cap, "\x1f");
        break;
    case 9:
        n = snprintf((char *)k, cap,
                     "team-b\x1f"
                     "b/%u",
                     (unsigned)below(r, 20));
        break;
    default: /* its own keys, a few of them, so that they exist */
        n = snprintf((char *)k, cap, "b/%u", (unsigned)below(r, 32));
        break;
    }
    return n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap - 1;
}

/* A List / RemoveByRegex pattern from a small grammar (anchors, groups, alternation,
 * counts, classes, back-references), at most depth 4. */
static const char *const re_atoms[] = {"a", "b", "team-a", "/", ".", "x"};
static const char *const re_classes[] = {"[a-z]", "[^b]", "[[:alnum:]]", "\\x1f", "[/]"};
static const char *const re_anchors[] = {"^", "$", ".*", ".+"};
static const char *const re_backrefs[] = {"\\1", "\\2", "a\\1"};
#define PICK(r, a) ((a)[below((r), sizeof(a) / sizeof((a)[0]))])

static void gen_re(rng_t *r, char *o, size_t cap, size_t *n, unsigned depth)
{
#define EMIT(s)                                                                                    \
    do {                                                                                           \
        const char *s_ = (s);                                                                      \
        size_t l_ = strlen(s_);                                                                    \
        if (*n + l_ < cap) {                                                                       \
            memcpy(o + *n, s_, l_);                                                                \
            *n += l_;                                                                              \
        }                                                                                          \
    } while (0)
    unsigned parts = 1 + (unsigned)below(r, 3);
    for (unsigned i = 0; i < parts; i++) {
        switch (below(r, depth >= 4 ? 4 : 9)) {
        case 0:
            EMIT(PICK(r, re_atoms));
            break;
        case 1:
            EMIT(PICK(r, re_classes));
            break;
        case 2:
            EMIT(PICK(r, re_anchors));
            break;
        case 3:
            EMIT(PICK(r, re_backrefs));
            break;
        default: {
            EMIT("(");
            gen_re(r, o, cap, n, depth + 1);
            if (chance(r, 2)) {
                EMIT("|");
                gen_re(r, o, cap, n, depth + 1);
            }
            EMIT(")");
            char q[32];
            switch (below(r, 5)) {
            case 0:
                EMIT("*");
                break;
            case 1:
                EMIT("+");
                break;
            case 2:
                snprintf(q, sizeof(q), "{%u,%u}", (unsigned)below(r, 3), (unsigned)below(r, 300));
                EMIT(q);
                break;
            case 3:
                snprintf(q, sizeof(q), "{%u}", (unsigned)below(r, 1000));
                EMIT(q);
                break;
            default:
                break;
            }
        }
        }
    }
#undef EMIT
}

static size_t gen_string(rng_t *r, const char *field, char *o, size_t cap)
{
    if (strcmp(field, "pattern") == 0) {
        size_t n = 0;
        if (chance(r, 8))
            n = (size_t)snprintf(o, cap, "^b/");
        else
            gen_re(r, o, cap, &n, 0);
        return n;
    }
    if (strcmp(field, "medium") == 0)
        return (size_t)snprintf(o, cap, "%s",
                                (const char *[]){"dram", "ssd", "", "DRAM", "nvme"}[below(r, 5)]);
    if (strcmp(field, "tenant") == 0)
        return (size_t)snprintf(
            o, cap, "%s",
            (const char *[]){"team-a", "team-b", "default", "", "team-a\x1f"}[below(r, 5)]);
    if (seen.n_names > 0 && chance(r, 2)) {
        const char *s = seen.names[below(r, seen.n_names < SEEN ? seen.n_names : SEEN)];
        size_t n = (size_t)snprintf(o, cap, "%s", s);
        if (n > 0 && chance(r, 3))
            o[below(r, n)] ^= 1; /* a near one */
        return n;
    }
    if (strstr(field, "endpoint") != NULL)
        return (size_t)snprintf(o, cap, "%s",
                                (const char *[]){"127.0.0.1:1", "[::1]:0", "localhost:65536",
                                                 "127.1:80", "[::ffff:127.0.0.1]:9",
                                                 "a:b:c"}[below(r, 6)]);
    if (strstr(field, "path") != NULL)
        return (size_t)snprintf(o, cap, "%s",
                                (const char *[]){"/dev/shm/../../etc/passwd", "@kvpool",
                                                 "/proc/self/mem", ""}[below(r, 4)]);
    size_t n = chance(r, 20) ? 300 : (size_t)below(r, 24);
    if (n >= cap)
        n = cap - 1;
    for (size_t i = 0; i < n; i++)
        o[i] = (char)(' ' + below(r, 95));
    return n;
}

static void gen_message(rng_t *r, const ProtobufCMessageDescriptor *d, buf_t *o, unsigned depth,
                        size_t body_cap);

static void gen_field(rng_t *r, const ProtobufCFieldDescriptor *f, buf_t *o, unsigned depth,
                      size_t body_cap)
{
    uint8_t tmp[8192];
    switch (f->type) {
    case PROTOBUF_C_TYPE_MESSAGE: {
        if (depth >= 3)
            return;
        buf_t sub = {.b = malloc(body_cap), .cap = body_cap};
        if (sub.b == NULL)
            return;
        gen_message(r, f->descriptor, &sub, depth + 1, body_cap / 4);
        put_len(o, f->id, sub.b, sub.len);
        free(sub.b);
        return;
    }
    case PROTOBUF_C_TYPE_STRING: {
        size_t n = gen_string(r, f->name, (char *)tmp, sizeof(tmp));
        put_len(o, f->id, tmp, n);
        return;
    }
    case PROTOBUF_C_TYPE_BYTES: {
        size_t n;
        if (strstr(f->name, "key") != NULL && strcmp(f->name, "conn_key") != 0 &&
            strcmp(f->name, "rdma_key") != 0)
            n = gen_key(r, tmp, sizeof(tmp));
        else {
            n = (size_t[]){0, 16, 32, 64, 80, 88}[below(r, 6)];
            if (chance(r, 4))
                n = below(r, 200);
            for (size_t i = 0; i < n; i++)
                tmp[i] = (uint8_t)rnd(r);
        }
        put_len(o, f->id, tmp, n);
        return;
    }
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_FLOAT: {
        uint32_t v = (uint32_t)rnd(r);
        put_tag(o, f->id, 5);
        put(o, &v, 4);
        return;
    }
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_DOUBLE: {
        uint64_t v = gen_id(r);
        put_tag(o, f->id, 1);
        put(o, &v, 8);
        return;
    }
    case PROTOBUF_C_TYPE_BOOL:
        put_tag(o, f->id, 0);
        put_varint(o, (uint64_t[]){0, 1, 2, 255, UINT64_MAX}[below(r, 5)]);
        return;
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SINT64: {
        int64_t v = (int64_t)(rnd(r) >> below(r, 64)) * (chance(r, 2) ? -1 : 1);
        put_tag(o, f->id, 0);
        put_varint(o, ((uint64_t)v << 1) ^ (uint64_t)(v >> 63));
        return;
    }
    default: /* varint types: sizes by name, ids otherwise */
        put_tag(o, f->id, 0);
        put_varint(o, strstr(f->name, "size") != NULL || strstr(f->name, "limit") != NULL ||
                              strstr(f->name, "max") != NULL
                          ? gen_size(r)
                          : gen_id(r));
        return;
    }
}

static void gen_message(rng_t *r, const ProtobufCMessageDescriptor *d, buf_t *o, unsigned depth,
                        size_t body_cap)
{
    for (unsigned i = 0; i < d->n_fields && !o->full; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (chance(r, 4))
            continue; /* absent */
        size_t n = 1;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            n = below(r, 4);
            if (chance(r, 12))
                n = 100 + below(r, chance(r, 4) ? 70000 : 2000); /* long */
        } else if (f->type == PROTOBUF_C_TYPE_MESSAGE && chance(r, 30)) {
            n = 2 + below(r, 50); /* a singular sub-message again: merged */
        }
        for (size_t k = 0; k < n && !o->full; k++)
            gen_field(r, f, o, depth, body_cap);
        o->full = false; /* a long run cut at the cap: what fits is sent */
    }
    if (chance(r, 8) || (depth == 0 && chance(r, 200))) { /* unknown fields */
        size_t n = chance(r, 25) ? 500 + below(r, 2000) : 1 + below(r, 5);
        for (size_t k = 0; k < n && !o->full; k++) {
            uint32_t id = 20 + (uint32_t)below(r, 1u << 20);
            switch (below(r, 3)) {
            case 0:
                put_tag(o, id, 0);
                put_varint(o, rnd(r));
                break;
            case 1: {
                uint64_t v = rnd(r);
                put_tag(o, id, 1);
                put(o, &v, 8);
                break;
            }
            default: {
                uint8_t t[64] = {0};
                put_len(o, id, t, below(r, sizeof(t)));
            }
            }
        }
        o->full = false;
    }
}

/* ---- the body and the frame, garbled now and then ---- */

static void garble(rng_t *r, buf_t *o)
{
    switch (below(r, 6)) {
    case 0: /* bits flipped */
        for (unsigned k = 0; k < 1 + below(r, 8) && o->len > 0; k++)
            o->b[below(r, o->len)] ^= (uint8_t)(1u << below(r, 8));
        break;
    case 1: /* cut */
        o->len = below(r, o->len + 1);
        break;
    case 2: /* junk after */
        for (unsigned k = 0; k < 1 + below(r, 64) && o->len < o->cap; k++)
            o->b[o->len++] = (uint8_t)rnd(r);
        break;
    case 3: /* doubled: every field again (protobuf merges) */
        if (o->len * 2 <= o->cap) {
            memcpy(o->b + o->len, o->b, o->len);
            o->len *= 2;
        }
        break;
    case 4: /* a length that runs past the end */
        if (o->len < o->cap - 12) {
            put_tag(o, 1, 2);
            put_varint(o, 1u << 30);
        }
        break;
    default:
        o->len = 0;
    }
}

/* ---- the fuzzer's connection ---- */

typedef struct conn {
    kvp_tls_t *tls;
    kvp_chan_t *ch;
    const principal_t *who;
    bool authed;
} conn_t;

static void conn_drop(conn_t *c)
{
    if (c->ch != NULL)
        kvp_chan_close(c->ch);
    c->ch = NULL;
    c->authed = false;
}

/* The marker in what the fuzzer received: a violation. */
void check_leak(const uint8_t *b, size_t n, const char *what)
{
    if (n >= strlen(marker) && memmem(b, n, marker, strlen(marker)) != NULL)
        violation("tenant A's marker %s in an answer to %s's %s (%zu bytes)", marker, "the fuzzer",
                  what, n);
}

typedef struct answer {
    int got; /* 1 an answer, 0 none in time, -1 the connection closed */
    int32_t frame_status;
    uint8_t *body;
    size_t len;
} answer_t;

static answer_t read_answer(conn_t *c, uint64_t req_id, const char *method, int wait_ms)
{
    answer_t a = {0};
    uint64_t deadline = now_us() + (uint64_t)wait_ms * 1000;
    for (;;) {
        int left = (int)((deadline - now_us()) / 1000);
        if ((int64_t)(deadline - now_us()) <= 0)
            return a;
        kvp_status_t s = kvp_chan_wait_readable(c->ch, left);
        if (s == KVP_ERR_TIMEOUT)
            return a;
        uint8_t hb[KVP_RPC_HDR_LEN];
        kvp_rpc_hdr_t h;
        if (s != KVP_OK || kvp_chan_recv_all(c->ch, hb, sizeof(hb)) != KVP_OK ||
            kvp_rpc_hdr_unpack(hb, KVP_RPC_MAX_BODY, &h) != KVP_OK) {
            a.got = -1;
            return a;
        }
        uint8_t *body = h.body_len ? malloc(h.body_len) : NULL;
        if ((h.body_len && body == NULL) ||
            (h.body_len && kvp_chan_recv_all(c->ch, body, h.body_len) != KVP_OK)) {
            free(body);
            a.got = -1;
            return a;
        }
        check_leak(body, h.body_len, method);
        if (h.request_id == req_id) {
            a.got = 1;
            a.frame_status = h.status;
            a.body = body;
            a.len = h.body_len;
            return a;
        }
        free(body); /* a stream's frame (SegRecord), or an earlier request's late answer */
    }
}

static bool conn_open(conn_t *c, const principal_t *who)
{
    conn_drop(c);
    c->who = who;
    int fd;
    if (kvp_tcp_connect(cfg.host, cfg.port, 2000, &fd) != KVP_OK)
        return false;
    kvp_sock_set_timeout(fd, 3000);
    char err[256];
    if (kvp_chan_open(c->tls, fd, cfg.host, 3000, &c->ch, err, sizeof(err)) != KVP_OK) {
        c->ch = NULL;
        return false;
    }
    if (who->token_len == 0) { /* a master without an ACL: nothing to prove */
        c->authed = true;
        return true;
    }
    /* Auth with its token */
    uint8_t body[300];
    buf_t o = {.b = body, .cap = sizeof(body)};
    put_len(&o, 1, who->token, who->token_len);
    uint8_t hb[KVP_RPC_HDR_LEN];
    kvp_rpc_hdr_t h = {.method = KVP_RPC_AUTH, .request_id = 1, .body_len = (uint32_t)o.len};
    kvp_rpc_hdr_pack(&h, hb);
    if (kvp_chan_send2(c->ch, hb, sizeof(hb), body, o.len) != KVP_OK) {
        conn_drop(c);
        return false;
    }
    answer_t a = read_answer(c, 1, "Auth", 3000);
    free(a.body);
    c->authed = a.got == 1 && a.frame_status == 0;
    if (!c->authed)
        conn_drop(c);
    return c->authed;
}

/* ---- tallies and the ring of last requests ---- */

static struct {
    uint64_t sent, closed, unanswered, garbled;
    uint64_t by_status[1 - STATUS_MIN];
} per[MAX_METHODS];
static uint64_t total_sent;
static atomic_ulong sent_now; /* total_sent, for the canary's reports */

typedef struct sent {
    uint64_t n;
    const char *who, *method;
    uint8_t *frame;
    size_t len, head; /* head: the bytes before the body (a frame header) */
} sent_t;
static sent_t ring[RING];

uint64_t remember(const char *who, const char *what, const uint8_t *a, size_t alen,
                  const uint8_t *b, size_t blen)
{
    uint64_t n = ++total_sent;
    atomic_store(&sent_now, n);
    sent_t *s = &ring[n % RING];
    free(s->frame);
    s->frame = malloc(alen + blen + 1);
    s->len = 0;
    s->head = alen;
    if (s->frame != NULL) {
        if (alen)
            memcpy(s->frame, a, alen);
        if (blen)
            memcpy(s->frame + alen, b, blen);
        s->len = alen + blen;
    }
    s->n = n;
    s->who = who;
    s->method = what;
    return n;
}

bool master_call(conn_t *c, uint16_t method, const uint8_t *body, size_t len, uint8_t **resp_p,
                 size_t *resp_len_p)
{
    *resp_p = NULL;
    *resp_len_p = 0;
    if (c->ch == NULL)
        return false;
    uint64_t req_id = 2 + total_sent;
    kvp_rpc_hdr_t h = {.method = method, .request_id = req_id, .body_len = (uint32_t)len};
    uint8_t hb[KVP_RPC_HDR_LEN];
    kvp_rpc_hdr_pack(&h, hb);
    remember(c->who->name, "(master call)", hb, sizeof(hb), body, len);
    if (kvp_chan_send2(c->ch, hb, sizeof(hb), body, len) != KVP_OK) {
        conn_drop(c);
        return false;
    }
    answer_t a = read_answer(c, req_id, "(master call)", ANSWER_WAIT_MS);
    if (a.got != 1) {
        conn_drop(c);
        return false;
    }
    if (a.frame_status != 0) {
        free(a.body);
        return false;
    }
    *resp_p = a.body;
    *resp_len_p = a.len;
    return true;
}

static int32_t resp_status(const uint8_t *b, size_t n)
{
    /* field 1, a varint: the response's status (every response type but Ping's) */
    if (n < 2 || b[0] != 0x08)
        return 0;
    uint64_t v = 0;
    for (size_t i = 1, sh = 0; i < n && sh < 64; i++, sh += 7) {
        v |= (uint64_t)(b[i] & 0x7f) << sh;
        if (!(b[i] & 0x80))
            break;
    }
    return (int32_t)v;
}

static void tally(size_t mi, int32_t st)
{
    if (st > 0 || st < STATUS_MIN)
        st = STATUS_MIN; /* out of range: counted with the lowest */
    per[mi].by_status[-st]++;
}

/* ---- one request ---- */

static void fuzz_one(rng_t *r, conn_t *c, uint8_t *body_buf)
{
    size_t mi = below(r, n_methods);
    const insider_method_t *m = &methods[mi];
    size_t cap = chance(r, 300) ? BIG_BODY_CAP : chance(r, 20) ? BODY_CAP : 64u << 10;
    buf_t o = {.b = body_buf, .cap = cap};
    if (m->req != NULL)
        gen_message(r, m->req, &o, 0, cap);
    bool garbled = false;
    if (chance(r, 6)) {
        garble(r, &o);
        garbled = true;
    }
    uint64_t req_id = 2 + total_sent;
    kvp_rpc_hdr_t h = {.method = m->id, .request_id = req_id, .body_len = (uint32_t)o.len};
    bool frame_lies = false, cut = false;
    switch (below(r, 60)) {
    case 0:
        h.method = (uint16_t)(0 + below(r, 2) * (KVP_RPC_METHOD_MAX + 1 + below(r, 100)));
        garbled = true;
        break;
    case 1:
        h.method |= KVP_RPC_RESPONSE_BIT;
        garbled = true;
        break;
    case 2:
        h.body_len = (uint32_t)(o.len + 1 + below(r, 64)); /* more than follows */
        frame_lies = true;
        break;
    case 3:
        cut = true; /* a frame cut, then the connection closed */
        break;
    default:
        break;
    }
    uint8_t hb[KVP_RPC_HDR_LEN];
    kvp_rpc_hdr_pack(&h, hb);
    if (chance(r, 200)) { /* a bad version */
        hb[4] = 0x7f;
        garbled = true;
    }
    per[mi].sent++;
    per[mi].garbled += garbled || frame_lies || cut;
    remember(c->who->name, m->name, hb, sizeof(hb), o.b, o.len);
    size_t send_len = cut ? below(r, o.len + 1) : o.len;
    kvp_status_t s = kvp_chan_send2(c->ch, hb, sizeof(hb), o.b, send_len);
    if (s != KVP_OK || cut || frame_lies) {
        conn_drop(c);
        return;
    }
    if (h.method == KVP_RPC_LEASE_RELEASE && hb[4] != 0x7f)
        return; /* one-way: no answer, even to a body it cannot decode */
    /* a garbled frame may be answered by a close; SegRecord of a segment of its own opens a
     * stream that answers with its first change */
    bool may_go_unanswered = garbled || m->id == KVP_RPC_SEG_RECORD || m->id == KVP_RPC_AUTH;
    answer_t a = read_answer(c, req_id, m->name, may_go_unanswered ? 1000 : ANSWER_WAIT_MS);
    if (a.got == 1) {
        int32_t st = a.frame_status != 0 ? a.frame_status : resp_status(a.body, a.len);
        tally(mi, st);
        if (a.frame_status == 0 && m->resp != NULL && a.len > 0) {
            ProtobufCMessage *msg = protobuf_c_message_unpack(m->resp, NULL, a.len, a.body);
            learn(msg, 0);
            if (msg != NULL)
                protobuf_c_message_free_unpacked(msg, NULL);
        }
        free(a.body);
        if (m->id == KVP_RPC_AUTH && a.frame_status != 0)
            conn_drop(c); /* a wrong token: the master closes */
        return;
    }
    if (a.got < 0) {
        per[mi].closed++;
        conn_drop(c);
        return;
    }
    per[mi].unanswered++;
    if (!may_go_unanswered)
        violation("%s's %s (request %" PRIu64 ", %zu bytes) unanswered for %d ms on an open "
                  "connection",
                  c->who->name, m->name, total_sent, o.len, ANSWER_WAIT_MS);
    conn_drop(c);
}

static void *fuzzer_main(void *arg)
{
    (void)arg;
    rng_t r = {cfg.seed ^ 0xF022F022F022F022ull};
    conn_t c = {0};
    char err[256];
    kvp_tls_params_t tp = {.ca = cfg.ca};
    if (cfg.ca != NULL && kvp_tls_create(&tp, false, &c.tls, err, sizeof(err)) != KVP_OK) {
        violation("TLS context: %s", err);
        return NULL;
    }
    uint8_t *body = malloc(BIG_BODY_CAP + 64);
    if (body == NULL) {
        violation("out of memory");
        return NULL;
    }
    uint64_t t0 = now_us(), slice = (uint64_t)cfg.seconds * 1000000u / (2 * cfg.n_p);
    if (slice < 2000000)
        slice = 2000000;
    unsigned fails = 0;
    while (!atomic_load(&stop)) {
        const principal_t *who = &cfg.p[((now_us() - t0) / slice) % cfg.n_p];
        if (who->stranger) {
            conn_drop(&c);
            owner_fuzz_one(&r, NULL, who->name);
            continue;
        }
        if (c.ch == NULL || c.who != who) {
            if (!conn_open(&c, who)) {
                if (++fails > 50) {
                    violation("principal %s cannot connect and authenticate (50 tries)", who->name);
                    break;
                }
                usleep(20000);
                continue;
            }
            fails = 0;
        }
        if (cfg.owner)
            owner_fuzz_one(&r, &c, who->name);
        else
            fuzz_one(&r, &c, body);
    }
    conn_drop(&c);
    if (c.tls != NULL)
        kvp_tls_destroy(c.tls);
    free(body);
    return NULL;
}

/* ---- the canary ---- */

static kvp_client_t *canary_client;
static kvp_metrics_t canary_m0; /* the canary's counters before its current call */

/* Where a slow call's time went: its master calls' wait and its transfers' (ms). */
static void where(char *buf, size_t len)
{
    kvp_metrics_t m1 = {.size = sizeof(m1)};
    if (kvp_metrics_snapshot(canary_client, &m1) != KVP_OK) {
        snprintf(buf, len, "?");
        return;
    }
    size_t n = 0;
    for (int i = 0; i < KVP_METRICS_RPC_MAX && n < len; i++) {
        uint64_t ns = m1.master_rpc[i].wait_ns - canary_m0.master_rpc[i].wait_ns;
        if (ns > 1000000)
            n += (size_t)snprintf(buf + n, len - n, "rpc %d %.1f ms, ", i, (double)ns / 1e6);
    }
    if (n < len)
        snprintf(buf + n, len - n, "transfers %.1f ms",
                 (double)(m1.transfer_ns[0] + m1.transfer_ns[1] - canary_m0.transfer_ns[0] -
                          canary_m0.transfer_ns[1]) /
                     1e6);
}

static void timed(const char *op, uint64_t t0)
{
    uint64_t us = now_us() - t0;
    if (us > atomic_load(&canary.worst_us)) {
        atomic_store(&canary.worst_us, us);
        snprintf(canary.worst_op, sizeof(canary.worst_op), "%s", op);
    }
    if (us > 250000 && atomic_fetch_add(&canary.slow, 1) < 20) {
        pthread_mutex_lock(&out_lock);
        struct timespec wall;
        clock_gettime(CLOCK_REALTIME, &wall);
        char w[256];
        where(w, sizeof(w));
        fprintf(stderr,
                "insider_fuzz: the canary's %s took %.1f ms (after request %" PRIu64
                " of the fuzzer; ended at %02ld:%02ld.%03ld; %s)\n",
                op, (double)us / 1000, atomic_load(&sent_now), (long)(wall.tv_sec / 60 % 60),
                (long)(wall.tv_sec % 60), wall.tv_nsec / 1000000, w);
        pthread_mutex_unlock(&out_lock);
    }
    if (us > (uint64_t)cfg.latency_ms * 1000)
        violation("the canary's %s took %" PRIu64 " ms (bound %u ms)", op, us / 1000,
                  cfg.latency_ms);
}

/* Object n's bytes: random, with the marker every MARKER_EVERY bytes (so that any read of
 * an owner's segment that reaches into one of them carries it). */
#define MARKER_EVERY 256
static size_t object_of(uint64_t n, uint8_t *b, size_t cap)
{
    rng_t r = {(cfg.seed ^ (n * 0x9E3779B97F4A7C15ull)) | 1};
    size_t ml = strlen(marker), len = ml + below(&r, cap - ml + 1);
    for (size_t i = 0; i < len; i++)
        b[i] = (uint8_t)rnd(&r);
    for (size_t i = 0; i + ml <= len; i += MARKER_EVERY)
        memcpy(b + i, marker, ml);
    return len;
}

#define CANARY_LIVE 64
#define CANARY_MAX (64u << 10)

static void *canary_main(void *arg)
{
    kvp_client_t *cl = arg;
    canary_client = cl;
    uint8_t *want = malloc(CANARY_MAX), *got = malloc(CANARY_MAX);
    if (want == NULL || got == NULL) {
        violation("out of memory");
        return NULL;
    }
    rng_t r = {cfg.seed ^ 0xCA9A27ull};
    uint64_t first = 0, next = 0; /* live objects: [first, next) */
    char key[128], pattern[128];
    snprintf(pattern, sizeof(pattern), "^a/%s/", marker);
    kvp_put_config_t pc;
    kvp_put_config_init(&pc);
    pc.pin = KVP_PIN_HARD; /* never evicted: a missing object is a finding */
    for (unsigned iter = 0; !atomic_load(&stop); iter++) {
        /* put one */
        snprintf(key, sizeof(key), "a/%s/%" PRIu64, marker, next);
        size_t len = object_of(next, want, CANARY_MAX);
        canary_m0.size = sizeof(canary_m0);
        kvp_metrics_snapshot(cl, &canary_m0);
        uint64_t t0 = now_us();
        kvp_status_t s = kvp_put(cl, key, want, len, &pc);
        timed("put", t0);
        if (s != KVP_OK) {
            violation("the canary's put of %s: %s (%s)", key, kvp_strerror(s),
                      kvp_client_last_error());
            break;
        }
        atomic_fetch_add(&canary.puts, 1);
        next++;
        /* read one back, byte-exact */
        uint64_t n = first + below(&r, next - first);
        snprintf(key, sizeof(key), "a/%s/%" PRIu64, marker, n);
        len = object_of(n, want, CANARY_MAX);
        kvp_metrics_snapshot(cl, &canary_m0);
        t0 = now_us();
        int64_t g = kvp_get_into(cl, key, got, CANARY_MAX);
        timed("get", t0);
        if (g != (int64_t)len || memcmp(got, want, len) != 0) {
            violation("the canary's get of %s: %s", key,
                      g < 0 ? kvp_strerror((kvp_status_t)g) : "wrong bytes");
            break;
        }
        atomic_fetch_add(&canary.gets, 1);
        t0 = now_us();
        int e = kvp_is_exist(cl, key);
        timed("exist", t0);
        if (e != 1) {
            violation("the canary's exist of %s: %d", key, e);
            break;
        }
        atomic_fetch_add(&canary.exists, 1);
        /* its listing shows every live object */
        if (iter % 8 == 0) {
            kvp_key_info_t *keys = NULL;
            size_t nk = 0;
            t0 = now_us();
            s = kvp_list_keys(cl, pattern, 1000, &keys, &nk);
            timed("list", t0);
            if (s != KVP_OK || nk != next - first) {
                violation("the canary's list: %s, %zu keys of %" PRIu64, kvp_strerror(s), nk,
                          next - first);
                kvp_key_list_free(keys, nk);
                break;
            }
            kvp_key_list_free(keys, nk);
            atomic_fetch_add(&canary.lists, 1);
        }
        /* remove the oldest past CANARY_LIVE */
        if (next - first > CANARY_LIVE) {
            snprintf(key, sizeof(key), "a/%s/%" PRIu64, marker, first);
            t0 = now_us();
            s = kvp_remove(cl, key);
            timed("remove", t0);
            if (s != KVP_OK) {
                violation("the canary's remove of %s: %s", key, kvp_strerror(s));
                break;
            }
            atomic_fetch_add(&canary.removes, 1);
            first++;
        }
        usleep(2000); /* a client at work, not a flood: the fuzzer's turn too */
    }
    /* the end: every live object once more, byte-exact */
    for (uint64_t n = first; n < next && atomic_load(&violations) == 0; n++) {
        snprintf(key, sizeof(key), "a/%s/%" PRIu64, marker, n);
        size_t len = object_of(n, want, CANARY_MAX);
        int64_t g = kvp_get_into(cl, key, got, CANARY_MAX);
        if (g != (int64_t)len || memcmp(got, want, len) != 0)
            violation("at the end, the canary's get of %s: %s", key,
                      g < 0 ? kvp_strerror((kvp_status_t)g) : "wrong bytes");
        atomic_fetch_add(&canary.gets, 1);
    }
    free(want);
    free(got);
    return NULL;
}

/* ---- the master's RSS and descriptors ---- */

/* One sample of a watched process (the master, an owner): false when it is gone. */
static bool sample(const char *who, pid_t pid, unsigned rss_max_mib, unsigned fds_max,
                   atomic_long *rss_seen, atomic_long *fds_seen)
{
    if (kill(pid, 0) != 0) {
        violation("the %s (pid %d) is gone", who, (int)pid);
        return false;
    }
    long kib = kvp_proc_rss_kib(pid);
    int fds = kvp_proc_fd_count(pid);
    if (kib > atomic_load(rss_seen))
        atomic_store(rss_seen, kib);
    if (fds > atomic_load(fds_seen))
        atomic_store(fds_seen, fds);
    if (kib > (long)rss_max_mib * 1024)
        violation("the %s's RSS %ld MiB, over %u MiB", who, kib / 1024, rss_max_mib);
    if (fds > (int)fds_max)
        violation("the %s has %d descriptors open, over %u", who, fds, fds_max);
    return true;
}

static void *monitor_main(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop)) {
        if (!sample("master", cfg.pid, cfg.rss_max_mib, cfg.fds_max, &rss_max_kib, &fds_max_seen))
            break;
        if (cfg.owner_pid > 0 && !sample("owner", cfg.owner_pid, cfg.owner_rss_max_mib,
                                         cfg.owner_fds_max, &owner_rss_kib, &owner_fds_seen))
            break;
        usleep(50000);
    }
    return NULL;
}

/* ---- the report ---- */

static void report(double secs)
{
    char line[8192];
    size_t n = 0;
#define OUT(...)                                                                                   \
    do {                                                                                           \
        int w_ = snprintf(line + n, sizeof(line) - n, __VA_ARGS__);                                \
        if (w_ > 0 && (size_t)w_ < sizeof(line) - n)                                               \
            n += (size_t)w_;                                                                       \
    } while (0)
    OUT("insider_fuzz: seed %" PRIu64 ", %.0f s: %" PRIu64 " requests (", cfg.seed, secs,
        total_sent);
    if (cfg.owner != NULL) {
        n += owner_report(line + n, sizeof(line) - n);
    } else {
        uint64_t status_all[1 - STATUS_MIN] = {0}, closed = 0, unanswered = 0;
        for (size_t i = 0; i < n_methods; i++) {
            OUT("%s%s %" PRIu64, i ? ", " : "", methods[i].name, per[i].sent);
            for (int k = 0; k < 1 - STATUS_MIN; k++)
                status_all[k] += per[i].by_status[k];
            closed += per[i].closed;
            unanswered += per[i].unanswered;
        }
        OUT("), unanswered {");
        for (size_t i = 0, k = 0; i < n_methods; i++)
            if (per[i].unanswered)
                OUT("%s%s %" PRIu64, k++ ? ", " : "", methods[i].name, per[i].unanswered);
        OUT("}, answers {");
        bool any = false;
        for (int k = 0; k < 1 - STATUS_MIN; k++)
            if (status_all[k]) {
                OUT("%s%d: %" PRIu64, any ? ", " : "", -k, status_all[k]);
                any = true;
            }
        OUT("}, closed %" PRIu64 " (%" PRIu64 " unanswered)", closed, unanswered);
    }
    OUT("; canary %lu puts %lu gets %lu exists %lu lists %lu removes, worst %lu ms (%s); master "
        "RSS max %ld MiB, fds max %ld",
        atomic_load(&canary.puts), atomic_load(&canary.gets), atomic_load(&canary.exists),
        atomic_load(&canary.lists), atomic_load(&canary.removes),
        atomic_load(&canary.worst_us) / 1000, canary.worst_op[0] ? canary.worst_op : "-",
        atomic_load(&rss_max_kib) / 1024, atomic_load(&fds_max_seen));
    if (cfg.owner_pid > 0)
        OUT("; owner RSS max %ld MiB, fds max %ld", atomic_load(&owner_rss_kib) / 1024,
            atomic_load(&owner_fds_seen));
    OUT("; %u violations", atomic_load(&violations));
#undef OUT
    printf("%s\n", line);
    fflush(stdout);
}

static void report_last(void)
{
    fprintf(stderr,
            "insider_fuzz: to reproduce: --seed %" PRIu64 " (answers steer it: the "
            "frames are in --dump); the last requests:\n",
            cfg.seed);
    FILE *dump = cfg.dump != NULL ? fopen(cfg.dump, "we") : NULL;
    uint64_t from = total_sent > 16 ? total_sent - 15 : 1;
    for (uint64_t i = total_sent > RING ? total_sent - RING + 1 : 1; i <= total_sent; i++) {
        sent_t *s = &ring[i % RING];
        if (s->frame == NULL || s->n != i)
            continue;
        if (dump != NULL) {
            fprintf(dump, "#%" PRIu64 " %s %s %zu\n", s->n, s->who, s->method, s->len);
            fwrite(s->frame, 1, s->len, dump);
            fputc('\n', dump);
        }
        if (i < from)
            continue;
        fprintf(stderr, "  #%" PRIu64 " %s %s, %zu bytes:", s->n, s->who, s->method, s->len);
        for (size_t k = 0; k < s->len && k < s->head + 48; k++)
            fprintf(stderr, "%s%02x", k == s->head ? " | " : "", s->frame[k]);
        fprintf(stderr, "\n");
    }
    if (dump != NULL) {
        fclose(dump);
        fprintf(stderr, "insider_fuzz: the last %d frames as sent: %s\n", RING, cfg.dump);
    }
}

/* ---- setup ---- */

static bool read_token(const char *path, char *out, size_t cap, size_t *len_p)
{
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return false;
    size_t n = fread(out, 1, cap - 1, f);
    fclose(f);
    while (n > 0 && (out[n - 1] == '\n' || out[n - 1] == '\r'))
        n--;
    out[n] = 0;
    if (len_p != NULL)
        *len_p = n;
    return n > 0;
}

static void usage(void)
{
    fprintf(stderr, "usage: insider_fuzz --master HOST:PORT [--ca CA] --pid PID --canary "
                    "TOKEN_FILE|- --principal NAME=TOKEN_FILE|-|none... [--seconds N] [--seed N] "
                    "[--latency-ms N] [--rss-max-mib N] [--fds-max N] [--dump FILE] [--no-fuzz 1] "
                    "[--owner HOST:PORT --owner-shm NAME --owner-pid PID [--owner-rss-max-mib N] "
                    "[--owner-fds-max N] [--unwritten-puts 1]]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    const char *canary_file = NULL;
    cfg.seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v == NULL)
            usage();
        if (strcmp(a, "--master") == 0)
            cfg.master = v;
        else if (strcmp(a, "--ca") == 0)
            cfg.ca = v;
        else if (strcmp(a, "--pid") == 0)
            cfg.pid = (pid_t)atoi(v);
        else if (strcmp(a, "--canary") == 0)
            canary_file = v;
        else if (strcmp(a, "--seconds") == 0)
            cfg.seconds = (unsigned)atoi(v);
        else if (strcmp(a, "--seed") == 0)
            cfg.seed = strtoull(v, NULL, 0);
        else if (strcmp(a, "--latency-ms") == 0)
            cfg.latency_ms = (unsigned)atoi(v);
        else if (strcmp(a, "--rss-max-mib") == 0)
            cfg.rss_max_mib = (unsigned)atoi(v);
        else if (strcmp(a, "--fds-max") == 0)
            cfg.fds_max = (unsigned)atoi(v);
        else if (strcmp(a, "--dump") == 0)
            cfg.dump = v;
        else if (strcmp(a, "--no-fuzz") == 0)
            cfg.no_fuzz = atoi(v) != 0;
        else if (strcmp(a, "--owner") == 0)
            cfg.owner = v;
        else if (strcmp(a, "--owner-shm") == 0)
            cfg.owner_shm = v;
        else if (strcmp(a, "--owner-pid") == 0)
            cfg.owner_pid = (pid_t)atoi(v);
        else if (strcmp(a, "--owner-rss-max-mib") == 0)
            cfg.owner_rss_max_mib = (unsigned)atoi(v);
        else if (strcmp(a, "--owner-fds-max") == 0)
            cfg.owner_fds_max = (unsigned)atoi(v);
        else if (strcmp(a, "--unwritten-puts") == 0)
            cfg.unwritten_puts = atoi(v) != 0;
        else if (strcmp(a, "--principal") == 0 && cfg.n_p < MAX_PRINCIPALS) {
            const char *eq = strchr(v, '=');
            principal_t *p = &cfg.p[cfg.n_p];
            if (eq == NULL || (size_t)(eq - v) >= sizeof(p->name))
                usage();
            memcpy(p->name, v, (size_t)(eq - v));
            if (strcmp(eq + 1, "-") == 0 || strcmp(eq + 1, "none") == 0) {
                p->stranger = strcmp(eq + 1, "none") == 0; /* "-": no token, no ACL */
                cfg.n_p++;
                i++;
                continue;
            }
            if (!read_token(eq + 1, p->token, sizeof(p->token), &p->token_len)) {
                fprintf(stderr, "insider_fuzz: cannot read a token from %s\n", eq + 1);
                return 2;
            }
            cfg.n_p++;
        } else
            usage();
        i++;
    }
    if (cfg.master == NULL || cfg.pid <= 0 || canary_file == NULL || cfg.n_p == 0 ||
        cfg.seconds == 0)
        usage();
    const char *colon = strrchr(cfg.master, ':');
    if (colon == NULL || (size_t)(colon - cfg.master) >= sizeof(cfg.host))
        usage();
    memcpy(cfg.host, cfg.master, (size_t)(colon - cfg.master));
    cfg.port = (uint16_t)atoi(colon + 1);
    if (strcmp(canary_file, "-") != 0 &&
        !read_token(canary_file, cfg.canary_token, sizeof(cfg.canary_token), NULL)) {
        fprintf(stderr, "insider_fuzz: cannot read the canary's token from %s\n", canary_file);
        return 2;
    }
    n_methods = insider_methods(methods, MAX_METHODS);
    rng_t mr = {cfg.seed ^ 0x3A5C3A5Cull};
    snprintf(marker, sizeof(marker), "cnry%016" PRIx64, rnd(&mr));
    signal(SIGPIPE, SIG_IGN);
    if (cfg.owner != NULL &&
        !owner_init(cfg.owner, cfg.owner_shm, cfg.ca != NULL, cfg.unwritten_puts)) {
        fprintf(stderr, "insider_fuzz: --owner HOST:PORT, --owner-shm NAME\n");
        return 2;
    }

    kvp_client_params_t cp;
    kvp_client_params_init(&cp);
    cp.master_addr = cfg.master;
    cp.tls_ca = cfg.ca;
    cp.token = cfg.canary_token[0] ? cfg.canary_token : NULL;
    cp.rpc_timeout_ms = 5000;
    kvp_client_t *cl = NULL;
    kvp_status_t s = kvp_client_create(&cp, &cl);
    if (s != KVP_OK) {
        fprintf(stderr, "insider_fuzz: the canary cannot connect: %s (%s)\n", kvp_strerror(s),
                kvp_client_last_error());
        return 2;
    }
    fprintf(stderr, "insider_fuzz: seed %" PRIu64 ", %zu methods, %zu principals, %u s\n", cfg.seed,
            n_methods, cfg.n_p, cfg.seconds);
    uint64_t t0 = now_us();
    pthread_t tf, tc, tm;
    pthread_create(&tm, NULL, monitor_main, NULL);
    pthread_create(&tc, NULL, canary_main, cl);
    if (!cfg.no_fuzz)
        pthread_create(&tf, NULL, fuzzer_main, NULL);
    while (!atomic_load(&stop) && now_us() - t0 < (uint64_t)cfg.seconds * 1000000u)
        usleep(100000);
    atomic_store(&stop, true);
    if (!cfg.no_fuzz)
        pthread_join(tf, NULL);
    pthread_join(tc, NULL);
    pthread_join(tm, NULL);
    kvp_client_destroy(cl);
    report((double)(now_us() - t0) / 1e6);
    if (atomic_load(&violations) > 0) {
        report_last();
        return 1;
    }
    return 0;
}
