"""Grammar compiles on native threads of their own (ROSEFAST_GRAMMAR_THREADS), waited for by greenlets.

    pool = GrammarPool(2)
    grammar = pool.run(key, lambda: grammars.compile(kind, value), timeout)   # TimeoutError past `timeout`

Identical compiles in flight are merged: a request whose key is being compiled waits on that compile. A
compile whose waiters have all given up before a thread takes it is dropped unrun (abandoned); one already
running finishes (llguidance cannot be stopped mid-way) and the grammar cache keeps its result for the next
request. Nothing here shares gevent's own thread pool (its DNS lookups, its other blocking calls).
"""


class Abandoned(Exception):
    """The compile was dropped before it ran: every request that wanted it had timed out."""


class _Job:
    __slots__ = ("result", "waiters")

    def __init__(self):
        self.result, self.waiters = None, 0


class GrammarPool:
    def __init__(self, threads):
        self.threads = threads
        self._pool = None
        self._jobs = {}   # key -> _Job in flight (touched by greenlets on the hub; popped by the pool's threads)
        self.runs = self.merged = self.abandoned = 0

    def run(self, key, fn, timeout):
        """fn()'s value (its exception re-raised), computed once for every waiter of `key` in flight; this
        greenlet waits at most `timeout` seconds (None: as long as it takes), then TimeoutError."""
        import gevent

        if self._pool is None:
            from gevent.threadpool import ThreadPool

            self._pool = ThreadPool(self.threads)
        while True:
            job = self._jobs.get(key)
            if job is None:
                job = self._jobs[key] = _Job()
                job.waiters += 1   # before the thread can look
                job.result = self._pool.spawn(self._call, key, job, fn)
            else:
                self.merged += 1
                job.waiters += 1
            try:
                value, error = job.result.get(timeout=timeout)
            except gevent.Timeout:
                raise TimeoutError from None
            finally:
                job.waiters -= 1
            if isinstance(error, Abandoned):   # it was dropped just as this request joined it: compile anew
                continue
            if error is not None:
                raise error
            return value

    def _call(self, key, job, fn):
        """On a pool thread: (value, None) or (None, the exception)."""
        try:
            if job.waiters == 0:
                self.abandoned += 1
                return None, Abandoned()
            self.runs += 1
            return fn(), None
        except Exception as e:  # noqa: BLE001 - re-raised in the waiting greenlets
            return None, e
        finally:
            if self._jobs.get(key) is job:
                del self._jobs[key]
