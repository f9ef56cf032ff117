/* broker._recvbuf: a receive buffer for one large request frame, not written to before the
 * socket writes into it.
 *
 * bytearray(n) zeroes its n bytes, which costs as much as the copy the buffer is there to
 * avoid, and makes every page of it resident at once: a client's 4-byte size prefix claiming
 * 100 MiB would hold 100 MiB before anything else arrived. A buffer from here is allocated
 * and not touched; with glibc, one of at least the mmap threshold (1 MiB in the broker,
 * broker/memtrim.py) is its own mapping whose pages become resident only as bytes are
 * written into them. Its content is undefined until written: the network layer
 * (broker/net.py) hands the transport only the part not yet received, and hands the frame
 * on only once every byte of it has been received.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *uninitialized(PyObject *self, PyObject *arg) {
    (void)self;
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "a buffer's size cannot be negative");
        return NULL;
    }
    return PyByteArray_FromStringAndSize(NULL, n);
}

static PyMethodDef methods[] = {
    {"uninitialized", uninitialized, METH_O,
     "uninitialized(n) -> bytearray of n bytes whose content is undefined until written"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "broker._recvbuf",
    "Receive buffers not written to before the socket writes into them.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__recvbuf(void) { return PyModule_Create(&module); }
