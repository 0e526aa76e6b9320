/*
 * client_type.c - kvpool._kvpool.Client: one kvp_client_t, its raw calls.
 *
 * Design: each method parses its arguments, positional or keyword, with the
 * converters of args.c while holding the GIL, then drops the GIL for the
 * library call, so Python threads sharing one Client run their transfers in
 * parallel (the C library is thread-safe); the batch calls go through the
 * one path of batch.c. Results are raw: object sizes and kvp_status_t codes,
 * never exceptions for what the library refuses; kvpool.Client and
 * mooncake.store turn them into exceptions or Mooncake's codes. Only bad
 * Python input (TypeError, ValueError) and a closed client (kvpool.Error,
 * KVP_ERR_SHUTDOWN) raise.
 *
 * A heap type made by the module's exec slot (module.c), tracked by the
 * garbage collector like its instances' reference to it; methods find the
 * module state (kvpool.Error, BufferHandle) from the instance's type.
 *
 * Invariant: self->c is only read under self->lock (read side, GIL released)
 * and only cleared under its write side, so close() waits for every call in
 * flight and no call ever sees a destroyed client.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "kvpool_py.h"

#include <structmember.h> /* after Python.h: T_PYSSIZET for __weaklistoffset__ */

kvp_client_t *kvp_py_client_lock(kvp_py_client_t *self)
{
    pthread_rwlock_rdlock(&self->lock);
    if (self->c == NULL) {
        pthread_rwlock_unlock(&self->lock);
        return NULL;
    }
    return self->c;
}

void kvp_py_client_unlock(kvp_py_client_t *self)
{
    pthread_rwlock_unlock(&self->lock);
}

PyObject *kvp_py_raise_closed(kvp_py_client_t *self)
{
    return kvp_py_raise(kvp_py_state_of(Py_TYPE(self)), KVP_ERR_SHUTDOWN, "the client is closed");
}

/* A call's int result (size, count or status), or the closed error when c is NULL. */
static PyObject *int_result(kvp_py_client_t *self, const kvp_client_t *c, int64_t r)
{
    if (c == NULL)
        return kvp_py_raise_closed(self);
    return PyLong_FromLongLong(r);
}

int kvp_py_call_failed(kvp_py_client_t *self, const kvp_client_t *c, kvp_status_t st,
                       PyObject **ret_p)
{
    if (c != NULL && st == KVP_OK)
        return 0;
    *ret_p = int_result(self, c, st);
    return 1;
}

/* ---------------- lifetime ---------------- */

static PyObject *client_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    (void)args;
    (void)kw;
    kvp_py_client_t *self = (kvp_py_client_t *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
    /* close() must not wait behind a stream of new readers */
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&self->lock, &attr);
    pthread_rwlockattr_destroy(&attr);
    return (PyObject *)self;
}

/* O&: Client()'s optional sizes; None leaves the library's default. */
static int size_or_none(PyObject *o, void *p, const char *what)
{
    size_t v;
    if (o == Py_None)
        return 1;
    if (kvp_py_size(o, &v, what) != 0)
        return 0;
    *(uint64_t *)p = v;
    return 1;
}

static int segment_size_conv(PyObject *o, void *p)
{
    return size_or_none(o, p, "segment_size");
}

static int file_offset_conv(PyObject *o, void *p)
{
    return size_or_none(o, p, "segment_file_offset");
}

static int rpc_timeout_conv(PyObject *o, void *p)
{
    return o == Py_None || kvp_py_u32(o, p, "rpc_timeout_ms") == 0;
}

static int tcp_streams_conv(PyObject *o, void *p)
{
    return o == Py_None || kvp_py_u32(o, p, "tcp_streams") == 0;
}

static int client_init(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"master",
                             "segment_size",
                             "transport",
                             "rpc_timeout_ms",
                             "data_host",
                             "segment_name",
                             "rdma_devices",
                             "verify_crc",
                             "tcp_streams",
                             "tls_cert",
                             "tls_key",
                             "tls_ca",
                             "token",
                             "segment_tenant",
                             "segment_file",
                             "segment_file_offset",
                             "dfs_path",
                             "tenant_id",
                             NULL};
    kvp_client_params_t p;
    kvp_client_params_init(&p);
    int verify_crc = 1;
    if (!PyArg_ParseTupleAndKeywords(
            args, kw, "|zO&zO&zzzpO&zzzzzzO&zz:Client", kwlist, &p.master_addr, segment_size_conv,
            &p.segment_size, &p.transport, rpc_timeout_conv, &p.rpc_timeout_ms, &p.data_host,
            &p.segment_name, &p.rdma_devices, &verify_crc, tcp_streams_conv, &p.tcp_streams,
            &p.tls_cert, &p.tls_key, &p.tls_ca, &p.token, &p.segment_tenant, &p.segment_file,
            file_offset_conv, &p.segment_file_offset, &p.dfs_path, &p.tenant_id))
        return -1;
    if (self->c != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Client.__init__ called twice");
        return -1;
    }
    p.verify_crc = verify_crc ? 1 : 0;
    kvp_client_t *c = NULL;
    kvp_status_t st;
    PyThreadState *ts = PyEval_SaveThread();
    st = kvp_client_create(&p, &c);
    PyEval_RestoreThread(ts);
    if (st != KVP_OK) {
        kvp_py_raise(kvp_py_state_of(Py_TYPE(self)), st, NULL);
        return -1;
    }
    self->c = c;
    return 0;
}

/*
 * Destroy the async queue and the client once no call is in flight (the
 * queue first: it waits for its batches, which use the client). Idempotent.
 */
static void client_close_impl(kvp_py_client_t *self)
{
    kvp_aq_t *aq;
    PyThreadState *ts = PyEval_SaveThread();
    pthread_rwlock_wrlock(&self->lock);
    kvp_client_t *c = self->c;
    aq = self->aq;
    self->c = NULL;
    self->aq = NULL;
    pthread_rwlock_unlock(&self->lock);
    kvp_aq_destroy(aq);
    kvp_client_destroy(c);
    PyEval_RestoreThread(ts);
    kvp_py_aq_free_ops(self, aq, NULL);
}

/* The instance holds its (heap) type; the queue's tokens are not visited: a batch
 * in flight owns its token until it is reaped or the queue is destroyed. */
static int client_traverse(kvp_py_client_t *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    return 0;
}

static void client_dealloc(kvp_py_client_t *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (self->weaklist != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    client_close_impl(self);
    pthread_rwlock_destroy(&self->lock);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyObject *client_close(kvp_py_client_t *self, PyObject *unused)
{
    (void)unused;
    client_close_impl(self);
    Py_RETURN_NONE;
}

static PyObject *client_closed(kvp_py_client_t *self, void *unused)
{
    (void)unused;
    return PyBool_FromLong(self->c == NULL);
}

static PyObject *client_segment_name(kvp_py_client_t *self, PyObject *unused)
{
    (void)unused;
    kvp_client_t *c;
    char name[512] = "";
    int has = 0;
    KVP_PY_WITH_CLIENT(self, c, {
        const char *s = kvp_client_segment_name(c);
        if (s != NULL) {
            snprintf(name, sizeof(name), "%s", s);
            has = 1;
        }
    });
    if (c == NULL)
        return kvp_py_raise_closed(self);
    if (!has)
        Py_RETURN_NONE;
    return PyUnicode_FromString(name);
}

/* ---------------- single-key calls ---------------- */

static PyObject *client_put(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"key", "buffer", "config", NULL};
    const char *key;
    Py_buffer view;
    kvp_py_config_t cfg = {.p = NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&y*|O&:put", kwlist, kvp_py_key_conv, &key, &view,
                                     kvp_py_config_conv, &cfg))
        return NULL;
    kvp_client_t *c;
    kvp_status_t st = KVP_OK;
    KVP_PY_WITH_CLIENT(self, c, st = kvp_put(c, key, view.buf, (size_t)view.len, cfg.p));
    PyBuffer_Release(&view);
    kvp_py_config_release(&cfg);
    return int_result(self, c, st);
}

static PyObject *client_put_from(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"key", "ptr", "size", "config", NULL};
    const char *key;
    void *ptr;
    size_t size;
    kvp_py_config_t cfg = {.p = NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O&O&|O&:put_from", kwlist, kvp_py_key_conv, &key,
                                     kvp_py_ptr_conv, &ptr, kvp_py_size_conv, &size,
                                     kvp_py_config_conv, &cfg))
        return NULL;
    kvp_client_t *c;
    kvp_status_t st = KVP_OK;
    KVP_PY_WITH_CLIENT(self, c, st = kvp_put(c, key, ptr, size, cfg.p));
    kvp_py_config_release(&cfg);
    return int_result(self, c, st);
}

/* put_parts(key, parts, config=None): one object from several buffers, in order. */
static PyObject *client_put_parts(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"key", "parts", "config", NULL};
    const char *key;
    kvp_py_bufs_t parts;
    kvp_py_config_t cfg = {.p = NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O&|O&:put_parts", kwlist, kvp_py_key_conv, &key,
                                     kvp_py_parts_conv, &parts, kvp_py_config_conv, &cfg))
        return NULL;
    const void *const *bufs1[1] = {(const void *const *)parts.ptrs.v};
    const size_t *sizes1[1] = {parts.sizes.v};
    size_t nb[1] = {(size_t)parts.ptrs.n};
    kvp_status_t res[1] = {KVP_OK};
    kvp_client_t *c;
    KVP_PY_WITH_CLIENT(self, c,
                       kvp_batch_put_from_multi(c, &key, bufs1, sizes1, nb, 1, cfg.p, res));
    kvp_py_parts_conv(NULL, &parts);
    kvp_py_config_release(&cfg);
    return int_result(self, c, res[0]);
}

/* get(key) -> bytes, or a negative status (int). */
static PyObject *client_get(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"key", NULL};
    const char *key;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&:get", kwlist, kvp_py_key_conv, &key))
        return NULL;
    /* The size first, then the bytes straight into a new bytes object. An upsert
     * in between can make the object larger: then ask again. */
    for (int attempt = 0;; attempt++) {
        kvp_client_t *c;
        int64_t size = 0;
        KVP_PY_WITH_CLIENT(self, c, size = kvp_get_size(c, key));
        if (c == NULL || size < 0)
            return int_result(self, c, size);
        PyObject *bytes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
        if (bytes == NULL)
            return NULL;
        char *dst = PyBytes_AS_STRING(bytes);
        int64_t got = 0;
        KVP_PY_WITH_CLIENT(self, c, got = kvp_get_into(c, key, dst, (size_t)size));
        if (c != NULL && got == KVP_ERR_BUFFER_TOO_SMALL && attempt < 4) {
            Py_DECREF(bytes);
            continue;
        }
        if (c == NULL || got < 0) {
            Py_DECREF(bytes);
            return int_result(self, c, got);
        }
        if (got < size && _PyBytes_Resize(&bytes, (Py_ssize_t)got) != 0)
            return NULL;
        return bytes;
    }
}

static PyObject *client_get_into(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"key", "buffer", NULL};
    const char *key;
    Py_buffer view;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&w*:get_into", kwlist, kvp_py_key_conv, &key,
                                     &view))
        return NULL;
    kvp_client_t *c;
    int64_t got = 0;
    KVP_PY_WITH_CLIENT(self, c, got = kvp_get_into(c, key, view.buf, (size_t)view.len));
    PyBuffer_Release(&view);
    return int_result(self, c, got);
}

static PyObject *client_get_into_ptr(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"key", "ptr", "size", NULL};
    const char *key;
    void *ptr;
    size_t size;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O&O&:get_into_ptr", kwlist, kvp_py_key_conv, &key,
                                     kvp_py_ptr_conv, &ptr, kvp_py_size_conv, &size))
        return NULL;
    kvp_client_t *c;
    int64_t got = 0;
    KVP_PY_WITH_CLIENT(self, c, got = kvp_get_into(c, key, ptr, size));
    return int_result(self, c, got);
}

/* get_size(key) -> size, or a negative status; is_exist(key) -> 1, 0 or a negative status */
static PyObject *key_call(kvp_py_client_t *self, PyObject *args, PyObject *kw, const char *format,
                          int exist)
{
    static char *kwlist[] = {"key", NULL};
    const char *key;
    if (!PyArg_ParseTupleAndKeywords(args, kw, format, kwlist, kvp_py_key_conv, &key))
        return NULL;
    kvp_client_t *c;
    int64_t r = 0;
    KVP_PY_WITH_CLIENT(self, c, r = exist ? kvp_is_exist(c, key) : kvp_get_size(c, key));
    return int_result(self, c, r);
}

static PyObject *client_get_size(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    return key_call(self, args, kw, "O&:get_size", 0);
}

static PyObject *client_is_exist(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    return key_call(self, args, kw, "O&:is_exist", 1);
}

static PyObject *client_remove(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"key", "force", NULL};
    const char *key;
    int force = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|p:remove", kwlist, kvp_py_key_conv, &key,
                                     &force))
        return NULL;
    kvp_client_t *c;
    kvp_status_t st = KVP_OK;
    KVP_PY_WITH_CLIENT(self, c, st = force ? kvp_remove_force(c, key) : kvp_remove(c, key));
    return int_result(self, c, st);
}

/* A remove_all / remove_by_regex result: the count removed, or a negative status. */
static PyObject *count_result(kvp_py_client_t *self, const kvp_client_t *c, kvp_status_t st,
                              uint64_t removed)
{
    PyObject *ret;
    if (kvp_py_call_failed(self, c, st, &ret))
        return ret;
    return PyLong_FromUnsignedLongLong(removed);
}

static PyObject *client_remove_all(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"force", NULL};
    int force = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|p:remove_all", kwlist, &force))
        return NULL;
    kvp_client_t *c;
    kvp_status_t st = KVP_OK;
    uint64_t removed = 0;
    KVP_PY_WITH_CLIENT(self, c, st = kvp_remove_all(c, force, &removed));
    return count_result(self, c, st, removed);
}

static int drain_timeout_conv(PyObject *o, void *p)
{
    return o == Py_None || kvp_py_u32(o, p, "timeout_ms") == 0;
}

static PyObject *client_drain(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"timeout_ms", NULL};
    uint32_t timeout_ms = 30000;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O&:drain", kwlist, drain_timeout_conv,
                                     &timeout_ms))
        return NULL;
    kvp_client_t *c;
    kvp_status_t st = KVP_OK;
    uint64_t moved = 0, lost = 0;
    KVP_PY_WITH_CLIENT(self, c, st = kvp_drain(c, timeout_ms, &moved, &lost));
    PyObject *ret;
    if (kvp_py_call_failed(self, c, st, &ret))
        return ret;
    return Py_BuildValue("(KK)", (unsigned long long)moved, (unsigned long long)lost);
}

static PyObject *client_remove_by_regex(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"pattern", "force", NULL};
    const char *pat;
    int force = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|p:remove_by_regex", kwlist, kvp_py_key_conv,
                                     &pat, &force))
        return NULL;
    kvp_client_t *c;
    kvp_status_t st = KVP_OK;
    uint64_t removed = 0;
    KVP_PY_WITH_CLIENT(self, c, st = kvp_remove_by_regex(c, pat, force, &removed));
    return count_result(self, c, st, removed);
}

static PyObject *client_register_buffer(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"ptr", "size", NULL};
    void *ptr;
    size_t size;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O&:register_buffer", kwlist, kvp_py_ptr_conv,
                                     &ptr, kvp_py_size_conv, &size))
        return NULL;
    kvp_client_t *c;
    kvp_status_t st = KVP_OK;
    KVP_PY_WITH_CLIENT(self, c, st = kvp_register_buffer(c, ptr, size));
    return int_result(self, c, st);
}

static PyObject *client_unregister_buffer(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"ptr", NULL};
    void *ptr;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&:unregister_buffer", kwlist, kvp_py_ptr_conv,
                                     &ptr))
        return NULL;
    kvp_client_t *c;
    kvp_status_t st = KVP_OK;
    KVP_PY_WITH_CLIENT(self, c, st = kvp_unregister_buffer(c, ptr));
    return int_result(self, c, st);
}

/* ---------------- batch calls (run by batch.c) ---------------- */

/* batch_put(keys, buffers, config=None) / batch_get_into(keys, buffers) */
static PyObject *client_batch_put(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"keys", "buffers", "config", NULL};
    kvp_py_batch_t b = {0};
    kvp_py_config_t cfg = {.p = NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O&|O&:batch_put", kwlist, kvp_py_keys_conv,
                                     &b.keys, kvp_py_buffers_conv, &b.bufs, kvp_py_config_conv,
                                     &cfg))
        return NULL;
    PyObject *r = kvp_py_batch_call(self, KVP_PY_BATCH_PUT, &b, &cfg);
    kvp_py_config_release(&cfg);
    return r;
}

static PyObject *client_batch_get_into(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"keys", "buffers", NULL};
    kvp_py_batch_t b = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O&:batch_get_into", kwlist, kvp_py_keys_conv,
                                     &b.keys, kvp_py_wbuffers_conv, &b.bufs))
        return NULL;
    return kvp_py_batch_call(self, KVP_PY_BATCH_GET, &b, NULL);
}

/* The (keys, ptrs, sizes[, config]) calls (config: the puts); `multi`: a list of
 * buffers per key. */
static PyObject *ptrs_call(kvp_py_client_t *self, PyObject *args, PyObject *kw, const char *format,
                           kvp_py_batch_op_t op, int multi)
{
    static char *kwlist_put[] = {"keys", "ptrs", "sizes", "config", NULL};
    static char *kwlist_get[] = {"keys", "ptrs", "sizes", NULL};
    char **kwlist =
        op == KVP_PY_BATCH_PUT || op == KVP_PY_BATCH_PUT_MULTI ? kwlist_put : kwlist_get;
    kvp_py_batch_t b = {0};
    kvp_py_config_t cfg = {.p = NULL};
    void *ptrs = multi ? (void *)&b.part_ptrs : (void *)&b.bufs.ptrs;
    void *sizes = multi ? (void *)&b.part_sizes : (void *)&b.bufs.sizes;
    if (!PyArg_ParseTupleAndKeywords(args, kw, format, kwlist, kvp_py_keys_conv, &b.keys,
                                     multi ? kvp_py_ptr_lists_conv : kvp_py_ptrs_conv, ptrs,
                                     multi ? kvp_py_size_lists_conv : kvp_py_sizes_conv, sizes,
                                     kvp_py_config_conv, &cfg))
        return NULL;
    PyObject *r = kvp_py_batch_call(self, op, &b, &cfg);
    kvp_py_config_release(&cfg);
    return r;
}

static PyObject *client_batch_put_from(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    return ptrs_call(self, args, kw, "O&O&O&|O&:batch_put_from", KVP_PY_BATCH_PUT, 0);
}

static PyObject *client_batch_get_into_ptrs(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    return ptrs_call(self, args, kw, "O&O&O&:batch_get_into_ptrs", KVP_PY_BATCH_GET, 0);
}

static PyObject *client_batch_put_multi(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    return ptrs_call(self, args, kw, "O&O&O&|O&:batch_put_multi", KVP_PY_BATCH_PUT_MULTI, 1);
}

static PyObject *client_batch_get_into_multi(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    return ptrs_call(self, args, kw, "O&O&O&:batch_get_into_multi", KVP_PY_BATCH_GET_MULTI, 1);
}

static PyObject *client_batch_remove(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"keys", "force", NULL};
    kvp_py_batch_t b = {0};
    int force = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|p:batch_remove", kwlist, kvp_py_keys_conv,
                                     &b.keys, &force))
        return NULL;
    return kvp_py_batch_call(self, force ? KVP_PY_BATCH_REMOVE_FORCE : KVP_PY_BATCH_REMOVE, &b,
                             NULL);
}

/* replica_clear(keys, segment="") -> [status]: kvp_batch_replica_clear */
static PyObject *client_replica_clear(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"keys", "segment", NULL};
    kvp_py_batch_t b = {0};
    b.segment = "";
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|s:replica_clear", kwlist, kvp_py_keys_conv,
                                     &b.keys, &b.segment))
        return NULL;
    return kvp_py_batch_call(self, KVP_PY_BATCH_REPLICA_CLEAR, &b, NULL);
}

/*
 * get_ranges(ranges) -> [bytes read or negative status]: ranges is a list of
 * (key, offset, buffer) or (key, offset, (ptr, length)); each reads bytes
 * [offset, offset + length) of its object (fewer at the object's end).
 */
static PyObject *client_get_ranges(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"ranges", NULL};
    kvp_py_batch_t b = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&:get_ranges", kwlist, kvp_py_ranges_conv, &b))
        return NULL;
    return kvp_py_batch_call(self, KVP_PY_BATCH_GET_RANGES, &b, NULL);
}

/* ---- transfer sessions (kvp_batch_*_session_*: Mooncake's) ---- */

/* The (keys) session calls: [status] per key. */
static PyObject *keys_only_call(kvp_py_client_t *self, PyObject *args, PyObject *kw,
                                const char *format, kvp_py_batch_op_t op)
{
    static char *kwlist[] = {"keys", NULL};
    kvp_py_batch_t b = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, format, kwlist, kvp_py_keys_conv, &b.keys))
        return NULL;
    return kvp_py_batch_call(self, op, &b, NULL);
}

static PyObject *client_get_session_start(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    return keys_only_call(self, args, kw, "O&:get_session_start", KVP_PY_BATCH_GET_SESSION_START);
}

/* get_session_end(keys) -> status (0) */
static PyObject *client_get_session_end(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"keys", NULL};
    kvp_py_batch_t b = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&:get_session_end", kwlist, kvp_py_keys_conv,
                                     &b.keys))
        return NULL;
    PyObject *ret = NULL;
    if (kvp_py_batch_run(self, KVP_PY_BATCH_GET_SESSION_END, &b, NULL, NULL) == 0)
        ret = PyLong_FromLongLong(b.keys.n > 0 ? b.results[0] : 0);
    kvp_py_batch_release(&b);
    return ret;
}

static PyObject *client_put_session_end(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    return keys_only_call(self, args, kw, "O&:put_session_end", KVP_PY_BATCH_PUT_SESSION_END);
}

static PyObject *client_put_session_revoke(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    return keys_only_call(self, args, kw, "O&:put_session_revoke", KVP_PY_BATCH_PUT_SESSION_REVOKE);
}

/* put_session_start(keys, sizes, config=None) -> [status] */
static PyObject *client_put_session_start(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"keys", "sizes", "config", NULL};
    kvp_py_batch_t b = {0};
    kvp_py_config_t cfg = {.p = NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O&|O&:put_session_start", kwlist,
                                     kvp_py_keys_conv, &b.keys, kvp_py_sizes_conv, &b.bufs.sizes,
                                     kvp_py_config_conv, &cfg))
        return NULL;
    return kvp_py_batch_call(self, KVP_PY_BATCH_PUT_SESSION_START, &b, &cfg);
}

/* The (keys, ptrs, sizes, offsets) range calls: [bytes or negative status] per key. */
static PyObject *session_ranges_call(kvp_py_client_t *self, PyObject *args, PyObject *kw,
                                     const char *format, kvp_py_batch_op_t op)
{
    static char *kwlist[] = {"keys", "ptrs", "sizes", "offsets", NULL};
    kvp_py_batch_t b = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, format, kwlist, kvp_py_keys_conv, &b.keys,
                                     kvp_py_ptr_lists_conv, &b.part_ptrs, kvp_py_size_lists_conv,
                                     &b.part_sizes, kvp_py_size_lists_conv, &b.part_offsets)) {
        kvp_py_batch_release(&b);
        return NULL;
    }
    return kvp_py_batch_call(self, op, &b, NULL);
}

static PyObject *client_get_session_ranges(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    return session_ranges_call(self, args, kw, "O&O&O&O&:get_session_ranges",
                               KVP_PY_BATCH_GET_SESSION_RANGES);
}

static PyObject *client_put_session_ranges(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    return session_ranges_call(self, args, kw, "O&O&O&O&:put_session_ranges",
                               KVP_PY_BATCH_PUT_SESSION_RANGES);
}

/* The keys of an exist call (`name` for the messages) and its run: 0, or -1 raised. */
static int exists_run(kvp_py_client_t *self, PyObject *args, PyObject *kw, const char *format,
                      kvp_py_batch_t *b, size_t *prefix)
{
    static char *kwlist[] = {"keys", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, format, kwlist, kvp_py_keys_conv, &b->keys))
        return -1;
    return kvp_py_batch_run(self, KVP_PY_BATCH_EXIST, b, NULL, prefix);
}

/* batch_exists(keys) -> ([1/0/negative per key], prefix_len) */
static PyObject *client_batch_exists(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    kvp_py_batch_t b = {0};
    size_t prefix;
    PyObject *ret = NULL;
    if (exists_run(self, args, kw, "O&:batch_exists", &b, &prefix) == 0) {
        PyObject *list = kvp_py_results_list(b.results, b.keys.n);
        if (list != NULL)
            ret = Py_BuildValue("(Nn)", list, (Py_ssize_t)prefix);
    }
    kvp_py_batch_release(&b);
    return ret;
}

/* batch_exists_bools(keys) -> [bool per key]; a per-key failure raises kvpool.Error naming
 * the first failing key. The native API's batch_exists, with no Python loop over the
 * results (two of them cost ~0.1 us a key: a tenth of a 128-key batch). */
static PyObject *client_batch_exists_bools(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    kvp_py_batch_t b = {0};
    size_t prefix;
    PyObject *ret = NULL;
    if (exists_run(self, args, kw, "O&:batch_exists_bools", &b, &prefix) != 0)
        goto out;
    for (Py_ssize_t i = 0; i < b.keys.n; i++) {
        if (b.results[i] >= 0)
            continue;
        /* a per-key status leaves the thread's last-error text as it was */
        PyObject *msg = PyUnicode_FromFormat("exist %R: %s", PyTuple_GET_ITEM(b.keys.tuple, i),
                                             kvp_strerror((kvp_status_t)b.results[i]));
        if (msg != NULL) {
            kvp_py_raise(kvp_py_state_of(Py_TYPE(self)), (int)b.results[i], PyUnicode_AsUTF8(msg));
            Py_DECREF(msg);
        }
        goto out;
    }
    ret = PyList_New(b.keys.n);
    for (Py_ssize_t i = 0; ret != NULL && i < b.keys.n; i++)
        PyList_SET_ITEM(ret, i, PyBool_FromLong(b.results[i] == 1));
out:
    kvp_py_batch_release(&b);
    return ret;
}

/*
 * batch_get_buffer(keys) -> [BufferHandle or negative status]: each object read
 * into memory of its own, sized from the master's metadata first. A key an
 * upsert grew between the two steps is sized and read again.
 */
static PyObject *client_batch_get_buffer(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"keys", NULL};
    kvp_py_keys_t keys;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&:batch_get_buffer", kwlist, kvp_py_keys_conv,
                                     &keys))
        return NULL;
    kvp_py_state_t *state = kvp_py_state_of(Py_TYPE(self));
    PyObject *handles = NULL, *ret = NULL;
    size_t n1 = keys.n > 0 ? (size_t)keys.n : 1;
    Py_ssize_t *idx = PyMem_Calloc(n1, sizeof(*idx)); /* idx[j]: the key of the j-th read */
    const char **rkeys = PyMem_Calloc(n1, sizeof(*rkeys));
    void **bufs = PyMem_Calloc(n1, sizeof(*bufs));
    size_t *sizes = PyMem_Calloc(n1, sizeof(*sizes));
    int64_t *results = PyMem_Calloc(n1, sizeof(*results));
    int64_t *got = PyMem_Calloc(n1, sizeof(*got));
    if (state == NULL)
        goto out;
    handles = PyList_New(keys.n);
    if (handles == NULL || idx == NULL || rkeys == NULL || bufs == NULL || sizes == NULL ||
        results == NULL || got == NULL) {
        if (handles != NULL)
            PyErr_NoMemory();
        goto out;
    }
    for (int round = 0;; round++) {
        kvp_client_t *c;
        size_t m = 0; /* the keys not read yet, sized in one master call */
        for (Py_ssize_t i = 0; i < keys.n; i++)
            if (PyList_GET_ITEM(handles, i) == NULL) {
                idx[m] = i;
                rkeys[m++] = keys.ptrs[i];
            }
        KVP_PY_WITH_CLIENT(self, c, (void)kvp_batch_get_size(c, rkeys, m, got));
        for (size_t j = 0; j < m; j++)
            results[idx[j]] = got[j];
        if (c == NULL) {
            kvp_py_raise_closed(self);
            goto out;
        }
        size_t n_read = 0;
        for (Py_ssize_t i = 0; i < keys.n; i++) {
            if (PyList_GET_ITEM(handles, i) != NULL)
                continue;
            PyObject *h = results[i] < 0 ? PyLong_FromLongLong(results[i])
                                         : kvp_py_buffer_handle_new(state, (size_t)results[i]);
            if (h == NULL)
                goto out;
            PyList_SET_ITEM(handles, i, h);
            if (results[i] < 0)
                continue;
            idx[n_read] = i;
            rkeys[n_read] = keys.ptrs[i];
            bufs[n_read] = kvp_py_buffer_handle_ptr(h);
            sizes[n_read] = (size_t)results[i];
            n_read++;
        }
        if (n_read == 0)
            break;
        KVP_PY_WITH_CLIENT(
            self, c, kvp_batch_get_into(c, rkeys, (void *const *)bufs, sizes, n_read, results));
        if (c == NULL) {
            kvp_py_raise_closed(self);
            goto out;
        }
        int again = 0;
        for (size_t j = 0; j < n_read; j++) {
            PyObject *h = PyList_GET_ITEM(handles, idx[j]);
            int64_t r = results[j];
            if (r >= 0) {
                kvp_py_buffer_handle_set_size(h, (size_t)r);
                continue;
            }
            PyObject *st = NULL; /* NULL: size it and read it again next round */
            if (r != KVP_ERR_BUFFER_TOO_SMALL || round >= 3) {
                st = PyLong_FromLongLong(r);
                if (st == NULL)
                    goto out;
            } else {
                again = 1;
            }
            PyList_SET_ITEM(handles, idx[j], st);
            Py_DECREF(h);
        }
        if (!again)
            break;
    }
    ret = handles;
    handles = NULL;
out:
    if (handles != NULL) {
        /* a list with NULL items must not reach Python; free it by hand */
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(handles); i++)
            if (PyList_GET_ITEM(handles, i) == NULL)
                PyList_SET_ITEM(handles, i, Py_NewRef(Py_None));
        Py_DECREF(handles);
    }
    PyMem_Free(idx);
    PyMem_Free(rkeys);
    PyMem_Free(bufs);
    PyMem_Free(sizes);
    PyMem_Free(results);
    PyMem_Free(got);
    kvp_py_keys_conv(NULL, &keys);
    return ret;
}

/* ---------------- the type ---------------- */

#define METH(name, fn, flags, doc)                                                                 \
    {                                                                                              \
        name, (PyCFunction)(void (*)(void))fn, flags, PyDoc_STR(doc)                               \
    }
#define KW (METH_VARARGS | METH_KEYWORDS)

static PyMethodDef client_methods[] = {
    METH("close", client_close, METH_NOARGS,
         "close(): unmount the segment and disconnect; waits for calls in flight"),
    METH("segment_name", client_segment_name, METH_NOARGS,
         "segment_name() -> the mounted segment's name, or None"),
    METH("put", client_put, KW, "put(key, buffer, config=None) -> status"),
    METH("put_from", client_put_from, KW, "put_from(key, ptr, size, config=None) -> status"),
    METH("put_parts", client_put_parts, KW,
         "put_parts(key, parts, config=None) -> status: one object from several buffers"),
    METH("get", client_get, KW, "get(key) -> bytes, or a negative status"),
    METH("get_into", client_get_into, KW,
         "get_into(key, buffer) -> object size, or a negative status"),
    METH("get_into_ptr", client_get_into_ptr, KW,
         "get_into_ptr(key, ptr, size) -> object size, or a negative status"),
    METH("get_size", client_get_size, KW, "get_size(key) -> size, or a negative status"),
    METH("is_exist", client_is_exist, KW, "is_exist(key) -> 1, 0 or a negative status"),
    METH("remove", client_remove, KW, "remove(key, force=False) -> status"),
    METH("remove_all", client_remove_all, KW,
         "remove_all(force=False) -> count removed, or a negative status"),
    METH("remove_by_regex", client_remove_by_regex, KW,
         "remove_by_regex(pattern, force=False) -> count removed, or a negative status"),
    METH("drain", client_drain, KW,
         "drain(timeout_ms=30000) -> (moved, lost), or a negative status: move this client's "
         "objects to other segments, then unmount its segment (kvp_drain)"),
    METH("register_buffer", client_register_buffer, KW, "register_buffer(ptr, size) -> status"),
    METH("unregister_buffer", client_unregister_buffer, KW, "unregister_buffer(ptr) -> status"),
    METH("batch_put", client_batch_put, KW,
         "batch_put(keys, buffers, config=None) -> [status]; buffers: buffer objects or "
         "(ptr, size) pairs"),
    METH("batch_put_from", client_batch_put_from, KW,
         "batch_put_from(keys, ptrs, sizes, config=None) -> [status]"),
    METH("batch_get_into", client_batch_get_into, KW,
         "batch_get_into(keys, buffers) -> [size or negative status]"),
    METH("batch_get_into_ptrs", client_batch_get_into_ptrs, KW,
         "batch_get_into_ptrs(keys, ptrs, sizes) -> [size or negative status]"),
    METH("batch_put_multi", client_batch_put_multi, KW,
         "batch_put_multi(keys, ptrs, sizes, config=None) -> [status]; ptrs, sizes: [[int]] "
         "(a list of buffers per key)"),
    METH("batch_get_into_multi", client_batch_get_into_multi, KW,
         "batch_get_into_multi(keys, ptrs, sizes) -> [size or negative status]; ptrs, sizes: "
         "[[int]]"),
    METH("get_ranges", client_get_ranges, KW,
         "get_ranges([(key, offset, buffer or (ptr, length))]) -> [bytes read or negative status]"),
    METH("get_session_start", client_get_session_start, KW,
         "get_session_start(keys) -> [status]: look up replicas and take a read lease once"),
    METH("get_session_ranges", client_get_session_ranges, KW,
         "get_session_ranges(keys, ptrs, sizes, offsets) -> [bytes read or negative status]; "
         "ptrs, sizes, offsets: [[int]] (object offsets), no master call"),
    METH("get_session_end", client_get_session_end, KW,
         "get_session_end(keys) -> 0: drop the get sessions, hand the leases back"),
    METH("put_session_start", client_put_session_start, KW,
         "put_session_start(keys, sizes, config=None) -> [status]: reserve the objects"),
    METH("put_session_ranges", client_put_session_ranges, KW,
         "put_session_ranges(keys, ptrs, sizes, offsets) -> [bytes written or negative status]; "
         "into every replica, no master call"),
    METH("put_session_end", client_put_session_end, KW,
         "put_session_end(keys) -> [status]: make the objects visible"),
    METH("put_session_revoke", client_put_session_revoke, KW,
         "put_session_revoke(keys) -> [status]: drop the puts, the keys stay absent"),
    METH("aq_open", kvp_py_aq_open, KW, "aq_open(workers=0): start the async queue (idempotent)"),
    METH("aq_fd", kvp_py_aq_fd, METH_NOARGS,
         "aq_fd() -> the queue's eventfd, readable while completions wait"),
    METH("aq_put", kvp_py_aq_put, KW,
         "aq_put(keys, buffers, config, token) -> 0 submitted, or a negative status"),
    METH("aq_get", kvp_py_aq_get, KW,
         "aq_get(keys, buffers, token) -> 0 submitted, or a negative status"),
    METH("aq_get_bytes", kvp_py_aq_get_bytes, KW,
         "aq_get_bytes(key, capacity, token) -> 0 submitted, or a negative status"),
    METH("aq_exist", kvp_py_aq_exist, KW,
         "aq_exist(keys, token) -> 0 submitted, or a negative status"),
    METH("aq_reap", kvp_py_aq_reap, KW, "aq_reap(max=256) -> [(token, status, results)]"),
    METH("aq_close", kvp_py_aq_close, METH_NOARGS,
         "aq_close() -> [token]: destroy the queue; the tokens never reaped"),
    METH("batch_get_buffer", client_batch_get_buffer, KW,
         "batch_get_buffer(keys) -> [BufferHandle or negative status]"),
    METH("batch_exists_bools", client_batch_exists_bools, KW,
         "batch_exists_bools(keys) -> [bool per key]; raises on a per-key failure"),
    METH("batch_exists", client_batch_exists, KW,
         "batch_exists(keys) -> ([1, 0 or negative status], cached prefix length)"),
    METH("batch_remove", client_batch_remove, KW, "batch_remove(keys, force=False) -> [status]"),
    METH("replica_clear", client_replica_clear, KW,
         "replica_clear(keys, segment='') -> [status]: Mooncake's replica clear (see the C API's "
         "kvp_batch_replica_clear)"),
    METH("stat", kvp_py_client_stat, METH_NOARGS, "stat() -> dict, or a negative status"),
    METH("metrics", kvp_py_client_metrics, METH_NOARGS,
         "metrics() -> dict of this client's counters (kvp_metrics_snapshot), or a negative "
         "status"),
    METH("metrics_text", kvp_py_client_metrics_text, METH_NOARGS,
         "metrics_text() -> the counters in the Prometheus text format, or a negative status"),
    METH("list_keys", kvp_py_client_list_keys, KW,
         "list_keys(pattern=None, max=1000) -> [dict], or a negative status"),
    METH("create_copy_task", kvp_py_client_create_copy_task, KW,
         "create_copy_task(key, targets) -> task id (hi, lo), or a negative status: new "
         "replicas of key on the target segments, written by a source replica's owner"),
    METH("create_move_task", kvp_py_client_create_move_task, KW,
         "create_move_task(key, source, target) -> task id (hi, lo), or a negative status"),
    METH("query_task", kvp_py_client_query_task, KW,
         "query_task((hi, lo)) -> dict(kind, status, created_ms, updated_ms, assigned, "
         "message), or a negative status"),
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef client_getset[] = {
    {"closed", (getter)client_closed, NULL, PyDoc_STR("True once close() was called"), NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef client_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(kvp_py_client_t, weaklist), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot client_slots[] = {
    {Py_tp_doc, (void *)PyDoc_STR(
                    "Client(master=None, segment_size=0, transport=None, rpc_timeout_ms=0, "
                    "data_host=None, segment_name=None, rdma_devices=None, verify_crc=True, "
                    "tcp_streams=0, tls_cert=None, tls_key=None, tls_ca=None, token=None, "
                    "segment_tenant=None, segment_file=None, segment_file_offset=0, dfs_path=None, "
                    "tenant_id=None): "
                    "the raw libkvpool client (results are status codes)")},
    {Py_tp_new, client_new},
    {Py_tp_init, client_init},
    {Py_tp_dealloc, client_dealloc},
    {Py_tp_traverse, client_traverse},
    {Py_tp_methods, client_methods},
    {Py_tp_getset, client_getset},
    {Py_tp_members, client_members},
    {0, NULL},
};

static PyType_Spec client_spec = {
    .name = "kvpool._kvpool.Client",
    .basicsize = sizeof(kvp_py_client_t),
    .flags =
        Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = client_slots,
};

PyTypeObject *kvp_py_client_type_new(PyObject *module)
{
    return (PyTypeObject *)PyType_FromModuleAndSpec(module, &client_spec, NULL);
}
