# cython: language_level=3
"""StreamOutputCollector, compiled. Same behaviour as _collector_py.

The waiting chunk is held as two C arrays of owned references (token id objects, text pieces):
a merge is a type check and a few pointer stores; the list and the string are built once, at take.
Each call is GIL-atomic: no Python code runs between reading and updating the state.
"""
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.ref cimport Py_DECREF, Py_INCREF, PyObject
from libc.string cimport memcpy

from rosefast.frontend._collector_py import check_delta, chunk_fields, chunk_repr, chunks_equal


cdef extern from "ptrvec.h":
    void rf_ptrvec_init(rf_ptrvec *v)
    int rf_ptrvec_reserve(rf_ptrvec *v, size_t extra)
    void rf_ptrvec_push_unchecked(rf_ptrvec *v, void *p)
    void rf_ptrvec_free(rf_ptrvec *v)


cdef extern from "Python.h":
    Py_ssize_t PySequence_Fast_GET_SIZE(object)
    PyObject **PySequence_Fast_ITEMS(object)
    # the same macros on borrowed pointers: no temporary reference per item, as an `object` would take
    void _incref "Py_INCREF" (PyObject *)
    void _decref "Py_DECREF" (PyObject *)
    Py_ssize_t _len "PyUnicode_GET_LENGTH" (PyObject *)
    int _kind "PyUnicode_KIND" (PyObject *)
    char *_data "PyUnicode_DATA" (PyObject *)
    Py_ssize_t PyUnicode_GET_LENGTH(object)
    unsigned int PyUnicode_MAX_CHAR_VALUE(object)
    object PyUnicode_New(Py_ssize_t size, unsigned int maxchar)
    int PyUnicode_KIND(object)
    void *PyUnicode_DATA(object)
    Py_ssize_t PyUnicode_CopyCharacters(object to, Py_ssize_t to_start, object frm, Py_ssize_t frm_start,
                                        Py_ssize_t how_many) except -1


cdef class StreamChunk:
    def __init__(self, token_ids, text, finished=False, finish_reason=None):
        self.token_ids = token_ids
        self.text = text
        self.finished = finished
        self.finish_reason = finish_reason

    def __eq__(self, other):
        return chunks_equal(self, other)

    def __repr__(self):
        return chunk_repr(self)


cdef inline void _release_all(rf_ptrvec *v):
    cdef size_t i
    for i in range(v.len):
        _decref(<PyObject *>v.items[i])
    v.len = 0


cdef class StreamOutputCollector:
    def __cinit__(self):
        rf_ptrvec_init(&self._ids)
        rf_ptrvec_init(&self._pieces)

    def __dealloc__(self):
        _release_all(&self._ids)
        _release_all(&self._pieces)
        rf_ptrvec_free(&self._ids)
        rf_ptrvec_free(&self._pieces)

    cdef int _put_other(self, object token_ids, object text, bint finished, object finish_reason) except -1:
        """The rare delta that is not exactly (list | tuple, str, None | str): checked, then read as plain types."""
        check_delta(token_ids, text, finish_reason)      # raises for the wrong types
        return self._put(list(token_ids), str(text), finished, finish_reason)

    cdef int _put(self, object token_ids, object text, bint finished, object finish_reason) except -1:
        # Parameters are never rebound here: Cython then borrows them (no reference traffic per merge).
        cdef Py_ssize_t i, n
        cdef PyObject **items
        cdef unsigned int maxchar
        # Validate (and reserve) before touching anything: a bad delta leaves the waiting chunk as it was.
        if type(text) is not str or (type(token_ids) is not list and type(token_ids) is not tuple) \
                or (finish_reason is not None and type(finish_reason) is not str):
            return self._put_other(token_ids, text, finished, finish_reason)
        n = PySequence_Fast_GET_SIZE(token_ids)
        if rf_ptrvec_reserve(&self._ids, n) < 0 or rf_ptrvec_reserve(&self._pieces, 1) < 0:
            raise MemoryError()
        items = PySequence_Fast_ITEMS(token_ids)           # a list's or a tuple's item array
        for i in range(n):
            _incref(items[i])
            rf_ptrvec_push_unchecked(&self._ids, <void *>items[i])
        if PyUnicode_GET_LENGTH(text):
            Py_INCREF(text)
            rf_ptrvec_push_unchecked(&self._pieces, <void *>text)
            self._text_len += PyUnicode_GET_LENGTH(text)
            maxchar = PyUnicode_MAX_CHAR_VALUE(text)
            if maxchar > self._maxchar:
                self._maxchar = maxchar
        if not self._has:
            self._finished = finished
            self._reason = finish_reason
            self._has = True
            return self._error is None
        if finished:
            self._finished = True
        if finish_reason:
            self._reason = finish_reason
        self.merges += 1
        return 0

    def put(self, token_ids, text, finished, finish_reason):
        """Store or merge one delta; True when the collector went from empty to ready."""
        return self._put(token_ids, text, finished, finish_reason) == 1

    def put_nowait(self, chunk):
        """Store or merge `chunk` (any object with the four fields); True when it became ready."""
        if type(chunk) is StreamChunk:
            return self._put((<StreamChunk>chunk).token_ids, (<StreamChunk>chunk).text,
                             (<StreamChunk>chunk).finished, (<StreamChunk>chunk).finish_reason) == 1
        token_ids, text, finished, finish_reason = chunk_fields(chunk)
        return self._put(token_ids, text, finished, finish_reason) == 1

    def put_error(self, exc):
        """Fail the stream: the consumer gets `exc` raised after the chunk already waiting."""
        if not isinstance(exc, BaseException):
            raise TypeError(f"put_error needs an exception, not {type(exc).__name__}")
        was_ready = self._has or self._error is not None
        self._error = exc
        return not was_ready

    cdef object _take_text(self):
        cdef size_t i, n = self._pieces.len
        cdef Py_ssize_t pos = 0, length, b, nbytes
        cdef int kind
        cdef char *data
        cdef char *src
        cdef PyObject *piece
        if n == 0:
            return ""
        if n == 1:
            text = <object>self._pieces.items[0]
            _decref(<PyObject *>self._pieces.items[0])   # `text` holds it now
            self._pieces.len = 0
            return text
        text = PyUnicode_New(self._text_len, self._maxchar)  # a str is not GC-tracked: no Python code runs
        kind = PyUnicode_KIND(text)
        data = <char *>PyUnicode_DATA(text)
        for i in range(n):
            piece = <PyObject *>self._pieces.items[i]
            length = _len(piece)
            if _kind(piece) == kind:   # same width: a plain copy (decode pieces are a few bytes: inline)
                nbytes = length * kind
                src = _data(piece)
                if nbytes <= 32:
                    for b in range(nbytes):
                        data[pos * kind + b] = src[b]
                else:
                    memcpy(data + pos * kind, src, nbytes)
            else:                      # narrower piece: widened by CPython
                PyUnicode_CopyCharacters(text, pos, <object>piece, 0, length)
            pos += length
        _release_all(&self._pieces)
        return text

    cpdef object get_nowait(self):
        """The waiting (merged) chunk as a fresh object the consumer owns, or None."""
        cdef StreamChunk chunk
        cdef Py_ssize_t i, n
        cdef list ids
        if not self._has:
            if self._error is not None:
                raise self._error
            return None
        while True:
            n = <Py_ssize_t>self._ids.len
            ids = PyList_New(n)      # may run the GC, and so other threads: check the length again
            if n == <Py_ssize_t>self._ids.len:
                break
        for i in range(n):           # the list takes over the references
            PyList_SET_ITEM(ids, i, <object>self._ids.items[i])
        self._ids.len = 0
        chunk = StreamChunk.__new__(StreamChunk)
        chunk.token_ids = ids
        chunk.text = self._take_text()
        chunk.finished = self._finished
        chunk.finish_reason = self._reason
        self._text_len = 0
        self._maxchar = 0
        self._reason = None
        self._finished = False
        self._has = False
        return chunk

    @property
    def ready(self):
        return self._has or self._error is not None
