/*
 * batch.c - the one path of the Client's synchronous batch calls.
 *
 * Design: a method parses its arguments with the converters of args.c into a
 * kvp_py_batch_t (keys, and buffers or lists of buffers) and hands it here:
 * kvp_py_batch_check sees that every part has one entry per key and that the
 * multi-buffer lists pair up, kvp_py_batch_run calls the library once with
 * the GIL released under the client's read lock, and widens the per-key
 * answers (statuses, sizes, 1/0) into b->results, which kvp_py_batch_call
 * returns as a list. A batch of no keys calls nothing and answers [].
 *
 * Thread: the calling Python thread; the GIL is released only around the
 * library call.
 */
#include <stdint.h>
#include <string.h>

_Static_assert(sizeof(size_t) == sizeof(uint64_t), "offsets and sizes are passed as uint64_t");

#include "kvpool_py.h"

static int check_n(Py_ssize_t m, Py_ssize_t n, const char *what)
{
    if (m != n) {
        PyErr_Format(PyExc_ValueError, "%s has %zd entries but there are %zd keys", what, m, n);
        return -1;
    }
    return 0;
}

int kvp_py_batch_check(kvp_py_batch_t *b)
{
    Py_ssize_t n = b->keys.n;
    const kvp_py_bufs_t *f = &b->bufs;
    if ((f->views != NULL && check_n(f->ptrs.n, n, "buffers") != 0) ||
        (f->views == NULL && f->ptrs.v != NULL && check_n(f->ptrs.n, n, "ptrs") != 0) ||
        (f->views == NULL && f->sizes.v != NULL && check_n(f->sizes.n, n, "sizes") != 0) ||
        (b->part_ptrs.ptrs != NULL && check_n(b->part_ptrs.n, n, "ptrs") != 0) ||
        (b->part_sizes.sizes != NULL && check_n(b->part_sizes.n, n, "sizes") != 0) ||
        (b->part_offsets.sizes != NULL && check_n(b->part_offsets.n, n, "offsets") != 0))
        return -1;
    for (Py_ssize_t i = 0; b->part_offsets.sizes != NULL && b->part_sizes.sizes != NULL && i < n;
         i++) {
        if (b->part_offsets.counts[i] != b->part_sizes.counts[i]) {
            PyErr_Format(PyExc_ValueError,
                         "offsets[%zd] has %zu offsets but sizes[%zd] has %zu sizes", i,
                         b->part_offsets.counts[i], i, b->part_sizes.counts[i]);
            return -1;
        }
    }
    if (b->part_ptrs.ptrs != NULL && b->part_sizes.sizes != NULL) {
        for (Py_ssize_t i = 0; i < n; i++) {
            size_t m = b->part_ptrs.counts[i], ms = b->part_sizes.counts[i];
            if (m != ms) {
                PyErr_Format(PyExc_ValueError,
                             "ptrs[%zd] has %zu buffers but sizes[%zd] has %zu sizes", i, m, i, ms);
                return -1;
            }
        }
    }
    b->results = PyMem_Calloc(n > 0 ? (size_t)n : 1, sizeof(*b->results));
    if (b->results == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* The library call of `op` over b's n keys; st (put, remove) or ex (exist) receive
 * the per-key answers that are not b->results. GIL released, read lock held. */
static void batch_call_locked(kvp_client_t *c, kvp_py_batch_op_t op, kvp_py_batch_t *b,
                              const kvp_put_config_t *cfg, kvp_status_t *st, int *ex,
                              size_t *prefix)
{
    const char *const *keys = b->keys.ptrs;
    size_t n = (size_t)b->keys.n;
    switch (op) {
    case KVP_PY_BATCH_PUT:
        kvp_batch_put_from(c, keys, (const void *const *)b->bufs.ptrs.v, b->bufs.sizes.v, n, cfg,
                           st);
        break;
    case KVP_PY_BATCH_GET:
        kvp_batch_get_into(c, keys, (void *const *)b->bufs.ptrs.v, b->bufs.sizes.v, n, b->results);
        break;
    case KVP_PY_BATCH_PUT_MULTI:
        kvp_batch_put_from_multi(c, keys, (const void *const *const *)b->part_ptrs.ptrs,
                                 (const size_t *const *)b->part_sizes.sizes, b->part_ptrs.counts, n,
                                 cfg, st);
        break;
    case KVP_PY_BATCH_GET_MULTI:
        kvp_batch_get_into_multi(c, keys, (void *const *const *)b->part_ptrs.ptrs,
                                 (const size_t *const *)b->part_sizes.sizes, b->part_ptrs.counts, n,
                                 b->results);
        break;
    case KVP_PY_BATCH_EXIST:
        kvp_batch_is_exist(c, keys, n, ex, prefix);
        break;
    case KVP_PY_BATCH_REMOVE:
        kvp_batch_remove(c, keys, n, st);
        break;
    case KVP_PY_BATCH_REMOVE_FORCE:
        kvp_batch_remove_force(c, keys, n, st);
        break;
    case KVP_PY_BATCH_GET_RANGES:
        kvp_get_into_ranges(c, b->ranges, n, b->results);
        break;
    case KVP_PY_BATCH_REPLICA_CLEAR:
        kvp_batch_replica_clear(c, keys, n, b->segment, st);
        break;
    case KVP_PY_BATCH_GET_SESSION_START:
        kvp_batch_get_session_start(c, keys, n, st);
        break;
    case KVP_PY_BATCH_GET_SESSION_RANGES:
        kvp_batch_get_into_multi_ranges(c, keys, (void *const *const *)b->part_ptrs.ptrs,
                                        (const size_t *const *)b->part_sizes.sizes,
                                        (const uint64_t *const *)b->part_offsets.sizes,
                                        b->part_ptrs.counts, n, b->results);
        break;
    case KVP_PY_BATCH_GET_SESSION_END: {
        kvp_status_t rc = kvp_batch_get_session_end(c, keys, n);
        for (size_t i = 0; i < n; i++)
            st[i] = rc;
        break;
    }
    case KVP_PY_BATCH_PUT_SESSION_START:
        kvp_batch_put_session_start(c, keys, (const uint64_t *)b->bufs.sizes.v, n, cfg, st);
        break;
    case KVP_PY_BATCH_PUT_SESSION_RANGES:
        kvp_batch_put_from_multi_ranges(c, keys, (const void *const *const *)b->part_ptrs.ptrs,
                                        (const size_t *const *)b->part_sizes.sizes,
                                        (const uint64_t *const *)b->part_offsets.sizes,
                                        b->part_ptrs.counts, n, b->results);
        break;
    case KVP_PY_BATCH_PUT_SESSION_END:
        kvp_batch_put_session_end(c, keys, n, st);
        break;
    case KVP_PY_BATCH_PUT_SESSION_REVOKE:
        kvp_batch_put_session_revoke(c, keys, n, st);
        break;
    }
}

int kvp_py_batch_run(kvp_py_client_t *self, kvp_py_batch_op_t op, kvp_py_batch_t *b,
                     const kvp_py_config_t *config, size_t *prefix_p)
{
    size_t prefix = 0;
    if (prefix_p != NULL)
        *prefix_p = 0;
    if (kvp_py_batch_check(b) != 0)
        return -1;
    Py_ssize_t n = b->keys.n;
    if (n == 0)
        return 0;
    /* the statuses (put, remove) and exist answers are int-sized: widened after the call */
    int wide = op == KVP_PY_BATCH_GET || op == KVP_PY_BATCH_GET_MULTI ||
               op == KVP_PY_BATCH_GET_RANGES || op == KVP_PY_BATCH_GET_SESSION_RANGES ||
               op == KVP_PY_BATCH_PUT_SESSION_RANGES;
    kvp_status_t *st = NULL;
    int *ex = NULL;
    if (op == KVP_PY_BATCH_EXIST)
        ex = PyMem_Calloc((size_t)n, sizeof(*ex));
    else if (!wide)
        st = PyMem_Calloc((size_t)n, sizeof(*st));
    if (!wide && st == NULL && ex == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    kvp_client_t *c;
    KVP_PY_WITH_CLIENT(
        self, c, batch_call_locked(c, op, b, config != NULL ? config->p : NULL, st, ex, &prefix));
    for (Py_ssize_t i = 0; c != NULL && !wide && i < n; i++)
        b->results[i] = st != NULL ? (int64_t)st[i] : (int64_t)ex[i];
    PyMem_Free(st);
    PyMem_Free(ex);
    if (c == NULL) {
        kvp_py_raise_closed(self);
        return -1;
    }
    if (prefix_p != NULL)
        *prefix_p = prefix;
    return 0;
}

PyObject *kvp_py_results_list(const int64_t *results, Py_ssize_t n)
{
    PyObject *list = PyList_New(n);
    if (list == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyLong_FromLongLong(results[i]);
        if (v == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, v);
    }
    return list;
}

PyObject *kvp_py_batch_call(kvp_py_client_t *self, kvp_py_batch_op_t op, kvp_py_batch_t *b,
                            const kvp_py_config_t *config)
{
    PyObject *ret = NULL;
    if (kvp_py_batch_run(self, op, b, config, NULL) == 0)
        ret = kvp_py_results_list(b->results, b->keys.n);
    kvp_py_batch_release(b);
    return ret;
}

void kvp_py_batch_release(kvp_py_batch_t *b)
{
    kvp_py_keys_conv(NULL, &b->keys);
    kvp_py_buffers_conv(NULL, &b->bufs);
    kvp_py_ptr_lists_conv(NULL, &b->part_ptrs);
    kvp_py_size_lists_conv(NULL, &b->part_sizes);
    kvp_py_size_lists_conv(NULL, &b->part_offsets);
    PyMem_Free(b->ranges);
    PyMem_Free(b->results);
    b->ranges = NULL;
    b->results = NULL;
}
