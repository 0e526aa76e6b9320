/*
 * event_sink.h - where the state and the handlers send KV events (objects stored on, or
 * removed from, a medium): an ops table they call without knowing who listens.
 *
 * The publisher (master/obs/events.c) implements it (kvp_events_sink); the server hands
 * the state its sink (kvp_master_state_t.events), NULL when no events are published.
 * Like client/transfer/transport.h: the callers never look behind the table, so the
 * state and the handlers stand below master/obs/ (tests/check_layering.py).
 *
 * Thread: the master's loop calls the ops; each returns at once (events.h says how).
 */
#ifndef KVP_MASTER_CORE_EVENT_SINK_H
#define KVP_MASTER_CORE_EVENT_SINK_H

#include <stddef.h>

typedef enum kvp_medium {
    KVP_MEDIUM_CPU = 0,  /* DRAM segments */
    KVP_MEDIUM_DISK = 1, /* SSD segments */
} kvp_medium_t;
#define KVP_MEDIUM_COUNT 2

typedef struct kvp_event_sink_ops {
    /* An object was stored on / removed from a medium. */
    void (*stored)(void *ctx, kvp_medium_t medium, const char *key, size_t key_len);
    void (*removed)(void *ctx, kvp_medium_t medium, const char *key, size_t key_len);
    /* Every object of the medium is gone (remove-all). */
    void (*cleared)(void *ctx, kvp_medium_t medium);
} kvp_event_sink_ops_t;

typedef struct kvp_event_sink {
    const kvp_event_sink_ops_t *ops;
    void *ctx; /* the implementation's (the publisher) */
} kvp_event_sink_t;

/* Send one event through sink; NULL (no publisher) is a no-op. */
static inline void kvp_event_stored(const kvp_event_sink_t *sink, kvp_medium_t medium,
                                    const char *key, size_t key_len)
{
    if (sink != NULL)
        sink->ops->stored(sink->ctx, medium, key, key_len);
}

static inline void kvp_event_removed(const kvp_event_sink_t *sink, kvp_medium_t medium,
                                     const char *key, size_t key_len)
{
    if (sink != NULL)
        sink->ops->removed(sink->ctx, medium, key, key_len);
}

static inline void kvp_event_cleared(const kvp_event_sink_t *sink, kvp_medium_t medium)
{
    if (sink != NULL)
        sink->ops->cleared(sink->ctx, medium);
}

#endif
