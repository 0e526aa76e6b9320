/*
 * args.c - the O& converters: Python arguments to the C arrays of libkvpool's
 * calls.
 *
 * Design: a call parses everything first, holding the GIL, with
 * PyArg_ParseTupleAndKeywords and these converters: keys into a tuple of str
 * (so a list mutated by another thread meanwhile cannot free a key under the
 * call), buffer objects into exported Py_buffer views (which pins their
 * memory: a bytearray cannot resize while exported), ints into pointers and
 * sizes. Only then is the GIL released around the C call. Bad input is a
 * TypeError or ValueError naming the argument and index, never a crash; what
 * the library itself refuses comes back as a status. A converter that
 * allocates returns Py_CLEANUP_SUPPORTED and frees what it holds when called
 * back with NULL (a later argument failed); on its own failure it frees
 * everything before it returns 0.
 *
 * Thread: the calling Python thread, GIL held.
 */
#include <string.h>

#include <limits.h>

#include "kvpool_py.h"

/* ---------------- single values ---------------- */

static int key_check(PyObject *o, const char **key)
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

int kvp_py_key_conv(PyObject *o, void *key_p)
{
    return key_check(o, key_p) == 0;
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

static int ptr_check(PyObject *o, void **p, const char *what)
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

int kvp_py_u32(PyObject *o, uint32_t *v, const char *what)
{
    size_t s;
    if (kvp_py_size(o, &s, what) != 0)
        return -1;
    if (s > UINT32_MAX) {
        PyErr_Format(PyExc_ValueError, "%s is too large", what);
        return -1;
    }
    *v = (uint32_t)s;
    return 0;
}

int kvp_py_ptr_conv(PyObject *o, void *ptr_p)
{
    return ptr_check(o, ptr_p, "ptr") == 0;
}

int kvp_py_size_conv(PyObject *o, void *size_p)
{
    return kvp_py_size(o, size_p, "size") == 0;
}

void kvp_py_config_release(kvp_py_config_t *config)
{
    PyMem_Free(config->groups);
    config->groups = NULL;
}

int kvp_py_config_conv(PyObject *o, void *config_p)
{
    kvp_py_config_t *config = config_p;
    kvp_put_config_t *cfg = &config->cfg;
    kvp_put_config_init(cfg);
    config->p = NULL;
    config->groups = NULL;
    if (o == Py_None)
        return 1;
    Py_ssize_t len = PyTuple_Check(o) ? PyTuple_GET_SIZE(o) : 0;
    if (len < 6 || len > 9) {
        PyErr_SetString(PyExc_TypeError,
                        "config must be None or a 6-tuple (replica_num, preferred_segment, pin, "
                        "soft_pin_ttl_s, mode, medium), or a 7-tuple with preferred_segments "
                        "(a tuple of at most 8 str, or None) last, or an 8-tuple with "
                        "group_ids (a sequence of str, one per key, or None) after it, or a "
                        "9-tuple with dfs_replica_num (an int, or None) last");
        return 0;
    }
    if (len == 9 && PyTuple_GET_ITEM(o, 8) != Py_None) {
        PyObject *d = PyTuple_GET_ITEM(o, 8);
        unsigned long dv = PyLong_Check(d) ? PyLong_AsUnsignedLong(d) : ULONG_MAX;
        if (PyErr_Occurred() || dv > UINT32_MAX) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "config: dfs_replica_num must be an int >= 0");
            return 0;
        }
        cfg->dfs_replica_num = (uint32_t)dv;
    }
    if (len >= 7 && PyTuple_GET_ITEM(o, 6) != Py_None) {
        PyObject *l = PyTuple_GET_ITEM(o, 6);
        if (!PyTuple_Check(l) || PyTuple_GET_SIZE(l) > 8) {
            PyErr_SetString(PyExc_TypeError,
                            "config: preferred_segments must be None or a tuple of at most 8 str");
            return 0;
        }
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(l); i++)
            if (key_check(PyTuple_GET_ITEM(l, i), &config->preferred[i]) != 0) {
                PyErr_Clear();
                PyErr_SetString(PyExc_TypeError, "config: preferred_segments must be str");
                return 0;
            }
        cfg->preferred_segments = config->preferred;
        cfg->n_preferred_segments = (size_t)PyTuple_GET_SIZE(l);
    }
    unsigned long v[6] = {0};
    static const int ints[] = {0, 2, 3, 4};
    for (size_t k = 0; k < sizeof(ints) / sizeof(ints[0]); k++) {
        PyObject *it = PyTuple_GET_ITEM(o, ints[k]);
        if (!PyLong_Check(it)) {
            PyErr_SetString(PyExc_TypeError, "config: replica_num, pin, soft_pin_ttl_s and "
                                             "mode must be ints");
            return 0;
        }
        v[ints[k]] = PyLong_AsUnsignedLong(it);
        if (PyErr_Occurred() || v[ints[k]] > UINT32_MAX) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "config: replica_num, pin, soft_pin_ttl_s and mode "
                                              "must be ints in 0..2^32-1");
            return 0;
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
        if (key_check(it, &strs[k]) != 0) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError,
                            "config: preferred_segment and medium must be None or str");
            return 0;
        }
        if (strs[k][0] == '\0')
            strs[k] = NULL;
    }
    cfg->preferred_segment = strs[0];
    cfg->medium = strs[1];
    if (len >= 8 && PyTuple_GET_ITEM(o, 7) != Py_None) {
        /* checked here; the count against the keys by the library (INVALID_ARG) */
        PyObject *l = PyTuple_GET_ITEM(o, 7);
        if (!PyTuple_Check(l) && !PyList_Check(l)) {
            PyErr_SetString(PyExc_TypeError, "config: group_ids must be None or a list of str");
            return 0;
        }
        Py_ssize_t n = PySequence_Fast_GET_SIZE(l);
        if (n > KVP_MAX_BATCH) {
            PyErr_SetString(PyExc_ValueError, "config: more group_ids than a batch has keys");
            return 0;
        }
        config->groups = PyMem_Malloc((size_t)(n > 0 ? n : 1) * sizeof(*config->groups));
        if (config->groups == NULL) {
            PyErr_NoMemory();
            return 0;
        }
        for (Py_ssize_t i = 0; i < n; i++)
            if (key_check(PySequence_Fast_GET_ITEM(l, i), &config->groups[i]) != 0) {
                PyErr_Clear();
                PyErr_SetString(PyExc_TypeError, "config: group_ids must be str without NUL");
                kvp_py_config_release(config);
                return 0;
            }
        cfg->group_ids = config->groups;
        cfg->n_group_ids = (size_t)n;
    }
    config->p = cfg;
    return 1;
}

/* ---------------- lists ---------------- */

/* Replace the pending exception with `type` "<prefix>: <its message>". */
static void reraise_prefixed(PyObject *type, const char *prefix)
{
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyErr_NormalizeException(&t, &v, &tb);
    PyErr_Format(type != NULL ? type : t, "%s: %S", prefix, v);
    Py_XDECREF(t);
    Py_XDECREF(v);
    Py_XDECREF(tb);
}

/* A tuple copy of a list argument (nothing in it can be replaced while the GIL is
 * released), with our message; str, bytes and buffers are refused. */
static PyObject *as_tuple(PyObject *o, const char *what)
{
    if (PyUnicode_Check(o) || PyBytes_Check(o) || PyByteArray_Check(o) || PyMemoryView_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be a list, not %.100s", what, Py_TYPE(o)->tp_name);
        return NULL;
    }
    PyObject *t = PySequence_Tuple(o);
    if (t == NULL && PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must be a list, not %.100s", what, Py_TYPE(o)->tp_name);
    }
    return t;
}

/* n elements of `size` bytes (at least one, so that NULL means "not given"). */
static void *alloc_n(Py_ssize_t n, size_t size)
{
    void *p = PyMem_Calloc(n > 0 ? (size_t)n : 1, size);
    if (p == NULL)
        PyErr_NoMemory();
    return p;
}

static void keys_release(kvp_py_keys_t *k)
{
    PyMem_Free(k->ptrs);
    Py_XDECREF(k->tuple);
    memset(k, 0, sizeof(*k));
}

int kvp_py_keys_conv(PyObject *o, void *keys_p)
{
    kvp_py_keys_t *k = keys_p;
    if (o == NULL) {
        keys_release(k);
        return 1;
    }
    memset(k, 0, sizeof(*k));
    if (PyUnicode_Check(o) || PyBytes_Check(o)) {
        PyErr_SetString(PyExc_TypeError, "keys must be a list of str, not a single string");
        return 0;
    }
    k->tuple = PySequence_Tuple(o);
    if (k->tuple == NULL) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "keys must be a list of str, not %.100s",
                         Py_TYPE(o)->tp_name);
        }
        return 0;
    }
    k->n = PyTuple_GET_SIZE(k->tuple);
    if ((size_t)k->n > KVP_MAX_BATCH) {
        PyErr_Format(PyExc_ValueError, "a batch holds at most %d keys (got %zd): split it",
                     KVP_MAX_BATCH, k->n);
        goto err;
    }
    k->ptrs = alloc_n(k->n, sizeof(*k->ptrs));
    if (k->ptrs == NULL)
        goto err;
    for (Py_ssize_t i = 0; i < k->n; i++) {
        if (key_check(PyTuple_GET_ITEM(k->tuple, i), &k->ptrs[i]) != 0) {
            char what[32];
            snprintf(what, sizeof(what), "keys[%zd]", i);
            reraise_prefixed(NULL, what);
            goto err;
        }
    }
    return Py_CLEANUP_SUPPORTED;
err:
    keys_release(k);
    return 0;
}

static void bufs_release(kvp_py_bufs_t *b)
{
    if (b->views != NULL)
        for (Py_ssize_t i = 0; i < b->ptrs.n; i++)
            if (b->views[i].obj != NULL)
                PyBuffer_Release(&b->views[i]);
    PyMem_Free(b->views);
    PyMem_Free(b->ptrs.v);
    PyMem_Free(b->sizes.v);
    memset(b, 0, sizeof(*b));
}

/* What a list of buffers is for: a put, a get, or put_parts (buffer objects only). */
typedef enum bufs_mode {
    BUFS_READ,
    BUFS_WRITE,
    BUFS_PARTS,
} bufs_mode_t;

/* One item of `buffers`: a (ptr, size) pair or a C-contiguous buffer object. */
static int buffer_item(PyObject *it, Py_ssize_t i, bufs_mode_t mode, kvp_py_bufs_t *b)
{
    if (mode != BUFS_PARTS && PyTuple_Check(it) && PyTuple_GET_SIZE(it) == 2) {
        char what[64];
        snprintf(what, sizeof(what), "buffers[%zd][0]", i);
        if (ptr_check(PyTuple_GET_ITEM(it, 0), &b->ptrs.v[i], what) != 0)
            return -1;
        snprintf(what, sizeof(what), "buffers[%zd][1]", i);
        return kvp_py_size(PyTuple_GET_ITEM(it, 1), &b->sizes.v[i], what);
    }
    if (mode != BUFS_PARTS && !PyObject_CheckBuffer(it)) {
        PyErr_Format(PyExc_TypeError,
                     "buffers[%zd] must be a buffer (bytes, bytearray, numpy array, ...) or "
                     "an (address, size) pair of ints, not %.100s",
                     i, Py_TYPE(it)->tp_name);
        return -1;
    }
    int flags = mode == BUFS_WRITE ? (PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) : PyBUF_C_CONTIGUOUS;
    if (PyObject_GetBuffer(it, &b->views[i], flags) != 0) {
        b->views[i].obj = NULL;
        if (mode == BUFS_PARTS) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "parts[%zd] must be a C-contiguous buffer", i);
            return -1;
        }
        char what[96];
        snprintf(what, sizeof(what), "buffers[%zd] cannot be %s", i,
                 mode == BUFS_WRITE ? "written (needs a writable, C-contiguous buffer)"
                                    : "read (needs a C-contiguous buffer)");
        reraise_prefixed(mode == BUFS_WRITE ? PyExc_TypeError : PyExc_ValueError, what);
        return -1;
    }
    b->ptrs.v[i] = b->views[i].buf;
    b->sizes.v[i] = (size_t)b->views[i].len;
    return 0;
}

static int buffers_conv(PyObject *o, kvp_py_bufs_t *b, bufs_mode_t mode)
{
    if (o == NULL) {
        bufs_release(b);
        return 1;
    }
    memset(b, 0, sizeof(*b));
    PyObject *seq = mode == BUFS_PARTS ? PySequence_Tuple(o) : as_tuple(o, "buffers");
    if (seq == NULL)
        return 0;
    Py_ssize_t n = PyTuple_GET_SIZE(seq);
    b->ptrs.n = b->sizes.n = n;
    b->ptrs.v = alloc_n(n, sizeof(*b->ptrs.v));
    b->sizes.v = alloc_n(n, sizeof(*b->sizes.v));
    b->views = alloc_n(n, sizeof(*b->views));
    if (b->ptrs.v == NULL || b->sizes.v == NULL || b->views == NULL)
        goto err;
    if (mode == BUFS_PARTS && n == 0) {
        PyErr_SetString(PyExc_ValueError, "put_parts needs at least one part");
        goto err;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (buffer_item(PyTuple_GET_ITEM(seq, i), i, mode, b) != 0)
            goto err;
    Py_DECREF(seq);
    return Py_CLEANUP_SUPPORTED;
err:
    Py_DECREF(seq);
    bufs_release(b);
    return 0;
}

int kvp_py_buffers_conv(PyObject *o, void *bufs_p)
{
    return buffers_conv(o, bufs_p, BUFS_READ);
}

int kvp_py_wbuffers_conv(PyObject *o, void *bufs_p)
{
    return buffers_conv(o, bufs_p, BUFS_WRITE);
}

int kvp_py_parts_conv(PyObject *o, void *bufs_p)
{
    return buffers_conv(o, bufs_p, BUFS_PARTS);
}

/* A single key as a batch of one: an async call's op owns its key this way. */
int kvp_py_one_key_conv(PyObject *o, void *keys_p)
{
    if (o == NULL)
        return kvp_py_keys_conv(NULL, keys_p);
    PyObject *one = PyTuple_Pack(1, o);
    if (one == NULL)
        return 0;
    int rc = kvp_py_keys_conv(one, keys_p);
    Py_DECREF(one);
    return rc;
}

/*
 * get_ranges' argument, a list of (key, offset, buffer or (ptr, length)), into
 * b: keys, writable buffers and the kvp_range_t array.
 */
int kvp_py_ranges_conv(PyObject *o, void *batch_p)
{
    kvp_py_batch_t *b = batch_p;
    if (o == NULL) {
        kvp_py_batch_release(b);
        return 1;
    }
    PyObject *seq = PySequence_Tuple(o);
    if (seq == NULL)
        return 0;
    int rc = 0;
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
    if (!kvp_py_keys_conv(keys, &b->keys) || !kvp_py_wbuffers_conv(bufs, &b->bufs))
        goto out;
    b->ranges = alloc_n(n, sizeof(*b->ranges));
    if (b->ranges == NULL)
        goto out;
    for (Py_ssize_t i = 0; i < n; i++) {
        size_t off;
        char what[48];
        snprintf(what, sizeof(what), "ranges[%zd] offset", i);
        if (kvp_py_size(PyTuple_GET_ITEM(PyTuple_GET_ITEM(seq, i), 1), &off, what) != 0)
            goto out;
        b->ranges[i] = (kvp_range_t){.key = b->keys.ptrs[i],
                                     .offset = off,
                                     .length = b->bufs.sizes.v[i],
                                     .buf = b->bufs.ptrs.v[i]};
    }
    rc = Py_CLEANUP_SUPPORTED;
out:
    if (rc == 0)
        kvp_py_batch_release(b);
    Py_XDECREF(keys);
    Py_XDECREF(bufs);
    Py_DECREF(seq);
    return rc;
}

/*
 * A list of ints into `*v_p` (n entries of `elem` bytes), each checked by
 * `check` with its name `what[i]`. 1, or 0 with an exception set and nothing
 * allocated. Used for pointers, sizes and the inner lists of the multi-buffer
 * calls.
 */
typedef int (*int_check_fn)(PyObject *o, void *out, const char *what);

static int ptr_item(PyObject *o, void *out, const char *what)
{
    return ptr_check(o, out, what);
}

static int size_item(PyObject *o, void *out, const char *what)
{
    return kvp_py_size(o, out, what);
}

static int int_list(PyObject *seq, const char *what, size_t elem, int_check_fn check, void **v_p)
{
    Py_ssize_t n = PyTuple_GET_SIZE(seq);
    char *v = alloc_n(n, elem);
    if (v == NULL)
        return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        char item[96]; /* the name cut at 60 bytes: room for any index */
        snprintf(item, sizeof(item), "%.60s[%zd]", what, i);
        if (check(PyTuple_GET_ITEM(seq, i), v + (size_t)i * elem, item) != 0) {
            PyMem_Free(v);
            return 0;
        }
    }
    *v_p = v;
    return 1;
}

/* The converter of a flat list of ints: `what` names it, `v` and `n` are filled. */
static int flat_conv(PyObject *o, const char *what, size_t elem, int_check_fn check, void **v_p,
                     Py_ssize_t *n_p)
{
    if (o == NULL) {
        PyMem_Free(*v_p);
        *v_p = NULL;
        *n_p = 0;
        return 1;
    }
    *v_p = NULL;
    *n_p = 0;
    PyObject *seq = as_tuple(o, what);
    if (seq == NULL)
        return 0;
    int ok = int_list(seq, what, elem, check, v_p);
    if (ok)
        *n_p = PyTuple_GET_SIZE(seq);
    Py_DECREF(seq);
    return ok ? Py_CLEANUP_SUPPORTED : 0;
}

int kvp_py_ptrs_conv(PyObject *o, void *ptrs_p)
{
    kvp_py_ptrs_t *p = ptrs_p;
    return flat_conv(o, "ptrs", sizeof(*p->v), ptr_item, (void **)&p->v, &p->n);
}

int kvp_py_sizes_conv(PyObject *o, void *sizes_p)
{
    kvp_py_sizes_t *s = sizes_p;
    return flat_conv(o, "sizes", sizeof(*s->v), size_item, (void **)&s->v, &s->n);
}

/* Both arrays of `l` (one of them is NULL) and the inner ones. */
static void lists_release(kvp_py_lists_t *l)
{
    for (Py_ssize_t i = 0; i < l->n; i++) {
        if (l->ptrs != NULL)
            PyMem_Free(l->ptrs[i]);
        if (l->sizes != NULL)
            PyMem_Free(l->sizes[i]);
    }
    PyMem_Free(l->ptrs);
    PyMem_Free(l->sizes);
    PyMem_Free(l->counts);
    memset(l, 0, sizeof(*l));
}

/* A list of non-empty lists of pointers (ptrs) or of sizes (!ptrs) into l. */
static int lists_conv(PyObject *o, int ptrs, kvp_py_lists_t *l)
{
    if (o == NULL) {
        lists_release(l);
        return 1;
    }
    memset(l, 0, sizeof(*l));
    const char *what = ptrs ? "ptrs" : "sizes";
    PyObject *seq = as_tuple(o, what);
    if (seq == NULL)
        return 0;
    l->n = PyTuple_GET_SIZE(seq);
    if (ptrs)
        l->ptrs = alloc_n(l->n, sizeof(*l->ptrs));
    else
        l->sizes = alloc_n(l->n, sizeof(*l->sizes));
    l->counts = alloc_n(l->n, sizeof(*l->counts));
    if ((l->ptrs == NULL && l->sizes == NULL) || l->counts == NULL)
        goto err;
    for (Py_ssize_t i = 0; i < l->n; i++) {
        char name[48];
        snprintf(name, sizeof(name), "%s[%zd]", what, i);
        PyObject *inner = as_tuple(PyTuple_GET_ITEM(seq, i), name);
        if (inner == NULL)
            goto err;
        l->counts[i] = (size_t)PyTuple_GET_SIZE(inner);
        void *v = NULL;
        int ok = 0;
        if (l->counts[i] == 0)
            PyErr_Format(PyExc_ValueError, "%s is empty: each key needs a buffer", name);
        else if (ptrs)
            ok = int_list(inner, name, sizeof(void *), ptr_item, &v);
        else
            ok = int_list(inner, name, sizeof(size_t), size_item, &v);
        Py_DECREF(inner);
        if (!ok)
            goto err;
        if (ptrs)
            l->ptrs[i] = v;
        else
            l->sizes[i] = v;
    }
    Py_DECREF(seq);
    return Py_CLEANUP_SUPPORTED;
err:
    Py_DECREF(seq);
    lists_release(l);
    return 0;
}

int kvp_py_ptr_lists_conv(PyObject *o, void *lists_p)
{
    return lists_conv(o, 1, lists_p);
}

int kvp_py_size_lists_conv(PyObject *o, void *lists_p)
{
    return lists_conv(o, 0, lists_p);
}
