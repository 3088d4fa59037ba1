"""The engine loop, in a native OS thread: takes new requests and aborts from a native queue, runs
`LLMEngine.step()`, detokenizes, and hands each step's output to the fan-out with one wakeup.

It sleeps on the queue when idle (no polling) and every torch call, model loading included, happens
on this thread.
"""
import _queue
import logging
import time

from rosefast._native import native_lock, start_native_thread
from rosefast.detok import IncrementalDetokenizer
from rosefast.errors import EngineError, ShutdownError

log = logging.getLogger("rosefast.manager")
_STOP = ("stop",)


class EngineThread:
    def __init__(self, engine_factory, fanout, waker, on_finished, timing=None, before_step=None):
        self._factory = engine_factory    # () -> (LLMEngine, tokenizer), run on this thread
        self._fanout, self._waker = fanout, waker
        self._tokenizer = None
        self._on_finished = on_finished   # (request_id) -> None: called once per request that ends here
        self._timing = timing             # dict request_id -> RequestTiming, or None
        self._before_step = before_step   # hook(step_number, request_ids), after scheduling: fault injection
        self._queue = _queue.SimpleQueue()
        self._detoks = {}
        self.engine = None
        self.load_error = None
        self._ready = native_lock()
        self._exited = native_lock()

    def start(self, wait=True):
        """Start the thread; with `wait`, block until the engine is loaded (re-raising a failure)."""
        self._ready.acquire()
        self._exited.acquire()
        start_native_thread(self._run)
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout=None):
        if not self._ready.acquire(True, -1 if timeout is None else timeout):
            return False
        self._ready.release()
        if self.load_error is not None:
            raise self.load_error
        return True

    @property
    def open_requests(self):
        """Requests the engine thread is detokenizing (admitted and not finished)."""
        return len(self._detoks)

    def submit(self, request_id, prompt_ids, params):
        self._queue.put(("add", request_id, prompt_ids, params))

    def abort(self, request_id):
        self._queue.put(("abort", request_id))

    def close(self, timeout=10.0):
        self._queue.put(_STOP)
        try:
            self.wait_ready(timeout)
        except BaseException:  # noqa: BLE001 - a failed load has nothing to stop
            pass
        if self._exited.acquire(True, timeout):
            self._exited.release()

    # -- the thread ----------------------------------------------------------------------------------

    def _run(self):
        try:
            engine, tokenizer = self._factory()
            self._tokenizer = tokenizer.backend_tokenizer
            engine.before_step = self._before_step
            self.engine = engine
        except BaseException as e:  # noqa: BLE001 - handed to the thread that started us
            self.load_error = e
            self._ready.release()
            self._exited.release()
            return
        self._ready.release()
        try:
            while True:
                item = self._queue.get() if not self.engine.has_unfinished() else self._next_nowait()
                while item is not None:
                    if item is _STOP:
                        self._fail_all(ShutdownError("the server is shutting down"))
                        return
                    self._handle(item)
                    item = self._next_nowait()
                if self.engine.has_unfinished():
                    self._step()
        finally:
            self._exited.release()

    def _next_nowait(self):
        try:
            return self._queue.get_nowait()
        except _queue.Empty:
            return None

    def _handle(self, item):
        if item[0] == "add":
            _, rid, ids, params = item
            try:
                self.engine.add_request(ids, params, request_id=rid)
            except (ValueError, TypeError) as e:
                self._fail(rid, e)
                return
            self._detoks[rid] = IncrementalDetokenizer(self._tokenizer, ids, params.stop,
                                                       params.include_stop_str_in_output)
        else:
            rid = item[1]
            self.engine.abort(rid)
            if self._detoks.pop(rid, None) is not None or rid in self._fanout:
                self._waker.wake(self._fanout.publish([rid], [[]], [""], [True], ["abort"]))
            self._on_finished(rid)

    def _fail(self, rid, exc):
        self._detoks.pop(rid, None)
        self._waker.wake(self._fanout.publish_error([rid], exc))
        self._on_finished(rid)

    def _fail_all(self, exc):
        for rid in list(self._detoks):
            self.engine.abort(rid)
            self._fail(rid, exc)

    def _step(self):
        engine = self.engine
        try:
            outputs = engine.step()
        except Exception as e:  # noqa: BLE001 - fail this step's requests, keep serving the rest
            log.error("engine step %d failed: %r", engine.steps, e, exc_info=True)
            # a failure before anything was scheduled fails everything open: never spin on it
            failed = list(engine.last_scheduled) or list(engine.seqs)
            engine.last_scheduled = []
            for rid in failed:
                engine.abort(rid)
                self._fail(rid, EngineError(f"engine step failed: {e!r}"))
            return
        now = time.perf_counter()
        rids, ids, texts, finished, reasons = [], [], [], [], []
        timing = self._timing
        for out in outputs:
            rid = out.request_id
            detok = self._detoks.get(rid)
            if detok is None:
                continue
            text = detok.step(out.new_token_ids)
            done, reason = out.finished, out.finish_reason
            if detok.stopped and not done:
                engine.abort(rid)
                done, reason = True, "stop"
            if done:
                if not detok.stopped:
                    text += detok.flush()
                del self._detoks[rid]
            if timing is not None:
                t = timing.get(rid)
                if t is not None:
                    if out.scheduled_at is not None:
                        t.scheduled, t.first_token = out.scheduled_at, now
                    t.token_times.extend([now] * len(out.new_token_ids))
                    t.finish_reason = reason
            rids.append(rid)
            ids.append(out.new_token_ids)
            texts.append(text)
            finished.append(done)
            reasons.append(reason)
            if done:
                self._on_finished(rid)
        if rids:
            self._waker.wake(self._fanout.publish(rids, ids, texts, finished, reasons))
