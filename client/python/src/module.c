/*
 * module.c - the kvpool._kvpool extension module: multi-phase init, the
 * module state (its heap types and kvpool.Error), the status table and the
 * module-level functions.
 *
 * Design: like CPython's own Modules/_sqlite, nothing lives in C globals: the
 * exec slot creates the types with PyType_FromModuleAndSpec and the exception,
 * and keeps them in the module state; a method finds them from its object's
 * type (kvp_py_state_of). kvpool.Error carries .status (the kvp_status_t, an
 * int) and .name ("KVP_ERR_NOT_FOUND"); its message is what
 * kvp_client_last_error() said on the thread that failed. The status names
 * and numbers come from the installed kvpool_status.h, texts from
 * kvp_strerror().
 *
 * Thread: any Python thread, GIL held.
 */
#include <string.h>

#include "kvpool_py.h"

/* ---------------- the status table ---------------- */

/* Indexed by -status. kvpool_status.h is append-only, with KVP_STATUS_MIN the last. */
#define STATUS_NAME(s) [-(s)] = #s
static const char *const status_names[] = {
    STATUS_NAME(KVP_OK),
    STATUS_NAME(KVP_ERR_INVALID_ARG),
    STATUS_NAME(KVP_ERR_NOMEM),
    STATUS_NAME(KVP_ERR_NOT_FOUND),
    STATUS_NAME(KVP_ERR_EXISTS),
    STATUS_NAME(KVP_ERR_POOL_FULL),
    STATUS_NAME(KVP_ERR_TOO_LARGE),
    STATUS_NAME(KVP_ERR_NO_SEGMENT),
    STATUS_NAME(KVP_ERR_BUFFER_TOO_SMALL),
    STATUS_NAME(KVP_ERR_CHECKSUM),
    STATUS_NAME(KVP_ERR_BAD_KEY),
    STATUS_NAME(KVP_ERR_PENDING),
    STATUS_NAME(KVP_ERR_NOT_PENDING),
    STATUS_NAME(KVP_ERR_CONNECT),
    STATUS_NAME(KVP_ERR_IO),
    STATUS_NAME(KVP_ERR_TIMEOUT),
    STATUS_NAME(KVP_ERR_PROTOCOL),
    STATUS_NAME(KVP_ERR_VERSION),
    STATUS_NAME(KVP_ERR_FRAME_TOO_LARGE),
    STATUS_NAME(KVP_ERR_SEGMENT_GONE),
    STATUS_NAME(KVP_ERR_OUT_OF_RANGE),
    STATUS_NAME(KVP_ERR_TRANSPORT),
    STATUS_NAME(KVP_ERR_UNKNOWN_METHOD),
    STATUS_NAME(KVP_ERR_TOO_MANY),
    STATUS_NAME(KVP_ERR_SYSTEM),
    STATUS_NAME(KVP_ERR_SHUTDOWN),
    STATUS_NAME(KVP_ERR_NOT_OWNER),
    STATUS_NAME(KVP_ERR_INTERNAL),
    STATUS_NAME(KVP_ERR_LEASED),
    STATUS_NAME(KVP_ERR_LEASE_EXPIRED),
    STATUS_NAME(KVP_ERR_POOL_BUSY),
    STATUS_NAME(KVP_ERR_NO_REPLICA),
    STATUS_NAME(KVP_ERR_UNKNOWN_SEGMENT),
    STATUS_NAME(KVP_ERR_PUT_REVOKED),
    STATUS_NAME(KVP_ERR_IN_USE),
    STATUS_NAME(KVP_ERR_UNSUPPORTED),
    STATUS_NAME(KVP_ERR_NO_SPACE),
    STATUS_NAME(KVP_ERR_NOT_LEADER),
    STATUS_NAME(KVP_ERR_DENIED),
    STATUS_NAME(KVP_ERR_QUOTA),
};
#undef STATUS_NAME

#define N_STATUS ((int)(sizeof(status_names) / sizeof(status_names[0])))
_Static_assert(N_STATUS == 1 - KVP_STATUS_MIN,
               "a status of kvpool_status.h is missing from status_names (module.c)");

const char *kvp_py_status_name(int status)
{
    return status <= 0 && status > -N_STATUS ? status_names[-status] : NULL;
}

/* ---------------- kvpool.Error ---------------- */

kvp_py_state_t *kvp_py_state_of(PyTypeObject *type)
{
    PyObject *m = PyType_GetModuleByDef(type, &kvp_py_module_def);
    return m != NULL ? PyModule_GetState(m) : NULL;
}

/* A new kvpool.Error instance (not raised). */
static PyObject *make_error(kvp_py_state_t *state, int status, const char *message)
{
    if (message == NULL || message[0] == '\0') {
        message = kvp_client_last_error();
        if (message == NULL || message[0] == '\0')
            message = kvp_strerror((kvp_status_t)status);
    }
    PyObject *e = PyObject_CallFunction(state->error, "s", message);
    if (e == NULL)
        return NULL;
    const char *name = kvp_py_status_name(status);
    PyObject *st = PyLong_FromLong(status);
    PyObject *nm = name ? PyUnicode_FromString(name) : PyUnicode_FromFormat("status %d", status);
    if (st == NULL || nm == NULL || PyObject_SetAttrString(e, "status", st) != 0 ||
        PyObject_SetAttrString(e, "name", nm) != 0) {
        Py_XDECREF(st);
        Py_XDECREF(nm);
        Py_DECREF(e);
        return NULL;
    }
    Py_DECREF(st);
    Py_DECREF(nm);
    return e;
}

PyObject *kvp_py_raise(kvp_py_state_t *state, int status, const char *message)
{
    if (state == NULL)
        return NULL; /* kvp_py_state_of raised */
    PyObject *e = make_error(state, status, message);
    if (e != NULL) {
        PyErr_SetObject(state->error, e);
        Py_DECREF(e);
    }
    return NULL;
}

/* ---------------- module functions ---------------- */

/* error(status, message=None) -> a kvpool.Error (not raised) */
static PyObject *mod_error(PyObject *mod, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"status", "message", NULL};
    int status;
    const char *message = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "i|z:error", kwlist, &status, &message))
        return NULL;
    return make_error(PyModule_GetState(mod), status, message);
}

static PyObject *mod_last_error(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    return PyUnicode_FromString(kvp_client_last_error());
}

static PyObject *mod_strerror(PyObject *mod, PyObject *args, PyObject *kw)
{
    (void)mod;
    static char *kwlist[] = {"status", NULL};
    long status;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "l:strerror", kwlist, &status))
        return NULL;
    return PyUnicode_FromString(kvp_strerror((kvp_status_t)status));
}

/* buffer_info(obj, writable=False) -> (address, nbytes) of a C-contiguous buffer */
static PyObject *mod_buffer_info(PyObject *mod, PyObject *args, PyObject *kw)
{
    (void)mod;
    static char *kwlist[] = {"obj", "writable", NULL};
    PyObject *obj;
    int writable = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|p:buffer_info", kwlist, &obj, &writable))
        return NULL;
    if (!PyObject_CheckBuffer(obj)) {
        PyErr_Format(PyExc_TypeError,
                     "a buffer (bytes, bytearray, numpy array, ...) is needed, "
                     "not %.100s",
                     Py_TYPE(obj)->tp_name);
        return NULL;
    }
    Py_buffer v;
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, &v, flags) != 0)
        return NULL;
    PyObject *r = Py_BuildValue("(Nn)", PyLong_FromVoidPtr(v.buf), v.len);
    PyBuffer_Release(&v);
    return r;
}

#define KW_METH(name, fn, doc)                                                                     \
    {                                                                                              \
        name, (PyCFunction)(void (*)(void))fn, METH_VARARGS | METH_KEYWORDS, PyDoc_STR(doc)        \
    }

static PyMethodDef mod_methods[] = {
    KW_METH("error", mod_error,
            "error(status, message=None) -> a kvpool.Error (message None: the calling "
            "thread's last libkvpool error)"),
    {"last_error", mod_last_error, METH_NOARGS,
     PyDoc_STR("last_error() -> what the calling thread's last failed call was about")},
    KW_METH("strerror", mod_strerror, "strerror(status) -> the status's text"),
    KW_METH("buffer_info", mod_buffer_info,
            "buffer_info(obj, writable=False) -> (address, nbytes)"),
    {NULL, NULL, 0, NULL},
};

/* ---------------- module state and init ---------------- */

static int add_statuses(PyObject *m)
{
    PyObject *d = PyDict_New();
    if (d == NULL)
        return -1;
    for (int i = 0; i < N_STATUS; i++) {
        if (status_names[i] == NULL)
            continue;
        PyObject *v = PyLong_FromLong(-i);
        if (v == NULL || PyDict_SetItemString(d, status_names[i], v) != 0) {
            Py_XDECREF(v);
            Py_DECREF(d);
            return -1;
        }
        Py_DECREF(v);
    }
    int rc = PyModule_AddObjectRef(m, "STATUS", d);
    Py_DECREF(d);
    return rc;
}

static PyObject *new_error_type(void)
{
    PyObject *dict =
        Py_BuildValue("{s:i,s:s}", "status", (int)KVP_ERR_INTERNAL, "name", "KVP_ERR_INTERNAL");
    if (dict == NULL)
        return NULL;
    PyObject *e = PyErr_NewExceptionWithDoc(
        "kvpool.Error",
        "A libkvpool call failed: .status is the kvp_status_t (negative int), .name its name "
        "(\"KVP_ERR_NOT_FOUND\"), the message says what happened.",
        NULL, dict);
    Py_DECREF(dict);
    return e;
}

static int module_exec(PyObject *m)
{
    kvp_py_state_t *state = PyModule_GetState(m);
    state->client_type = kvp_py_client_type_new(m);
    if (state->client_type == NULL || PyModule_AddType(m, state->client_type) != 0)
        return -1;
    state->buffer_handle_type = kvp_py_buffer_handle_type_new(m);
    if (state->buffer_handle_type == NULL || PyModule_AddType(m, state->buffer_handle_type) != 0)
        return -1;
    state->error = new_error_type();
    if (state->error == NULL || PyModule_AddObjectRef(m, "Error", state->error) != 0)
        return -1;
    if (add_statuses(m) != 0 || PyModule_AddIntConstant(m, "MAX_BATCH", KVP_MAX_BATCH) != 0 ||
        PyModule_AddIntConstant(m, "MAX_KEY_LEN", KVP_MAX_KEY_LEN) != 0 ||
        PyModule_AddStringConstant(m, "SEGMENT_LOCAL", KVP_SEGMENT_LOCAL) != 0 ||
        PyModule_AddIntConstant(m, "AQ_MAX_INFLIGHT", KVP_AQ_MAX_INFLIGHT) != 0 ||
        PyModule_AddFunctions(m, kvp_py_te_methods) != 0)
        return -1;
    return 0;
}

static int module_traverse(PyObject *m, visitproc visit, void *arg)
{
    kvp_py_state_t *state = PyModule_GetState(m);
    Py_VISIT(state->client_type);
    Py_VISIT(state->buffer_handle_type);
    Py_VISIT(state->error);
    return 0;
}

static int module_clear(PyObject *m)
{
    kvp_py_state_t *state = PyModule_GetState(m);
    Py_CLEAR(state->client_type);
    Py_CLEAR(state->buffer_handle_type);
    Py_CLEAR(state->error);
    return 0;
}

static void module_free(void *m)
{
    module_clear(m);
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
    {0, NULL},
};

struct PyModuleDef kvp_py_module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kvpool._kvpool",
    .m_doc = PyDoc_STR("libkvpool bindings (raw layer under kvpool and mooncake.store)"),
    .m_size = sizeof(kvp_py_state_t),
    .m_methods = mod_methods,
    .m_slots = module_slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC PyInit__kvpool(void)
{
    return PyModuleDef_Init(&kvp_py_module_def);
}
