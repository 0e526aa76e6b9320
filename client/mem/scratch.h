/*
 * scratch.h - a thread's scratch arena for the per-batch state of one call.
 *
 * The object flows need arrays sized by the batch (statuses, key views,
 * transfer ops) and the unpacked master replies. They come from a bump
 * arena owned by the calling thread: grown to the largest batch the thread
 * has seen, then reused, so a steady stream of calls allocates nothing.
 * Everything taken after a mark is given back at once by releasing to it;
 * the outermost public call (kvp_api_leave) releases all.
 *
 * Thread: each thread has its own arena; nothing is shared.
 */
#ifndef KVP_CLIENT_MEM_SCRATCH_H
#define KVP_CLIENT_MEM_SCRATCH_H

#include <stddef.h>

#include <protobuf-c/protobuf-c.h>

/* Where the arena is now; release to it to give back what was taken since. */
size_t kvp_scratch_mark(void);
void kvp_scratch_release(size_t mark);
/* 16-byte aligned memory valid until the release of an earlier mark; NULL when out of
 * memory. Never freed one by one. */
void *kvp_scratch_alloc(size_t len);
void *kvp_scratch_calloc(size_t n, size_t size);

/* Growable buffers of the calling thread, kept until it exits (freed then): the master
 * connection's reply buffer, its request packing buffer, and the keys of a request put in
 * the client's namespace for its packing (control/key_scope.c). */
typedef struct kvp_thread_buf {
    unsigned char *p;
    size_t cap;
} kvp_thread_buf_t;
enum { KVP_TBUF_RX = 0, KVP_TBUF_PACK = 1, KVP_TBUF_KEYS = 2, KVP_TBUF_COUNT };
/* NULL only when out of memory. */
kvp_thread_buf_t *kvp_thread_buf(int which);
/* Make b hold at least len bytes (another thread's buffer is allowed while that thread
 * waits on us). NULL when out of memory (the buffer is unchanged). */
unsigned char *kvp_thread_buf_reserve(kvp_thread_buf_t *b, size_t len);

/* Bytes the calling thread's main block holds (diagnostics and tests): after a call
 * that overflowed it, the next release to empty grows it to what that call needed. */
size_t kvp_scratch_capacity(void);

/* protobuf-c allocator over the arena (its free does nothing): for unpacking replies. */
extern ProtobufCAllocator kvp_scratch_pb;

#endif
