/*
 * buffers.c - the public calls that register an application's buffers once, so
 * that the data path moves them zero-copy (kvp_register_buffer): a thin layer
 * over the transfer engine's registry (transfer/engine.c).
 *
 * Thread: any client thread; the registry's lock serialises changes.
 */
#include "client/api.h"
#include "client/client_priv.h"
#include "client/transfer/engine.h"

kvp_status_t kvp_register_buffer(kvp_client_t *c, void *addr, size_t len)
{
    kvp_api_enter();
    kvp_status_t st =
        c == NULL ? KVP_ERR_INVALID_ARG : kvp_transfer_register_buffer(&c->xfer, addr, len);
    return (kvp_status_t)kvp_api_leave(st, "register_buffer");
}

kvp_status_t kvp_unregister_buffer(kvp_client_t *c, void *addr)
{
    kvp_api_enter();
    kvp_status_t st =
        c == NULL ? KVP_ERR_INVALID_ARG : kvp_transfer_unregister_buffer(&c->xfer, addr);
    return (kvp_status_t)kvp_api_leave(st, "unregister_buffer");
}
