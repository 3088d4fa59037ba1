"""Wakers: how the engine's native thread wakes the consumers whose collectors became ready.

The engine loop calls `wake(ready_ids)` once per step, with what `FanOut.publish` returned; a
consumer calls `wait(request_id, timeout)` when its collector was empty, then takes the chunk.

- `ThreadWaker`: consumers are OS threads; each request has a native binary semaphore.
- `GeventWaker`: consumers are greenlets. Made in the hub's thread; `wake` appends the ids to a
  deque and sends one libev async-watcher signal (thread-safe, coalesced); the callback, in the
  hub, sets the gevent Event of each ready request.
"""
from collections import deque

from rosefast._native import native_lock


class ThreadWaker:
    """Per-request native semaphores; `wake` releases each ready one."""

    def __init__(self):
        self._signals = {}
        self.wakes = 0   # wake() calls that had something to wake

    def register(self, request_id):
        lock = native_lock()
        lock.acquire()
        self._signals[request_id] = lock

    def unregister(self, request_id):
        self._signals.pop(request_id, None)

    @property
    def registered(self):
        return len(self._signals)

    def wake(self, request_ids):
        if not request_ids:
            return
        self.wakes += 1
        signals = self._signals
        for rid in request_ids:
            lock = signals.get(rid)
            if lock is not None and lock.locked():
                try:
                    lock.release()
                except RuntimeError:  # another waker released it first: already signalled
                    pass

    def wait(self, request_id, timeout=None):
        """Block until woken (True) or `timeout` seconds pass (False); a wake before the wait counts."""
        lock = self._signals.get(request_id)
        if lock is None:
            return True
        return lock.acquire(True, -1 if timeout is None else timeout)

    def close(self):
        self._signals.clear()


class GeventWaker:
    """One async-watcher send per step from the engine thread; the hub wakes the ready greenlets."""

    def __init__(self, hub=None):
        import gevent
        from gevent.event import Event

        self._event_type = Event
        self._hub = hub or gevent.get_hub()
        self._pending = deque()
        self._events = {}
        self._watcher = self._hub.loop.async_()
        self._watcher.start(self._on_signal)
        self.wakes = 0       # wake() calls that had something to wake (sends)
        self.callbacks = 0   # hub callbacks run (libev coalesces sends)

    def register(self, request_id):
        self._events[request_id] = self._event_type()

    def unregister(self, request_id):
        self._events.pop(request_id, None)

    @property
    def registered(self):
        return len(self._events)

    def wake(self, request_ids):
        """Called from any thread (normally the engine's): queue the ids, send one signal."""
        if not request_ids:
            return
        self._pending.extend(request_ids)
        self.wakes += 1
        self._watcher.send()

    def _on_signal(self):
        self.callbacks += 1
        pending, events = self._pending, self._events
        while pending:
            event = events.get(pending.popleft())
            if event is not None:
                event.set()

    def wait(self, request_id, timeout=None):
        event = self._events.get(request_id)
        if event is None:
            return True
        woken = event.wait(timeout)
        event.clear()
        return woken

    def close(self):
        self._watcher.stop()
        self._watcher.close()
        self._events.clear()
