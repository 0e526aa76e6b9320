/*
 * module.c - the kvpool._kvpool extension module: its types, kvpool.Error and
 * the status table.
 *
 * kvpool.Error carries .status (the kvp_status_t, an int) and .name
 * ("KVP_ERR_NOT_FOUND"); its message is what kvp_client_last_error() said on
 * the thread that failed. Status names, numbers and texts come from
 * common/status_list.h, the one list everything else is generated from.
 */
#include <string.h>

#include "common/status_list.h"
#include "kvpool_py.h"

PyObject *kvp_py_error;

static const struct {
    int value;
    const char *name;
} status_names[] = {
#define X(name, value, text) {value, #name},
    KVP_STATUS_LIST(X)
#undef X
};

const char *kvp_py_status_name(int status)
{
    for (size_t i = 0; i < sizeof(status_names) / sizeof(status_names[0]); i++)
        if (status_names[i].value == status)
            return status_names[i].name;
    return NULL;
}

/* A new kvpool.Error instance (not raised). */
static PyObject *make_error(int status, const char *message)
{
    if (message == NULL || message[0] == '\0') {
        message = kvp_client_last_error();
        if (message == NULL || message[0] == '\0')
            message = kvp_strerror((kvp_status_t)status);
    }
    PyObject *e = PyObject_CallFunction(kvp_py_error, "s", message);
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

PyObject *kvp_py_raise(int status, const char *message)
{
    PyObject *e = make_error(status, message);
    if (e != NULL) {
        PyErr_SetObject(kvp_py_error, e);
        Py_DECREF(e);
    }
    return NULL;
}

static PyObject *mod_error(PyObject *mod, PyObject *args)
{
    (void)mod;
    int status;
    const char *message = NULL;
    if (!PyArg_ParseTuple(args, "i|z:error", &status, &message))
        return NULL;
    return make_error(status, message);
}

static PyObject *mod_last_error(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    return PyUnicode_FromString(kvp_client_last_error());
}

static PyObject *mod_strerror(PyObject *mod, PyObject *arg)
{
    (void)mod;
    long st = PyLong_AsLong(arg);
    if (st == -1 && PyErr_Occurred())
        return NULL;
    return PyUnicode_FromString(kvp_strerror((kvp_status_t)st));
}

/* buffer_info(obj, writable=False) -> (address, nbytes) of a C-contiguous buffer */
static PyObject *mod_buffer_info(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *obj;
    int writable = 0;
    if (!PyArg_ParseTuple(args, "O|p:buffer_info", &obj, &writable))
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

static PyMethodDef mod_methods[] = {
    {"error", mod_error, METH_VARARGS,
     PyDoc_STR("error(status, message=None) -> a kvpool.Error (message None: the calling "
               "thread's last libkvpool error)")},
    {"last_error", mod_last_error, METH_NOARGS,
     PyDoc_STR("last_error() -> what the calling thread's last failed call was about")},
    {"strerror", mod_strerror, METH_O, PyDoc_STR("strerror(status) -> the status's text")},
    {"buffer_info", mod_buffer_info, METH_VARARGS,
     PyDoc_STR("buffer_info(obj, writable=False) -> (address, nbytes)")},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef kvpool_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kvpool._kvpool",
    .m_doc = PyDoc_STR("libkvpool bindings (raw layer under kvpool and mooncake.store)"),
    .m_size = -1,
    .m_methods = mod_methods,
};

static int add_statuses(PyObject *m)
{
    PyObject *d = PyDict_New();
    if (d == NULL)
        return -1;
    for (size_t i = 0; i < sizeof(status_names) / sizeof(status_names[0]); i++) {
        PyObject *v = PyLong_FromLong(status_names[i].value);
        if (v == NULL || PyDict_SetItemString(d, status_names[i].name, v) != 0) {
            Py_XDECREF(v);
            Py_DECREF(d);
            return -1;
        }
        Py_DECREF(v);
    }
    return PyModule_AddObject(m, "STATUS", d) == 0 ? 0 : (Py_DECREF(d), -1);
}

PyMODINIT_FUNC PyInit__kvpool(void)
{
    if (PyType_Ready(&kvp_py_client_type) < 0 || PyType_Ready(&kvp_py_buffer_handle_type) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&kvpool_module);
    if (m == NULL)
        return NULL;
    PyObject *dict =
        Py_BuildValue("{s:i,s:s}", "status", (int)KVP_ERR_INTERNAL, "name", "KVP_ERR_INTERNAL");
    if (dict == NULL)
        goto err;
    kvp_py_error = PyErr_NewExceptionWithDoc(
        "kvpool.Error",
        "A libkvpool call failed: .status is the kvp_status_t (negative int), .name its name "
        "(\"KVP_ERR_NOT_FOUND\"), the message says what happened.",
        NULL, dict);
    Py_DECREF(dict);
    if (kvp_py_error == NULL)
        goto err;
    Py_INCREF(kvp_py_error);
    if (PyModule_AddObject(m, "Error", kvp_py_error) != 0)
        goto err;
    Py_INCREF(&kvp_py_client_type);
    if (PyModule_AddObject(m, "Client", (PyObject *)&kvp_py_client_type) != 0)
        goto err;
    Py_INCREF(&kvp_py_buffer_handle_type);
    if (PyModule_AddObject(m, "BufferHandle", (PyObject *)&kvp_py_buffer_handle_type) != 0)
        goto err;
    if (add_statuses(m) != 0 || PyModule_AddIntConstant(m, "MAX_BATCH", KVP_MAX_BATCH) != 0 ||
        PyModule_AddIntConstant(m, "MAX_KEY_LEN", KVP_MAX_KEY_LEN) != 0 ||
        PyModule_AddStringConstant(m, "SEGMENT_LOCAL", KVP_SEGMENT_LOCAL) != 0 ||
        PyModule_AddIntConstant(m, "AQ_MAX_INFLIGHT", KVP_AQ_MAX_INFLIGHT) != 0)
        goto err;
    return m;
err:
    Py_DECREF(m);
    return NULL;
}
