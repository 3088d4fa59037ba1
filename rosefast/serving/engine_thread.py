"""The engine loop, in a native OS thread: builds the engine from its config, takes new requests and
aborts from a native queue, runs `LLMEngine.step()`, detokenizes, and sends each step's output through
the outbox with one wakeup.

It sleeps on the queue when idle (no polling) and every torch call, model loading included, happens
on this thread.
"""
import _queue
import logging
import time

from rosefast._native import native_lock, start_native_thread
from rosefast.serving.detok import IncrementalDetokenizer
from rosefast.device import is_fatal_device_error
from rosefast.engine.grammar import GrammarError
from rosefast.errors import EngineDeadError, EngineError, ShutdownError
from rosefast.serving.outbox import StepBatch

log = logging.getLogger("rosefast.engine")

_STOP = ("stop",)


class EngineThread:
    """`EngineThread(config, requests, outbox, ...)`: `requests` is the manager's RequestTable (outputs are
    matched to their records by id), `outbox` where they go. `tokenizer` replaces the model's own,
    `wrap_tokenizer(tokenizer)` wraps it (fault injection), `before_step` goes to the engine, and
    `on_ready()` runs on this thread once everything is loaded, before the first request is taken;
    `on_load_error(error)` runs on it when loading fails (the server logs it and ends its worker), and
    `after_step(step_number)` after each step's output is sent (fault injection).
    A fatal device error (EngineDeadError), or any exception that escapes the loop (a bug outside the
    engine's own per-row isolation), ends the engine: every open request fails with it, the thread steps
    no more, `dead` holds the error and `on_dead(error)` runs (the server restarts its worker)."""

    def __init__(self, config, requests, outbox, *, tokenizer=None, wrap_tokenizer=None, before_step=None,
                 on_ready=None, on_dead=None, on_load_error=None, after_step=None):
        self.config = config
        self._requests, self._outbox = requests, outbox
        self._tokenizer_override, self._wrap_tokenizer = tokenizer, wrap_tokenizer
        self._before_step, self._on_ready, self._on_dead = before_step, on_ready, on_dead
        self._on_load_error, self._after_step = on_load_error, after_step
        self._queue = _queue.SimpleQueue()
        self.model = None        # the ResolvedModel, the tokenizer and the engine, once loaded
        self.tokenizer = None
        self.engine = None
        self.load_error = None
        self.dead = None         # the EngineDeadError that ended the engine
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

    def submit(self, record, prompt_ids):
        self._queue.put(("add", ((record, prompt_ids),)))

    def submit_many(self, entries):
        """(record, prompt ids) pairs in one queue item: the engine takes them all before its next step, so
        a request's prompts are prefilled together."""
        self._queue.put(("add", tuple(entries)))

    def abort(self, record):
        self._queue.put(("abort", record))

    def close(self, timeout=10.0):
        self._queue.put(_STOP)
        try:
            self.wait_ready(timeout)
        except BaseException:  # noqa: BLE001 - a failed load has nothing to stop
            pass
        if self._exited.acquire(True, timeout):
            self._exited.release()

    # -- the thread ----------------------------------------------------------------------------------

    def _load(self):
        from rosefast.engine.llm_engine import LLMEngine
        from rosefast.build import load_tokenizer, resolve_model

        model = resolve_model(self.config.model)
        tokenizer = self._tokenizer_override or load_tokenizer(model)   # the worker's one tokenizer: the engine's
        engine = LLMEngine(self.config, before_step=self._before_step, tokenizer=tokenizer)   # (its grammars') too
        if self._wrap_tokenizer is not None:   # (fault injection: the prompts' encoding only)
            tokenizer = self._wrap_tokenizer(tokenizer)
        self.model, self.tokenizer = engine.model, tokenizer
        self._decoder = tokenizer.backend_tokenizer
        if self._on_ready is not None:
            self._on_ready()
        self.engine = engine

    def _run(self):
        try:
            self._load()
        except BaseException as e:  # noqa: BLE001 - handed to the thread that started us
            self.load_error = e
            self._ready.release()
            self._exited.release()
            if self._on_load_error is not None:
                self._on_load_error(e)
            return
        self._ready.release()
        engine = self.engine
        try:
            while True:
                stepping = self.dead is None and engine.has_unfinished()
                item = self._next_nowait() if stepping else self._queue.get()
                while item is not None:
                    if item is _STOP:
                        self._fail_all(ShutdownError("the server is shutting down"))
                        return
                    self._guarded(self._handle, item)
                    item = self._next_nowait()
                if self.dead is None and engine.has_unfinished():
                    self._guarded(self._step)
        finally:
            self._exited.release()

    def _guarded(self, fn, *args):
        """Run `fn` of the loop; whatever escapes it ends the engine (a dead device, or a bug whose state no
        later step can trust): the open requests fail with it instead of waiting for a thread that is gone."""
        try:
            fn(*args)
        except BaseException as e:  # noqa: BLE001 - the thread must outlive it to fail what is open
            if self.dead is not None:
                return
            if isinstance(e, EngineDeadError):
                self._die(e)
            elif is_fatal_device_error(e):
                self._die(EngineDeadError(f"the device failed: {e}"))
            else:
                log.critical("the engine thread failed", exc_info=True)
                self._die(EngineDeadError(f"the engine thread failed: {e!r}"))

    def _die(self, error):
        """No engine call can succeed any more: fail what is open without touching the device again."""
        self.dead = EngineDeadError(f"{error}; this worker restarts")
        records = [r for r in self._requests.open() if r.detok is not None]
        self._outbox.fail(records, self.dead)
        if self._on_dead is not None:
            self._on_dead(self.dead)

    def _next_nowait(self):
        try:
            return self._queue.get_nowait()
        except _queue.Empty:
            return None

    def _handle(self, item):
        if item[0] == "add":
            for record, ids in item[1]:
                self._add(record, ids)
        else:
            record = item[1]
            if self.dead is None:
                self.engine.abort(record.id)
            if not record.finished:
                self._outbox.end([record], "abort")

    def _add(self, record, ids):
        """A prompt's first choice (its forks are the others) into the engine."""
        if record.finished:          # aborted (or failed) while it waited for this thread
            return
        choices = [record, *record.forks]
        if self.dead is not None:
            self._outbox.fail(choices, self.dead)
            return
        try:
            self.engine.add_request(ids, record.params, request_id=record.id, fork_ids=[f.id for f in choices[1:]])
        except (ValueError, TypeError) as e:
            self._outbox.fail(choices, e)
            return
        for choice in choices:
            choice.detok = IncrementalDetokenizer(self._decoder, ids, record.params.stop,
                                                  record.params.include_stop_str_in_output)

    def _fail_all(self, exc):
        records = [r for r in self._requests.open() if r.detok is not None]
        if self.dead is None:
            for record in records:
                self.engine.abort(record.id)
        self._outbox.fail(records, exc)

    def _step(self):
        engine = self.engine
        result = engine.step()
        requests = self._requests
        if result.failed:   # each with its own error where its row failed alone
            by_error = {}
            for rid in result.failed:
                record = requests.get(rid)
                if record is not None and not record.finished:
                    by_error.setdefault(result.errors.get(rid, result.error), []).append(record)
            for error, records in by_error.items():   # a grammar the library refused while generating is the
                self._outbox.fail(records, error if isinstance(error, GrammarError) else   # request's (a 400)
                                  EngineError(f"engine step failed: {error!r}"))
        now = time.perf_counter()
        step = StepBatch()
        for out in result.outputs:
            record = requests.get(out.request_id)
            if record is None or record.detok is None:   # its consumer is gone, or it was aborted
                continue
            detok, ids, logprobs = record.detok, out.new_token_ids, out.logprobs
            try:
                text = detok.step(ids)
                done, reason = out.finished, out.finish_reason
                if detok.used < len(ids):   # a stop string ended the text before the step's last token (speculative
                    ids = ids[:detok.used]  # steps give several): the tokens after it are not output, as one at a
                    logprobs = logprobs and logprobs[:detok.used]   # time they would not have been made
                    done = False
                if detok.stopped and not done:
                    engine.abort(record.id)
                    done, reason = True, "stop"
                if done and detok.stopped:
                    record.stop_string = detok.stop_string
                if done and not detok.stopped:
                    text += detok.flush()
            except Exception as e:  # noqa: BLE001 - this request's text fails this request alone
                log.error("detokenizing request %r failed: %r", record.id, e, exc_info=True)
                engine.abort(record.id)
                self._outbox.fail([record], EngineError(f"detokenizing failed: {e!r}"))
                continue
            if out.prompt_logprobs is not None:
                record.lead.prompt_logprobs = out.prompt_logprobs
            if out.cached_tokens is not None:
                record.cached_tokens = out.cached_tokens
            if out.embedding is not None:
                record.embedding = out.embedding
            t = record.timing
            if t is not None:
                if out.scheduled_at is not None:
                    t.scheduled, t.first_token = out.scheduled_at, now
                t.token_times.extend([now] * len(ids))
                t.finish_reason = reason
            step.add(record, ids, text, done, reason, logprobs)   # (the entries ride with their tokens)
        self._outbox.send(step)
        if self._after_step is not None:
            self._after_step(engine.steps)
