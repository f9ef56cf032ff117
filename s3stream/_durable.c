/* s3stream._durable: the file store's durable write as one call that holds no GIL.

put(tmp, final, directory, parts, drop_cached) writes `parts` (objects with the buffer
protocol, one after the other, writev without joining them) to `tmp`, fsyncs it, renames it
to `final` and fsyncs `directory`; with drop_cached the object is kept out of the page cache
(written around it, O_DIRECT, where the file system allows; else its pages dropped once
durable). That is what s3stream.objectstore.LocalDirObjectStore did with one Python call
per system call. Each of those calls gave the GIL up and had to take it back; with the event
loop busy (a broker answering ~2,400 Produce requests a second) taking it back waited for
the loop's thread, a few milliseconds each time: the write of a WAL object took 7 ms at the
median, 3.3 ms as one call (issue 17, benchmarks/README.md).

The buffers are held (their exporters pinned) for the duration of the call; they are copied
only into the aligned staging buffer of a write around the page cache. On failure an OSError
carries errno and the path of the step that failed; the temporary file is then left as it
is, as before (the store's caller never reads it: an object exists under its final name or
not at all).

Writer() does the same writes on a thread of its own that never takes the GIL, one after the
other in the order submitted: submit(...) queues one and returns its id at once; the thread
writes an 8-byte count to an eventfd (fileno()) after each, and completed() hands back the
finished ones as (id, errno or 0, path of the failed step or None), releasing their buffers.
An event loop watches the eventfd (s3stream.objectstore): a write then costs the loop's
thread no GIL hand-over at all, where a worker thread of Python's took the GIL twice (to
start, and to hand the result back), each time waiting for the busy loop to let it go.
close() lets the thread finish what was submitted, then stops it. The thread blocks every
signal (they stay the main thread's). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
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
        if (w == 0) /* nothing written of a non-empty buffer: not a loop to go round again */
            return EIO;
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

/* A write that bypasses the page cache (O_DIRECT) needs its memory, length and file offset
   aligned to the device's blocks: the parts are copied into one aligned staging buffer (a
   copy the kernel would otherwise make into the page cache, with the cache's bookkeeping,
   its write-back and then the dropping of the pages on top, ~0.5 s of system CPU per GiB
   against ~0.2 here; issue 17), padded with zeros to the block, written, and the file cut
   back to its size. */
#define DIRECT_ALIGN 4096
#define STAGING_KEPT (16 << 20) /* a writer keeps its staging buffer up to this size */

typedef struct {
    char *buf;
    size_t cap;
} staging;

static void staging_free(staging *s) {
    free(s->buf);
    s->buf = NULL;
    s->cap = 0;
}

/* 0, an errno, or EINVAL when the file system does not take the write this way (the caller
   then writes it through the page cache). */
static int write_direct(int fd, struct iovec *iov, Py_ssize_t n, staging *s) {
    size_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        total += iov[i].iov_len;
    size_t padded = (total + DIRECT_ALIGN - 1) / DIRECT_ALIGN * DIRECT_ALIGN;
    if (padded == 0)
        return 0;
    if (s->cap < padded) {
        staging_free(s);
        void *p;
        int err = posix_memalign(&p, DIRECT_ALIGN, padded);
        if (err)
            return err;
        s->buf = p;
        s->cap = padded;
    }
    char *at = s->buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (iov[i].iov_len)
            memcpy(at, iov[i].iov_base, iov[i].iov_len);
        at += iov[i].iov_len;
    }
    memset(at, 0, padded - total);
    size_t off = 0;
    while (off < padded) {
        ssize_t w = pwrite(fd, s->buf + off, padded - off, (off_t)off);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        if (w == 0 || w % DIRECT_ALIGN) /* the rest would be unaligned: through the cache */
            return EINVAL;
        off += (size_t)w;
    }
    if (padded != total && ftruncate(fd, (off_t)total) < 0)
        return errno;
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

/* The system calls, without the GIL; sets *step to where an error happened. With
   drop_cached the object is not to stay in the page cache: written around it (O_DIRECT)
   where the file system takes that, else through it and its pages dropped once durable. */
static int durable_write(const char *tmp, const char *final, const char *dir,
                         struct iovec *iov, Py_ssize_t n, int drop_cached, staging *s,
                         enum step *step) {
    *step = STEP_TMP;
    int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
    int direct = drop_cached;
    int fd = direct ? open(tmp, flags | O_DIRECT, 0644) : -1;
    if (fd < 0 && direct && errno != EINVAL) /* EINVAL: no O_DIRECT here (tmpfs) */
        return errno;
    if (fd < 0) {
        direct = 0;
        fd = open(tmp, flags, 0644);
        if (fd < 0)
            return errno;
    }
    int err = 0;
    if (direct) {
        err = write_direct(fd, iov, n, s);
        if (err == EINVAL) { /* opened so, refused when written: through the cache after all */
            direct = 0;
            int fl = fcntl(fd, F_GETFL);
            err = (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_DIRECT) < 0 || ftruncate(fd, 0) < 0)
                      ? errno
                      : 0;
        }
    }
    if (!err && !direct)
        err = write_all(fd, iov, n);
    if (!err && fsync(fd) < 0)
        err = errno;
    if (!err && drop_cached && !direct) /* clean now: dropped at once (a hint) */
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

/* One write's arguments, taken from Python (buffers held, paths as bytes) until released. */
typedef struct job {
    struct job *next;
    unsigned long long id;
    PyObject *paths[3]; /* tmp, final, directory: as given (for errors) */
    PyObject *bytes[3]; /* the same, encoded for the file system */
    Py_buffer *views;
    struct iovec *iov;
    Py_ssize_t held; /* views taken */
    int drop_cached;
    int err;
    enum step step;
} job;

static void job_free(job *j) {
    for (Py_ssize_t i = 0; i < j->held; i++)
        PyBuffer_Release(&j->views[i]);
    PyMem_Free(j->views);
    PyMem_Free(j->iov);
    for (int i = 0; i < 3; i++) {
        Py_XDECREF(j->paths[i]);
        Py_XDECREF(j->bytes[i]);
    }
    PyMem_Free(j);
}

/* The arguments (tmp, final, directory, parts, drop_cached) as a job, or NULL with an
   exception set. */
static job *job_new(PyObject *args) {
    PyObject *parts, *fast = NULL;
    job *j = PyMem_Calloc(1, sizeof(job));
    if (j == NULL)
        return (job *)PyErr_NoMemory();
    if (!PyArg_ParseTuple(args, "OOOOp", &j->paths[0], &j->paths[1], &j->paths[2], &parts,
                          &j->drop_cached)) {
        j->paths[0] = j->paths[1] = j->paths[2] = NULL; /* borrowed: not ours to release */
        goto fail;
    }
    for (int i = 0; i < 3; i++)
        Py_INCREF(j->paths[i]);
    for (int i = 0; i < 3; i++)
        if (!PyUnicode_FSConverter(j->paths[i], &j->bytes[i]))
            goto fail;
    fast = PySequence_Fast(parts, "parts must be a sequence of buffers");
    if (fast == NULL)
        goto fail;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    j->views = PyMem_Calloc(n ? (size_t)n : 1, sizeof(Py_buffer));
    j->iov = PyMem_Calloc(n ? (size_t)n : 1, sizeof(struct iovec));
    if (j->views == NULL || j->iov == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (; j->held < n; j->held++) {
        Py_buffer *v = &j->views[j->held];
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(fast, j->held), v, PyBUF_SIMPLE) < 0)
            goto fail;
        j->iov[j->held].iov_base = v->buf;
        j->iov[j->held].iov_len = (size_t)v->len;
    }
    Py_DECREF(fast);
    return j;
fail:
    Py_XDECREF(fast);
    job_free(j);
    return NULL;
}

static void job_run(job *j, staging *s) {
    j->err = durable_write(PyBytes_AS_STRING(j->bytes[0]), PyBytes_AS_STRING(j->bytes[1]),
                           PyBytes_AS_STRING(j->bytes[2]), j->iov, j->held, j->drop_cached, s,
                           &j->step);
}

/* The path of the step that failed (a new reference), or None. */
static PyObject *job_failed_path(job *j) {
    if (!j->err)
        Py_RETURN_NONE;
    PyObject *p = j->paths[j->step == STEP_DIR ? 2 : (j->step == STEP_FINAL ? 1 : 0)];
    return Py_NewRef(p);
}

static PyObject *put(PyObject *self, PyObject *args) {
    (void)self;
    job *j = job_new(args);
    if (j == NULL)
        return NULL;
    staging s = {NULL, 0};
    Py_BEGIN_ALLOW_THREADS
    job_run(j, &s);
    staging_free(&s);
    Py_END_ALLOW_THREADS
    PyObject *result = NULL;
    if (j->err) {
        PyObject *where = job_failed_path(j);
        errno = j->err;
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, where);
        Py_DECREF(where);
    } else {
        result = Py_NewRef(Py_None);
    }
    job_free(j);
    return result;
}

/* -- Writer: the writes on a thread of their own ---------------------------------------- */

typedef struct {
    PyObject_HEAD
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job *todo, *todo_tail; /* submitted, not yet written */
    job *done, *done_tail; /* written, not yet collected */
    int efd;
    int started, closing;
    pthread_t thread;
    unsigned long long next_id;
    staging stage; /* the thread's own */
} Writer;

static void *writer_run(void *arg) {
    Writer *w = arg;
    /* Named, for top and py-spy. SCHED_BATCH: woken by a submit, the thread does not take
       the CPU from the event loop's thread that woke it (on a 2-vCPU VM the loop's thread
       was preempted inside submit() for the writer's copy and write: ~5% of its samples at
       full speed were "in submit"); it runs when a CPU is free or at the loop's next wait.
       Both are hints: nothing fails without them. */
    (void)pthread_setname_np(pthread_self(), "floe-wal-write");
    struct sched_param none = {0};
    (void)pthread_setschedparam(pthread_self(), SCHED_BATCH, &none);
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (w->todo == NULL && !w->closing)
            pthread_cond_wait(&w->cv, &w->mu);
        job *j = w->todo;
        if (j == NULL) /* closing, and everything submitted written */
            break;
        w->todo = j->next;
        if (w->todo == NULL)
            w->todo_tail = NULL;
        pthread_mutex_unlock(&w->mu);
        job_run(j, &w->stage); /* no GIL: only the job's and the thread's own memory */
        if (w->stage.cap > STAGING_KEPT)
            staging_free(&w->stage);
        pthread_mutex_lock(&w->mu);
        j->next = NULL;
        if (w->done_tail)
            w->done_tail->next = j;
        else
            w->done = j;
        w->done_tail = j;
        uint64_t one = 1;
        ssize_t r;
        do /* cannot overflow: completed() reads it down before taking the list */
            r = write(w->efd, &one, sizeof one);
        while (r < 0 && errno == EINTR);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

static PyObject *Writer_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (PyTuple_GET_SIZE(args) || (kwds != NULL && PyDict_GET_SIZE(kwds))) {
        PyErr_SetString(PyExc_TypeError, "Writer() takes no arguments");
        return NULL;
    }
    Writer *w = (Writer *)type->tp_alloc(type, 0);
    if (w == NULL)
        return NULL;
    w->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (w->efd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        Py_DECREF(w);
        return NULL;
    }
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    return (PyObject *)w;
}

/* Stop the thread once it has written everything submitted (without the GIL meanwhile). */
static void writer_stop(Writer *w) {
    pthread_mutex_lock(&w->mu);
    w->closing = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    if (w->started) {
        Py_BEGIN_ALLOW_THREADS
        pthread_join(w->thread, NULL);
        Py_END_ALLOW_THREADS
        w->started = 0;
    }
}

static void Writer_dealloc(Writer *w) {
    if (w->efd >= 0) { /* fully made */
        writer_stop(w);
        for (job *j = w->done; j != NULL;) {
            job *next = j->next;
            job_free(j);
            j = next;
        }
        close(w->efd);
        staging_free(&w->stage);
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
    }
    Py_TYPE(w)->tp_free((PyObject *)w);
}

static PyObject *Writer_submit(Writer *w, PyObject *args) {
    job *j = job_new(args);
    if (j == NULL)
        return NULL;
    pthread_mutex_lock(&w->mu);
    if (w->closing) {
        pthread_mutex_unlock(&w->mu);
        job_free(j);
        PyErr_SetString(PyExc_ValueError, "the writer is closed");
        return NULL;
    }
    if (!w->started) { /* the thread blocks every signal: they stay the main thread's */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        int err = pthread_create(&w->thread, NULL, writer_run, w);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (err) {
            pthread_mutex_unlock(&w->mu);
            job_free(j);
            errno = err;
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        w->started = 1;
    }
    j->id = ++w->next_id;
    if (w->todo_tail)
        w->todo_tail->next = j;
    else
        w->todo = j;
    w->todo_tail = j;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return PyLong_FromUnsignedLongLong(j->id);
}

static PyObject *Writer_completed(Writer *w, PyObject *Py_UNUSED(ignored)) {
    /* the count first, then the list: a write finished in between counts again */
    uint64_t count;
    while (read(w->efd, &count, sizeof count) < 0 && errno == EINTR)
        ;
    pthread_mutex_lock(&w->mu);
    job *j = w->done;
    w->done = w->done_tail = NULL;
    pthread_mutex_unlock(&w->mu);
    PyObject *out = PyList_New(0);
    for (; j != NULL;) {
        job *next = j->next;
        if (out != NULL) {
            PyObject *path = job_failed_path(j);
            PyObject *item = Py_BuildValue("(KiN)", j->id, j->err, path);
            if (item == NULL || PyList_Append(out, item) < 0)
                Py_CLEAR(out);
            Py_XDECREF(item);
        }
        job_free(j);
        j = next;
    }
    return out;
}

static PyObject *Writer_fileno(Writer *w, PyObject *Py_UNUSED(ignored)) {
    return PyLong_FromLong(w->efd);
}

static PyObject *Writer_close(Writer *w, PyObject *Py_UNUSED(ignored)) {
    writer_stop(w);
    Py_RETURN_NONE;
}

static PyMethodDef writer_methods[] = {
    {"submit", (PyCFunction)Writer_submit, METH_VARARGS,
     "submit(tmp, final, directory, parts, drop_cached) -> id: queue a write as put() does it"},
    {"completed", (PyCFunction)Writer_completed, METH_NOARGS,
     "completed() -> [(id, errno or 0, path of the failed step or None)]"},
    {"fileno", (PyCFunction)Writer_fileno, METH_NOARGS,
     "fileno() -> the eventfd readable once a write has finished"},
    {"close", (PyCFunction)Writer_close, METH_NOARGS,
     "close(): write what was submitted, then stop the thread"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject WriterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "s3stream._durable.Writer",
    .tp_basicsize = sizeof(Writer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Durable writes on a thread that never takes the GIL (see the module's comment).",
    .tp_new = Writer_new,
    .tp_dealloc = (destructor)Writer_dealloc,
    .tp_methods = writer_methods,
};

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

PyMODINIT_FUNC PyInit__durable(void) {
    if (PyType_Ready(&WriterType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Writer", (PyObject *)&WriterType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
