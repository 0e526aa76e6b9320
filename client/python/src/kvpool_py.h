/*
 * kvpool_py.h - shared declarations of the kvpool._kvpool extension module.
 *
 * The extension is the thin, fast layer: it turns Python arguments into the C
 * arrays libkvpool takes, calls the library with the GIL released, and hands
 * back raw results (object sizes, kvp_status_t codes). Raising kvpool.Error
 * (the native API) or returning Mooncake's integer codes (mooncake.store) is
 * the job of the pure-Python packages on top of it.
 *
 * Layout: module.c (multi-phase init, the module state, kvpool.Error and the
 * status table), client_type.c (Client), client_admin.c and aq.c (Client's
 * admin and async-queue methods), buffer_handle.c (BufferHandle), args.c (the
 * O& argument converters), batch.c (the batch calls' plumbing: one place that
 * checks, runs and reports a batch). Only libkvpool's installed headers are
 * included.
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

/* ---------------- module (module.c) ---------------- */

/* Per-module state: the heap types and the exception, no globals. */
typedef struct kvp_py_state {
    PyTypeObject *client_type;
    PyTypeObject *buffer_handle_type;
    PyObject *error; /* kvpool.Error */
} kvp_py_state_t;

extern struct PyModuleDef kvp_py_module_def;

/* The state of the module that defined `type` or one of its bases. */
kvp_py_state_t *kvp_py_state_of(PyTypeObject *type);

/* Raise kvpool.Error(status, message); message NULL: kvp_client_last_error(). */
PyObject *kvp_py_raise(kvp_py_state_t *state, int status, const char *message);
/* The status's name ("KVP_ERR_NOT_FOUND"), or NULL for a number not in the list. */
const char *kvp_py_status_name(int status);

/* The types, created by the module's exec slot; NULL with an exception set on failure. */
PyTypeObject *kvp_py_client_type_new(PyObject *module);
PyTypeObject *kvp_py_buffer_handle_type_new(PyObject *module);

/* ---------------- Client (client_type.c) ---------------- */

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

/*
 * Take the client for a call: the kvp_client_t with the read lock held, or NULL
 * (lock not held) when the client is closed. Call with the GIL released, since
 * close() holds the write lock while it destroys the client; pair a non-NULL
 * return with kvp_py_client_unlock. Raise the closed error with
 * kvp_py_raise_closed() once the GIL is back.
 */
kvp_client_t *kvp_py_client_lock(kvp_py_client_t *self);
void kvp_py_client_unlock(kvp_py_client_t *self);
PyObject *kvp_py_raise_closed(kvp_py_client_t *self);
/*
 * Whether a call made through KVP_PY_WITH_CLIENT failed: 0 when it ran (c not
 * NULL) and returned KVP_OK; else 1 with *ret_p the method's result: the
 * status as an int, or NULL with the closed error raised.
 */
int kvp_py_call_failed(kvp_py_client_t *self, const kvp_client_t *c, kvp_status_t st,
                       PyObject **ret_p);

/* Run `stmt` with `c` set to the client, the GIL released; `c` is NULL when closed. */
#define KVP_PY_WITH_CLIENT(self, c, stmt)                                                          \
    do {                                                                                           \
        PyThreadState *ts_ = PyEval_SaveThread();                                                  \
        c = kvp_py_client_lock(self);                                                              \
        if (c != NULL) {                                                                           \
            stmt;                                                                                  \
            kvp_py_client_unlock(self);                                                            \
        }                                                                                          \
        PyEval_RestoreThread(ts_);                                                                 \
    } while (0)

/*
 * aq.c: the Client's async queue methods (aq_open, aq_fd, aq_put, aq_get,
 * aq_get_bytes, aq_exist, aq_reap, aq_close), and kvp_py_aq_free_ops, which
 * frees the batches queue `aq` left unreaped once it is destroyed, appending
 * their tokens to `tokens` (a list, or NULL to drop them). GIL held.
 */
PyObject *kvp_py_aq_open(kvp_py_client_t *self, PyObject *args, PyObject *kw);
PyObject *kvp_py_aq_fd(kvp_py_client_t *self, PyObject *unused);
PyObject *kvp_py_aq_put(kvp_py_client_t *self, PyObject *args, PyObject *kw);
PyObject *kvp_py_aq_get(kvp_py_client_t *self, PyObject *args, PyObject *kw);
PyObject *kvp_py_aq_get_bytes(kvp_py_client_t *self, PyObject *args, PyObject *kw);
PyObject *kvp_py_aq_exist(kvp_py_client_t *self, PyObject *args, PyObject *kw);
PyObject *kvp_py_aq_reap(kvp_py_client_t *self, PyObject *args, PyObject *kw);
PyObject *kvp_py_aq_close(kvp_py_client_t *self, PyObject *unused);
void kvp_py_aq_free_ops(kvp_py_client_t *self, kvp_aq_t *aq, PyObject *tokens);

/* client_admin.c: stat(), metrics(), metrics_text(), list_keys(pattern=None, max=1000). */
PyObject *kvp_py_client_stat(kvp_py_client_t *self, PyObject *unused);
PyObject *kvp_py_client_metrics(kvp_py_client_t *self, PyObject *unused);
PyObject *kvp_py_client_metrics_text(kvp_py_client_t *self, PyObject *unused);
PyObject *kvp_py_client_list_keys(kvp_py_client_t *self, PyObject *args, PyObject *kw);
PyObject *kvp_py_client_create_copy_task(kvp_py_client_t *self, PyObject *args, PyObject *kw);
PyObject *kvp_py_client_create_move_task(kvp_py_client_t *self, PyObject *args, PyObject *kw);
PyObject *kvp_py_client_query_task(kvp_py_client_t *self, PyObject *args, PyObject *kw);

/* ---------------- argument converters (args.c) ---------------- */

/*
 * O& converters: each takes one argument and returns 1 (Py_CLEANUP_SUPPORTED
 * where it allocated: PyArg_Parse* then releases it when a later argument
 * fails), or 0 with a TypeError or ValueError naming the argument (and the
 * index, in a list) set. After a successful parse the caller releases what
 * they hold (kvp_py_batch_release). Everything the C call reads is owned by
 * the parsed value or by the call's arguments: keys are copied into a tuple
 * (a list the caller mutates meanwhile cannot free a key under the released
 * GIL), lists into tuples, and buffer objects stay exported until release.
 */

/* The UTF-8 keys of a list of str. */
typedef struct kvp_py_keys {
    Py_ssize_t n;
    PyObject *tuple;   /* the keys, owned */
    const char **ptrs; /* n keys, borrowed from `tuple` */
} kvp_py_keys_t;

/* Pointers or sizes, one per key. */
typedef struct kvp_py_ptrs {
    Py_ssize_t n;
    void **v; /* NULL: not given */
} kvp_py_ptrs_t;

typedef struct kvp_py_sizes {
    Py_ssize_t n;
    size_t *v; /* NULL: not given */
} kvp_py_sizes_t;

/* One buffer per key: from `buffers` (views exported) or from ptrs and sizes. */
typedef struct kvp_py_bufs {
    kvp_py_ptrs_t ptrs;
    kvp_py_sizes_t sizes; /* sizes (put) or capacities (get) */
    Py_buffer *views;     /* n views when buffer objects were given, else NULL */
} kvp_py_bufs_t;

/* Several buffers per key (the multi-buffer calls): a list of pointers or
 * of sizes per key, `ptrs` or `sizes` set (the other NULL). */
typedef struct kvp_py_lists {
    Py_ssize_t n;
    void ***ptrs;   /* ptrs[i]: counts[i] pointers */
    size_t **sizes; /* sizes[i]: counts[i] sizes */
    size_t *counts;
} kvp_py_lists_t;

/* A put config: `p` is NULL for None (the library's defaults), else &cfg. */
typedef struct kvp_py_config {
    kvp_put_config_t cfg;
    const kvp_put_config_t *p;
    const char *preferred[8]; /* cfg.preferred_segments (borrowed from the tuple's str) */
    const char **groups;      /* cfg.group_ids (PyMem; the str borrowed): kvp_py_config_release */
} kvp_py_config_t;

/* Free what kvp_py_config_conv allocated (the group ids' array). */
void kvp_py_config_release(kvp_py_config_t *config);

/* str without NUL -> const char * (borrowed from the argument) */
int kvp_py_key_conv(PyObject *o, void *key_p);
/* int (or __index__), not 0, not negative -> void * ("ptr") */
int kvp_py_ptr_conv(PyObject *o, void *ptr_p);
/* int >= 0 -> size_t ("size") */
int kvp_py_size_conv(PyObject *o, void *size_p);
/* None or (replica_num, preferred_segment|None, pin, soft_pin_ttl_s, mode,
 * medium|None[, preferred_segments|None[, group_ids|None]]) -> kvp_py_config_t; the
 * strings are borrowed from the tuple */
int kvp_py_config_conv(PyObject *o, void *config_p);
/* list of str -> kvp_py_keys_t (at most KVP_MAX_BATCH) */
int kvp_py_keys_conv(PyObject *o, void *keys_p);
/* list of buffer objects or (ptr, size) pairs -> kvp_py_bufs_t: readable, or
 * writable (for gets) */
int kvp_py_buffers_conv(PyObject *o, void *bufs_p);
int kvp_py_wbuffers_conv(PyObject *o, void *bufs_p);
/* put_parts' parts: at least one C-contiguous buffer object -> kvp_py_bufs_t */
int kvp_py_parts_conv(PyObject *o, void *bufs_p);
/* a single key -> kvp_py_keys_t of one (for calls that outlive their arguments) */
int kvp_py_one_key_conv(PyObject *o, void *keys_p);
/* list of ints -> kvp_py_ptrs_t ("ptrs") / kvp_py_sizes_t ("sizes") */
int kvp_py_ptrs_conv(PyObject *o, void *ptrs_p);
int kvp_py_sizes_conv(PyObject *o, void *sizes_p);
/* list of non-empty lists of ints -> kvp_py_lists_t: pointers ("ptrs") / sizes ("sizes") */
int kvp_py_ptr_lists_conv(PyObject *o, void *lists_p);
int kvp_py_size_lists_conv(PyObject *o, void *lists_p);

/* get_ranges' [(key, offset, buffer or (ptr, length))] -> kvp_py_batch_t (keys, bufs,
 * ranges) */
int kvp_py_ranges_conv(PyObject *o, void *batch_p);

/* Checks of a value a converter does not see alone (GIL held; 0, or -1 raised). */
int kvp_py_size(PyObject *o, size_t *s, const char *what);
int kvp_py_u32(PyObject *o, uint32_t *v, const char *what);

/* ---------------- batches (batch.c) ---------------- */

/*
 * One batch call: the converters fill the parts its arguments give (keys
 * always), kvp_py_batch_run checks they agree with the keys and runs it.
 * Zero-initialise, and release with kvp_py_batch_release on every path.
 */
typedef struct kvp_py_batch {
    kvp_py_keys_t keys;
    kvp_py_bufs_t bufs;       /* single-buffer calls */
    kvp_py_lists_t part_ptrs; /* multi-buffer calls */
    kvp_py_lists_t part_sizes;
    kvp_py_lists_t part_offsets; /* the session range calls: an object offset per buffer */
    kvp_range_t *ranges;         /* get_ranges */
    int64_t *results;            /* keys.n results, allocated by kvp_py_batch_check */
    const char *segment;         /* replica_clear: the segment's name (borrowed) */
} kvp_py_batch_t;

typedef enum kvp_py_batch_op {
    KVP_PY_BATCH_PUT,                /* kvp_batch_put_from over bufs */
    KVP_PY_BATCH_GET,                /* kvp_batch_get_into over bufs */
    KVP_PY_BATCH_PUT_MULTI,          /* kvp_batch_put_from_multi over parts */
    KVP_PY_BATCH_GET_MULTI,          /* kvp_batch_get_into_multi over parts */
    KVP_PY_BATCH_EXIST,              /* kvp_batch_is_exist */
    KVP_PY_BATCH_REMOVE,             /* kvp_batch_remove */
    KVP_PY_BATCH_REMOVE_FORCE,       /* kvp_batch_remove_force */
    KVP_PY_BATCH_GET_RANGES,         /* kvp_get_into_ranges over ranges */
    KVP_PY_BATCH_GET_SESSION_START,  /* kvp_batch_get_session_start */
    KVP_PY_BATCH_GET_SESSION_RANGES, /* kvp_batch_get_into_multi_ranges over parts */
    KVP_PY_BATCH_GET_SESSION_END,    /* kvp_batch_get_session_end (its status per key) */
    KVP_PY_BATCH_PUT_SESSION_START,  /* kvp_batch_put_session_start, sizes in bufs.sizes */
    KVP_PY_BATCH_PUT_SESSION_RANGES, /* kvp_batch_put_from_multi_ranges over parts */
    KVP_PY_BATCH_PUT_SESSION_END,    /* kvp_batch_put_session_end */
    KVP_PY_BATCH_PUT_SESSION_REVOKE, /* kvp_batch_put_session_revoke */
    KVP_PY_BATCH_REPLICA_CLEAR,      /* kvp_batch_replica_clear with segment */
} kvp_py_batch_op_t;

/* The parts b holds have one entry per key, the parts lists pair up; results
 * allocated. 0, or -1 with a ValueError (or MemoryError) set. */
int kvp_py_batch_check(kvp_py_batch_t *b);
/*
 * Check b and run `op` over it with the GIL released (no call for 0 keys): the
 * per-key results (sizes, statuses, 1/0) in b->results; *prefix_p (may be
 * NULL) the cached prefix of an exist. 0, or -1 with an exception set.
 */
int kvp_py_batch_run(kvp_py_client_t *self, kvp_py_batch_op_t op, kvp_py_batch_t *b,
                     const kvp_py_config_t *config, size_t *prefix_p);
/* kvp_py_batch_run, then b->results as a list of ints; releases b. */
PyObject *kvp_py_batch_call(kvp_py_client_t *self, kvp_py_batch_op_t op, kvp_py_batch_t *b,
                            const kvp_py_config_t *config);
/* The first n results as a list of ints. */
PyObject *kvp_py_results_list(const int64_t *results, Py_ssize_t n);
void kvp_py_batch_release(kvp_py_batch_t *b);

/* ---------------- BufferHandle (buffer_handle.c) ---------------- */

/* A BufferHandle owning `cap` bytes of page-aligned memory; `size` of them valid. */
PyObject *kvp_py_buffer_handle_new(kvp_py_state_t *state, size_t cap);
void *kvp_py_buffer_handle_ptr(PyObject *h);
void kvp_py_buffer_handle_set_size(PyObject *h, size_t size);

/* The transfer engine's module functions (te.c): te_create, te_transfer, ... */
extern PyMethodDef kvp_py_te_methods[];

#endif
