/*
 * buffer_handle.c - kvpool._kvpool.BufferHandle: memory of its own holding one
 * object read by batch_get_buffer, as Mooncake's BufferHandle: the buffer
 * protocol (writable, so torch.frombuffer and numpy.frombuffer take it
 * without a copy), ptr(), size() and len().
 *
 * The memory is page-aligned and freed with the handle; views taken through
 * the buffer protocol keep the handle alive. A heap type made by the module's
 * exec slot (module.c); Python cannot instantiate it. A handle refers to no
 * Python object but its type, so it is not tracked by the garbage collector
 * (no cycle can run through it, and batch_get_buffer makes hundreds at a
 * time); its dealloc drops the reference to the type.
 */
#include <stdlib.h>

#include "kvpool_py.h"

typedef struct buffer_handle {
    PyObject_HEAD void *ptr;
    size_t size; /* the object's bytes */
} buffer_handle_t;

PyObject *kvp_py_buffer_handle_new(kvp_py_state_t *state, size_t cap)
{
    buffer_handle_t *h = PyObject_New(buffer_handle_t, state->buffer_handle_type);
    if (h == NULL)
        return NULL;
    h->ptr = NULL;
    h->size = cap;
    if (posix_memalign(&h->ptr, 4096, cap > 0 ? cap : 1) != 0) {
        h->ptr = NULL;
        Py_DECREF(h);
        return PyErr_NoMemory();
    }
    return (PyObject *)h;
}

void *kvp_py_buffer_handle_ptr(PyObject *o)
{
    return ((buffer_handle_t *)o)->ptr;
}

void kvp_py_buffer_handle_set_size(PyObject *o, size_t size)
{
    ((buffer_handle_t *)o)->size = size;
}

static void handle_dealloc(buffer_handle_t *h)
{
    PyTypeObject *tp = Py_TYPE(h);
    free(h->ptr);
    tp->tp_free(h);
    Py_DECREF(tp);
}

static int handle_getbuffer(buffer_handle_t *h, Py_buffer *view, int flags)
{
    return PyBuffer_FillInfo(view, (PyObject *)h, h->ptr, (Py_ssize_t)h->size, 0, flags);
}

static PyObject *handle_ptr(buffer_handle_t *h, PyObject *unused)
{
    (void)unused;
    return PyLong_FromVoidPtr(h->ptr);
}

static PyObject *handle_size(buffer_handle_t *h, PyObject *unused)
{
    (void)unused;
    return PyLong_FromSize_t(h->size);
}

static Py_ssize_t handle_len(buffer_handle_t *h)
{
    return (Py_ssize_t)h->size;
}

static PyObject *handle_repr(buffer_handle_t *h)
{
    return PyUnicode_FromFormat("<BufferHandle ptr=%p size=%zu>", h->ptr, h->size);
}

static PyMethodDef handle_methods[] = {
    {"ptr", (PyCFunction)handle_ptr, METH_NOARGS, PyDoc_STR("ptr() -> address of the bytes")},
    {"size", (PyCFunction)handle_size, METH_NOARGS, PyDoc_STR("size() -> the object's length")},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot handle_slots[] = {
    {Py_tp_doc,
     (void *)PyDoc_STR("One object read by batch_get_buffer: buffer protocol, ptr(), size()")},
    {Py_tp_dealloc, handle_dealloc},
    {Py_tp_repr, handle_repr},
    {Py_tp_methods, handle_methods},
    {Py_bf_getbuffer, handle_getbuffer},
    {Py_sq_length, handle_len},
    {0, NULL},
};

static PyType_Spec handle_spec = {
    .name = "kvpool._kvpool.BufferHandle",
    .basicsize = sizeof(buffer_handle_t),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = handle_slots,
};

PyTypeObject *kvp_py_buffer_handle_type_new(PyObject *module)
{
    return (PyTypeObject *)PyType_FromModuleAndSpec(module, &handle_spec, NULL);
}
