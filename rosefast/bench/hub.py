"""The in-process benchmark's consumers as the server has them: a greenlet per stream, all on one native thread
running a gevent hub of its own, woken once per engine step (GeventWaker). The earlier driver made an OS thread per
request (2,000 for --num-requests 2000), all woken each step, each wanting the GIL beside the arrival loop."""
import _queue
import threading
from collections import deque

from rosefast.frontend.waker import GeventWaker


class HubConsumers:
    """`spawn(fn, *args)` from any thread runs fn(*args) as a greenlet on the hub's thread; `waker` is the
    GeventWaker a SchedulerManager takes (made on that thread, as it must be); `close()` ends the thread."""

    def __init__(self):
        made = _queue.SimpleQueue()
        self._inbox = deque()   # (fn, args): appended by any thread, taken in the hub
        self._thread = threading.Thread(target=self._run, args=(made,), name="rosefast-bench-hub", daemon=True)
        self._thread.start()
        self.waker, self._watcher = made.get()

    def _run(self, made):
        import gevent
        from gevent.event import Event

        hub = gevent.get_hub()   # this thread's own
        self._done = Event()
        watcher = hub.loop.async_()
        watcher.start(self._take)
        made.put((GeventWaker(hub), watcher))
        self._done.wait()
        watcher.stop()
        watcher.close()

    def _take(self):
        import gevent

        while self._inbox:
            fn, args = self._inbox.popleft()
            gevent.spawn(fn, *args)

    def spawn(self, fn, *args):
        self._inbox.append((fn, args))
        self._watcher.send()   # thread-safe; coalesced by libev

    def close(self):
        if self._thread.is_alive():
            self.spawn(self._done.set)
            self._thread.join()
