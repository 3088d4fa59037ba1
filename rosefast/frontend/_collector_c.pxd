from cpython.ref cimport PyObject


cdef extern from "ptrvec.h":
    ctypedef struct rf_ptrvec:
        void **items
        size_t len
        size_t cap


cdef class StreamChunk:
    cdef public object token_ids
    cdef public object text
    cdef public object finished
    cdef public object finish_reason
    cdef public Py_ssize_t merged   # set by the collector: how many later deltas were merged into this one
    # logprobs: its tokens' logprob entries, one per token, merged with them (when asked); set by the manager's
    # stream, never read or merged by the collector: its prompt's length and the prompt tokens the prefix cache
    # served; on a choice's final chunk the stop string that ended it; with several choices or prompt logprobs,
    # the choice's index, its prompt's logprobs
    cdef public object prompt_tokens
    cdef public object cached_tokens
    cdef public object stop_string
    cdef public object index
    cdef public object logprobs
    cdef public object prompt_logprobs


cimport cython


@cython.final   # cdef methods called directly (no vtable), so the C compiler can inline the merge
cdef class StreamOutputCollector:
    cdef rf_ptrvec _ids        # owned references to the waiting chunk's token id objects
    cdef rf_ptrvec _pieces     # owned references to its non-empty text pieces
    cdef rf_ptrvec _logprobs   # owned references to its tokens' logprob entries (when a delta brought some)
    cdef bint _has_logprobs
    cdef Py_ssize_t _text_len  # total code points in _pieces
    cdef unsigned int _maxchar
    cdef bint _finished
    cdef object _reason
    cdef bint _has
    cdef object _error
    cdef readonly Py_ssize_t merges
    cdef Py_ssize_t _merges_taken   # `merges` at the last take

    cdef int _put(self, PyObject *token_ids, PyObject *text, bint finished, PyObject *finish_reason,
                  PyObject *logprobs) except -1
    cdef int _put_other(self, object token_ids, object text, bint finished, object finish_reason,
                        object logprobs) except -1
    cdef object _put_fields(self, object chunk)
    cpdef object get_nowait(self)
    cdef object _take_text(self)
