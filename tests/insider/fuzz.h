/*
 * fuzz.h - what the insider fuzzer's parts share (insider_fuzz.c: the master's methods, the
 * canary, the monitor, the report; owner_frames.c: an owner's data plane): its random
 * numbers, its clock, its violations and the ring of the last frames sent, and a call to
 * the master on the fuzzing principal's connection.
 */
#ifndef KVP_TESTS_INSIDER_FUZZ_H
#define KVP_TESTS_INSIDER_FUZZ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* random numbers (xorshift64*, one stream per thread) */
typedef struct rng {
    uint64_t s;
} rng_t;

static inline uint64_t rnd(rng_t *r)
{
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545F4914F6CDD1Dull;
}

static inline uint64_t below(rng_t *r, uint64_t n)
{
    return n == 0 ? 0 : rnd(r) % n;
}

static inline bool chance(rng_t *r, unsigned one_in)
{
    return below(r, one_in) == 0;
}

/* CLOCK_MONOTONIC in us. */
uint64_t now_us(void);
/* Report a violation (stderr) and end the run. */
void violation(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Tenant A's canary marker in b (what the fuzzer received, `what`): a violation. */
void check_leak(const uint8_t *b, size_t n, const char *what);
/* Keep the frame a || b (sent by `who`, of kind `what`, both static text) among the last
 * ones for the report: its number. */
uint64_t remember(const char *who, const char *what, const uint8_t *a, size_t alen,
                  const uint8_t *b, size_t blen);

/* The fuzzing principal's connection to the master (insider_fuzz.c). */
typedef struct conn conn_t;
/* Send one request of `method` with `body` on c and wait for its answer: true when it was
 * answered with frame status 0 (*resp_p, *resp_len_p: its body, malloc'd, or NULL); false
 * otherwise (the connection dropped when it closed or kept silent). */
bool master_call(conn_t *c, uint16_t method, const uint8_t *body, size_t len, uint8_t **resp_p,
                 size_t *resp_len_p);

#endif
