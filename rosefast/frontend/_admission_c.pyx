# cython: language_level=3
"""Admission counter, compiled. Each method runs under the GIL without releasing it: atomic."""
from libc.stdint cimport int64_t, uint64_t

from rosefast.frontend._admission_py import RELEASE_ERROR, check_limit


cdef extern from "admission.h":
    ctypedef struct rf_admission:
        int64_t limit
        int64_t inflight
        uint64_t accepted_total
        uint64_t rejected_total
    void rf_admission_init(rf_admission *a, int64_t limit)
    int rf_admission_try_acquire(rf_admission *a)
    int rf_admission_release(rf_admission *a)


cdef class AdmissionCounter:
    cdef rf_admission _state

    def __init__(self, limit=None):
        limit = check_limit(limit)
        rf_admission_init(&self._state, -1 if limit is None else limit)

    cpdef bint try_acquire(self):
        return rf_admission_try_acquire(&self._state)

    cpdef release(self):
        if rf_admission_release(&self._state) < 0:
            raise RuntimeError(RELEASE_ERROR)

    @property
    def limit(self):
        return None if self._state.limit < 0 else self._state.limit

    @limit.setter
    def limit(self, value):
        value = check_limit(value)
        self._state.limit = -1 if value is None else value

    @property
    def inflight(self):
        return self._state.inflight

    @property
    def accepted_total(self):
        return self._state.accepted_total

    @property
    def rejected_total(self):
        return self._state.rejected_total

    def __repr__(self):
        return (f"AdmissionCounter(limit={self.limit}, inflight={self.inflight}, "
                f"accepted_total={self.accepted_total}, rejected_total={self.rejected_total})")
