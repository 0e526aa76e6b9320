/*
 * te.c - the transfer engine's raw calls (kvpool_te.h) in kvpool._kvpool, under
 * mooncake.engine.TransferEngine (client/python/mooncake/engine.py): an engine
 * is a capsule; calls return the kvp_status_t (0 or negative) and release the
 * GIL while bytes move.
 *
 * Thread: any Python thread, GIL held (released inside transfers).
 */
#include <stdbool.h>
#include <stdlib.h>

#include "kvpool_py.h"
#include "kvpool_te.h"

#define TE_CAPSULE "kvpool.te"

typedef struct te_box {
    kvp_te_t *te;
} te_box_t;

static void te_capsule_free(PyObject *cap)
{
    te_box_t *box = PyCapsule_GetPointer(cap, TE_CAPSULE);
    if (box == NULL)
        return;
    if (box->te != NULL) {
        kvp_te_t *te = box->te;
        box->te = NULL;
        PyThreadState *ts = PyEval_SaveThread();
        kvp_te_destroy(te);
        PyEval_RestoreThread(ts);
    }
    free(box);
}

static kvp_te_t *te_of(PyObject *cap)
{
    te_box_t *box = PyCapsule_GetPointer(cap, TE_CAPSULE);
    if (box == NULL)
        return NULL;
    if (box->te == NULL)
        PyErr_SetString(PyExc_ValueError, "the transfer engine was destroyed");
    return box->te;
}

/* A sequence of n ints into a new array (uint64 each); -1 with an exception. */
static int u64_list(PyObject *seq, uint64_t **out, Py_ssize_t *n_p)
{
    PyObject *fast = PySequence_Fast(seq, "expected a list of ints");
    if (fast == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    uint64_t *a = malloc(sizeof(uint64_t) * (size_t)(n > 0 ? n : 1));
    if (a == NULL) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        a[i] = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(fast, i));
        if (PyErr_Occurred()) {
            free(a);
            Py_DECREF(fast);
            return -1;
        }
    }
    Py_DECREF(fast);
    *out = a;
    *n_p = n;
    return 0;
}

static PyObject *py_te_create(PyObject *mod, PyObject *args)
{
    (void)mod;
    const char *host, *metadata, *protocol;
    if (!PyArg_ParseTuple(args, "sss", &host, &metadata, &protocol))
        return NULL;
    kvp_te_t *te = NULL;
    kvp_status_t st;
    PyThreadState *ts = PyEval_SaveThread();
    st = kvp_te_create(host, metadata, protocol, &te);
    PyEval_RestoreThread(ts);
    if (st != KVP_OK)
        return Py_BuildValue("(iO)", (int)st, Py_None);
    te_box_t *box = malloc(sizeof(*box));
    if (box == NULL) {
        kvp_te_destroy(te);
        return PyErr_NoMemory();
    }
    box->te = te;
    PyObject *cap = PyCapsule_New(box, TE_CAPSULE, te_capsule_free);
    if (cap == NULL) {
        kvp_te_destroy(te);
        free(box);
        return NULL;
    }
    PyObject *r = Py_BuildValue("(iO)", 0, cap);
    Py_DECREF(cap);
    return r;
}

static PyObject *py_te_destroy(PyObject *mod, PyObject *cap)
{
    (void)mod;
    te_box_t *box = PyCapsule_GetPointer(cap, TE_CAPSULE);
    if (box == NULL)
        return NULL;
    kvp_te_t *te = box->te;
    box->te = NULL;
    PyThreadState *ts = PyEval_SaveThread();
    kvp_te_destroy(te);
    PyEval_RestoreThread(ts);
    Py_RETURN_NONE;
}

static PyObject *py_te_rpc_port(PyObject *mod, PyObject *cap)
{
    (void)mod;
    kvp_te_t *te = te_of(cap);
    return te == NULL ? NULL : PyLong_FromLong(kvp_te_rpc_port(te));
}

static PyObject *py_te_first_buffer(PyObject *mod, PyObject *cap)
{
    (void)mod;
    kvp_te_t *te = te_of(cap);
    return te == NULL ? NULL : PyLong_FromUnsignedLongLong(kvp_te_first_buffer(te));
}

static PyObject *py_te_register(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *cap;
    unsigned long long addr, len;
    if (!PyArg_ParseTuple(args, "OKK", &cap, &addr, &len))
        return NULL;
    kvp_te_t *te = te_of(cap);
    if (te == NULL)
        return NULL;
    return PyLong_FromLong(kvp_te_register(te, (void *)(uintptr_t)addr, (size_t)len));
}

static PyObject *py_te_unregister(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *cap;
    unsigned long long addr;
    if (!PyArg_ParseTuple(args, "OK", &cap, &addr))
        return NULL;
    kvp_te_t *te = te_of(cap);
    if (te == NULL)
        return NULL;
    kvp_status_t st;
    PyThreadState *ts = PyEval_SaveThread();
    st = kvp_te_unregister(te, (void *)(uintptr_t)addr);
    PyEval_RestoreThread(ts);
    return PyLong_FromLong(st);
}

enum { TE_SYNC, TE_ASYNC, TE_ON_CUDA };

/* (cap, target, opcode, locals, remotes, lens[, stream: TE_ON_CUDA]) */
static PyObject *te_move(PyObject *args, int how)
{
    PyObject *cap, *pl, *pr, *pn;
    const char *target;
    int opcode;
    unsigned long long stream = 0;
    if (!PyArg_ParseTuple(args, how == TE_ON_CUDA ? "OsiOOO|K" : "OsiOOO", &cap, &target, &opcode,
                          &pl, &pr, &pn, &stream))
        return NULL;
    bool async = how == TE_ASYNC;
    kvp_te_t *te = te_of(cap);
    if (te == NULL)
        return NULL;
    uint64_t *l = NULL, *r = NULL, *n = NULL;
    Py_ssize_t nl, nr, nn;
    PyObject *ret = NULL;
    if (u64_list(pl, &l, &nl) != 0 || u64_list(pr, &r, &nr) != 0 || u64_list(pn, &n, &nn) != 0)
        goto out;
    if (nl != nr || nl != nn) {
        ret = async ? Py_BuildValue("(iK)", (int)KVP_ERR_INVALID_ARG, 0ULL)
                    : PyLong_FromLong(KVP_ERR_INVALID_ARG);
        goto out;
    }
    kvp_status_t st;
    uint64_t id = 0;
    void *const *locals = (void *const *)l; /* uintptr_t and void * are one size here */
    _Static_assert(sizeof(uint64_t) == sizeof(void *), "64-bit pointers");
    PyThreadState *ts = PyEval_SaveThread();
    if (async)
        st = kvp_te_submit(te, target, opcode, (size_t)nl, locals, r, n, &id);
    else if (how == TE_ON_CUDA)
        st = kvp_te_transfer_on_cuda(te, target, opcode, (size_t)nl, locals, r, n,
                                     (uintptr_t)stream);
    else
        st = kvp_te_transfer(te, target, opcode, (size_t)nl, locals, r, n);
    PyEval_RestoreThread(ts);
    ret = async ? Py_BuildValue("(iK)", (int)st, (unsigned long long)id) : PyLong_FromLong(st);
out:
    free(l);
    free(r);
    free(n);
    return ret;
}

static PyObject *py_te_transfer(PyObject *mod, PyObject *args)
{
    (void)mod;
    return te_move(args, TE_SYNC);
}

static PyObject *py_te_submit(PyObject *mod, PyObject *args)
{
    (void)mod;
    return te_move(args, TE_ASYNC);
}

static PyObject *py_te_transfer_on_cuda(PyObject *mod, PyObject *args)
{
    (void)mod;
    return te_move(args, TE_ON_CUDA);
}

static PyObject *py_te_status(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *cap;
    unsigned long long id;
    unsigned int wait_ms;
    if (!PyArg_ParseTuple(args, "OKI", &cap, &id, &wait_ms))
        return NULL;
    kvp_te_t *te = te_of(cap);
    if (te == NULL)
        return NULL;
    int st;
    PyThreadState *ts = PyEval_SaveThread();
    st = kvp_te_status(te, id, wait_ms);
    PyEval_RestoreThread(ts);
    return PyLong_FromLong(st);
}

static PyObject *py_te_counters(PyObject *mod, PyObject *cap)
{
    (void)mod;
    kvp_te_t *te = te_of(cap);
    if (te == NULL)
        return NULL;
    kvp_te_counters_t c;
    kvp_te_get_counters(te, &c);
    kvp_te_peer_stat_t ps[64];
    size_t np = kvp_te_peer_stats(te, ps, 64);
    PyObject *peers = PyDict_New();
    for (size_t i = 0; peers != NULL && i < np && i < 64; i++) {
        PyObject *v = Py_BuildValue("{s:s,s:K,s:K,s:K}", "route", ps[i].route, "transfers",
                                    (unsigned long long)ps[i].transfers, "bytes",
                                    (unsigned long long)ps[i].bytes, "failures",
                                    (unsigned long long)ps[i].failures);
        if (v == NULL || PyDict_SetItemString(peers, ps[i].target, v) != 0)
            Py_CLEAR(peers);
        Py_XDECREF(v);
    }
    if (peers == NULL)
        return NULL;
    return Py_BuildValue(
        "{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:N}",
        "writes", c.transfers[KVP_TE_WRITE], "write_bytes", c.bytes[KVP_TE_WRITE], "reads",
        c.transfers[KVP_TE_READ], "read_bytes", c.bytes[KVP_TE_READ], "failures", c.failures,
        "served_writes", c.served[KVP_TE_WRITE], "served_write_bytes", c.served_bytes[KVP_TE_WRITE],
        "served_reads", c.served[KVP_TE_READ], "refused_range", c.refused_range,
        "refused_protected", c.refused_protected, "refused_user", c.refused_user, "refused_auth",
        c.refused_auth, "served_cma_writes", c.served_cma[KVP_TE_WRITE], "served_cma_reads",
        c.served_cma[KVP_TE_READ], "notifies", c.notifies, "notifies_dropped", c.notifies_dropped,
        "refused_role", c.refused_role, "refused_tenant", c.refused_tenant, "served_lease_writes",
        c.served_lease[KVP_TE_WRITE], "served_lease_reads", c.served_lease[KVP_TE_READ], "leases",
        c.leases, "peers", peers);
}

static PyObject *py_te_remote_regions(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *cap;
    const char *target;
    if (!PyArg_ParseTuple(args, "Os", &cap, &target))
        return NULL;
    kvp_te_t *te = te_of(cap);
    if (te == NULL)
        return NULL;
    uint64_t addrs[64], lens[64];
    size_t n = 0;
    PyThreadState *ts = PyEval_SaveThread();
    kvp_status_t st = kvp_te_remote_regions(te, target, addrs, lens, 64, &n);
    PyEval_RestoreThread(ts);
    PyObject *list = PyList_New(0);
    for (size_t i = 0; list != NULL && i < n && i < 64; i++) {
        PyObject *t =
            Py_BuildValue("(KK)", (unsigned long long)addrs[i], (unsigned long long)lens[i]);
        if (t == NULL || PyList_Append(list, t) != 0)
            Py_CLEAR(list);
        Py_XDECREF(t);
    }
    return list == NULL ? NULL : Py_BuildValue("(iN)", (int)st, list);
}

static PyObject *py_te_notify(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *cap;
    const char *target, *name, *msg;
    Py_ssize_t name_len, msg_len;
    if (!PyArg_ParseTuple(args, "Oss#s#", &cap, &target, &name, &name_len, &msg, &msg_len))
        return NULL;
    kvp_te_t *te = te_of(cap);
    if (te == NULL)
        return NULL;
    PyThreadState *ts = PyEval_SaveThread();
    kvp_status_t st = kvp_te_notify(te, target, name, (size_t)name_len, msg, (size_t)msg_len);
    PyEval_RestoreThread(ts);
    return PyLong_FromLong(st);
}

static void notify_append(void *arg, const char *name, size_t name_len, const char *msg,
                          size_t msg_len)
{
    PyObject **list = arg;
    if (*list == NULL)
        return;
    PyObject *t = Py_BuildValue("(y#y#)", name, (Py_ssize_t)name_len, msg, (Py_ssize_t)msg_len);
    if (t == NULL || PyList_Append(*list, t) != 0)
        Py_CLEAR(*list);
    Py_XDECREF(t);
}

static PyObject *py_te_get_notifies(PyObject *mod, PyObject *cap)
{
    (void)mod;
    kvp_te_t *te = te_of(cap);
    if (te == NULL)
        return NULL;
    PyObject *list = PyList_New(0);
    kvp_te_get_notifies(te, notify_append, &list); /* taken even when the list fails */
    return list;
}

PyMethodDef kvp_py_te_methods[] = {
    {"te_notify", py_te_notify, METH_VARARGS,
     "te_notify(engine, target, name, msg) -> status (queued at target)"},
    {"te_get_notifies", py_te_get_notifies, METH_O,
     "te_get_notifies(engine) -> [(name bytes, msg bytes), ...], oldest first, taken"},
    {"te_remote_regions", py_te_remote_regions, METH_VARARGS,
     "te_remote_regions(engine, target) -> (status, [(address, length), ...] (64 at most))"},
    {"te_create", py_te_create, METH_VARARGS,
     "te_create(local_hostname, metadata, protocol) -> (status, engine or None)"},
    {"te_destroy", py_te_destroy, METH_O, "te_destroy(engine)"},
    {"te_rpc_port", py_te_rpc_port, METH_O, "te_rpc_port(engine) -> int"},
    {"te_first_buffer", py_te_first_buffer, METH_O, "te_first_buffer(engine) -> int"},
    {"te_register", py_te_register, METH_VARARGS, "te_register(engine, addr, len) -> status"},
    {"te_unregister", py_te_unregister, METH_VARARGS, "te_unregister(engine, addr) -> status"},
    {"te_transfer", py_te_transfer, METH_VARARGS,
     "te_transfer(engine, target, opcode, locals, remotes, lens) -> status"},
    {"te_transfer_on_cuda", py_te_transfer_on_cuda, METH_VARARGS,
     "te_transfer_on_cuda(engine, target, opcode, locals, remotes, lens, stream) -> status"},
    {"te_submit", py_te_submit, METH_VARARGS,
     "te_submit(engine, target, opcode, locals, remotes, lens) -> (status, batch id)"},
    {"te_status", py_te_status, METH_VARARGS,
     "te_status(engine, batch_id, wait_ms) -> 1 done, 0 running, < 0 failed"},
    {"te_counters", py_te_counters, METH_O, "te_counters(engine) -> dict"},
    {NULL, NULL, 0, NULL},
};
