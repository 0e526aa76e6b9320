/*
 * kvpool_py.h - shared declarations of the kvpool._kvpool extension module.
 *
 * The extension is the thin, fast layer: it turns Python arguments into the C
 * arrays libkvpool takes, calls the library with the GIL released, and hands
 * back raw results (object sizes, kvp_status_t codes). Raising kvpool.Error
 * (the native API) or returning Mooncake's integer codes (mooncake.store) is
 * the job of the pure-Python packages on top of it.
 *
 * Threads: every function here runs on a Python thread holding the GIL,
 * except where a comment says the GIL is released.
 */
#ifndef KVPOOL_PY_H
#define KVPOOL_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdint.h>

#include "kvpool.h"

struct kvp_py_aq_op;

/*
 * A Client: the kvp_client_t plus a lock that lets close() wait for calls in
 * flight, and its async queue once an asyncio call opened it.
 */
typedef struct kvp_py_client {
    PyObject_HEAD kvp_client_t *c; /* NULL once closed */
    kvp_aq_t *aq;                  /* NULL until aq_open, and once closed */
    pthread_rwlock_t lock;         /* read: a call in flight; write: close (c and aq) */
    struct kvp_py_aq_op *ops;      /* batches submitted to aq and not reaped (GIL) */
    PyObject *weaklist;
} kvp_py_client_t;

extern PyTypeObject kvp_py_client_type;

extern PyTypeObject kvp_py_buffer_handle_type;
extern PyObject *kvp_py_error; /* kvpool.Error */

/*
 * Take the client for a call: the kvp_client_t with the read lock held, or NULL
 * (lock not held) when the client is closed. Call with the GIL released, since
 * close() holds the write lock while it destroys the client; pair a non-NULL
 * return with kvp_py_client_unlock. Raise the closed error with
 * kvp_py_raise_closed() once the GIL is back.
 */
kvp_client_t *kvp_py_client_lock(kvp_py_client_t *self);
void kvp_py_client_unlock(kvp_py_client_t *self);
PyObject *kvp_py_raise_closed(void);

/*
 * aq.c: the Client's async queue methods (aq_open, aq_fd, aq_put, aq_get,
 * aq_get_bytes, aq_exist, aq_reap, aq_close), and kvp_py_aq_free_ops, which
 * frees the batches queue `aq` left unreaped once it is destroyed, appending
 * their tokens to `tokens` (a list, or NULL to drop them). GIL held.
 */
PyObject *kvp_py_aq_open(kvp_py_client_t *self, PyObject *args);
PyObject *kvp_py_aq_fd(kvp_py_client_t *self, PyObject *unused);
PyObject *kvp_py_aq_put(kvp_py_client_t *self, PyObject *args);
PyObject *kvp_py_aq_get(kvp_py_client_t *self, PyObject *args);
PyObject *kvp_py_aq_get_bytes(kvp_py_client_t *self, PyObject *args);
PyObject *kvp_py_aq_exist(kvp_py_client_t *self, PyObject *args);
PyObject *kvp_py_aq_reap(kvp_py_client_t *self, PyObject *args);
PyObject *kvp_py_aq_close(kvp_py_client_t *self, PyObject *unused);
void kvp_py_aq_free_ops(kvp_py_client_t *self, kvp_aq_t *aq, PyObject *tokens);

/* Raise kvpool.Error(status, message); message NULL: kvp_client_last_error(). */
PyObject *kvp_py_raise(int status, const char *message);
/* The status's name ("KVP_ERR_NOT_FOUND"), or NULL for a number not in the list. */
const char *kvp_py_status_name(int status);

/*
 * The arrays of one batch call. Filled by the kvp_py_batch_* parsers below
 * (each returns 0, or -1 with a Python exception set), freed by
 * kvp_py_batch_cleanup on every path. Everything the C call reads is owned
 * here: the keys are a tuple (a list the caller mutates meanwhile cannot free
 * a key under the released GIL) and buffer objects stay exported until cleanup.
 */
typedef struct kvp_py_batch {
    Py_ssize_t n;
    PyObject *keys;        /* tuple of str, owned */
    const char **key_ptrs; /* n UTF-8 keys, borrowed from `keys` */
    void **bufs;           /* n buffers */
    size_t *sizes;         /* n sizes (put) or capacities (get) */
    Py_buffer *views;      /* n views when buffer objects were given, else NULL */
    int64_t *results;      /* n results */
    /* multi-buffer calls: n lists of parts */
    void ***part_bufs;
    size_t **part_sizes;
    size_t *n_parts;
} kvp_py_batch_t;

int kvp_py_batch_keys(PyObject *keys, kvp_py_batch_t *b);
/* items: buffer-protocol objects or (ptr, size) pairs; writable: for gets */
int kvp_py_batch_buffers(PyObject *items, int writable, kvp_py_batch_t *b);
/* two parallel sequences of ints */
int kvp_py_batch_ptrs(PyObject *ptrs, PyObject *sizes, kvp_py_batch_t *b);
/* two parallel sequences of sequences of ints (one list of parts per key) */
int kvp_py_batch_multi(PyObject *ptrs, PyObject *sizes, kvp_py_batch_t *b);
void kvp_py_batch_cleanup(kvp_py_batch_t *b);

/* A pointer from a Python int (or __index__): not 0, not negative. */
int kvp_py_ptr(PyObject *o, void **p, const char *what);
/* A size from a Python int: not negative. */
int kvp_py_size(PyObject *o, size_t *s, const char *what);
/* A key: a str without NUL; *key points into `o` (borrowed). */
int kvp_py_key(PyObject *o, const char **key);
/*
 * The put config from None or the tuple (replica_num, preferred_segment|None,
 * pin, soft_pin_ttl_s, mode, medium|None); *cfg_p is NULL for None. The strings
 * are borrowed from the tuple, which the caller keeps alive for the call.
 */
int kvp_py_put_config(PyObject *o, kvp_put_config_t *cfg, const kvp_put_config_t **cfg_p);

/* A BufferHandle owning `cap` bytes of page-aligned memory; `size` of them valid. */
PyObject *kvp_py_buffer_handle_new(size_t cap);
void *kvp_py_buffer_handle_ptr(PyObject *h);
void kvp_py_buffer_handle_set_size(PyObject *h, size_t size);

#endif
