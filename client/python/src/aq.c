/*
 * aq.c - the Client's async queue (libkvpool's kvp_aq_*), for kvpool.aio.
 *
 * Design: a submission parses its arguments with the converters of the
 * synchronous call (args.c) into an op that owns them (the keys tuple,
 * exported buffer views, the result arrays) and a token (the asyncio future),
 * checks them as a synchronous batch is checked (batch.c), and hands the arrays to
 * kvp_aq_put/get/exist with the op as user_data; it returns at once. The
 * queue's eventfd is watched by the event loop (loop.add_reader); aq_reap()
 * takes the completions, turns each op's results into Python objects, frees
 * the op and returns (token, status, results) for the loop to complete the
 * futures. No thread per call: the batches run on the queue's fixed workers.
 *
 * Invariants: an op lives on self->ops (a list touched only with the GIL)
 * from just before its submission until it is reaped, or until the queue is
 * destroyed (close), which waits for every batch, so no op is freed while the
 * library may still use its arrays. The queue is used only under the client's
 * read lock and destroyed only after it was unhooked under the write lock.
 */
#include <string.h>

#include "kvpool_py.h"

typedef enum op_kind {
    OP_PUT,
    OP_GET,
    OP_GET_BYTES,
    OP_EXIST,
} op_kind_t;

typedef struct kvp_py_aq_op {
    struct kvp_py_aq_op *prev, *next; /* on the client's ops list */
    op_kind_t kind;
    kvp_aq_t *aq;     /* the queue it went to (set under the lock at submit) */
    PyObject *token;  /* owned; handed back with the completion */
    kvp_py_batch_t b; /* keys, buffers, sizes, int64 results: borrowed by the queue */
    kvp_status_t *st; /* put results */
    int *ex;          /* exist results */
    PyObject *bytes;  /* OP_GET_BYTES: the bytes object read into, owned */
} aq_op_t;

static aq_op_t *op_new(op_kind_t kind, PyObject *token)
{
    aq_op_t *op = PyMem_Calloc(1, sizeof(*op));
    if (op == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    op->kind = kind;
    op->token = Py_NewRef(token);
    return op;
}

static void op_free(aq_op_t *op)
{
    kvp_py_batch_release(&op->b);
    PyMem_Free(op->st);
    PyMem_Free(op->ex);
    Py_XDECREF(op->bytes);
    Py_XDECREF(op->token);
    PyMem_Free(op);
}

static void op_link(kvp_py_client_t *self, aq_op_t *op)
{
    op->prev = NULL;
    op->next = self->ops;
    if (self->ops != NULL)
        self->ops->prev = op;
    self->ops = op;
}

static void op_unlink(kvp_py_client_t *self, aq_op_t *op)
{
    if (op->prev != NULL)
        op->prev->next = op->next;
    else
        self->ops = op->next;
    if (op->next != NULL)
        op->next->prev = op->prev;
    op->prev = op->next = NULL;
}

void kvp_py_aq_free_ops(kvp_py_client_t *self, kvp_aq_t *aq, PyObject *tokens)
{
    aq_op_t *next;
    for (aq_op_t *op = self->ops; op != NULL; op = next) {
        next = op->next;
        if (aq == NULL || op->aq != aq)
            continue; /* not submitted yet, or to another queue */
        op_unlink(self, op);
        if (tokens != NULL && PyList_Append(tokens, op->token) != 0)
            PyErr_Clear(); /* no memory: the future is dropped, not leaked */
        op_free(op);
    }
}

PyObject *kvp_py_aq_open(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"workers", NULL};
    unsigned int workers = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|I:aq_open", kwlist, &workers))
        return NULL;
    kvp_status_t st = KVP_OK;
    int closed = 0;
    PyThreadState *ts = PyEval_SaveThread();
    pthread_rwlock_wrlock(&self->lock);
    if (self->c == NULL)
        closed = 1;
    else if (self->aq == NULL)
        st = kvp_aq_create(self->c, workers, &self->aq);
    pthread_rwlock_unlock(&self->lock);
    PyEval_RestoreThread(ts);
    if (closed)
        return kvp_py_raise_closed(self);
    if (st != KVP_OK)
        return kvp_py_raise(kvp_py_state_of(Py_TYPE(self)), st, NULL);
    Py_RETURN_NONE;
}

static PyObject *raise_not_open(kvp_py_client_t *self)
{
    return kvp_py_raise(kvp_py_state_of(Py_TYPE(self)), KVP_ERR_SHUTDOWN,
                        "the async queue is not open (or closed)");
}

PyObject *kvp_py_aq_fd(kvp_py_client_t *self, PyObject *unused)
{
    (void)unused;
    int fd = -1;
    PyThreadState *ts = PyEval_SaveThread();
    pthread_rwlock_rdlock(&self->lock);
    if (self->aq != NULL)
        fd = kvp_aq_fd(self->aq);
    pthread_rwlock_unlock(&self->lock);
    PyEval_RestoreThread(ts);
    if (fd < 0)
        return raise_not_open(self);
    return PyLong_FromLong(fd);
}

static int alloc_results(aq_op_t *op)
{
    size_t n = op->b.keys.n > 0 ? (size_t)op->b.keys.n : 1;
    if (op->kind == OP_PUT)
        op->st = PyMem_Calloc(n, sizeof(*op->st));
    if (op->kind == OP_EXIST)
        op->ex = PyMem_Calloc(n, sizeof(*op->ex));
    if ((op->kind == OP_PUT && op->st == NULL) || (op->kind == OP_EXIST && op->ex == NULL)) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/*
 * Check op's batch and hand it to the queue (`kind` picks the call). Returns
 * 0 (submitted: the op is the queue's until reaped, do not touch it), a
 * negative status (not submitted: op freed), or raises (bad batch or closed:
 * op freed).
 */
static PyObject *submit(kvp_py_client_t *self, aq_op_t *op, const kvp_put_config_t *cfgp)
{
    if (kvp_py_batch_check(&op->b) != 0 || alloc_results(op) != 0) {
        op_free(op);
        return NULL;
    }
    op_link(self, op);
    kvp_status_t st = KVP_OK;
    int open = 0;
    kvp_py_batch_t *b = &op->b;
    PyThreadState *ts = PyEval_SaveThread();
    pthread_rwlock_rdlock(&self->lock);
    if (self->c != NULL && self->aq != NULL) {
        open = 1;
        op->aq = self->aq;
        switch (op->kind) {
        case OP_PUT:
            st = kvp_aq_put(self->aq, b->keys.ptrs, (const void *const *)b->bufs.ptrs.v,
                            b->bufs.sizes.v, (size_t)b->keys.n, cfgp, op->st, op);
            break;
        case OP_GET:
        case OP_GET_BYTES:
            st = kvp_aq_get(self->aq, b->keys.ptrs, (void *const *)b->bufs.ptrs.v, b->bufs.sizes.v,
                            (size_t)b->keys.n, b->results, op);
            break;
        case OP_EXIST:
            st = kvp_aq_exist(self->aq, b->keys.ptrs, (size_t)b->keys.n, op->ex, op);
            break;
        }
    }
    pthread_rwlock_unlock(&self->lock);
    PyEval_RestoreThread(ts);
    if (open && st == KVP_OK)
        return PyLong_FromLong(0);
    op_unlink(self, op);
    op_free(op);
    if (!open)
        return raise_not_open(self);
    return PyLong_FromLong(st);
}

/* An op of `kind` owning the parsed batch *b (moved: *b is left empty) and token. */
static aq_op_t *op_take(op_kind_t kind, kvp_py_batch_t *b, PyObject *token)
{
    aq_op_t *op = op_new(kind, token);
    if (op == NULL) {
        kvp_py_batch_release(b);
        return NULL;
    }
    op->b = *b;
    memset(b, 0, sizeof(*b));
    return op;
}

/* aq_put(keys, buffers, config, token) -> 0 submitted, or a negative status */
PyObject *kvp_py_aq_put(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"keys", "buffers", "config", "token", NULL};
    kvp_py_batch_t b = {0};
    kvp_py_config_t cfg; /* the queue copies the config and its strings at submit */
    PyObject *token;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O&O&O:aq_put", kwlist, kvp_py_keys_conv, &b.keys,
                                     kvp_py_buffers_conv, &b.bufs, kvp_py_config_conv, &cfg,
                                     &token))
        return NULL;
    aq_op_t *op = op_take(OP_PUT, &b, token);
    PyObject *r = op != NULL ? submit(self, op, cfg.p) : NULL;
    kvp_py_config_release(&cfg);
    return r;
}

/* aq_get(keys, buffers, token) -> 0 submitted, or a negative status */
PyObject *kvp_py_aq_get(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"keys", "buffers", "token", NULL};
    kvp_py_batch_t b = {0};
    PyObject *token;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O&O:aq_get", kwlist, kvp_py_keys_conv, &b.keys,
                                     kvp_py_wbuffers_conv, &b.bufs, &token))
        return NULL;
    aq_op_t *op = op_take(OP_GET, &b, token);
    return op != NULL ? submit(self, op, NULL) : NULL;
}

/* O&: aq_get_bytes' capacity, a size >= 1 */
static int capacity_conv(PyObject *o, void *cap_p)
{
    size_t *cap = cap_p;
    if (kvp_py_size(o, cap, "capacity") != 0)
        return 0;
    if (*cap == 0 || *cap > PY_SSIZE_T_MAX) {
        PyErr_SetString(PyExc_ValueError, "capacity must be >= 1");
        return 0;
    }
    return 1;
}

/* aq_get_bytes(key, capacity, token) -> 0 submitted, or a negative status; reaped
 * as bytes (the object) or a negative status */
PyObject *kvp_py_aq_get_bytes(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"key", "capacity", "token", NULL};
    kvp_py_batch_t b = {0};
    size_t cap;
    PyObject *token;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O&O:aq_get_bytes", kwlist, kvp_py_one_key_conv,
                                     &b.keys, capacity_conv, &cap, &token))
        return NULL;
    aq_op_t *op = op_take(OP_GET_BYTES, &b, token);
    if (op == NULL)
        return NULL;
    kvp_py_bufs_t *f = &op->b.bufs;
    f->ptrs.n = f->sizes.n = 1;
    f->ptrs.v = PyMem_Calloc(1, sizeof(*f->ptrs.v));
    f->sizes.v = PyMem_Calloc(1, sizeof(*f->sizes.v));
    op->bytes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)cap);
    if (f->ptrs.v == NULL || f->sizes.v == NULL || op->bytes == NULL) {
        if (op->bytes != NULL)
            PyErr_NoMemory();
        op_free(op);
        return NULL;
    }
    f->ptrs.v[0] = PyBytes_AS_STRING(op->bytes);
    f->sizes.v[0] = cap;
    return submit(self, op, NULL);
}

/* aq_exist(keys, token) -> 0 submitted, or a negative status */
PyObject *kvp_py_aq_exist(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"keys", "token", NULL};
    kvp_py_batch_t b = {0};
    PyObject *token;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O:aq_exist", kwlist, kvp_py_keys_conv, &b.keys,
                                     &token))
        return NULL;
    aq_op_t *op = op_take(OP_EXIST, &b, token);
    return op != NULL ? submit(self, op, NULL) : NULL;
}

/* The Python results of a completed op: [int] per key, or bytes / int (get_bytes). */
static PyObject *op_results(aq_op_t *op)
{
    if (op->kind == OP_GET_BYTES) {
        int64_t r = op->b.results[0];
        if (r < 0)
            return PyLong_FromLongLong(r);
        PyObject *bytes = op->bytes;
        op->bytes = NULL;
        if (r < PyBytes_GET_SIZE(bytes) && _PyBytes_Resize(&bytes, (Py_ssize_t)r) != 0)
            return NULL;
        return bytes;
    }
    PyObject *list = PyList_New(op->b.keys.n);
    for (Py_ssize_t i = 0; list != NULL && i < op->b.keys.n; i++) {
        long long v = op->kind == OP_PUT     ? op->st[i]
                      : op->kind == OP_EXIST ? op->ex[i]
                                             : op->b.results[i];
        PyObject *o = PyLong_FromLongLong(v);
        if (o == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, i, o);
    }
    return list;
}

#define REAP_MAX 256

/* aq_reap(max=256) -> [(token, status, results)]: completions, oldest first */
PyObject *kvp_py_aq_reap(kvp_py_client_t *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"max", NULL};
    Py_ssize_t max = REAP_MAX;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|n:aq_reap", kwlist, &max))
        return NULL;
    if (max < 1 || max > REAP_MAX)
        max = REAP_MAX;
    kvp_aq_completion_t done[REAP_MAX];
    size_t got = 0;
    PyThreadState *ts = PyEval_SaveThread();
    pthread_rwlock_rdlock(&self->lock);
    if (self->aq != NULL)
        got = kvp_aq_reap(self->aq, done, (size_t)max);
    pthread_rwlock_unlock(&self->lock);
    PyEval_RestoreThread(ts);
    PyObject *list = PyList_New(0);
    /* every reaped op is freed here, even when building the list fails */
    for (size_t i = 0; i < got; i++) {
        aq_op_t *op = done[i].user_data;
        op_unlink(self, op);
        if (list != NULL) {
            PyObject *res = op_results(op);
            PyObject *item =
                res != NULL ? Py_BuildValue("(OiN)", op->token, (int)done[i].status, res) : NULL;
            if (item == NULL || PyList_Append(list, item) != 0)
                Py_CLEAR(list);
            Py_XDECREF(item);
        }
        op_free(op);
    }
    return list;
}

/* aq_close() -> [token]: destroy the queue (waits for its batches); the tokens
 * of the batches that were not reaped */
PyObject *kvp_py_aq_close(kvp_py_client_t *self, PyObject *unused)
{
    (void)unused;
    kvp_aq_t *aq;
    PyThreadState *ts = PyEval_SaveThread();
    pthread_rwlock_wrlock(&self->lock);
    aq = self->aq;
    self->aq = NULL;
    pthread_rwlock_unlock(&self->lock);
    kvp_aq_destroy(aq);
    PyEval_RestoreThread(ts);
    PyObject *tokens = PyList_New(0);
    /* the ops' memory is freed even when the list cannot be made */
    if (tokens == NULL) {
        PyObject *t, *v, *tb;
        PyErr_Fetch(&t, &v, &tb);
        kvp_py_aq_free_ops(self, aq, NULL);
        PyErr_Restore(t, v, tb);
    }
    if (tokens != NULL)
        kvp_py_aq_free_ops(self, aq, tokens);
    return tokens;
}
