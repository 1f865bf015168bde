/* Where the whole events of a segment's bytes start: the one per-event loop of a segment read,
 * in C. The same rule as protocol/event_frames.py's Python fallback (which documents it):
 *
 *   starts(buffer, max_event_size) -> (starts, stop, bad)
 *
 * starts: bytes, the native int32 positions of the whole events' 8-byte headers; stop: where the
 * last whole event ends; bad: the position of a header that is not an event's (type other than 0,
 * or a length above max_event_size), else -1. The walk stops at a bad header or at an event the
 * buffer does not hold whole. Buffers of 2 GiB or more are refused (ValueError): positions are
 * int32, as Arrow's binary offsets are. Optional: without a C compiler the Python loop is used.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

static PyObject *
event_starts(PyObject *module, PyObject *args)
{
    Py_buffer view;
    long long max_event_size;
    if (!PyArg_ParseTuple(args, "y*L", &view, &max_event_size))
        return NULL;
    if (view.len > INT32_MAX) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "buffers of 2 GiB or more are not split here");
        return NULL;
    }
    const unsigned char *buf = (const unsigned char *)view.buf;
    Py_ssize_t len = view.len, pos = 0, count = 0, bad = -1;
    /* At most one event per 8 bytes: the result is cut to size below. */
    PyObject *out = PyBytes_FromStringAndSize(NULL, (len / 8) * (Py_ssize_t)sizeof(int32_t));
    if (out == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    int32_t *starts = (int32_t *)PyBytes_AS_STRING(out);
    Py_BEGIN_ALLOW_THREADS
    while (pos + 8 <= len) {
        const unsigned char *h = buf + pos;
        /* type (int32, 0 for an event) and length (uint32), both big-endian: one 64-bit number
           that equals the length exactly when the header is an event's */
        uint64_t word = ((uint64_t)h[0] << 56) | ((uint64_t)h[1] << 48) | ((uint64_t)h[2] << 40) |
                        ((uint64_t)h[3] << 32) | ((uint64_t)h[4] << 24) | ((uint64_t)h[5] << 16) |
                        ((uint64_t)h[6] << 8) | (uint64_t)h[7];
        if (max_event_size < 0 || word > (uint64_t)max_event_size) {
            bad = pos;
            break;
        }
        if (word > (uint64_t)(len - pos - 8)) /* cut off by the buffer's end (no overflow) */
            break;
        starts[count++] = (int32_t)pos;
        pos += 8 + (Py_ssize_t)word;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (_PyBytes_Resize(&out, count * (Py_ssize_t)sizeof(int32_t)) < 0)
        return NULL;
    return Py_BuildValue("(Nnn)", out, pos, bad);
}

static PyMethodDef methods[] = {
    {"event_starts", event_starts, METH_VARARGS,
     "event_starts(buffer, max_event_size) -> (starts: bytes of native int32, stop, bad position or -1)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_event_frames", "The event-header walk of a segment read, in C.", -1, methods,
};

PyMODINIT_FUNC
PyInit__event_frames(void)
{
    return PyModule_Create(&module);
}
