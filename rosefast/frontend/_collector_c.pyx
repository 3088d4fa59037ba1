# cython: language_level=3
"""StreamOutputCollector, compiled. Same behaviour as _collector_py.

The waiting chunk is held as two C arrays of owned references (token id objects, text pieces):
a merge is a type check and a few pointer stores; the list and the string are built once, at take.
Each call is GIL-atomic: no Python code runs between reading and updating the state.
"""
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.ref cimport PyObject
from libc.string cimport memcpy

from rosefast.frontend._collector_py import check_logprobs, chunk_fields, chunk_repr, chunks_equal, plain_delta


cdef extern from "ptrvec.h":
    void rf_ptrvec_init(rf_ptrvec *v)
    int rf_ptrvec_reserve(rf_ptrvec *v, size_t extra)
    void rf_ptrvec_push_unchecked(rf_ptrvec *v, void *p)
    void rf_ptrvec_free(rf_ptrvec *v)


cdef extern from "Python.h":
    ctypedef unsigned char Py_UCS1
    ctypedef unsigned short Py_UCS2
    ctypedef struct PyTypeObject:
        pass
    PyTypeObject PyUnicode_Type, PyList_Type, PyTuple_Type
    PyObject *_None "Py_None"
    PyObject *_True "Py_True"
    PyObject *_False "Py_False"
    # the same macros on borrowed pointers: no temporary reference per item, as an `object` would take
    void _incref "Py_INCREF" (PyObject *)
    void _decref "Py_DECREF" (PyObject *)
    Py_ssize_t _len "PyUnicode_GET_LENGTH" (PyObject *)
    int _kind "PyUnicode_KIND" (PyObject *)
    char *_data "PyUnicode_DATA" (PyObject *)
    unsigned int _maxchar "PyUnicode_MAX_CHAR_VALUE" (PyObject *)
    PyTypeObject *_type "Py_TYPE" (PyObject *)
    Py_ssize_t _seq_size "PySequence_Fast_GET_SIZE" (PyObject *)
    PyObject **_seq_items "PySequence_Fast_ITEMS" (PyObject *)
    object PyUnicode_New(Py_ssize_t size, unsigned int maxchar)


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


cdef inline int _merge(StreamOutputCollector self, PyObject *token_ids, PyObject *text, bint finished,
                       PyObject *finish_reason, PyObject *logprobs) except -1:
    """Store or merge one delta. The references are borrowed: no Python code runs on this path (the rare
    delta of other types goes to _put_other, which takes its own references first)."""
    cdef Py_ssize_t i, n, length
    cdef PyObject **items
    cdef unsigned int maxchar
    # Validate (and reserve) before touching anything: a bad delta leaves the waiting chunk as it was.
    if _type(text) != &PyUnicode_Type \
            or (_type(token_ids) != &PyList_Type and _type(token_ids) != &PyTuple_Type) \
            or (finish_reason != _None and _type(finish_reason) != &PyUnicode_Type) \
            or (logprobs != _None and ((_type(logprobs) != &PyList_Type and _type(logprobs) != &PyTuple_Type)
                                       or _seq_size(logprobs) != _seq_size(token_ids))):
        return self._put_other(<object>token_ids, <object>text, finished, <object>finish_reason, <object>logprobs)
    n = _seq_size(token_ids)
    if rf_ptrvec_reserve(&self._ids, n) < 0 or rf_ptrvec_reserve(&self._pieces, 1) < 0 \
            or (logprobs != _None and rf_ptrvec_reserve(&self._logprobs, n) < 0):
        raise MemoryError()
    items = _seq_items(token_ids)            # a list's or a tuple's item array
    for i in range(n):
        _incref(items[i])
        rf_ptrvec_push_unchecked(&self._ids, <void *>items[i])
    if logprobs != _None:                    # one entry per token, kept beside them
        items = _seq_items(logprobs)
        for i in range(n):
            _incref(items[i])
            rf_ptrvec_push_unchecked(&self._logprobs, <void *>items[i])
        self._has_logprobs = True
    length = _len(text)
    if length:
        _incref(text)
        rf_ptrvec_push_unchecked(&self._pieces, <void *>text)
        self._text_len += length
        maxchar = _maxchar(text)
        if maxchar > self._maxchar:
            self._maxchar = maxchar
    if not self._has:
        self._finished = finished
        self._reason = <object>finish_reason
        self._has = True
        return self._error is None
    if finished:
        self._finished = True
    if finish_reason != _None and _len(finish_reason):   # the last non-empty reason wins
        self._reason = <object>finish_reason
    self.merges += 1
    return 0


cdef class StreamOutputCollector:
    def __cinit__(self):
        rf_ptrvec_init(&self._ids)
        rf_ptrvec_init(&self._pieces)
        rf_ptrvec_init(&self._logprobs)

    def __dealloc__(self):
        _release_all(&self._ids)
        _release_all(&self._pieces)
        _release_all(&self._logprobs)
        rf_ptrvec_free(&self._ids)
        rf_ptrvec_free(&self._pieces)
        rf_ptrvec_free(&self._logprobs)

    cdef int _put_other(self, object token_ids, object text, bint finished, object finish_reason,
                        object logprobs) except -1:
        """The rare delta that is not exactly (list | tuple, str, None | str, None | list | tuple of one entry per
        token): checked, then read as plain types. plain_delta's frame holds its own references while the checks
        and conversions run Python code."""
        cdef object ids, piece, reason
        ids, piece, reason = plain_delta(token_ids, text, finish_reason)   # raises for the wrong types
        check_logprobs(ids, logprobs)                                        # and for entries that do not line up
        return _merge(self, <PyObject *>ids, <PyObject *>piece, finished, <PyObject *>reason, <PyObject *>logprobs)

    cdef int _put(self, PyObject *token_ids, PyObject *text, bint finished, PyObject *finish_reason,
                  PyObject *logprobs) except -1:
        """Store or merge one delta given as borrowed references (the fan-out's entry)."""
        return _merge(self, token_ids, text, finished, finish_reason, logprobs)

    def put(self, token_ids, text, finished, finish_reason, logprobs=None):
        """Store or merge one delta (its tokens' logprob entries with it, one per token, when asked); True when
        the collector went from empty to ready."""
        return _merge(self, <PyObject *>token_ids, <PyObject *>text, finished, <PyObject *>finish_reason,
                      <PyObject *>logprobs) == 1

    def put_nowait(self, chunk):
        """Store or merge `chunk` (any object with the four fields); True when it became ready."""
        cdef PyObject *finished
        if type(chunk) is StreamChunk:
            finished = <PyObject *>(<StreamChunk>chunk).finished
            if finished == _True or finished == _False:
                # The fields are read in place (borrowed): the caller's reference to the chunk keeps them
                # alive, and no Python code runs until the merge is done (a `finished` that is not a bool
                # could: its truth is taken on the other path, which holds its own references).
                return _merge(self, <PyObject *>(<StreamChunk>chunk).token_ids,
                              <PyObject *>(<StreamChunk>chunk).text, finished == _True,
                              <PyObject *>(<StreamChunk>chunk).finish_reason,
                              <PyObject *>(<StreamChunk>chunk).logprobs) == 1
        return self._put_fields(chunk)

    cdef object _put_fields(self, object chunk):
        """put_nowait of any other object with the four fields, or of a StreamChunk whose `finished` is not a
        bool: the fields are owned here before Python code can run (its own frame: the common path stays small)."""
        token_ids, text, finished, finish_reason = chunk_fields(chunk)
        logprobs = getattr(chunk, "logprobs", None)
        return _merge(self, <PyObject *>token_ids, <PyObject *>text, finished, <PyObject *>finish_reason,
                      <PyObject *>logprobs) == 1

    def put_error(self, exc):
        """Fail the stream: the consumer gets `exc` raised after the chunk already waiting."""
        if not isinstance(exc, BaseException):
            raise TypeError(f"put_error needs an exception, not {type(exc).__name__}")
        was_ready = self._has or self._error is not None
        self._error = exc
        return not was_ready

    cdef object _take_text(self):
        cdef size_t i, n = self._pieces.len
        cdef Py_ssize_t pos = 0, length, j, nbytes
        cdef int kind, piece_kind
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
        kind = _kind(<PyObject *>text)
        data = _data(<PyObject *>text)
        for i in range(n):
            # Decode pieces are a few code points: copied (or widened) here, not through a C API call each.
            piece = <PyObject *>self._pieces.items[i]
            length = _len(piece)
            piece_kind = _kind(piece)
            src = _data(piece)
            if piece_kind == kind:
                nbytes = length * kind
                if nbytes <= 32:
                    for j in range(nbytes):
                        data[pos * kind + j] = src[j]
                else:
                    memcpy(data + pos * kind, src, nbytes)
            elif kind == 4:            # one wide character makes the whole text UCS4: widen the rest
                if piece_kind == 1:
                    for j in range(length):
                        (<Py_UCS4 *>data)[pos + j] = (<Py_UCS1 *>src)[j]
                else:
                    for j in range(length):
                        (<Py_UCS4 *>data)[pos + j] = (<Py_UCS2 *>src)[j]
            else:                      # UCS2 text, one-byte piece
                for j in range(length):
                    (<Py_UCS2 *>data)[pos + j] = (<Py_UCS1 *>src)[j]
            pos += length
            _decref(piece)             # a plain str: freeing it runs no Python code
        self._pieces.len = 0
        return text

    cpdef object get_nowait(self):
        """The waiting (merged) chunk as a fresh object the consumer owns, or None."""
        cdef StreamChunk chunk
        cdef Py_ssize_t i, n, m
        cdef bint has_logprobs
        cdef list ids
        cdef object logprobs
        if not self._has:
            if self._error is not None:
                raise self._error
            return None
        # Both allocations may run the GC, and so finalizers and other threads, which may put: they come
        # before any state is read (the list's length is checked again), and nothing after them allocates.
        chunk = StreamChunk.__new__(StreamChunk)
        while True:
            n = <Py_ssize_t>self._ids.len
            m = <Py_ssize_t>self._logprobs.len
            has_logprobs = self._has_logprobs
            ids = PyList_New(n)
            logprobs = PyList_New(m) if has_logprobs else None
            if n == <Py_ssize_t>self._ids.len and m == <Py_ssize_t>self._logprobs.len \
                    and has_logprobs == self._has_logprobs:
                break
        for i in range(n):           # the list takes over the references
            PyList_SET_ITEM(ids, i, <object>self._ids.items[i])
        self._ids.len = 0
        if has_logprobs:
            for i in range(m):
                PyList_SET_ITEM(logprobs, i, <object>self._logprobs.items[i])
            self._logprobs.len = 0
            self._has_logprobs = False
        chunk.token_ids = ids
        chunk.logprobs = logprobs
        chunk.text = self._take_text()
        chunk.finished = self._finished
        chunk.finish_reason = self._reason
        chunk.merged = self.merges - self._merges_taken
        self._merges_taken = self.merges
        self._text_len = 0
        self._maxchar = 0
        self._reason = None
        self._finished = False
        self._has = False
        return chunk

    @property
    def ready(self):
        return self._has or self._error is not None
