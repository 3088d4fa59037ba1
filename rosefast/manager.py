"""SchedulerManager: the in-process serving core that the HTTP server and the streaming benchmark drive.

    manager = SchedulerManager(model="smollm2-135m", max_inflight_requests=64, tokenize_workers=2)
    rid = manager.add_request("Tell me a story", max_tokens=64, temperature=0)   # returns at once
    for text in manager.stream_text(rid):
        print(text, end="")
    manager.close()

`add_request` checks admission first (over `max_inflight_requests` it raises OverloadedError before an
id is made or a token encoded), then allocates the id and the request's collector; with
`tokenize_workers > 0` the prompt is encoded by native worker threads, otherwise inline; pre-tokenized
prompts (`prompt_token_ids`) skip tokenization. The engine runs in its own native thread. Each request's
inflight slot is released exactly once: when it finishes, fails or is aborted.

Once the model is loaded, the objects made so far (torch, transformers, the model: ~340k of them) are
moved out of the garbage collector's reach with `gc.freeze()` (`freeze_gc=False` to keep Python's
default): a full collection over them takes ~150 ms on a 2-core CPU, and it would stall whichever
thread triggered it: a step of every stream, or a submit. The last manager to close unfreezes them.
"""
import gc
import itertools
import time

from rosefast.config import EngineConfig
from rosefast.engine.sampling import SamplingParams
from rosefast.engine_thread import EngineThread
from rosefast.errors import EngineError, NotReadyError, OverloadedError, ShutdownError
from rosefast.frontend.admission import AdmissionCounter
from rosefast.frontend.fanout import FanOut
from rosefast.frontend.waker import GeventWaker, ThreadWaker
from rosefast.timing import RequestTiming
from rosefast.tokenize_pool import TokenizePool

WAIT_SLICE = 0.5   # a consumer re-checks for shutdown this often while it waits
_gc_frozen_by = set()   # ids of the open managers that froze the startup objects


class SchedulerManager:
    def __init__(self, engine_config=None, *, max_batch_size=None, prefill_max_batch_size=None,
                 max_active_requests=None, max_inflight_requests=None, tokenize_workers=0,
                 record_token_timestamps=False, waker="thread", before_step=None, tokenizer=None, wait=True,
                 wrap_tokenizer=None, freeze_gc=True, **engine_kwargs):
        overrides = {k: v for k, v in dict(max_batch_size=max_batch_size, prefill_max_batch_size=prefill_max_batch_size,
                                          max_active_requests=max_active_requests).items() if v is not None}
        if engine_config is None:
            unknown = set(engine_kwargs) - set(EngineConfig.__dataclass_fields__)
            if unknown:
                raise TypeError(f"unknown SchedulerManager argument(s): {', '.join(sorted(unknown))}")
            engine_config = EngineConfig(**engine_kwargs, **overrides)
        else:
            engine_config = EngineConfig(**{**engine_config.__dict__, **overrides})
        if isinstance(tokenize_workers, bool) or not isinstance(tokenize_workers, int) or tokenize_workers < 0:
            raise ValueError(f"tokenize_workers must be an integer >= 0, got {tokenize_workers!r}")
        self.config = engine_config
        self.model = None            # the ResolvedModel, once loaded
        self.tokenizer = tokenizer
        self.engine = None
        self.admission = AdmissionCounter(max_inflight_requests)
        self.fanout = FanOut()
        self.waker = GeventWaker() if waker == "gevent" else ThreadWaker() if waker == "thread" else waker
        self._slots = {}             # request id -> True while it holds an inflight slot
        self._pending = {}           # request id -> SamplingParams while its prompt is being tokenized
        self._prompt_tokens = {}     # request id -> prompt length, until the stream ends
        self._timing = {} if record_token_timestamps else None
        self._ids = itertools.count(1)
        self.tokenized_total = 0     # prompts encoded (inline or by the workers)
        self._closed = False
        self._tokenize_workers = tokenize_workers
        self._wrap_tokenizer = wrap_tokenizer   # e.g. fault injection around the loaded tokenizer
        self._pool = None
        self._freeze_gc = freeze_gc
        self._engine_thread = EngineThread(self._load, self.fanout, self.waker, self._release, self._timing,
                                           before_step)
        self._engine_thread.start(wait=wait)

    def _load(self):
        """On the engine thread: resolve the model (converting it once), load the tokenizer and the engine."""
        from rosefast.engine.llm_engine import LLMEngine
        from rosefast.models import load_tokenizer, resolve_model

        self.model = resolve_model(self.config.model)
        self.config.model = self.model
        if self.tokenizer is None:
            self.tokenizer = load_tokenizer(self.model)
        if self._wrap_tokenizer is not None:
            self.tokenizer = self._wrap_tokenizer(self.tokenizer)
        engine = LLMEngine(self.config)
        if self._tokenize_workers:
            self._pool = TokenizePool(self.tokenizer, self._tokenize_workers, self._tokenized, self._fail)
        if self._freeze_gc:
            gc.collect()                   # what is garbage now is not frozen with the rest
            gc.freeze()
            _gc_frozen_by.add(id(self))
        self.engine = engine
        return engine, self.tokenizer

    @property
    def ready(self):
        """True once the model is loaded and requests are accepted."""
        return self.engine is not None

    @property
    def load_error(self):
        return self._engine_thread.load_error

    def wait_ready(self, timeout=None):
        """Block (natively) until loaded; re-raise a loading failure. False on timeout."""
        return self._engine_thread.wait_ready(timeout)

    # -- submit --------------------------------------------------------------------------------------

    def add_request(self, prompt=None, *, prompt_token_ids=None, params=None, **sampling):
        """Admit, allocate an id and enqueue; returns the request id. Raises OverloadedError when full,
        ValueError/TypeError for a bad request (nothing is kept of it)."""
        if self._closed:
            raise ShutdownError("the manager is closed")
        if self.engine is None:
            raise NotReadyError("the model is still loading" if self.load_error is None else
                                f"the model failed to load: {self.load_error}")
        if not self.admission.try_acquire():
            raise OverloadedError(f"{self.admission.inflight} requests in flight (max_inflight_requests="
                                  f"{self.admission.limit}); retry later")
        try:
            params = params if params is not None else SamplingParams(**sampling)
            if (prompt is None) == (prompt_token_ids is None):
                raise ValueError("give exactly one of prompt or prompt_token_ids")
            if prompt_token_ids is not None:
                ids = list(prompt_token_ids)
                self.engine.check_prompt(ids)
            else:
                if not isinstance(prompt, str) or not prompt:
                    raise ValueError("prompt must be a non-empty string")
                ids = None
                if self._pool is None:
                    ids = self._encode(prompt)
                    self.engine.check_prompt(ids)
        except BaseException:
            self.admission.release()
            raise
        rid = next(self._ids)
        self.fanout.register(rid)
        self.waker.register(rid)
        self._slots[rid] = True
        timing = None
        if self._timing is not None:
            timing = self._timing[rid] = RequestTiming()
        if ids is not None:
            self._prompt_tokens[rid] = len(ids)
            self._engine_thread.submit(rid, ids, params)
        else:
            self._pending[rid] = params
            self._pool.submit(rid, prompt)
        if timing is not None:
            timing.submit = time.perf_counter()
            if ids is not None:
                timing.tokenized = timing.submit
                timing.prompt_tokens = len(ids)
        return rid

    def _encode(self, prompt):
        self.tokenized_total += 1
        try:
            return self.tokenizer(prompt)["input_ids"]
        except Exception as e:  # noqa: BLE001 - the tokenizer's failure, not the client's
            raise EngineError(f"tokenization failed: {e}") from e

    def _tokenized(self, rid, ids, when):
        """From a tokenize worker: hand the request to the engine (unless it was aborted meanwhile)."""
        self.tokenized_total += 1
        params = self._pending.pop(rid, None)
        if params is None:
            return
        try:
            self.engine.check_prompt(ids)
        except ValueError as e:
            self._fail(rid, e)
            return
        self._prompt_tokens[rid] = len(ids)
        if self._timing is not None and rid in self._timing:
            self._timing[rid].tokenized = when
            self._timing[rid].prompt_tokens = len(ids)
        self._engine_thread.submit(rid, ids, params)

    def _fail(self, rid, exc):
        self._pending.pop(rid, None)
        self.waker.wake(self.fanout.publish_error([rid], exc))
        self._release(rid)

    def _release(self, rid):
        if self._slots.pop(rid, None):     # dict.pop is atomic: exactly one caller gets True
            self.admission.release()

    # -- consume -------------------------------------------------------------------------------------

    def stream(self, request_id):
        """Yield the request's chunks (token_ids, text, finished, finish_reason) until it finishes; an
        engine failure is raised here. Closing the generator early aborts the request."""
        collector = self.fanout.get(request_id)
        if collector is None:
            raise KeyError(f"unknown request id {request_id!r} (finished and consumed, or never added)")
        finished = False
        try:
            while True:
                chunk = collector.get_nowait()
                if chunk is None:
                    if not self.waker.wait(request_id, WAIT_SLICE) and self._closed and not collector.ready:
                        raise ShutdownError("the manager closed before the request finished")
                    continue
                yield chunk
                if chunk.finished:
                    finished = True
                    return
        finally:
            self._close_stream(request_id, abort=not finished)

    def stream_text(self, request_id):
        for chunk in self.stream(request_id):
            if chunk.text:
                yield chunk.text

    def prompt_tokens(self, request_id):
        """The request's prompt length once it is tokenized (None before), until its stream ends."""
        return self._prompt_tokens.get(request_id)

    def _close_stream(self, rid, abort):
        self._prompt_tokens.pop(rid, None)
        self.fanout.unregister(rid)
        self.waker.unregister(rid)
        if abort and rid in self._slots:
            self.abort(rid)

    def abort(self, request_id):
        """Stop a request: the engine frees its KV at its next loop; its slot is released now."""
        self._pending.pop(request_id, None)
        self._engine_thread.abort(request_id)
        self._release(request_id)

    def pop_timing(self, request_id):
        """The request's RequestTiming (removed), or None (not recording, or already popped)."""
        return None if self._timing is None else self._timing.pop(request_id, None)

    def bookkeeping(self):
        """Sizes of every per-request map (all 0 when nothing is in flight): leak checks and /metrics."""
        sizes = {"slots": len(self._slots), "pending_tokenize": len(self._pending),
                 "prompt_tokens": len(self._prompt_tokens), "timing": len(self._timing or ()),
                 "collectors": len(self.fanout), "wakers": self.waker.registered}
        engine = self.engine
        if engine is not None:
            sizes.update(detokenizers=self._engine_thread.open_requests, engine_sequences=len(engine.seqs),
                         running=len(engine.scheduler.running), waiting=len(engine.scheduler.waiting),
                         kv_blocks_used=engine.block_manager.num_used_blocks)
        return sizes

    # -- lifecycle -----------------------------------------------------------------------------------

    @property
    def inflight(self):
        return self.admission.inflight

    def close(self):
        """Stop the workers and the engine thread; whatever is still open fails with ShutdownError."""
        if self._closed:
            return
        self._closed = True
        self._prompt_tokens.clear()
        if self._pool is not None:
            self._pool.close()
        self._engine_thread.close()
        open_ids = list(self._slots)
        if open_ids:
            self.waker.wake(self.fanout.publish_error(open_ids, ShutdownError("the manager was closed")))
        for rid in open_ids:
            self._release(rid)
        if id(self) in _gc_frozen_by:
            _gc_frozen_by.discard(id(self))
            if not _gc_frozen_by:
                gc.unfreeze()              # the model and the rest become collectable again

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
