/*
 * log.h - level-checked logging.
 *
 * KVP_LOG_*(fmt, ...) evaluates its arguments only when the level is on and
 * preserves errno, so `%m` works after a failed syscall. Daemons log to
 * stderr at "info" by default; the library is silent ("off") unless
 * KVPOOL_LOG_LEVEL is set or the application calls kvp_log_set_level().
 *
 * KVP_LOG_WARN_LIMITED(fmt, ...) is for per-operation paths: at most one line a
 * second from its call site; the lines held back in between are counted and
 * the count is said just before the next line that goes out.
 */
#ifndef KVP_COMMON_LOG_H
#define KVP_COMMON_LOG_H

#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

typedef enum kvp_log_level {
    KVP_LOG_OFF = 0,
    KVP_LOG_ERROR = 1,
    KVP_LOG_WARN = 2,
    KVP_LOG_INFO = 3,
    KVP_LOG_DEBUG = 4,
} kvp_log_level_t;

extern int kvp_log_level_g;

void kvp_log_set_level(kvp_log_level_t level);
/* Parse "off|error|warn|info|debug"; false when the text is none of these. */
bool kvp_log_parse_level(const char *text, kvp_log_level_t *level_p);
/* Apply $KVPOOL_LOG_LEVEL if set and valid; true when it is set (valid or not). The one
 * place the library reads it (a process-wide setting: every client's creation applies it);
 * kvpool-master reads it through its option table (master/master_options.c). */
bool kvp_log_init_from_env(void);
/* Prefix every line with this component name (borrowed; keep it static). */
void kvp_log_set_component(const char *name);

void kvp_log_write(kvp_log_level_t level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define KVP_LOG_(lvl, ...)                                                                         \
    do {                                                                                           \
        if (__builtin_expect(kvp_log_level_g >= (lvl), 0)) {                                       \
            int kvp_saved_errno_ = errno;                                                          \
            kvp_log_write((lvl), __FILE__, __LINE__, __VA_ARGS__);                                 \
            errno = kvp_saved_errno_;                                                              \
        }                                                                                          \
    } while (0)

/* One call site's rate limit (a static in KVP_LOG_LIMITED_); any thread. */
typedef struct kvp_log_limit {
    _Atomic uint64_t next_ms; /* the earliest time the next line may go out */
    _Atomic uint64_t held;    /* lines held back since the last one that went out */
} kvp_log_limit_t;

/* May a line of this call site go out at now_ms (at most one every every_ms)? true: yes,
 * *held_p the lines held back since the last one (now said: the count restarts); false: it
 * is held back and counted. */
bool kvp_log_limit_take(kvp_log_limit_t *limit, uint64_t now_ms, uint32_t every_ms,
                        uint64_t *held_p);
/* Milliseconds of CLOCK_MONOTONIC (the limiter's clock). */
uint64_t kvp_log_now_ms(void);

#define KVP_LOG_LIMITED_(lvl, ...)                                                                 \
    do {                                                                                           \
        static kvp_log_limit_t kvp_limit_;                                                         \
        uint64_t kvp_held_;                                                                        \
        if (__builtin_expect(kvp_log_level_g >= (lvl), 0) &&                                       \
            kvp_log_limit_take(&kvp_limit_, kvp_log_now_ms(), 1000, &kvp_held_)) {                 \
            if (kvp_held_ > 0)                                                                     \
                KVP_LOG_((lvl), "%llu lines like the next were held back in the last second",      \
                         (unsigned long long)kvp_held_);                                           \
            KVP_LOG_((lvl), __VA_ARGS__);                                                          \
        }                                                                                          \
    } while (0)

#define KVP_LOG_ERROR(...) KVP_LOG_(KVP_LOG_ERROR, __VA_ARGS__)
#define KVP_LOG_WARN(...) KVP_LOG_(KVP_LOG_WARN, __VA_ARGS__)
#define KVP_LOG_INFO(...) KVP_LOG_(KVP_LOG_INFO, __VA_ARGS__)
#define KVP_LOG_DEBUG(...) KVP_LOG_(KVP_LOG_DEBUG, __VA_ARGS__)
#define KVP_LOG_WARN_LIMITED(...) KVP_LOG_LIMITED_(KVP_LOG_WARN, __VA_ARGS__)

#endif
