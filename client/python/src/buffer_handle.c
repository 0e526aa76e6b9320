/*
 * buffer_handle.c - kvpool._kvpool.BufferHandle: memory of its own holding one
 * object read by batch_get_buffer, as Mooncake's BufferHandle: the buffer
 * protocol (writable, so torch.frombuffer and numpy.frombuffer take it
 * without a copy), ptr(), size() and len().
 *
 * The memory is page-aligned and freed with the handle; views taken through
 * the buffer protocol keep the handle alive.
 */
#include <stdlib.h>

#include "kvpool_py.h"

typedef struct buffer_handle {
    PyObject_HEAD void *ptr;
    size_t size; /* the object's bytes */
} buffer_handle_t;

PyObject *kvp_py_buffer_handle_new(size_t cap)
{
    buffer_handle_t *h = PyObject_New(buffer_handle_t, &kvp_py_buffer_handle_type);
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
    free(h->ptr);
    PyObject_Free(h);
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

static PyBufferProcs handle_as_buffer = {
    .bf_getbuffer = (getbufferproc)handle_getbuffer,
};

static PySequenceMethods handle_as_sequence = {
    .sq_length = (lenfunc)handle_len,
};

static PyMethodDef handle_methods[] = {
    {"ptr", (PyCFunction)handle_ptr, METH_NOARGS, PyDoc_STR("ptr() -> address of the bytes")},
    {"size", (PyCFunction)handle_size, METH_NOARGS, PyDoc_STR("size() -> the object's length")},
    {NULL, NULL, 0, NULL},
};

PyTypeObject kvp_py_buffer_handle_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvpool._kvpool.BufferHandle",
    .tp_basicsize = sizeof(buffer_handle_t),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = PyDoc_STR("One object read by batch_get_buffer: buffer protocol, ptr(), size()"),
    .tp_dealloc = (destructor)handle_dealloc,
    .tp_as_buffer = &handle_as_buffer,
    .tp_as_sequence = &handle_as_sequence,
    .tp_methods = handle_methods,
    .tp_repr = (reprfunc)handle_repr,
};
