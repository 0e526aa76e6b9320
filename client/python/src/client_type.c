/*
 * client_type.c - kvpool._kvpool.Client: one kvp_client_t, its raw calls.
 *
 * Design: each method parses its arguments with the GIL held (args.c), then
 * drops the GIL for the library call, so Python threads sharing one Client
 * run their transfers in parallel (the C library is thread-safe). Results are
 * raw: object sizes and kvp_status_t codes, never exceptions for what the
 * library refuses; kvpool.Client and mooncake.store turn them into
 * exceptions or Mooncake's codes. Only bad Python input (TypeError,
 * ValueError) and a closed client (kvpool.Error, KVP_ERR_SHUTDOWN) raise.
 *
 * Invariant: self->c is only read under self->lock (read side, GIL released)
 * and only cleared under its write side, so close() waits for every call in
 * flight and no call ever sees a destroyed client.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "kvpool_py.h"

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

PyObject *kvp_py_raise_closed(void)
{
    return kvp_py_raise(KVP_ERR_SHUTDOWN, "the client is closed");
}

/* Run `stmt` with `c` set to the client, the GIL released; `c` is NULL when closed. */
#define WITH_CLIENT(self, c, stmt)                                                                 \
    do {                                                                                           \
        PyThreadState *ts_ = PyEval_SaveThread();                                                  \
        c = kvp_py_client_lock(self);                                                              \
        if (c != NULL) {                                                                           \
            stmt;                                                                                  \
            kvp_py_client_unlock(self);                                                            \
        }                                                                                          \
        PyEval_RestoreThread(ts_);                                                                 \
    } while (0)

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

static int client_init(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {
        "master",       "segment_size", "transport",  "rpc_timeout_ms", "data_host",
        "segment_name", "rdma_devices", "verify_crc", "tcp_streams",    NULL};
    const char *master = NULL, *transport = NULL, *data_host = NULL, *segment_name = NULL;
    const char *rdma_devices = NULL;
    PyObject *seg_obj = NULL, *timeout_obj = NULL, *streams_obj = NULL;
    int verify_crc = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|zOzOzzzpO:Client", kwlist, &master, &seg_obj,
                                     &transport, &timeout_obj, &data_host, &segment_name,
                                     &rdma_devices, &verify_crc, &streams_obj))
        return -1;
    if (self->c != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Client.__init__ called twice");
        return -1;
    }
    kvp_client_params_t p;
    kvp_client_params_init(&p);
    size_t v = 0;
    if (seg_obj != NULL && seg_obj != Py_None) {
        if (kvp_py_size(seg_obj, &v, "segment_size") != 0)
            return -1;
        p.segment_size = v;
    }
    if (timeout_obj != NULL && timeout_obj != Py_None) {
        if (kvp_py_size(timeout_obj, &v, "rpc_timeout_ms") != 0)
            return -1;
        if (v > UINT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "rpc_timeout_ms is too large");
            return -1;
        }
        p.rpc_timeout_ms = (uint32_t)v;
    }
    if (streams_obj != NULL && streams_obj != Py_None) {
        if (kvp_py_size(streams_obj, &v, "tcp_streams") != 0)
            return -1;
        if (v > UINT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "tcp_streams is too large");
            return -1;
        }
        p.tcp_streams = (uint32_t)v;
    }
    p.master_addr = master;
    p.transport = transport;
    p.data_host = data_host;
    p.segment_name = segment_name;
    p.rdma_devices = rdma_devices;
    p.verify_crc = verify_crc ? 1 : 0;
    kvp_client_t *c = NULL;
    kvp_status_t st;
    PyThreadState *ts = PyEval_SaveThread();
    st = kvp_client_create(&p, &c);
    PyEval_RestoreThread(ts);
    if (st != KVP_OK) {
        kvp_py_raise(st, NULL);
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

static void client_dealloc(kvp_py_client_t *self)
{
    if (self->weaklist != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    client_close_impl(self);
    pthread_rwlock_destroy(&self->lock);
    Py_TYPE(self)->tp_free((PyObject *)self);
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
    WITH_CLIENT(self, c, {
        const char *s = kvp_client_segment_name(c);
        if (s != NULL) {
            snprintf(name, sizeof(name), "%s", s);
            has = 1;
        }
    });
    if (c == NULL)
        return kvp_py_raise_closed();
    if (!has)
        Py_RETURN_NONE;
    return PyUnicode_FromString(name);
}

/* ---------------- single-key calls ---------------- */

static PyObject *client_put(kvp_py_client_t *self, PyObject *args)
{
    PyObject *key_obj, *cfg_obj = Py_None;
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "Oy*|O:put", &key_obj, &view, &cfg_obj))
        return NULL;
    const char *key;
    kvp_put_config_t cfg;
    const kvp_put_config_t *cfgp;
    if (kvp_py_key(key_obj, &key) != 0 || kvp_py_put_config(cfg_obj, &cfg, &cfgp) != 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    kvp_client_t *c;
    kvp_status_t st = KVP_OK;
    WITH_CLIENT(self, c, st = kvp_put(c, key, view.buf, (size_t)view.len, cfgp));
    PyBuffer_Release(&view);
    if (c == NULL)
        return kvp_py_raise_closed();
    return PyLong_FromLong(st);
}

static PyObject *client_put_from(kvp_py_client_t *self, PyObject *args)
{
    PyObject *key_obj, *ptr_obj, *size_obj, *cfg_obj = Py_None;
    if (!PyArg_ParseTuple(args, "OOO|O:put_from", &key_obj, &ptr_obj, &size_obj, &cfg_obj))
        return NULL;
    const char *key;
    void *ptr;
    size_t size;
    kvp_put_config_t cfg;
    const kvp_put_config_t *cfgp;
    if (kvp_py_key(key_obj, &key) != 0 || kvp_py_ptr(ptr_obj, &ptr, "ptr") != 0 ||
        kvp_py_size(size_obj, &size, "size") != 0 || kvp_py_put_config(cfg_obj, &cfg, &cfgp) != 0)
        return NULL;
    kvp_client_t *c;
    kvp_status_t st = KVP_OK;
    WITH_CLIENT(self, c, st = kvp_put(c, key, ptr, size, cfgp));
    if (c == NULL)
        return kvp_py_raise_closed();
    return PyLong_FromLong(st);
}

/* put_parts(key, parts, config): one object from several buffers, in order. */
static PyObject *client_put_parts(kvp_py_client_t *self, PyObject *args)
{
    PyObject *key_obj, *parts_obj, *cfg_obj = Py_None;
    if (!PyArg_ParseTuple(args, "OO|O:put_parts", &key_obj, &parts_obj, &cfg_obj))
        return NULL;
    kvp_py_batch_t b;
    PyObject *ret = NULL;
    PyObject *one = PyTuple_Pack(1, key_obj);
    if (one == NULL)
        return NULL;
    int rc = kvp_py_batch_keys(one, &b);
    Py_DECREF(one);
    if (rc != 0)
        goto out;
    PyObject *parts = PySequence_Tuple(parts_obj);
    if (parts == NULL)
        goto out;
    Py_ssize_t m = PyTuple_GET_SIZE(parts);
    Py_buffer *views = PyMem_Calloc(m > 0 ? (size_t)m : 1, sizeof(*views));
    kvp_put_config_t cfg;
    const kvp_put_config_t *cfgp;
    Py_ssize_t got = 0;
    if (views == NULL) {
        PyErr_NoMemory();
        goto out_parts;
    }
    if (m == 0) {
        PyErr_SetString(PyExc_ValueError, "put_parts needs at least one part");
        goto out_parts;
    }
    for (; got < m; got++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(parts, got), &views[got], PyBUF_C_CONTIGUOUS) !=
            0) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "parts[%zd] must be a C-contiguous buffer", got);
            goto out_parts;
        }
    }
    if (kvp_py_put_config(cfg_obj, &cfg, &cfgp) != 0)
        goto out_parts;
    kvp_client_t *c;
    int64_t st = KVP_OK;
    {
        const void **pb = PyMem_Calloc((size_t)m, sizeof(void *));
        size_t *ps = PyMem_Calloc((size_t)m, sizeof(size_t));
        if (pb == NULL || ps == NULL) {
            PyMem_Free(pb);
            PyMem_Free(ps);
            PyErr_NoMemory();
            goto out_parts;
        }
        for (Py_ssize_t j = 0; j < m; j++) {
            pb[j] = views[j].buf;
            ps[j] = (size_t)views[j].len;
        }
        const void *const *bufs1[1] = {pb};
        const size_t *sizes1[1] = {ps};
        size_t nb[1] = {(size_t)m};
        kvp_status_t res[1] = {KVP_OK};
        WITH_CLIENT(self, c, {
            kvp_batch_put_from_multi(c, b.key_ptrs, bufs1, sizes1, nb, 1, cfgp, res);
            st = res[0];
        });
        PyMem_Free(pb);
        PyMem_Free(ps);
    }
    if (c == NULL)
        kvp_py_raise_closed();
    else
        ret = PyLong_FromLongLong(st);
out_parts:
    for (Py_ssize_t j = 0; j < got; j++)
        PyBuffer_Release(&views[j]);
    PyMem_Free(views);
    Py_DECREF(parts);
out:
    kvp_py_batch_cleanup(&b);
    return ret;
}

/* get(key) -> bytes, or a negative status (int). */
static PyObject *client_get(kvp_py_client_t *self, PyObject *key_obj)
{
    const char *key;
    if (kvp_py_key(key_obj, &key) != 0)
        return NULL;
    /* The size first, then the bytes straight into a new bytes object. An upsert
     * in between can make the object larger: then ask again. */
    for (int attempt = 0;; attempt++) {
        kvp_client_t *c;
        int64_t size = 0;
        WITH_CLIENT(self, c, size = kvp_get_size(c, key));
        if (c == NULL)
            return kvp_py_raise_closed();
        if (size < 0)
            return PyLong_FromLongLong(size);
        PyObject *bytes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
        if (bytes == NULL)
            return NULL;
        char *dst = PyBytes_AS_STRING(bytes);
        int64_t got = 0;
        WITH_CLIENT(self, c, got = kvp_get_into(c, key, dst, (size_t)size));
        if (c == NULL) {
            Py_DECREF(bytes);
            return kvp_py_raise_closed();
        }
        if (got == KVP_ERR_BUFFER_TOO_SMALL && attempt < 4) {
            Py_DECREF(bytes);
            continue;
        }
        if (got < 0) {
            Py_DECREF(bytes);
            return PyLong_FromLongLong(got);
        }
        if (got < size && _PyBytes_Resize(&bytes, (Py_ssize_t)got) != 0)
            return NULL;
        return bytes;
    }
}

static PyObject *client_get_into(kvp_py_client_t *self, PyObject *args)
{
    PyObject *key_obj;
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "Ow*:get_into", &key_obj, &view))
        return NULL;
    const char *key;
    if (kvp_py_key(key_obj, &key) != 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    kvp_client_t *c;
    int64_t got = 0;
    WITH_CLIENT(self, c, got = kvp_get_into(c, key, view.buf, (size_t)view.len));
    PyBuffer_Release(&view);
    if (c == NULL)
        return kvp_py_raise_closed();
    return PyLong_FromLongLong(got);
}

static PyObject *client_get_into_ptr(kvp_py_client_t *self, PyObject *args)
{
    PyObject *key_obj, *ptr_obj, *size_obj;
    if (!PyArg_ParseTuple(args, "OOO:get_into_ptr", &key_obj, &ptr_obj, &size_obj))
        return NULL;
    const char *key;
    void *ptr;
    size_t size;
    if (kvp_py_key(key_obj, &key) != 0 || kvp_py_ptr(ptr_obj, &ptr, "ptr") != 0 ||
        kvp_py_size(size_obj, &size, "size") != 0)
        return NULL;
    kvp_client_t *c;
    int64_t got = 0;
    WITH_CLIENT(self, c, got = kvp_get_into(c, key, ptr, size));
    if (c == NULL)
        return kvp_py_raise_closed();
    return PyLong_FromLongLong(got);
}

static PyObject *client_get_size(kvp_py_client_t *self, PyObject *key_obj)
{
    const char *key;
    if (kvp_py_key(key_obj, &key) != 0)
        return NULL;
    kvp_client_t *c;
    int64_t size = 0;
    WITH_CLIENT(self, c, size = kvp_get_size(c, key));
    if (c == NULL)
        return kvp_py_raise_closed();
    return PyLong_FromLongLong(size);
}

static PyObject *client_is_exist(kvp_py_client_t *self, PyObject *key_obj)
{
    const char *key;
    if (kvp_py_key(key_obj, &key) != 0)
        return NULL;
    kvp_client_t *c;
    int r = 0;
    WITH_CLIENT(self, c, r = kvp_is_exist(c, key));
    if (c == NULL)
        return kvp_py_raise_closed();
    return PyLong_FromLong(r);
}

static PyObject *client_remove(kvp_py_client_t *self, PyObject *args)
{
    PyObject *key_obj;
    int force = 0;
    if (!PyArg_ParseTuple(args, "O|p:remove", &key_obj, &force))
        return NULL;
    const char *key;
    if (kvp_py_key(key_obj, &key) != 0)
        return NULL;
    kvp_client_t *c;
    kvp_status_t st = KVP_OK;
    WITH_CLIENT(self, c, st = force ? kvp_remove_force(c, key) : kvp_remove(c, key));
    if (c == NULL)
        return kvp_py_raise_closed();
    return PyLong_FromLong(st);
}

/* remove_all(force) / remove_by_regex(pattern, force) -> count, or a negative status */
static PyObject *client_remove_all(kvp_py_client_t *self, PyObject *args)
{
    int force = 0;
    if (!PyArg_ParseTuple(args, "|p:remove_all", &force))
        return NULL;
    kvp_client_t *c;
    kvp_status_t st = KVP_OK;
    uint64_t removed = 0;
    WITH_CLIENT(self, c, st = kvp_remove_all(c, force, &removed));
    if (c == NULL)
        return kvp_py_raise_closed();
    if (st != KVP_OK)
        return PyLong_FromLong(st);
    return PyLong_FromUnsignedLongLong(removed);
}

static PyObject *client_remove_by_regex(kvp_py_client_t *self, PyObject *args)
{
    PyObject *pat_obj;
    int force = 0;
    if (!PyArg_ParseTuple(args, "O|p:remove_by_regex", &pat_obj, &force))
        return NULL;
    const char *pat;
    if (kvp_py_key(pat_obj, &pat) != 0)
        return NULL;
    kvp_client_t *c;
    kvp_status_t st = KVP_OK;
    uint64_t removed = 0;
    WITH_CLIENT(self, c, st = kvp_remove_by_regex(c, pat, force, &removed));
    if (c == NULL)
        return kvp_py_raise_closed();
    if (st != KVP_OK)
        return PyLong_FromLong(st);
    return PyLong_FromUnsignedLongLong(removed);
}

static PyObject *client_register_buffer(kvp_py_client_t *self, PyObject *args)
{
    PyObject *ptr_obj, *size_obj;
    if (!PyArg_ParseTuple(args, "OO:register_buffer", &ptr_obj, &size_obj))
        return NULL;
    void *ptr;
    size_t size;
    if (kvp_py_ptr(ptr_obj, &ptr, "ptr") != 0 || kvp_py_size(size_obj, &size, "size") != 0)
        return NULL;
    kvp_client_t *c;
    kvp_status_t st = KVP_OK;
    WITH_CLIENT(self, c, st = kvp_register_buffer(c, ptr, size));
    if (c == NULL)
        return kvp_py_raise_closed();
    return PyLong_FromLong(st);
}

static PyObject *client_unregister_buffer(kvp_py_client_t *self, PyObject *ptr_obj)
{
    void *ptr;
    if (kvp_py_ptr(ptr_obj, &ptr, "ptr") != 0)
        return NULL;
    kvp_client_t *c;
    kvp_status_t st = KVP_OK;
    WITH_CLIENT(self, c, st = kvp_unregister_buffer(c, ptr));
    if (c == NULL)
        return kvp_py_raise_closed();
    return PyLong_FromLong(st);
}

/* ---------------- batch calls ---------------- */

static PyObject *results_list(const kvp_py_batch_t *b)
{
    PyObject *list = PyList_New(b->n);
    if (list == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < b->n; i++) {
        PyObject *v = PyLong_FromLongLong(b->results[i]);
        if (v == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, v);
    }
    return list;
}

/* Run a batch put over b (bufs, sizes filled); statuses into b->results. */
static PyObject *batch_put_run(kvp_py_client_t *self, kvp_py_batch_t *b, PyObject *cfg_obj)
{
    kvp_put_config_t cfg;
    const kvp_put_config_t *cfgp;
    if (kvp_py_put_config(cfg_obj, &cfg, &cfgp) != 0)
        return NULL;
    kvp_status_t *st = PyMem_Calloc(b->n > 0 ? (size_t)b->n : 1, sizeof(*st));
    if (st == NULL)
        return PyErr_NoMemory();
    kvp_client_t *c = NULL;
    if (b->n > 0) {
        WITH_CLIENT(self, c,
                    kvp_batch_put_from(c, b->key_ptrs, (const void *const *)b->bufs, b->sizes,
                                       (size_t)b->n, cfgp, st));
        if (c == NULL) {
            PyMem_Free(st);
            return kvp_py_raise_closed();
        }
    }
    for (Py_ssize_t i = 0; i < b->n; i++)
        b->results[i] = st[i];
    PyMem_Free(st);
    return results_list(b);
}

static PyObject *client_batch_put(kvp_py_client_t *self, PyObject *args)
{
    PyObject *keys, *bufs, *cfg_obj = Py_None, *ret = NULL;
    if (!PyArg_ParseTuple(args, "OO|O:batch_put", &keys, &bufs, &cfg_obj))
        return NULL;
    kvp_py_batch_t b;
    if (kvp_py_batch_keys(keys, &b) == 0 && kvp_py_batch_buffers(bufs, 0, &b) == 0)
        ret = batch_put_run(self, &b, cfg_obj);
    kvp_py_batch_cleanup(&b);
    return ret;
}

static PyObject *client_batch_put_from(kvp_py_client_t *self, PyObject *args)
{
    PyObject *keys, *ptrs, *sizes, *cfg_obj = Py_None, *ret = NULL;
    if (!PyArg_ParseTuple(args, "OOO|O:batch_put_from", &keys, &ptrs, &sizes, &cfg_obj))
        return NULL;
    kvp_py_batch_t b;
    if (kvp_py_batch_keys(keys, &b) == 0 && kvp_py_batch_ptrs(ptrs, sizes, &b) == 0)
        ret = batch_put_run(self, &b, cfg_obj);
    kvp_py_batch_cleanup(&b);
    return ret;
}

static PyObject *batch_get_run(kvp_py_client_t *self, kvp_py_batch_t *b)
{
    if (b->n > 0) {
        kvp_client_t *c;
        WITH_CLIENT(self, c,
                    kvp_batch_get_into(c, b->key_ptrs, (void *const *)b->bufs, b->sizes,
                                       (size_t)b->n, b->results));
        if (c == NULL)
            return kvp_py_raise_closed();
    }
    return results_list(b);
}

static PyObject *client_batch_get_into(kvp_py_client_t *self, PyObject *args)
{
    PyObject *keys, *bufs, *ret = NULL;
    if (!PyArg_ParseTuple(args, "OO:batch_get_into", &keys, &bufs))
        return NULL;
    kvp_py_batch_t b;
    if (kvp_py_batch_keys(keys, &b) == 0 && kvp_py_batch_buffers(bufs, 1, &b) == 0)
        ret = batch_get_run(self, &b);
    kvp_py_batch_cleanup(&b);
    return ret;
}

static PyObject *client_batch_get_into_ptrs(kvp_py_client_t *self, PyObject *args)
{
    PyObject *keys, *ptrs, *sizes, *ret = NULL;
    if (!PyArg_ParseTuple(args, "OOO:batch_get_into_ptrs", &keys, &ptrs, &sizes))
        return NULL;
    kvp_py_batch_t b;
    if (kvp_py_batch_keys(keys, &b) == 0 && kvp_py_batch_ptrs(ptrs, sizes, &b) == 0)
        ret = batch_get_run(self, &b);
    kvp_py_batch_cleanup(&b);
    return ret;
}

static PyObject *client_batch_put_multi(kvp_py_client_t *self, PyObject *args)
{
    PyObject *keys, *ptrs, *sizes, *cfg_obj = Py_None, *ret = NULL;
    if (!PyArg_ParseTuple(args, "OOO|O:batch_put_multi", &keys, &ptrs, &sizes, &cfg_obj))
        return NULL;
    kvp_py_batch_t b;
    kvp_put_config_t cfg;
    const kvp_put_config_t *cfgp;
    if (kvp_py_batch_keys(keys, &b) != 0 || kvp_py_batch_multi(ptrs, sizes, &b) != 0 ||
        kvp_py_put_config(cfg_obj, &cfg, &cfgp) != 0)
        goto out;
    kvp_status_t *st = PyMem_Calloc(b.n > 0 ? (size_t)b.n : 1, sizeof(*st));
    if (st == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    kvp_client_t *c = NULL;
    if (b.n > 0) {
        WITH_CLIENT(self, c,
                    kvp_batch_put_from_multi(c, b.key_ptrs, (const void *const *const *)b.part_bufs,
                                             (const size_t *const *)b.part_sizes, b.n_parts,
                                             (size_t)b.n, cfgp, st));
        if (c == NULL) {
            PyMem_Free(st);
            kvp_py_raise_closed();
            goto out;
        }
    }
    for (Py_ssize_t i = 0; i < b.n; i++)
        b.results[i] = st[i];
    PyMem_Free(st);
    ret = results_list(&b);
out:
    kvp_py_batch_cleanup(&b);
    return ret;
}

static PyObject *client_batch_get_into_multi(kvp_py_client_t *self, PyObject *args)
{
    PyObject *keys, *ptrs, *sizes, *ret = NULL;
    if (!PyArg_ParseTuple(args, "OOO:batch_get_into_multi", &keys, &ptrs, &sizes))
        return NULL;
    kvp_py_batch_t b;
    if (kvp_py_batch_keys(keys, &b) != 0 || kvp_py_batch_multi(ptrs, sizes, &b) != 0)
        goto out;
    if (b.n > 0) {
        kvp_client_t *c;
        WITH_CLIENT(self, c,
                    kvp_batch_get_into_multi(c, b.key_ptrs, (void *const *const *)b.part_bufs,
                                             (const size_t *const *)b.part_sizes, b.n_parts,
                                             (size_t)b.n, b.results));
        if (c == NULL) {
            kvp_py_raise_closed();
            goto out;
        }
    }
    ret = results_list(&b);
out:
    kvp_py_batch_cleanup(&b);
    return ret;
}

/*
 * batch_get_buffer(keys) -> [BufferHandle or negative status]: each object read
 * into memory of its own, sized from the master's metadata first. A key an
 * upsert grew between the two steps is sized and read again.
 */
static PyObject *client_batch_get_buffer(kvp_py_client_t *self, PyObject *keys)
{
    kvp_py_batch_t b;
    PyObject *handles = NULL, *ret = NULL;
    Py_ssize_t *idx = NULL; /* idx[j]: the key of the j-th read of this round */
    const char **rkeys = NULL;
    if (kvp_py_batch_keys(keys, &b) != 0)
        goto out;
    size_t n1 = b.n > 0 ? (size_t)b.n : 1;
    handles = PyList_New(b.n);
    idx = PyMem_Calloc(n1, sizeof(*idx));
    rkeys = PyMem_Calloc(n1, sizeof(*rkeys));
    if (handles == NULL || idx == NULL || rkeys == NULL) {
        if (handles != NULL)
            PyErr_NoMemory();
        goto out;
    }
    for (int round = 0;; round++) {
        kvp_client_t *c;
        WITH_CLIENT(self, c, {
            for (Py_ssize_t i = 0; i < b.n; i++)
                if (PyList_GET_ITEM(handles, i) == NULL)
                    b.results[i] = kvp_get_size(c, b.key_ptrs[i]);
        });
        if (c == NULL) {
            kvp_py_raise_closed();
            goto out;
        }
        size_t n_read = 0;
        for (Py_ssize_t i = 0; i < b.n; i++) {
            if (PyList_GET_ITEM(handles, i) != NULL)
                continue;
            PyObject *h = b.results[i] < 0 ? PyLong_FromLongLong(b.results[i])
                                           : kvp_py_buffer_handle_new((size_t)b.results[i]);
            if (h == NULL)
                goto out;
            PyList_SET_ITEM(handles, i, h);
            if (b.results[i] < 0)
                continue;
            idx[n_read] = i;
            rkeys[n_read] = b.key_ptrs[i];
            b.bufs[n_read] = kvp_py_buffer_handle_ptr(h);
            b.sizes[n_read] = (size_t)b.results[i];
            n_read++;
        }
        if (n_read == 0)
            break;
        WITH_CLIENT(
            self, c,
            kvp_batch_get_into(c, rkeys, (void *const *)b.bufs, b.sizes, n_read, b.results));
        if (c == NULL) {
            kvp_py_raise_closed();
            goto out;
        }
        int again = 0;
        for (size_t j = 0; j < n_read; j++) {
            PyObject *h = PyList_GET_ITEM(handles, idx[j]);
            int64_t r = b.results[j];
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
    kvp_py_batch_cleanup(&b);
    return ret;
}

/* Exist over keys into b->results (1/0/negative per key), the cached prefix into *prefix;
 * 0, or -1 with an exception set (b is to be cleaned up either way). */
static int exists_run(kvp_py_client_t *self, PyObject *keys, kvp_py_batch_t *b, size_t *prefix)
{
    if (kvp_py_batch_keys(keys, b) != 0)
        return -1;
    int *r = PyMem_Calloc(b->n > 0 ? (size_t)b->n : 1, sizeof(int));
    if (r == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *prefix = 0;
    if (b->n > 0) {
        kvp_client_t *c;
        WITH_CLIENT(self, c, kvp_batch_is_exist(c, b->key_ptrs, (size_t)b->n, r, prefix));
        if (c == NULL) {
            PyMem_Free(r);
            kvp_py_raise_closed();
            return -1;
        }
    }
    for (Py_ssize_t i = 0; i < b->n; i++)
        b->results[i] = r[i];
    PyMem_Free(r);
    return 0;
}

/* batch_exists(keys) -> ([1/0/negative per key], prefix_len) */
static PyObject *client_batch_exists(kvp_py_client_t *self, PyObject *keys)
{
    kvp_py_batch_t b;
    size_t prefix;
    PyObject *ret = NULL;
    if (exists_run(self, keys, &b, &prefix) == 0) {
        PyObject *list = results_list(&b);
        if (list != NULL)
            ret = Py_BuildValue("(Nn)", list, (Py_ssize_t)prefix);
    }
    kvp_py_batch_cleanup(&b);
    return ret;
}

/* batch_exists_bools(keys) -> [bool per key]; a per-key failure raises kvpool.Error naming
 * the first failing key. The native API's batch_exists, with no Python loop over the
 * results (two of them cost ~0.1 us a key: a tenth of a 128-key batch). */
static PyObject *client_batch_exists_bools(kvp_py_client_t *self, PyObject *keys)
{
    kvp_py_batch_t b;
    size_t prefix;
    PyObject *ret = NULL;
    if (exists_run(self, keys, &b, &prefix) != 0)
        goto out;
    for (Py_ssize_t i = 0; i < b.n; i++) {
        if (b.results[i] >= 0)
            continue;
        /* a per-key status leaves the thread's last-error text as it was */
        PyObject *msg = PyUnicode_FromFormat("exist %R: %s", PyTuple_GET_ITEM(b.keys, i),
                                             kvp_strerror((kvp_status_t)b.results[i]));
        if (msg != NULL) {
            kvp_py_raise((int)b.results[i], PyUnicode_AsUTF8(msg));
            Py_DECREF(msg);
        }
        goto out;
    }
    ret = PyList_New(b.n);
    for (Py_ssize_t i = 0; ret != NULL && i < b.n; i++)
        PyList_SET_ITEM(ret, i, PyBool_FromLong(b.results[i] == 1));
out:
    kvp_py_batch_cleanup(&b);
    return ret;
}

static PyObject *client_batch_remove(kvp_py_client_t *self, PyObject *args)
{
    PyObject *keys, *ret = NULL;
    int force = 0;
    if (!PyArg_ParseTuple(args, "O|p:batch_remove", &keys, &force))
        return NULL;
    kvp_py_batch_t b;
    if (kvp_py_batch_keys(keys, &b) != 0)
        goto out;
    kvp_status_t *st = PyMem_Calloc(b.n > 0 ? (size_t)b.n : 1, sizeof(*st));
    if (st == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    if (b.n > 0) {
        kvp_client_t *c;
        WITH_CLIENT(self, c,
                    force ? kvp_batch_remove_force(c, b.key_ptrs, (size_t)b.n, st)
                          : kvp_batch_remove(c, b.key_ptrs, (size_t)b.n, st));
        if (c == NULL) {
            PyMem_Free(st);
            kvp_py_raise_closed();
            goto out;
        }
    }
    for (Py_ssize_t i = 0; i < b.n; i++)
        b.results[i] = st[i];
    PyMem_Free(st);
    ret = results_list(&b);
out:
    kvp_py_batch_cleanup(&b);
    return ret;
}

/*
 * get_ranges(ranges) -> [bytes read or negative status]: ranges is a list of
 * (key, offset, buffer) or (key, offset, (ptr, length)); each reads bytes
 * [offset, offset + length) of its object (fewer at the object's end).
 */
static PyObject *client_get_ranges(kvp_py_client_t *self, PyObject *ranges_obj)
{
    PyObject *ret = NULL;
    kvp_range_t *ranges = NULL;
    kvp_py_batch_t b;
    memset(&b, 0, sizeof(b));
    PyObject *seq = PySequence_Tuple(ranges_obj);
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(seq);
    PyObject *keys = PyTuple_New(n), *bufs = PyTuple_New(n);
    if (keys == NULL || bufs == NULL)
        goto out;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyTuple_GET_ITEM(seq, i);
        if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 3) {
            PyErr_Format(PyExc_TypeError, "ranges[%zd] must be a (key, offset, buffer) tuple", i);
            goto out;
        }
        PyTuple_SET_ITEM(keys, i, Py_NewRef(PyTuple_GET_ITEM(r, 0)));
        PyTuple_SET_ITEM(bufs, i, Py_NewRef(PyTuple_GET_ITEM(r, 2)));
    }
    if (kvp_py_batch_keys(keys, &b) != 0 || kvp_py_batch_buffers(bufs, 1, &b) != 0)
        goto out;
    ranges = PyMem_Calloc(n > 0 ? (size_t)n : 1, sizeof(*ranges));
    if (ranges == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        size_t off;
        char what[48];
        snprintf(what, sizeof(what), "ranges[%zd] offset", i);
        if (kvp_py_size(PyTuple_GET_ITEM(PyTuple_GET_ITEM(seq, i), 1), &off, what) != 0)
            goto out;
        ranges[i] = (kvp_range_t){
            .key = b.key_ptrs[i], .offset = off, .length = b.sizes[i], .buf = b.bufs[i]};
    }
    if (n > 0) {
        kvp_client_t *c;
        WITH_CLIENT(self, c, kvp_get_into_ranges(c, ranges, (size_t)n, b.results));
        if (c == NULL) {
            kvp_py_raise_closed();
            goto out;
        }
    }
    ret = results_list(&b);
out:
    PyMem_Free(ranges);
    kvp_py_batch_cleanup(&b);
    Py_XDECREF(keys);
    Py_XDECREF(bufs);
    Py_DECREF(seq);
    return ret;
}

/* ---------------- admin ---------------- */

static int dict_set_u64(PyObject *d, const char *k, uint64_t v)
{
    PyObject *o = PyLong_FromUnsignedLongLong(v);
    if (o == NULL)
        return -1;
    int rc = PyDict_SetItemString(d, k, o);
    Py_DECREF(o);
    return rc;
}

static int dict_set_str(PyObject *d, const char *k, const char *v)
{
    PyObject *o = PyUnicode_DecodeUTF8(v, (Py_ssize_t)strlen(v), "replace");
    if (o == NULL)
        return -1;
    int rc = PyDict_SetItemString(d, k, o);
    Py_DECREF(o);
    return rc;
}

/* The uint64_t counters of kvp_pool_stat_t, by name. */
#define STAT_FIELD(f)                                                                              \
    {                                                                                              \
#f, offsetof(kvp_pool_stat_t, f)                                                           \
    }
static const struct {
    const char *name;
    size_t off;
} stat_fields[] = {
    STAT_FIELD(capacity),          STAT_FIELD(used),
    STAT_FIELD(objects),           STAT_FIELD(pending),
    STAT_FIELD(evicted_objects),   STAT_FIELD(evicted_bytes),
    STAT_FIELD(put_timeouts),      STAT_FIELD(moved_objects),
    STAT_FIELD(reading_objects),   STAT_FIELD(reading_bytes),
    STAT_FIELD(leases_released),   STAT_FIELD(leases_expired),
    STAT_FIELD(ssd_capacity),      STAT_FIELD(ssd_used),
    STAT_FIELD(offloaded_objects), STAT_FIELD(offload_dropped),
    STAT_FIELD(offload_failed),    STAT_FIELD(offloading_objects),
    STAT_FIELD(promoted_objects),  STAT_FIELD(hits_dram),
    STAT_FIELD(hits_ssd),          STAT_FIELD(ssd_evicted_objects),
    STAT_FIELD(adopted_objects),   STAT_FIELD(ssd_lost_objects),
    STAT_FIELD(adopt_refused),     STAT_FIELD(epoch),
};
#undef STAT_FIELD

static PyObject *stat_dict(const kvp_pool_stat_t *s)
{
    PyObject *d = PyDict_New();
    if (d == NULL)
        return NULL;
    for (size_t i = 0; i < sizeof(stat_fields) / sizeof(stat_fields[0]); i++) {
        uint64_t v;
        memcpy(&v, (const char *)s + stat_fields[i].off, sizeof(v));
        if (dict_set_u64(d, stat_fields[i].name, v) != 0)
            goto err;
    }
    if (dict_set_str(d, "leader", s->leader) != 0 || dict_set_str(d, "standbys", s->standbys) != 0)
        goto err;
    PyObject *segs = PyList_New((Py_ssize_t)s->n_segments);
    if (segs == NULL)
        goto err;
    if (PyDict_SetItemString(d, "segments", segs) != 0) {
        Py_DECREF(segs);
        goto err;
    }
    Py_DECREF(segs); /* d holds it */
    for (size_t i = 0; i < s->n_segments; i++) {
        const kvp_segment_info_t *g = &s->segments[i];
        PyObject *sd = PyDict_New();
        if (sd == NULL)
            goto err;
        PyList_SET_ITEM(segs, (Py_ssize_t)i, sd);
        if (dict_set_u64(sd, "id", g->id) != 0 || dict_set_str(sd, "name", g->name) != 0 ||
            dict_set_str(sd, "medium", g->medium) != 0 ||
            dict_set_str(sd, "endpoint", g->endpoint) != 0 ||
            dict_set_u64(sd, "size", g->size) != 0 || dict_set_u64(sd, "used", g->used) != 0 ||
            dict_set_u64(sd, "objects", g->objects) != 0 ||
            PyDict_SetItemString(sd, "draining", g->draining ? Py_True : Py_False) != 0)
            goto err;
    }
    return d;
err:
    Py_DECREF(d);
    return NULL;
}

/* stat() -> dict, or a negative status */
static PyObject *client_stat(kvp_py_client_t *self, PyObject *unused)
{
    (void)unused;
    kvp_client_t *c;
    kvp_pool_stat_t *s = NULL;
    kvp_status_t st = KVP_OK;
    WITH_CLIENT(self, c, st = kvp_pool_stat(c, &s));
    if (c == NULL)
        return kvp_py_raise_closed();
    if (st != KVP_OK)
        return PyLong_FromLong(st);
    PyObject *d = stat_dict(s);
    kvp_pool_stat_free(s);
    return d;
}

/* {"ops": n, "bytes": n} into d[key]; -1 on a Python error. */
static int dict_set_count(PyObject *d, const char *key, const kvp_metrics_count_t *c)
{
    PyObject *o = Py_BuildValue("{s:K,s:K}", "ops", (unsigned long long)c->ops, "bytes",
                                (unsigned long long)c->bytes);
    if (o == NULL)
        return -1;
    int rc = PyDict_SetItemString(d, key, o);
    Py_DECREF(o);
    return rc;
}

/* {"put": {ops, bytes}, "get": {ops, bytes}} into d[name]. */
static int dict_set_dirs(PyObject *d, const char *name, const kvp_metrics_count_t *put,
                         const kvp_metrics_count_t *get)
{
    PyObject *o = PyDict_New();
    if (o == NULL)
        return -1;
    int rc = dict_set_count(o, "put", put) != 0 || dict_set_count(o, "get", get) != 0
                 ? -1
                 : PyDict_SetItemString(d, name, o);
    Py_DECREF(o);
    return rc;
}

/* A new empty dict set as d[name] (borrowed back), or NULL. */
static PyObject *dict_sub(PyObject *d, const char *name)
{
    PyObject *o = PyDict_New();
    if (o == NULL)
        return NULL;
    int rc = PyDict_SetItemString(d, name, o);
    Py_DECREF(o);
    return rc == 0 ? o : NULL;
}

static PyObject *metrics_dict(const kvp_metrics_t *m)
{
    PyObject *d = PyDict_New();
    if (d == NULL)
        return NULL;
    PyObject *cl, *sv, *er, *sg, *io, *segs;
    if (dict_set_u64(d, "version", m->version) != 0 || (cl = dict_sub(d, "client")) == NULL ||
        (sv = dict_sub(d, "served")) == NULL || (er = dict_sub(d, "errors")) == NULL ||
        (sg = dict_sub(d, "staged")) == NULL || (io = dict_sub(d, "ssd_io")) == NULL)
        goto err;
    for (unsigned t = 0; t < KVP_METRICS_TP_COUNT; t++)
        if (dict_set_dirs(cl, kvp_metrics_transport_name(t), &m->client[t].put,
                          &m->client[t].get) != 0)
            goto err;
    /* only the data servers see requests: tcp (the DRAM segment) and ssd */
    if (dict_set_dirs(sv, "tcp", &m->served[KVP_METRICS_TP_TCP].put,
                      &m->served[KVP_METRICS_TP_TCP].get) != 0 ||
        dict_set_dirs(sv, "ssd", &m->served[KVP_METRICS_TP_SSD].put,
                      &m->served[KVP_METRICS_TP_SSD].get) != 0 ||
        dict_set_u64(er, "put", m->put_errors) != 0 ||
        dict_set_u64(er, "get", m->get_errors) != 0 ||
        dict_set_count(sg, "host", &m->staged[0]) != 0 ||
        dict_set_count(sg, "gpu", &m->staged[1]) != 0 ||
        dict_set_count(io, "read", &m->ssd_read) != 0 ||
        dict_set_count(io, "write", &m->ssd_write) != 0 ||
        dict_set_u64(io, "errors", m->ssd_io_errors) != 0)
        goto err;
    segs = PyList_New(0);
    if (segs == NULL)
        goto err;
    int rc = PyDict_SetItemString(d, "segments", segs);
    Py_DECREF(segs);
    if (rc != 0)
        goto err;
    for (int tier = 0; tier < 2; tier++) {
        const char *name = tier == 0 ? m->dram_segment : m->ssd_segment;
        if (name[0] == '\0')
            continue;
        PyObject *sd = Py_BuildValue(
            "{s:s,s:s,s:K,s:O,s:O}", "name", name, "tier", tier == 0 ? "dram" : "ssd", "capacity",
            (unsigned long long)(tier == 0 ? m->dram_capacity : m->ssd_capacity), "mounted",
            (tier == 0 ? m->dram_mounted : m->ssd_mounted) ? Py_True : Py_False, "draining",
            tier == 0 && m->dram_draining ? Py_True : Py_False);
        if (sd == NULL)
            goto err;
        rc = PyList_Append(segs, sd);
        Py_DECREF(sd);
        if (rc != 0)
            goto err;
    }
    return d;
err:
    Py_DECREF(d);
    return NULL;
}

/* metrics() -> dict, or a negative status */
static PyObject *client_metrics(kvp_py_client_t *self, PyObject *unused)
{
    (void)unused;
    kvp_client_t *c;
    kvp_metrics_t m = {.size = sizeof(m)};
    kvp_status_t st = KVP_OK;
    WITH_CLIENT(self, c, st = kvp_metrics_snapshot(c, &m));
    if (c == NULL)
        return kvp_py_raise_closed();
    if (st != KVP_OK)
        return PyLong_FromLong(st);
    return metrics_dict(&m);
}

/* metrics_text() -> str (Prometheus text exposition), or a negative status */
static PyObject *client_metrics_text(kvp_py_client_t *self, PyObject *unused)
{
    (void)unused;
    kvp_client_t *c;
    kvp_metrics_t m = {.size = sizeof(m)};
    kvp_status_t st = KVP_OK;
    WITH_CLIENT(self, c, st = kvp_metrics_snapshot(c, &m));
    if (c == NULL)
        return kvp_py_raise_closed();
    if (st != KVP_OK)
        return PyLong_FromLong(st);
    size_t need = kvp_metrics_format_prometheus(&m, NULL, 0);
    char *buf = PyMem_Malloc(need + 1);
    if (buf == NULL)
        return PyErr_NoMemory();
    kvp_metrics_format_prometheus(&m, buf, need + 1);
    PyObject *r = PyUnicode_DecodeUTF8(buf, (Py_ssize_t)need, "replace");
    PyMem_Free(buf);
    return r;
}

/* list_keys(pattern=None, max=1000) -> [dict], or a negative status */
static PyObject *client_list_keys(kvp_py_client_t *self, PyObject *args)
{
    const char *pattern = NULL;
    Py_ssize_t max = 1000;
    if (!PyArg_ParseTuple(args, "|zn:list_keys", &pattern, &max))
        return NULL;
    if (max < 0) {
        PyErr_SetString(PyExc_ValueError, "max must be >= 0");
        return NULL;
    }
    kvp_client_t *c;
    kvp_key_info_t *keys = NULL;
    size_t n = 0;
    kvp_status_t st = KVP_OK;
    WITH_CLIENT(self, c, st = kvp_list_keys(c, pattern, (size_t)max, &keys, &n));
    if (c == NULL)
        return kvp_py_raise_closed();
    if (st != KVP_OK)
        return PyLong_FromLong(st);
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list != NULL && i < n; i++) {
        PyObject *d = Py_BuildValue(
            "{s:s,s:K,s:O,s:I,s:I,s:I}", "key", keys[i].key, "size",
            (unsigned long long)keys[i].size, "complete", keys[i].complete ? Py_True : Py_False,
            "replicas", keys[i].n_replicas, "lease_ms", keys[i].lease_ms, "pin", keys[i].pin);
        if (d == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, d);
    }
    kvp_key_list_free(keys, n);
    return list;
}

#define METH(name, fn, flags, doc)                                                                 \
    {                                                                                              \
        name, (PyCFunction)(void (*)(void))fn, flags, PyDoc_STR(doc)                               \
    }

static PyMethodDef client_methods[] = {
    METH("close", client_close, METH_NOARGS,
         "close(): unmount the segment and disconnect; waits for calls in flight"),
    METH("segment_name", client_segment_name, METH_NOARGS,
         "segment_name() -> the mounted segment's name, or None"),
    METH("put", client_put, METH_VARARGS, "put(key, buffer, config=None) -> status"),
    METH("put_from", client_put_from, METH_VARARGS,
         "put_from(key, ptr, size, config=None) -> status"),
    METH("put_parts", client_put_parts, METH_VARARGS,
         "put_parts(key, parts, config=None) -> status: one object from several buffers"),
    METH("get", client_get, METH_O, "get(key) -> bytes, or a negative status"),
    METH("get_into", client_get_into, METH_VARARGS,
         "get_into(key, buffer) -> object size, or a negative status"),
    METH("get_into_ptr", client_get_into_ptr, METH_VARARGS,
         "get_into_ptr(key, ptr, size) -> object size, or a negative status"),
    METH("get_size", client_get_size, METH_O, "get_size(key) -> size, or a negative status"),
    METH("is_exist", client_is_exist, METH_O, "is_exist(key) -> 1, 0 or a negative status"),
    METH("remove", client_remove, METH_VARARGS, "remove(key, force=False) -> status"),
    METH("remove_all", client_remove_all, METH_VARARGS,
         "remove_all(force=False) -> count removed, or a negative status"),
    METH("remove_by_regex", client_remove_by_regex, METH_VARARGS,
         "remove_by_regex(pattern, force=False) -> count removed, or a negative status"),
    METH("register_buffer", client_register_buffer, METH_VARARGS,
         "register_buffer(ptr, size) -> status"),
    METH("unregister_buffer", client_unregister_buffer, METH_O, "unregister_buffer(ptr) -> status"),
    METH("batch_put", client_batch_put, METH_VARARGS,
         "batch_put(keys, buffers, config=None) -> [status]; buffers: buffer objects or "
         "(ptr, size) pairs"),
    METH("batch_put_from", client_batch_put_from, METH_VARARGS,
         "batch_put_from(keys, ptrs, sizes, config=None) -> [status]"),
    METH("batch_get_into", client_batch_get_into, METH_VARARGS,
         "batch_get_into(keys, buffers) -> [size or negative status]"),
    METH("batch_get_into_ptrs", client_batch_get_into_ptrs, METH_VARARGS,
         "batch_get_into_ptrs(keys, ptrs, sizes) -> [size or negative status]"),
    METH("batch_put_multi", client_batch_put_multi, METH_VARARGS,
         "batch_put_multi(keys, [[ptr]], [[size]], config=None) -> [status]"),
    METH("batch_get_into_multi", client_batch_get_into_multi, METH_VARARGS,
         "batch_get_into_multi(keys, [[ptr]], [[size]]) -> [size or negative status]"),
    METH("get_ranges", client_get_ranges, METH_O,
         "get_ranges([(key, offset, buffer or (ptr, length))]) -> [bytes read or negative status]"),
    METH("aq_open", kvp_py_aq_open, METH_VARARGS,
         "aq_open(workers=0): start the async queue (idempotent)"),
    METH("aq_fd", kvp_py_aq_fd, METH_NOARGS,
         "aq_fd() -> the queue's eventfd, readable while completions wait"),
    METH("aq_put", kvp_py_aq_put, METH_VARARGS,
         "aq_put(keys, buffers, config, token) -> 0 submitted, or a negative status"),
    METH("aq_get", kvp_py_aq_get, METH_VARARGS,
         "aq_get(keys, buffers, token) -> 0 submitted, or a negative status"),
    METH("aq_get_bytes", kvp_py_aq_get_bytes, METH_VARARGS,
         "aq_get_bytes(key, capacity, token) -> 0 submitted, or a negative status"),
    METH("aq_exist", kvp_py_aq_exist, METH_VARARGS,
         "aq_exist(keys, token) -> 0 submitted, or a negative status"),
    METH("aq_reap", kvp_py_aq_reap, METH_VARARGS, "aq_reap(max=256) -> [(token, status, results)]"),
    METH("aq_close", kvp_py_aq_close, METH_NOARGS,
         "aq_close() -> [token]: destroy the queue; the tokens never reaped"),
    METH("batch_get_buffer", client_batch_get_buffer, METH_O,
         "batch_get_buffer(keys) -> [BufferHandle or negative status]"),
    METH("batch_exists_bools", client_batch_exists_bools, METH_O,
         "batch_exists_bools(keys) -> [bool per key]; raises on a per-key failure"),
    METH("batch_exists", client_batch_exists, METH_O,
         "batch_exists(keys) -> ([1, 0 or negative status], cached prefix length)"),
    METH("batch_remove", client_batch_remove, METH_VARARGS,
         "batch_remove(keys, force=False) -> [status]"),
    METH("stat", client_stat, METH_NOARGS, "stat() -> dict, or a negative status"),
    METH("metrics", client_metrics, METH_NOARGS,
         "metrics() -> dict of this client's counters (kvp_metrics_snapshot), or a negative "
         "status"),
    METH("metrics_text", client_metrics_text, METH_NOARGS,
         "metrics_text() -> the counters in the Prometheus text format, or a negative status"),
    METH("list_keys", client_list_keys, METH_VARARGS,
         "list_keys(pattern=None, max=1000) -> [dict], or a negative status"),
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef client_getset[] = {
    {"closed", (getter)client_closed, NULL, PyDoc_STR("True once close() was called"), NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject kvp_py_client_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvpool._kvpool.Client",
    .tp_basicsize = sizeof(kvp_py_client_t),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = PyDoc_STR("Client(master=None, segment_size=0, transport=None, rpc_timeout_ms=0, "
                        "data_host=None, segment_name=None, rdma_devices=None, verify_crc=True, "
                        "tcp_streams=0): the raw libkvpool client (results are status codes)"),
    .tp_new = client_new,
    .tp_init = (initproc)client_init,
    .tp_dealloc = (destructor)client_dealloc,
    .tp_methods = client_methods,
    .tp_getset = client_getset,
    .tp_weaklistoffset = offsetof(kvp_py_client_t, weaklist),
};
