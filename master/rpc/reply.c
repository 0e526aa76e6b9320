/*
 * reply.c - the response builder: what every handler used to write around its answer.
 *
 * Design: a handler declares its response (Kvpool__XResponse resp = ..._INIT) and a
 * kvp_reply_t around it, allocates the arrays the response points into from the reply,
 * collects segment descriptors in r->segs, and ends with one of kvp_reply_send (the
 * answer), kvp_reply_fail / kvp_reply_deny (a whole-request status with why) or
 * kvp_reply_abort (no answer: out of memory). Each of them packs through kvp_call_reply
 * (call.c, the one packer) where there is an answer, runs the handler's end callback (undo
 * what only the answer would have told the caller of) and releases everything, so a
 * handler has no cleanup ladder of its own. The `status` and `message` fields are found by
 * name in the response's descriptor, as dispatch.c finds a request's keys: each response a
 * handler builds has a `status` (tests/unit/master/rpc/test_reply.c checks the method
 * table); those with a `message` give it room at init. A message is set only when not
 * empty: proto3 does not send an empty string, so the bytes are the same.
 *
 * Thread: master loop only.
 */
#include "master/rpc/reply.h"

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kvp_reply_init(kvp_reply_t *r, kvp_call_t *call, ProtobufCMessage *resp, size_t text_max)
{
    assert(text_max <= KVP_REPLY_TEXT_MAX);
    r->call = call;
    r->resp = resp;
    memset(&r->segs, 0, sizeof(r->segs));
    r->text_max = text_max;
    r->text[0] = '\0';
    r->n_arrays = 0;
    r->end_cb = NULL;
    r->end_arg = NULL;
}

void kvp_reply_on_end(kvp_reply_t *r, kvp_reply_end_cb_t cb, void *arg)
{
    r->end_cb = cb;
    r->end_arg = arg;
}

static void *keep(kvp_reply_t *r, void *p)
{
    assert(r->n_arrays < KVP_REPLY_ARRAYS_MAX);
    if (p != NULL)
        r->arrays[r->n_arrays++] = p;
    return p;
}

void *kvp_reply_alloc(kvp_reply_t *r, size_t n, size_t size)
{
    return keep(r, malloc((n ? n : 1) * size));
}

void *kvp_reply_calloc(kvp_reply_t *r, size_t n, size_t size)
{
    return keep(r, calloc(n ? n : 1, size));
}

/* The response's field `name` (of type `type`); it must have it. */
static void *field(kvp_reply_t *r, const char *name, ProtobufCType type, size_t **count_p)
{
    const ProtobufCFieldDescriptor *f =
        protobuf_c_message_descriptor_get_field_by_name(r->resp->descriptor, name);
    assert(f != NULL && f->type == type);
    (void)type; /* only asserted */
    if (count_p != NULL)
        *count_p = (size_t *)((char *)r->resp + f->quantifier_offset);
    return (char *)r->resp + f->offset;
}

int32_t *kvp_reply_statuses(kvp_reply_t *r, size_t n)
{
    int32_t *out = kvp_reply_alloc(r, n, sizeof(*out));
    if (out == NULL)
        return NULL;
    size_t *n_statuses;
    *(int32_t **)field(r, "statuses", PROTOBUF_C_TYPE_SINT32, &n_statuses) = out;
    *n_statuses = n;
    return out;
}

bool kvp_reply_segments(kvp_reply_t *r)
{
    if (!kvp_seg_set_finish(&r->segs) || !kvp_seg_set_conn_keys(r->call, &r->segs))
        return false;
    size_t *n_segments;
    Kvpool__SegmentDesc ***segments = field(r, "segments", PROTOBUF_C_TYPE_MESSAGE, &n_segments);
    *segments = r->segs.ptrs;
    *n_segments = r->segs.n;
    return true;
}

/* Run the end callback with rc, release what the reply holds; rc. */
static kvp_status_t end(kvp_reply_t *r, kvp_status_t rc)
{
    if (r->end_cb != NULL)
        r->end_cb(r, rc, r->end_arg);
    kvp_seg_set_free(&r->segs);
    for (unsigned i = 0; i < r->n_arrays; i++)
        free(r->arrays[i]);
    r->n_arrays = 0;
    return rc;
}

kvp_status_t kvp_reply_send(kvp_reply_t *r)
{
    if (r->text[0] != '\0')
        *(char **)field(r, "message", PROTOBUF_C_TYPE_STRING, NULL) = r->text;
    return end(r, kvp_call_reply(r->call, r->resp));
}

static kvp_status_t vfail(kvp_reply_t *r, int32_t status, const char *fmt, va_list ap)
{
    assert(fmt == NULL || r->text_max > 0);
    *(int32_t *)field(r, "status", PROTOBUF_C_TYPE_INT32, NULL) = status;
    if (fmt != NULL)
        vsnprintf(r->text, r->text_max, fmt, ap);
    return kvp_reply_send(r);
}

kvp_status_t kvp_reply_fail(kvp_reply_t *r, int32_t status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kvp_status_t rc = vfail(r, status, fmt, ap);
    va_end(ap);
    return rc;
}

kvp_status_t kvp_reply_deny(kvp_reply_t *r, const char *fmt, ...)
{
    r->call->st->stats.refused_role++;
    va_list ap;
    va_start(ap, fmt);
    kvp_status_t rc = vfail(r, KVP_ERR_DENIED, fmt, ap);
    va_end(ap);
    return rc;
}

kvp_status_t kvp_reply_abort(kvp_reply_t *r)
{
    return end(r, KVP_ERR_NOMEM);
}
