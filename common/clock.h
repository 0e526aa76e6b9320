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

/* The monotonic time ms from now, as pthread_cond_timedwait takes it (a condition whose
 * clock is CLOCK_MONOTONIC: pthread_condattr_setclock). */
static inline struct timespec kvp_deadline_ms(uint64_t ms)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    t.tv_sec += (time_t)(ms / 1000);
    t.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000L;
    }
    return t;
}

#endif
