/*
 * scratch.c - the per-thread bump arena (see scratch.h).
 *
 * Design: one main block per thread. A request that does not fit takes an
 * overflow block from malloc; when the arena is released to empty, the
 * overflow blocks are freed and the main block is regrown once to hold
 * everything the call needed, so the next call of that size fits. The
 * blocks are freed when the thread exits (a pthread key destructor).
 *
 * Thread: thread-local; no locks.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "client/mem/scratch.h"

#define ALIGN 16u
#define MIN_BLOCK (64u << 10)

typedef struct overflow {
    struct overflow *next;
    size_t len;
} overflow_t;

typedef struct arena {
    uint8_t *blk;
    size_t cap, used;
    overflow_t *over; /* blocks taken since the arena was last empty */
    size_t over_bytes;
    kvp_thread_buf_t bufs[KVP_TBUF_COUNT];
} arena_t;

static _Thread_local arena_t *tl_arena;
static pthread_key_t arena_key;
static pthread_once_t arena_once = PTHREAD_ONCE_INIT;

static void arena_free_over(arena_t *a)
{
    while (a->over != NULL) {
        overflow_t *o = a->over;
        a->over = o->next;
        free(o);
    }
    a->over_bytes = 0;
}

static void arena_destroy(void *p)
{
    arena_t *a = p;
    arena_free_over(a);
    free(a->blk);
    for (int i = 0; i < KVP_TBUF_COUNT; i++)
        free(a->bufs[i].p);
    free(a);
}

static void arena_key_init(void)
{
    pthread_key_create(&arena_key, arena_destroy);
}

static arena_t *arena(void)
{
    if (tl_arena == NULL) {
        pthread_once(&arena_once, arena_key_init);
        arena_t *a = calloc(1, sizeof(*a));
        if (a == NULL)
            return NULL;
        pthread_setspecific(arena_key, a);
        tl_arena = a;
    }
    return tl_arena;
}

size_t kvp_scratch_mark(void)
{
    arena_t *a = arena();
    return a ? a->used : 0;
}

void kvp_scratch_release(size_t mark)
{
    arena_t *a = tl_arena;
    if (a == NULL)
        return;
    a->used = mark < a->used ? mark : a->used;
    if (a->used == 0 && a->over != NULL) {
        /* the last call did not fit: grow the main block once to what it needed */
        size_t want = a->cap + a->over_bytes;
        arena_free_over(a);
        uint8_t *b = malloc(want);
        if (b != NULL) {
            free(a->blk);
            a->blk = b;
            a->cap = want;
        }
    }
}

void *kvp_scratch_alloc(size_t len)
{
    arena_t *a = arena();
    if (a == NULL)
        return NULL;
    len = (len + ALIGN - 1) & ~(size_t)(ALIGN - 1);
    if (len == 0)
        len = ALIGN;
    if (a->blk == NULL && a->used == 0) {
        size_t cap = len > MIN_BLOCK ? len : MIN_BLOCK;
        a->blk = malloc(cap);
        a->cap = a->blk ? cap : 0;
    }
    if (a->blk != NULL && a->cap - a->used >= len) {
        void *p = a->blk + a->used;
        a->used += len;
        return p;
    }
    /* does not fit: an overflow block until the arena is next empty */
    overflow_t *o = malloc(sizeof(overflow_t) + ALIGN + len);
    if (o == NULL)
        return NULL;
    o->next = a->over;
    o->len = len;
    a->over = o;
    a->over_bytes += len + ALIGN;
    return (uint8_t *)o + ((sizeof(overflow_t) + ALIGN - 1) & ~(size_t)(ALIGN - 1));
}

void *kvp_scratch_calloc(size_t n, size_t size)
{
    if (size != 0 && n > SIZE_MAX / size)
        return NULL;
    void *p = kvp_scratch_alloc(n * size);
    if (p != NULL)
        memset(p, 0, n * size);
    return p;
}

size_t kvp_scratch_capacity(void)
{
    return tl_arena ? tl_arena->cap : 0;
}

kvp_thread_buf_t *kvp_thread_buf(int which)
{
    arena_t *a = arena();
    return a ? &a->bufs[which] : NULL;
}

unsigned char *kvp_thread_buf_reserve(kvp_thread_buf_t *b, size_t len)
{
    if (len > b->cap || b->p == NULL) {
        size_t cap = len > 4096 ? len : 4096;
        unsigned char *p = realloc(b->p, cap);
        if (p == NULL)
            return NULL;
        b->p = p;
        b->cap = cap;
    }
    return b->p;
}

static void *pb_alloc(void *data, size_t size)
{
    (void)data;
    return kvp_scratch_alloc(size);
}

static void pb_free(void *data, void *ptr)
{
    (void)data;
    (void)ptr;
}

ProtobufCAllocator kvp_scratch_pb = {.alloc = pb_alloc, .free = pb_free, .allocator_data = NULL};
