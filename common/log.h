/*
 * log.h - level-checked logging.
 *
 * KVP_LOG_*(fmt, ...) evaluates its arguments only when the level is on and
 * preserves errno, so `%m` works after a failed syscall. Daemons log to
 * stderr at "info" by default; the library is silent ("off") unless
 * KVPOOL_LOG_LEVEL is set or the application calls kvp_log_set_level().
 */
#ifndef KVP_COMMON_LOG_H
#define KVP_COMMON_LOG_H

#include <errno.h>
#include <stdbool.h>

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
/* Apply $KVPOOL_LOG_LEVEL if set and valid. */
void kvp_log_init_from_env(void);
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

#define KVP_LOG_ERROR(...) KVP_LOG_(KVP_LOG_ERROR, __VA_ARGS__)
#define KVP_LOG_WARN(...) KVP_LOG_(KVP_LOG_WARN, __VA_ARGS__)
#define KVP_LOG_INFO(...) KVP_LOG_(KVP_LOG_INFO, __VA_ARGS__)
#define KVP_LOG_DEBUG(...) KVP_LOG_(KVP_LOG_DEBUG, __VA_ARGS__)

#endif
