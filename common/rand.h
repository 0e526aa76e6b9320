/*
 * rand.h - random numbers: seeds from the kernel, a fast generator for draws.
 *
 * Thread: kvp_random_u64 is thread-safe; kvp_rng_next uses only its state.
 */
#ifndef KVP_COMMON_RAND_H
#define KVP_COMMON_RAND_H

#include <stdint.h>

/* A random 64-bit value from getrandom(2) (never 0). */
uint64_t kvp_random_u64(void);

/*
 * xorshift64*: a fast deterministic generator (placement draws, benchmarks).
 * *state must not be 0.
 */
static inline uint64_t kvp_rng_next(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * 0x2545F4914F6CDD1Dull;
}

#endif
