"""Wakers: how the engine's native thread wakes the consumers whose collectors became ready.

Each request gets a signal (`waker.signal()`, kept in its record); the engine loop calls
`wake(signals)` once per step, with what `publish` returned; a consumer calls `wait(signal, timeout)`
when its collector was empty, then takes the chunk. A wakeup before the wait is not lost.

- `ThreadWaker`: consumers are OS threads; a signal is a native binary semaphore.
- `GeventWaker`: consumers are greenlets; a signal is a GreenSignal (a flag, or the parked consumer's
  gevent Waiter). Made in the hub's thread; `wake` appends the signals to a deque and sends one libev
  async-watcher signal (thread-safe, coalesced); the callback, in the hub, switches into each parked
  consumer (or flags the signal for a consumer not waiting yet).
"""
from collections import deque

from rosefast._native import native_lock


class ThreadWaker:
    """Native binary semaphores; `wake` releases each ready one."""

    wait_slice = 0.5   # consumers re-check for shutdown this often: a close can race an admission on another thread

    def __init__(self):
        self.wakes = 0   # wake() calls that had something to wake

    @staticmethod
    def signal():
        lock = native_lock()
        lock.acquire()
        return lock

    def wake(self, signals):
        if not signals:
            return
        self.wakes += 1
        for lock in signals:
            if lock.locked():
                try:
                    lock.release()
                except RuntimeError:  # another waker released it first: already signalled
                    pass

    @staticmethod
    def wait(signal, timeout=None):
        """Block until woken (True) or `timeout` seconds pass (False); a wake before the wait counts."""
        return signal.acquire(True, -1 if timeout is None else timeout)

    def close(self):
        pass


class GreenSignal:
    """A consumer greenlet's wakeup: `ready` when woken while it was not waiting, else its parked Waiter."""
    __slots__ = ("ready", "waiter")

    def __init__(self):
        self.ready = False
        self.waiter = None


class GeventWaker:
    """One async-watcher send per step from the engine thread; the hub wakes the ready greenlets."""

    # No timer per wait (a gevent Timeout made and cancelled per streamed event): admissions and close() both
    # run on the hub thread, so close() fails every request admitted before it, which wakes its consumer.
    wait_slice = None

    def __init__(self, hub=None):
        import gevent
        from gevent.hub import Waiter

        self._waiter_type = Waiter
        self._hub = hub or gevent.get_hub()
        self._pending = deque()
        self._watcher = self._hub.loop.async_()
        self._watcher.start(self._on_signal)
        self.wakes = 0       # wake() calls that had something to wake (sends)
        self.callbacks = 0   # hub callbacks run (libev coalesces sends)

    @staticmethod
    def signal():
        return GreenSignal()

    def wake(self, signals):
        """Called from any thread (normally the engine's): queue the signals, send one libev signal."""
        if not signals:
            return
        self._pending.extend(signals)
        self.wakes += 1
        self._watcher.send()

    def _on_signal(self):
        """In the hub: switch straight into each parked consumer (a gevent Event would schedule a callback per
        set and notify its links from there: twice the hub's work per wakeup)."""
        self.callbacks += 1
        pending = self._pending
        while pending:
            signal = pending.popleft()
            waiter = signal.waiter
            if waiter is None:
                signal.ready = True
            else:
                signal.waiter = None
                waiter.switch(True)

    def wait(self, signal, timeout=None):
        """Park the calling greenlet until woken (True) or `timeout` seconds pass (False); a wake before the
        wait counts."""
        if signal.ready:
            signal.ready = False
            return True
        waiter = signal.waiter = self._waiter_type(self._hub)
        timer = None
        if timeout is not None:
            timer = self._hub.loop.timer(timeout)
            timer.start(waiter.switch, False)
        try:
            return waiter.get()
        finally:
            signal.waiter = None
            if timer is not None:
                timer.close()

    def close(self):
        self._watcher.stop()
        self._watcher.close()
