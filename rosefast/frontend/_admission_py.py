"""Admission counter, pure Python: the reference for _admission_c.pyx."""
from rosefast._native import native_lock


def check_limit(limit):
    """Validate a limit: None (unlimited) or an int >= 0."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"limit must be None or an int >= 0, not {type(limit).__name__}")
    if limit < 0:
        raise ValueError(f"limit must be None or an int >= 0, got {limit}")
    return limit


RELEASE_ERROR = "release() without a matching try_acquire(): nothing is in flight"


class AdmissionCounter:
    __slots__ = ("_limit", "_inflight", "_accepted", "_rejected", "_lock")

    def __init__(self, limit=None):
        self._limit = check_limit(limit)
        self._inflight = 0
        self._accepted = 0
        self._rejected = 0
        # Python bytecode can switch threads between the check and the increment: serialize.
        self._lock = native_lock()

    def try_acquire(self):
        with self._lock:
            if self._limit is not None and self._inflight >= self._limit:
                self._rejected += 1
                return False
            self._inflight += 1
            self._accepted += 1
            return True

    def release(self):
        with self._lock:
            if self._inflight <= 0:
                raise RuntimeError(RELEASE_ERROR)
            self._inflight -= 1

    @property
    def limit(self):
        return self._limit

    @limit.setter
    def limit(self, value):
        self._limit = check_limit(value)

    @property
    def inflight(self):
        return self._inflight

    @property
    def accepted_total(self):
        return self._accepted

    @property
    def rejected_total(self):
        return self._rejected

    def __repr__(self):
        return (f"AdmissionCounter(limit={self._limit}, inflight={self._inflight}, "
                f"accepted_total={self._accepted}, rejected_total={self._rejected})")
