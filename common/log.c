/*
 * log.c - stderr logging with a level check and a component prefix.
 *
 * Thread-safe: one fprintf per line (stdio locks the stream); the rate
 * limits of per-operation paths are atomics.
 */
#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int kvp_log_level_g = KVP_LOG_OFF;
static const char *log_component = "kvpool";

static const char *const level_names[] = {"off", "error", "warn", "info", "debug"};

void kvp_log_set_level(kvp_log_level_t level)
{
    kvp_log_level_g = level;
}

void kvp_log_set_component(const char *name)
{
    log_component = name;
}

bool kvp_log_parse_level(const char *text, kvp_log_level_t *level_p)
{
    for (int i = 0; i < (int)(sizeof(level_names) / sizeof(level_names[0])); i++) {
        if (text != NULL && strcasecmp(text, level_names[i]) == 0) {
            *level_p = (kvp_log_level_t)i;
            return true;
        }
    }
    return false;
}

bool kvp_log_init_from_env(void)
{
    kvp_log_level_t level;
    /* process-wide, like the level itself: read here, not by the client's env.c */
    const char *env = getenv("KVPOOL_LOG_LEVEL");
    if (env != NULL && kvp_log_parse_level(env, &level))
        kvp_log_set_level(level);
    return env != NULL;
}

void kvp_log_write(kvp_log_level_t level, const char *file, int line, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);

    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    const char *base = strrchr(file, '/');
    fprintf(stderr, "%02d:%02d:%02d.%03ld %s %-5s %s (%s:%d)\n", tm.tm_hour, tm.tm_min, tm.tm_sec,
            ts.tv_nsec / 1000000, log_component, level_names[level], msg, base ? base + 1 : file,
            line);
}

uint64_t kvp_log_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

bool kvp_log_limit_take(kvp_log_limit_t *limit, uint64_t now_ms, uint32_t every_ms,
                        uint64_t *held_p)
{
    uint64_t next = atomic_load_explicit(&limit->next_ms, memory_order_relaxed);
    /* one thread wins the slot; the others count themselves held back */
    if (now_ms >= next &&
        atomic_compare_exchange_strong(&limit->next_ms, &next, now_ms + every_ms)) {
        *held_p = atomic_exchange(&limit->held, 0);
        return true;
    }
    atomic_fetch_add_explicit(&limit->held, 1, memory_order_relaxed);
    return false;
}
