/*
 * registry.c - buffers the application registers (kvp_register_buffer, through
 * kvp_transfer_register_buffer):
 * remembered for the client's life with their memory kind (host or CUDA,
 * asked of the driver once, here) and registered with the transports that
 * need it (rdma memory regions, GPU dma-bufs) once, never per operation. The
 * engine reads the regions per op without a lock (registry.h).
 *
 * Thread: any client thread; changes are serialised by the registry's lock.
 */
#include <stdlib.h>
#include <string.h>

#include "client/mem/registry.h"

void kvp_mem_registry_init(kvp_mem_registry_t *reg)
{
    pthread_mutex_init(&reg->lock, NULL);
    atomic_init(&reg->cur, NULL);
    reg->retired = NULL;
}

void kvp_mem_registry_cleanup(kvp_mem_registry_t *reg)
{
    free(atomic_load(&reg->cur));
    while (reg->retired != NULL) {
        kvp_mem_snap_t *s = reg->retired;
        reg->retired = s->retired_next;
        free(s);
    }
    pthread_mutex_destroy(&reg->lock);
}

/* Index of the first region with addr > a (upper bound). */
static size_t snap_upper(const kvp_mem_snap_t *s, uintptr_t a)
{
    size_t lo = 0, hi = s->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (s->r[mid].addr <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

const kvp_mem_region_t *kvp_mem_lookup(kvp_mem_registry_t *reg, const void *addr, size_t len)
{
    const kvp_mem_snap_t *s = atomic_load_explicit(&reg->cur, memory_order_acquire);
    if (s == NULL || s->n == 0)
        return NULL;
    uintptr_t a = (uintptr_t)addr;
    size_t i = snap_upper(s, a);
    if (i == 0)
        return NULL;
    const kvp_mem_region_t *r = &s->r[i - 1];
    return a - r->addr < r->len && len <= r->len - (a - r->addr) ? r : NULL;
}

bool kvp_mem_overlaps_locked(kvp_mem_registry_t *reg, uintptr_t a, size_t len)
{
    const kvp_mem_snap_t *s = atomic_load_explicit(&reg->cur, memory_order_relaxed);
    if (s == NULL)
        return false;
    size_t i = snap_upper(s, a);
    if (i > 0 && s->r[i - 1].addr + s->r[i - 1].len > a)
        return true;
    return i < s->n && s->r[i].addr < a + len;
}

/* Publish a copy of the current snapshot with region r inserted (r != NULL) or the region
 * at index `drop` left out. */
static kvp_status_t snap_publish(kvp_mem_registry_t *reg, const kvp_mem_region_t *r, size_t drop)
{
    kvp_mem_snap_t *old = atomic_load_explicit(&reg->cur, memory_order_relaxed);
    size_t n = old ? old->n : 0;
    size_t m = r != NULL ? n + 1 : n - 1;
    kvp_mem_snap_t *s = malloc(sizeof(*s) + (m ? m : 1) * sizeof(s->r[0]));
    if (s == NULL)
        return KVP_ERR_NOMEM;
    s->retired_next = NULL;
    s->n = m;
    size_t w = 0;
    if (r != NULL) {
        size_t pos = old ? snap_upper(old, r->addr) : 0;
        for (size_t i = 0; i < pos; i++)
            s->r[w++] = old->r[i];
        s->r[w++] = *r;
        for (size_t i = pos; i < n; i++)
            s->r[w++] = old->r[i];
    } else {
        for (size_t i = 0; i < n; i++)
            if (i != drop)
                s->r[w++] = old->r[i];
    }
    atomic_store_explicit(&reg->cur, s, memory_order_release);
    if (old != NULL) {
        old->retired_next = reg->retired;
        reg->retired = old;
    }
    return KVP_OK;
}

kvp_status_t kvp_mem_insert_locked(kvp_mem_registry_t *reg, const kvp_mem_region_t *region)
{
    return snap_publish(reg, region, 0);
}

kvp_status_t kvp_mem_remove_locked(kvp_mem_registry_t *reg, uintptr_t addr,
                                   kvp_mem_region_t *region_p)
{
    const kvp_mem_snap_t *s = atomic_load_explicit(&reg->cur, memory_order_relaxed);
    for (size_t i = 0; s != NULL && i < s->n; i++) {
        if (s->r[i].addr != addr)
            continue;
        kvp_mem_region_t r = s->r[i];
        kvp_status_t st = snap_publish(reg, NULL, i);
        if (st == KVP_OK)
            *region_p = r;
        return st;
    }
    return KVP_ERR_NOT_FOUND;
}
