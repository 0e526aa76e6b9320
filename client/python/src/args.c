/*
 * args.c - Python arguments to the C arrays of libkvpool's calls.
 *
 * Design: a batch call parses everything first, holding the GIL: keys into a
 * tuple of str (so a list mutated by another thread meanwhile cannot free a
 * key under the call), buffer objects into exported Py_buffer views (which
 * pins their memory: a bytearray cannot resize while exported), ints into
 * pointers and sizes. Only then is the GIL released around the C call. Bad
 * input is a TypeError or ValueError naming the argument and index, never a
 * crash; what the library itself refuses comes back as a status.
 *
 * Thread: the calling Python thread, GIL held.
 */
#include <string.h>

#include "kvpool_py.h"

int kvp_py_key(PyObject *o, const char **key)
{
    if (!PyUnicode_Check(o)) {
        PyErr_Format(PyExc_TypeError, "a key must be str, not %.100s", Py_TYPE(o)->tp_name);
        return -1;
    }
    Py_ssize_t len;
    const char *s = PyUnicode_AsUTF8AndSize(o, &len);
    if (s == NULL)
        return -1;
    if ((size_t)len != strlen(s)) {
        PyErr_SetString(PyExc_ValueError, "a key must not contain NUL characters");
        return -1;
    }
    *key = s;
    return 0;
}

/* An int (or __index__) as an unsigned 64-bit value; *neg set for a negative one. */
static int index_u64(PyObject *o, unsigned long long *v, int *neg, const char *what)
{
    if (PyBool_Check(o) || !PyIndex_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, not %.100s", what, Py_TYPE(o)->tp_name);
        return -1;
    }
    PyObject *i = PyNumber_Index(o);
    if (i == NULL)
        return -1;
    int overflow = 0;
    long long sv = PyLong_AsLongLongAndOverflow(i, &overflow);
    *neg = overflow < 0 || (overflow == 0 && sv < 0);
    *v = 0;
    if (!*neg)
        *v = PyLong_AsUnsignedLongLong(i);
    Py_DECREF(i);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s is too large", what);
        return -1;
    }
    return 0;
}

int kvp_py_ptr(PyObject *o, void **p, const char *what)
{
    unsigned long long v;
    int neg;
    if (index_u64(o, &v, &neg, what) != 0)
        return -1;
    if (neg || v > UINTPTR_MAX) {
        PyErr_Format(PyExc_ValueError, "%s is not a valid address (negative or too large)", what);
        return -1;
    }
    if (v == 0) {
        PyErr_Format(PyExc_ValueError, "%s is a null pointer (0)", what);
        return -1;
    }
    *p = (void *)(uintptr_t)v;
    return 0;
}

int kvp_py_size(PyObject *o, size_t *s, const char *what)
{
    unsigned long long v;
    int neg;
    if (index_u64(o, &v, &neg, what) != 0)
        return -1;
    if (neg || v > SIZE_MAX) {
        PyErr_Format(PyExc_ValueError, "%s must be a size >= 0, got a negative or too large int",
                     what);
        return -1;
    }
    *s = (size_t)v;
    return 0;
}

int kvp_py_put_config(PyObject *o, kvp_put_config_t *cfg, const kvp_put_config_t **cfg_p)
{
    kvp_put_config_init(cfg);
    *cfg_p = NULL;
    if (o == NULL || o == Py_None)
        return 0;
    if (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) != 6) {
        PyErr_SetString(PyExc_TypeError, "config must be None or a 6-tuple (replica_num, "
                                         "preferred_segment, pin, soft_pin_ttl_s, mode, medium)");
        return -1;
    }
    unsigned long v[6] = {0};
    static const int ints[] = {0, 2, 3, 4};
    for (size_t k = 0; k < sizeof(ints) / sizeof(ints[0]); k++) {
        PyObject *it = PyTuple_GET_ITEM(o, ints[k]);
        if (!PyLong_Check(it)) {
            PyErr_SetString(PyExc_TypeError, "config: replica_num, pin, soft_pin_ttl_s and "
                                             "mode must be ints");
            return -1;
        }
        v[ints[k]] = PyLong_AsUnsignedLong(it);
        if (PyErr_Occurred() || v[ints[k]] > UINT32_MAX) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "config: replica_num, pin, soft_pin_ttl_s and mode "
                                              "must be ints in 0..2^32-1");
            return -1;
        }
    }
    cfg->replica_num = (uint32_t)v[0];
    cfg->pin = (uint32_t)v[2];
    cfg->soft_pin_ttl_s = (uint32_t)v[3];
    cfg->mode = (uint32_t)v[4];
    const char *strs[2] = {NULL, NULL};
    static const int sidx[] = {1, 5};
    for (int k = 0; k < 2; k++) {
        PyObject *it = PyTuple_GET_ITEM(o, sidx[k]);
        if (it == Py_None)
            continue;
        if (kvp_py_key(it, &strs[k]) != 0) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError,
                            "config: preferred_segment and medium must be None or str");
            return -1;
        }
        if (strs[k][0] == '\0')
            strs[k] = NULL;
    }
    cfg->preferred_segment = strs[0];
    cfg->medium = strs[1];
    *cfg_p = cfg;
    return 0;
}

/* Allocate the arrays of a batch of b->n keys (results too). */
static int batch_alloc(kvp_py_batch_t *b)
{
    size_t n = b->n > 0 ? (size_t)b->n : 1;
    b->key_ptrs = PyMem_Calloc(n, sizeof(*b->key_ptrs));
    b->bufs = PyMem_Calloc(n, sizeof(*b->bufs));
    b->sizes = PyMem_Calloc(n, sizeof(*b->sizes));
    b->results = PyMem_Calloc(n, sizeof(*b->results));
    if (b->key_ptrs == NULL || b->bufs == NULL || b->sizes == NULL || b->results == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

int kvp_py_batch_keys(PyObject *keys, kvp_py_batch_t *b)
{
    memset(b, 0, sizeof(*b));
    if (PyUnicode_Check(keys) || PyBytes_Check(keys)) {
        PyErr_SetString(PyExc_TypeError, "keys must be a list of str, not a single string");
        return -1;
    }
    b->keys = PySequence_Tuple(keys);
    if (b->keys == NULL) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "keys must be a list of str, not %.100s",
                         Py_TYPE(keys)->tp_name);
        }
        return -1;
    }
    b->n = PyTuple_GET_SIZE(b->keys);
    if ((size_t)b->n > KVP_MAX_BATCH) {
        PyErr_Format(PyExc_ValueError, "a batch holds at most %d keys (got %zd): split it",
                     KVP_MAX_BATCH, b->n);
        return -1;
    }
    if (batch_alloc(b) != 0)
        return -1;
    for (Py_ssize_t i = 0; i < b->n; i++) {
        if (kvp_py_key(PyTuple_GET_ITEM(b->keys, i), &b->key_ptrs[i]) != 0) {
            PyObject *t, *v, *tb;
            PyErr_Fetch(&t, &v, &tb);
            PyErr_NormalizeException(&t, &v, &tb);
            PyErr_Format(t, "keys[%zd]: %S", i, v);
            Py_XDECREF(t);
            Py_XDECREF(v);
            Py_XDECREF(tb);
            return -1;
        }
    }
    return 0;
}

static int check_len(PyObject *seq, Py_ssize_t n, const char *what)
{
    Py_ssize_t m = PySequence_Fast_GET_SIZE(seq);
    if (m != n) {
        PyErr_Format(PyExc_ValueError, "%s has %zd entries but there are %zd keys", what, m, n);
        return -1;
    }
    return 0;
}

/* PySequence_Fast with our message; rejects str/bytes. */
static PyObject *as_seq(PyObject *o, const char *what)
{
    if (PyUnicode_Check(o) || PyBytes_Check(o) || PyByteArray_Check(o) || PyMemoryView_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be a list, not %.100s", what, Py_TYPE(o)->tp_name);
        return NULL;
    }
    /* a tuple copy: nothing in it can be replaced while the GIL is released */
    PyObject *t = PySequence_Tuple(o);
    if (t == NULL && PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must be a list, not %.100s", what, Py_TYPE(o)->tp_name);
    }
    return t;
}

int kvp_py_batch_buffers(PyObject *items, int writable, kvp_py_batch_t *b)
{
    PyObject *seq = as_seq(items, "buffers");
    if (seq == NULL)
        return -1;
    int rc = -1;
    if (check_len(seq, b->n, "buffers") != 0)
        goto out;
    b->views = PyMem_Calloc(b->n > 0 ? (size_t)b->n : 1, sizeof(*b->views));
    if (b->views == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < b->n; i++) {
        PyObject *it = PySequence_Fast_GET_ITEM(seq, i);
        if (PyTuple_Check(it) && PyTuple_GET_SIZE(it) == 2) {
            char what[64];
            snprintf(what, sizeof(what), "buffers[%zd][0]", i);
            if (kvp_py_ptr(PyTuple_GET_ITEM(it, 0), &b->bufs[i], what) != 0)
                goto out;
            snprintf(what, sizeof(what), "buffers[%zd][1]", i);
            if (kvp_py_size(PyTuple_GET_ITEM(it, 1), &b->sizes[i], what) != 0)
                goto out;
            continue;
        }
        if (!PyObject_CheckBuffer(it)) {
            PyErr_Format(PyExc_TypeError,
                         "buffers[%zd] must be a buffer (bytes, bytearray, numpy array, ...) or "
                         "an (address, size) pair of ints, not %.100s",
                         i, Py_TYPE(it)->tp_name);
            goto out;
        }
        int flags = writable ? (PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) : PyBUF_C_CONTIGUOUS;
        if (PyObject_GetBuffer(it, &b->views[i], flags) != 0) {
            PyObject *t, *v, *tb;
            PyErr_Fetch(&t, &v, &tb);
            PyErr_NormalizeException(&t, &v, &tb);
            PyErr_Format(writable ? PyExc_TypeError : PyExc_ValueError,
                         "buffers[%zd] cannot be %s: %S", i,
                         writable ? "written (needs a writable, C-contiguous buffer)"
                                  : "read (needs a C-contiguous buffer)",
                         v);
            Py_XDECREF(t);
            Py_XDECREF(v);
            Py_XDECREF(tb);
            b->views[i].obj = NULL;
            goto out;
        }
        b->bufs[i] = b->views[i].buf;
        b->sizes[i] = (size_t)b->views[i].len;
    }
    rc = 0;
out:
    Py_DECREF(seq);
    return rc;
}

int kvp_py_batch_ptrs(PyObject *ptrs, PyObject *sizes, kvp_py_batch_t *b)
{
    PyObject *ps = as_seq(ptrs, "ptrs");
    if (ps == NULL)
        return -1;
    PyObject *ss = as_seq(sizes, "sizes");
    int rc = -1;
    if (ss == NULL)
        goto out;
    if (check_len(ps, b->n, "ptrs") != 0 || check_len(ss, b->n, "sizes") != 0)
        goto out;
    for (Py_ssize_t i = 0; i < b->n; i++) {
        char what[48];
        snprintf(what, sizeof(what), "ptrs[%zd]", i);
        if (kvp_py_ptr(PySequence_Fast_GET_ITEM(ps, i), &b->bufs[i], what) != 0)
            goto out;
        snprintf(what, sizeof(what), "sizes[%zd]", i);
        if (kvp_py_size(PySequence_Fast_GET_ITEM(ss, i), &b->sizes[i], what) != 0)
            goto out;
    }
    rc = 0;
out:
    Py_DECREF(ps);
    Py_XDECREF(ss);
    return rc;
}

int kvp_py_batch_multi(PyObject *ptrs, PyObject *sizes, kvp_py_batch_t *b)
{
    PyObject *ps = as_seq(ptrs, "ptrs");
    if (ps == NULL)
        return -1;
    PyObject *ss = as_seq(sizes, "sizes");
    int rc = -1;
    if (ss == NULL)
        goto out;
    if (check_len(ps, b->n, "ptrs") != 0 || check_len(ss, b->n, "sizes") != 0)
        goto out;
    size_t n = b->n > 0 ? (size_t)b->n : 1;
    b->part_bufs = PyMem_Calloc(n, sizeof(*b->part_bufs));
    b->part_sizes = PyMem_Calloc(n, sizeof(*b->part_sizes));
    b->n_parts = PyMem_Calloc(n, sizeof(*b->n_parts));
    if (b->part_bufs == NULL || b->part_sizes == NULL || b->n_parts == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < b->n; i++) {
        char what[64];
        snprintf(what, sizeof(what), "ptrs[%zd]", i);
        PyObject *pi = as_seq(PySequence_Fast_GET_ITEM(ps, i), what);
        if (pi == NULL)
            goto out;
        snprintf(what, sizeof(what), "sizes[%zd]", i);
        PyObject *si = as_seq(PySequence_Fast_GET_ITEM(ss, i), what);
        if (si == NULL) {
            Py_DECREF(pi);
            goto out;
        }
        Py_ssize_t m = PySequence_Fast_GET_SIZE(pi);
        int ok = 0;
        if (m != PySequence_Fast_GET_SIZE(si)) {
            PyErr_Format(PyExc_ValueError, "ptrs[%zd] has %zd buffers but sizes[%zd] has %zd sizes",
                         i, m, i, PySequence_Fast_GET_SIZE(si));
        } else if (m == 0) {
            PyErr_Format(PyExc_ValueError, "ptrs[%zd] is empty: each key needs a buffer", i);
        } else {
            b->part_bufs[i] = PyMem_Calloc((size_t)m, sizeof(void *));
            b->part_sizes[i] = PyMem_Calloc((size_t)m, sizeof(size_t));
            if (b->part_bufs[i] == NULL || b->part_sizes[i] == NULL) {
                PyErr_NoMemory();
            } else {
                ok = 1;
                b->n_parts[i] = (size_t)m;
                size_t total = 0;
                for (Py_ssize_t j = 0; ok && j < m; j++) {
                    snprintf(what, sizeof(what), "ptrs[%zd][%zd]", i, j);
                    if (kvp_py_ptr(PySequence_Fast_GET_ITEM(pi, j), &b->part_bufs[i][j], what) !=
                        0) {
                        ok = 0;
                        break;
                    }
                    snprintf(what, sizeof(what), "sizes[%zd][%zd]", i, j);
                    if (kvp_py_size(PySequence_Fast_GET_ITEM(si, j), &b->part_sizes[i][j], what) !=
                        0)
                        ok = 0;
                    else
                        total += b->part_sizes[i][j];
                }
                b->sizes[i] = total;
            }
        }
        Py_DECREF(pi);
        Py_DECREF(si);
        if (!ok)
            goto out;
    }
    rc = 0;
out:
    Py_DECREF(ps);
    Py_XDECREF(ss);
    return rc;
}

void kvp_py_batch_cleanup(kvp_py_batch_t *b)
{
    if (b->views != NULL) {
        for (Py_ssize_t i = 0; i < b->n; i++)
            if (b->views[i].obj != NULL)
                PyBuffer_Release(&b->views[i]);
        PyMem_Free(b->views);
    }
    if (b->part_bufs != NULL)
        for (Py_ssize_t i = 0; i < b->n; i++)
            PyMem_Free(b->part_bufs[i]);
    if (b->part_sizes != NULL)
        for (Py_ssize_t i = 0; i < b->n; i++)
            PyMem_Free(b->part_sizes[i]);
    PyMem_Free(b->part_bufs);
    PyMem_Free(b->part_sizes);
    PyMem_Free(b->n_parts);
    PyMem_Free(b->key_ptrs);
    PyMem_Free(b->bufs);
    PyMem_Free(b->sizes);
    PyMem_Free(b->results);
    Py_XDECREF(b->keys);
    memset(b, 0, sizeof(*b));
}
