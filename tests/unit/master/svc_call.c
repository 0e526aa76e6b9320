/*
 * svc_call.c - see svc_call.h.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "tests/unit/master/svc_call.h"

int svc_state_setup(void **state)
{
    kvp_master_state_t *st = calloc(1, sizeof(*st));
    if (st == NULL || kvp_master_state_init(st) != KVP_OK)
        return -1;
    *state = st;
    return 0;
}

int svc_state_teardown(void **state)
{
    kvp_master_state_cleanup(*state);
    free(*state);
    return 0;
}

void *svc_call(kvp_master_state_t *st, uint64_t conn, uint16_t method, const ProtobufCMessage *req,
               const ProtobufCMessageDescriptor *resp_desc)
{
    void *m = svc_call_as(st, conn, NULL, method, req, resp_desc);
    assert_non_null(m);
    return m;
}

void *svc_call_as(kvp_master_state_t *st, uint64_t conn, const kvp_principal_t *who,
                  uint16_t method, const ProtobufCMessage *req,
                  const ProtobufCMessageDescriptor *resp_desc)
{
    size_t n = protobuf_c_message_get_packed_size(req);
    uint8_t *body = malloc(n ? n : 1);
    assert_non_null(body);
    assert_int_equal(protobuf_c_message_pack(req, body), n);
    uint8_t *resp = NULL;
    size_t rlen = 0;
    char err[256] = "";
    kvp_status_t s =
        kvp_dispatch_handle(st, conn, who, method, body, n, &resp, &rlen, err, sizeof(err));
    free(body);
    if (s != KVP_OK)
        fail_msg("method %u: frame-level status %d (%s)", method, s, err);
    if (resp == NULL)
        return NULL; /* no answer (a SegRecord that became a stream) */
    ProtobufCMessage *m = protobuf_c_message_unpack(resp_desc, NULL, rlen, resp);
    free(resp);
    assert_non_null(m);
    return m;
}

void svc_msg_free(void *msg)
{
    protobuf_c_message_free_unpacked((ProtobufCMessage *)msg, NULL);
}

static ProtobufCBinaryData *keys_buf;
static size_t keys_cap;

static void keys_free(void)
{
    free(keys_buf);
}

ProtobufCBinaryData *svc_keys(const char *const *keys, size_t n)
{
    if (n > keys_cap) {
        if (keys_buf == NULL)
            atexit(keys_free);
        keys_buf = realloc(keys_buf, n * sizeof(*keys_buf));
        assert_non_null(keys_buf);
        keys_cap = n;
    }
    for (size_t i = 0; i < n; i++) {
        keys_buf[i].data = (uint8_t *)keys[i];
        keys_buf[i].len = strlen(keys[i]);
    }
    return keys_buf;
}
