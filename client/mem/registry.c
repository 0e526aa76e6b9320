/*
 * registry.c - buffers the application registers (kvp_register_buffer):
 * remembered for the client's life, registered with the transports that
 * need it (rdma memory regions, GPU dma-bufs) once, never per operation.
 *
 * Thread: any client thread; the list is guarded by buf_lock.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/client_priv.h"
#include "client/internal.h"
#include "client/mem/gpu.h"
#include "common/crc32c.h"
#include "common/log.h"
#include "common/rpc.h"
#include "kvpool.pb-c.h"

static kvp_status_t register_buffer_impl(kvp_client_t *c, void *addr, size_t len)
{
    if (c == NULL || addr == NULL || len == 0)
        return KVP_ERR_INVALID_ARG;
    uintptr_t a = (uintptr_t)addr;
    kvp_status_t st = KVP_OK;
    pthread_mutex_lock(&c->buf_lock);
    for (reg_buf_t *b = c->bufs; b; b = b->next)
        if (a < b->addr + b->len && b->addr < a + len)
            st = KVP_ERR_EXISTS;
    if (st == KVP_OK) {
        reg_buf_t *b = malloc(sizeof(*b));
        if (b == NULL) {
            st = KVP_ERR_NOMEM;
        } else {
            st = kvp_transfer_register(&c->xfer, addr, len);
            if (st == KVP_OK) {
                *b = (reg_buf_t){.addr = a, .len = len, .next = c->bufs};
                c->bufs = b;
            } else {
                free(b);
            }
        }
    }
    pthread_mutex_unlock(&c->buf_lock);
    return st;
}

kvp_status_t kvp_register_buffer(kvp_client_t *c, void *addr, size_t len)
{
    kvp_api_enter();
    return (kvp_status_t)kvp_api_leave(register_buffer_impl(c, addr, len), "register_buffer");
}

static kvp_status_t unregister_buffer_impl(kvp_client_t *c, void *addr)
{
    if (c == NULL || addr == NULL)
        return KVP_ERR_INVALID_ARG;
    kvp_status_t st = KVP_ERR_NOT_FOUND;
    pthread_mutex_lock(&c->buf_lock);
    for (reg_buf_t **pp = &c->bufs; *pp; pp = &(*pp)->next) {
        if ((*pp)->addr == (uintptr_t)addr) {
            reg_buf_t *b = *pp;
            *pp = b->next;
            kvp_transfer_unregister(&c->xfer, addr);
            free(b);
            st = KVP_OK;
            break;
        }
    }
    pthread_mutex_unlock(&c->buf_lock);
    return st;
}

kvp_status_t kvp_unregister_buffer(kvp_client_t *c, void *addr)
{
    kvp_api_enter();
    return (kvp_status_t)kvp_api_leave(unregister_buffer_impl(c, addr), "unregister_buffer");
}
