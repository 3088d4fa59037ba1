"""Admission counter: refuse a request at once when `limit` requests are in flight.

    counter = AdmissionCounter(limit=64)    # limit=None: unlimited
    if not counter.try_acquire():           # one integer check; the caller answers 429
        ...
    counter.release()                       # exactly once per accepted request

`limit` may change at run time (lowering it below `inflight` refuses new requests until enough
release). `inflight` is never negative: a release without an acquire raises RuntimeError.
`accepted_total` and `rejected_total` count every decision. Safe from several threads: the compiled
flavour does each call under the GIL without releasing it; the pure twin takes a native lock.
"""
from rosefast._select import select

impl = select("admission")
AdmissionCounter = impl.AdmissionCounter

__all__ = ["AdmissionCounter"]
