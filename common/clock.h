/*
 * clock.h - the monotonic clock, in nanoseconds and milliseconds.
 *
 * Thread-safe.
 */
#ifndef KVP_COMMON_CLOCK_H
#define KVP_COMMON_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t kvp_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t kvp_now_ms(void)
{
    return kvp_now_ns() / 1000000ull;
}

#endif
