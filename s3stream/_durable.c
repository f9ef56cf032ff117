/* s3stream._durable: the file store's durable write as one call that holds no GIL.

put(tmp, final, directory, parts, drop_cached) writes `parts` (objects with the buffer
protocol, one after the other, writev without joining them) to `tmp`, fsyncs it, optionally
drops its pages from the page cache, renames it to `final` and fsyncs `directory`: what
s3stream.objectstore.LocalDirObjectStore did with one Python call per system call. Each of
those calls gave the GIL up and had to take it back; with the event loop busy (a broker
answering ~2,400 Produce requests a second) taking it back waited for the loop's thread, a
few milliseconds each time: the write of a WAL object took 7 ms at the median, 3.3 ms as
one call (issue 17, benchmarks/README.md).

The buffers are held (their exporters pinned) for the duration of the call; nothing is
copied. On failure an OSError carries errno and the path of the step that failed; the
temporary file is then left as it is, as before (the store's caller never reads it: an
object exists under its final name or not at all). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/uio.h>
#include <unistd.h>

#ifndef IOV_MAX
#define IOV_MAX 1024
#endif

enum step { STEP_NONE, STEP_TMP, STEP_FINAL, STEP_DIR };

/* Write every iovec, however short a writev comes back; 0 or an errno. */
static int write_all(int fd, struct iovec *iov, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n && iov[i].iov_len == 0)
        i++;
    while (i < n) {
        int count = (n - i) > IOV_MAX ? IOV_MAX : (int)(n - i);
        ssize_t w = writev(fd, iov + i, count);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        size_t left = (size_t)w;
        while (i < n && left >= iov[i].iov_len) { /* whole buffers written */
            left -= iov[i].iov_len;
            i++;
        }
        if (left) { /* one written in part: the rest of it next */
            iov[i].iov_base = (char *)iov[i].iov_base + left;
            iov[i].iov_len -= left;
        }
        while (i < n && iov[i].iov_len == 0)
            i++;
    }
    return 0;
}

static int fsync_dir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return errno;
    int err = fsync(fd) < 0 ? errno : 0;
    if (close(fd) < 0 && !err)
        err = errno;
    return err;
}

/* The system calls, without the GIL; sets *step to where an error happened. */
static int durable_write(const char *tmp, const char *final, const char *dir,
                         struct iovec *iov, Py_ssize_t n, int drop_cached, enum step *step) {
    *step = STEP_TMP;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return errno;
    int err = write_all(fd, iov, n);
    if (!err && fsync(fd) < 0)
        err = errno;
    if (!err && drop_cached) /* clean now: dropped at once (a hint; nothing fails without it) */
        (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    if (close(fd) < 0 && !err)
        err = errno;
    if (err)
        return err;
    *step = STEP_FINAL;
    if (rename(tmp, final) < 0)
        return errno;
    *step = STEP_DIR;
    return fsync_dir(dir);
}

static PyObject *put(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *tmp_o, *final_o, *dir_o, *parts; /* the paths as given: for errors */
    PyObject *tmp = NULL, *final = NULL, *dir = NULL, *fast = NULL, *result = NULL;
    Py_buffer *views = NULL;
    struct iovec *iov = NULL;
    Py_ssize_t n = 0, held = 0;
    int drop_cached;
    if (!PyArg_ParseTuple(args, "OOOOp", &tmp_o, &final_o, &dir_o, &parts, &drop_cached))
        return NULL;
    if (!PyUnicode_FSConverter(tmp_o, &tmp) || !PyUnicode_FSConverter(final_o, &final) ||
        !PyUnicode_FSConverter(dir_o, &dir))
        goto done;
    fast = PySequence_Fast(parts, "parts must be a sequence of buffers");
    if (fast == NULL)
        goto done;
    n = PySequence_Fast_GET_SIZE(fast);
    views = PyMem_Calloc(n ? (size_t)n : 1, sizeof(Py_buffer));
    iov = PyMem_Calloc(n ? (size_t)n : 1, sizeof(struct iovec));
    if (views == NULL || iov == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (; held < n; held++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(fast, held), &views[held],
                               PyBUF_SIMPLE) < 0)
            goto done;
        iov[held].iov_base = views[held].buf;
        iov[held].iov_len = (size_t)views[held].len;
    }
    const char *tmp_s = PyBytes_AS_STRING(tmp), *final_s = PyBytes_AS_STRING(final),
               *dir_s = PyBytes_AS_STRING(dir);
    enum step step = STEP_NONE;
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = durable_write(tmp_s, final_s, dir_s, iov, n, drop_cached, &step);
    Py_END_ALLOW_THREADS
    if (err) {
        errno = err;
        PyObject *where = step == STEP_DIR ? dir_o : (step == STEP_FINAL ? final_o : tmp_o);
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, where);
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    for (Py_ssize_t i = 0; i < held; i++)
        PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(iov);
    Py_XDECREF(fast);
    Py_XDECREF(tmp);
    Py_XDECREF(final);
    Py_XDECREF(dir);
    return result;
}

static PyMethodDef methods[] = {
    {"put", put, METH_VARARGS,
     "put(tmp, final, directory, parts, drop_cached): write parts to tmp, fsync, rename to "
     "final, fsync directory; without the GIL."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "s3stream._durable", NULL, -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__durable(void) { return PyModule_Create(&module); }
