"""SchedulerManager: the in-process serving core that the HTTP server and the streaming benchmark drive.

    manager = SchedulerManager(model="smollm2-135m", max_inflight_requests=64, tokenize_workers=2)
    rid = manager.add_request("Tell me a story", max_tokens=64, temperature=0)   # returns at once
    for text in manager.stream_text(rid):
        print(text, end="")
    manager.close()

`add_request` checks admission first (over `max_inflight_requests` it raises OverloadedError before an
id is made or a token encoded), then makes the request's record (rosefast.serving.request: the one place its
state lives) with its id and collector; with
`tokenize_workers > 0` the prompt is encoded by native worker threads, otherwise inline; pre-tokenized
prompts (`prompt_token_ids`) skip tokenization. The engine runs in its own native thread. Each request's
inflight slot is released exactly once: when it finishes, fails or is aborted.

Once the model is loaded, the objects made so far (torch, transformers, the model: ~340k of them) are
moved out of the garbage collector's reach with `gc.freeze()` (`freeze_gc=False` to keep Python's
default): a full collection over them takes ~150 ms on a 2-core CPU, and it would stall whichever
thread triggered it: a step of every stream, or a submit. The last manager to close unfreezes them
(except under gevent: see close()).
"""
import gc
import sys
import time

from rosefast.config import EngineConfig
from rosefast.engine.sampling_params import SamplingParams
from rosefast.serving.engine_thread import EngineThread
from rosefast.errors import EngineError, NotReadyError, OverloadedError, ShutdownError
from rosefast.frontend.admission import AdmissionCounter
from rosefast.frontend.waker import GeventWaker, ThreadWaker
from rosefast.serving.histogram import DEPTH_BOUNDS, Histogram
from rosefast.serving.outbox import Outbox
from rosefast.serving.request import RequestTable
from rosefast.serving.timing import RequestTiming
from rosefast.serving.tokenize_pool import TokenizePool

WAIT_SLICE = 0.5   # a consumer re-checks for shutdown this often while it waits (unless its waker says otherwise)
_gc_frozen_by = set()   # ids of the open managers that froze the startup objects


class SchedulerManager:
    """The serving core: admits requests, tokenizes them off the submit path, runs the engine thread and
    streams each request's chunks back (named after the design it grows from; the engine schedules)."""

    def __init__(self, engine_config=None, *, max_inflight_requests=None, tokenize_workers=0,
                 record_token_timestamps=False, waker="thread", before_step=None, tokenizer=None, wait=True,
                 wrap_tokenizer=None, freeze_gc=True, on_dead=None, on_load_error=None, after_step=None,
                 **engine_kwargs):
        if engine_config is None:
            unknown = set(engine_kwargs) - set(EngineConfig.__dataclass_fields__)
            if unknown:
                raise TypeError(f"unknown SchedulerManager argument(s): {', '.join(sorted(unknown))}")
            engine_config = EngineConfig(**engine_kwargs)
        elif engine_kwargs:
            raise TypeError("give the engine's settings as engine_config or as keyword arguments, not both: "
                            + ", ".join(sorted(engine_kwargs)))
        if isinstance(tokenize_workers, bool) or not isinstance(tokenize_workers, int) or tokenize_workers < 0:
            raise ValueError(f"tokenize_workers must be an integer >= 0, got {tokenize_workers!r}")
        self.config = engine_config
        self.admission = AdmissionCounter(max_inflight_requests)
        self.waker = GeventWaker() if waker == "gevent" else ThreadWaker() if waker == "thread" else waker
        self._wait_slice = getattr(self.waker, "wait_slice", WAIT_SLICE)
        self.requests = RequestTable()
        self.outbox = Outbox(self.waker)
        self.tokenized_total = 0     # prompts encoded (inline or by the workers)
        self.backlog = Histogram(DEPTH_BOUNDS)   # the depth of every chunk a stream takes (1 + deltas merged)
        self._record_timing = record_token_timestamps
        self._closed = False
        self._tokenize_workers = tokenize_workers
        self._pool = None
        self._freeze_gc = freeze_gc
        self._pooling = None
        self._engine_thread = EngineThread(engine_config, self.requests, self.outbox, tokenizer=tokenizer,
                                           wrap_tokenizer=wrap_tokenizer, before_step=before_step,
                                           on_ready=self._on_ready, on_dead=on_dead, on_load_error=on_load_error,
                                           after_step=after_step)
        self._engine_thread.start(wait=wait)

    def _on_ready(self):
        """On the engine thread, once the model is loaded: start the tokenize workers, freeze the GC."""
        if self._tokenize_workers:
            self._pool = TokenizePool(self.tokenizer, self._tokenize_workers, self._tokenized, self._fail)
        if self._freeze_gc:
            gc.collect()                   # what is garbage now is not frozen with the rest
            gc.freeze()
            _gc_frozen_by.add(id(self))

    @property
    def engine(self):
        """The LLMEngine (None until loaded). Use its API from the engine thread only; read its stats()."""
        return self._engine_thread.engine

    @property
    def model(self):
        """The ResolvedModel, once loaded."""
        return self._engine_thread.model

    @property
    def tokenizer(self):
        return self._engine_thread.tokenizer

    def embedding_pooling(self):
        """How this model's prompts become embeddings (rosefast.sources.pooling.Pooling, read once); a ValueError
        that says why where it cannot embed."""
        if self._pooling is None:
            model = self.model
            if model is None or model.source == "stand-in":
                raise ValueError("the stand-in engine has no model to take hidden states from")
            from rosefast.build import load_pooling   # (loaded by now)

            self._pooling = load_pooling(model)
        return self._pooling

    @property
    def hidden_size(self):
        return self.engine.args.hidden_size

    @property
    def ready(self):
        """True once the model is loaded and requests are accepted."""
        return self.engine is not None

    @property
    def download(self):
        """The model's download while it loads (a hub name: rosefast.sources.hub), or None: {"model", "bytes",
        "total", "fraction", "rate_mb_s", "eta_s", "done"}."""
        build = sys.modules.get("rosefast.build")   # (not imported here: nothing is fetched before it is, and a
        return build.DOWNLOAD.view() if build is not None else None   # /health must not wait on torch's import)

    # what a front end may know of the loaded model, without reaching into the engine
    @property
    def max_model_len(self):
        """The context length served (prompt + completion)."""
        return self.engine.max_model_len

    @property
    def vocab_size(self):
        return self.engine.args.vocab_size

    @property
    def grammars(self):
        """The engine's grammar compiler and cache (rosefast.engine.grammar.Grammars): thread-safe to compile
        from any thread; what a request's SamplingParams carry."""
        return self.engine.grammars

    @property
    def dead(self):
        """The EngineDeadError that ended the engine (a fatal device error, or the engine thread's own), or None."""
        return self._engine_thread.dead

    @property
    def load_error(self):
        return self._engine_thread.load_error

    def wait_ready(self, timeout=None):
        """Block (natively) until loaded; re-raise a loading failure. False on timeout."""
        return self._engine_thread.wait_ready(timeout)

    # -- submit --------------------------------------------------------------------------------------

    def add_request(self, prompt=None, *, prompt_token_ids=None, params=None, n=1, **sampling):
        """Admit, allocate an id and enqueue; returns the request id. Raises OverloadedError when full,
        ValueError/TypeError for a bad request (nothing is kept of it). With n > 1 the request has n
        choices of the same prompt (one prefill, one admission slot); its stream gives each chunk's
        `index`."""
        if (prompt is None) == (prompt_token_ids is None):
            raise ValueError("give exactly one of prompt or prompt_token_ids")
        return self._admit([prompt if prompt_token_ids is None else list(prompt_token_ids)], params, n, sampling)

    def add_requests(self, prompts, *, params=None, n=1, **sampling):
        """Several prompts (strings or token id lists) in one request: one stream, chunks indexed
        prompt * n + choice. It takes one admission slot per prompt, all or none (OverloadedError)."""
        if not isinstance(prompts, (list, tuple)) or not prompts:
            raise ValueError("prompts must be a non-empty list")
        return self._admit([p if isinstance(p, str) else list(p) for p in prompts], params, n, sampling)

    def _admit(self, prompts, params, n, sampling):
        if self._closed:
            raise ShutdownError("the manager is closed")
        engine = self.engine
        if engine is None:
            raise NotReadyError("the model is still loading" if self.load_error is None else
                                f"the model failed to load: {self.load_error}")
        if self.dead is not None:
            raise ShutdownError(str(self.dead))
        taken = 0
        try:
            for _ in prompts:
                if not self.admission.try_acquire():
                    raise OverloadedError(f"{self.admission.inflight} requests in flight (max_inflight_requests="
                                          f"{self.admission.limit}); retry later")
                taken += 1
            params = params if params is not None else SamplingParams(**sampling)
            if params.processed or params.stop_token_ids:
                engine.check_params(params)
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"n must be an integer >= 1, got {n!r}")
            encoded = []
            for prompt in prompts:
                if isinstance(prompt, str):
                    if not prompt:
                        raise ValueError("prompt must be a non-empty string")
                    ids = self._encode(prompt) if self._pool is None else None
                else:
                    ids = prompt
                if ids is not None:
                    engine.check_prompt(ids, n)
                encoded.append(ids)
        except BaseException:
            for _ in range(taken):
                self.admission.release()
            raise
        timing = RequestTiming if self._record_timing else None
        signal = self.waker.signal()
        if len(prompts) == 1 and n == 1:
            leads = [self.requests.add(params, self.admission, signal, timing and timing())]
        else:
            group = self.requests.add_group(params, self.admission, len(prompts), n, signal, timing)
            leads = group.records[::n]
        ready = []
        for lead, prompt, ids in zip(leads, prompts, encoded):
            if lead.timing is not None:
                lead.timing.submit = time.perf_counter()
            if ids is not None:
                self._set_prompt(lead, ids, lead.timing and lead.timing.submit)
                ready.append((lead, ids))
            else:
                self._pool.submit(lead, prompt)
        if ready:   # one hand-over: the engine prefills a request's prompts together
            self._engine_thread.submit_many(ready)
        return leads[0].id

    @staticmethod
    def _set_prompt(lead, ids, tokenized):
        lead.prompt_tokens = len(ids)
        if lead.params.prompt_logprobs is not None:
            lead.prompt_ids = ids
        if lead.timing is not None:
            lead.timing.tokenized = tokenized

    def _encode(self, prompt):
        self.tokenized_total += 1
        try:
            return self.tokenizer(prompt)["input_ids"]
        except Exception as e:  # noqa: BLE001 - the tokenizer's failure, not the client's
            raise EngineError(f"tokenization failed: {e}") from e

    def _tokenized(self, lead, ids, when):
        """From a tokenize worker: hand a prompt's choices to the engine (unless they ended meanwhile)."""
        self.tokenized_total += 1
        if lead.finished or lead.aborted:
            return
        try:
            self.engine.check_prompt(ids, 1 + len(lead.forks))
        except ValueError as e:
            self._fail(lead, e)
            return
        self._set_prompt(lead, ids, when)
        self._engine_thread.submit(lead, ids)

    def _fail(self, lead, exc):
        self.outbox.fail([lead, *lead.forks], exc)

    # -- consume -------------------------------------------------------------------------------------

    def stream(self, request_id):
        """Yield the request's chunks (token_ids, text, finished, finish_reason; prompt_tokens and
        cached_tokens: its prompt's length and the part the prefix cache served; on a choice's final chunk,
        stop_string: the stop string that ended it, or None) until it finishes; an engine failure is raised here. Closing the generator
        early aborts the request. A request has one stream: its records are forgotten when it ends.
        With several choices (n > 1, or several prompts) or logprobs, each chunk also has its choice's
        `index`, its tokens' `logprobs` entries (when asked: (logprob, [(token, logprob)] top k) each) and,
        on a choice's first chunk, `prompt_logprobs` (when asked: (token id, entry) per prompt token, the
        first entry None); the stream ends when every choice has."""
        record = self.requests.get(request_id)
        if record is None:
            raise KeyError(f"unknown request id {request_id!r} (finished and consumed, or never added)")
        if record.group is None and record.params.logprobs is None and record.params.prompt_logprobs is None:
            return self._stream(record)
        return self._stream_choices(record.choices())

    def _stream(self, record):
        collector, signal, wait, depth = record.collector, record.signal, self.waker.wait, self.backlog.observe
        finished = False
        try:
            while True:
                chunk = collector.get_nowait()
                if chunk is None:
                    if not wait(signal, self._wait_slice) and self._closed and not collector.ready:
                        raise ShutdownError("the manager closed before the request finished")
                    continue
                depth(chunk.merged + 1)
                chunk.prompt_tokens, chunk.cached_tokens = record.prompt_tokens, record.cached_tokens
                if chunk.finished:
                    finished = True
                    chunk.stop_string = record.stop_string
                    yield chunk
                    return
                yield chunk
        finally:
            self.requests.remove(record.id)
            if not finished:
                self._abort(record)

    def _stream_choices(self, records):
        signal, wait = records[0].signal, self.waker.wait
        waiting = list(records)          # not finished yet
        fresh = set(range(len(records)))  # not one chunk taken yet
        try:
            while waiting:
                taken = False
                for record in list(waiting):
                    chunk = record.collector.get_nowait()
                    if chunk is None:
                        continue
                    taken = True
                    self.backlog.observe(chunk.merged + 1)
                    chunk.index = record.index   # (its tokens' logprobs came merged with them, in the chunk)
                    lead = record.lead           # (its prompt's facts)
                    if record.index in fresh:
                        fresh.discard(record.index)
                        if lead.prompt_logprobs is not None:   # (token id, its entry), the first's None
                            chunk.prompt_logprobs = list(zip(lead.prompt_ids, lead.prompt_logprobs))
                    chunk.prompt_tokens, chunk.cached_tokens = lead.prompt_tokens, record.cached_tokens
                    if chunk.finished:
                        chunk.stop_string = record.stop_string
                        waiting.remove(record)
                    yield chunk
                if not taken and not wait(signal, self._wait_slice) and self._closed \
                        and not any(r.collector.ready for r in waiting):
                    raise ShutdownError("the manager closed before the request finished")
        finally:
            self.requests.remove(records[0].id)
            for record in waiting:
                self._abort(record)

    def embeddings(self, request_id):
        """An embeddings request (params.pooling) read to its end: (its vectors in input order, not normalized;
        its prompts' tokens). Engine failures are raised, as by stream()."""
        records = self.requests.get(request_id)
        if records is None:
            raise KeyError(f"unknown request id {request_id!r} (finished and consumed, or never added)")
        records = records.choices()
        for _ in self.stream(request_id):
            pass
        if any(r.embedding is None for r in records):
            raise EngineError("the embeddings request ended without its vectors (aborted)")
        return [r.embedding for r in records], sum(r.lead.prompt_tokens or 0 for r in records)

    def stream_text(self, request_id):
        for chunk in self.stream(request_id):
            if chunk.text:
                yield chunk.text

    def abort(self, request_id):
        """Stop a request: the engine frees its KV at its next loop; its slot is released now."""
        record = self.requests.get(request_id)
        if record is not None:
            for choice in record.choices():
                self._abort(choice)

    def discard(self, request_id):
        """Forget a request whose stream will not be read (its answer failed before it began): aborted as a
        client that went away is, its records gone from the table. Nothing for one already ended."""
        self.abort(request_id)
        self.requests.remove(request_id)

    def _abort(self, record):
        if not (record.finished or record.aborted):
            record.aborted = True
            self._engine_thread.abort(record)   # the engine thread ends it (and wakes a waiting consumer)
        record.release()

    def timing(self, request_id):
        """The request's RequestTiming, filled in as it goes (None when not recording, or unknown). Take it
        before its stream ends: the record is forgotten then."""
        record = self.requests.get(request_id)
        return None if record is None else record.timing

    def bookkeeping(self):
        """What is held per request (all 0 when nothing is in flight): leak checks and /metrics."""
        counts = self.requests.counts()
        sizes = {"requests": counts["requests"], "holding_slot": counts["holding_slot"],
                 "in_engine": counts["in_engine"]}
        engine = self.engine
        if engine is not None:
            stats = engine.stats()
            sizes.update(engine_sequences=stats["sequences"], running=stats["running"], waiting=stats["waiting"],
                         kv_blocks_used=stats["kv_blocks_used"])
        return sizes

    def engine_stats(self):
        """The engine's counters and gauges (KV blocks, prefix cache, batch), read at scrape time; None until
        loaded."""
        engine = self.engine
        return None if engine is None else engine.stats()

    def stats(self):
        """Counters and gauges of the serving core, read at scrape time."""
        return {"inflight": self.admission.inflight, "admitted": self.admission.accepted_total,
                "rejected": self.admission.rejected_total, "tokenized_prompts": self.tokenized_total,
                "merged_chunks": self.backlog.sum - self.backlog.count}

    # -- lifecycle -----------------------------------------------------------------------------------

    @property
    def inflight(self):
        return self.admission.inflight

    def close(self):
        """Stop the workers and the engine thread; whatever is still open fails with ShutdownError."""
        if self._closed:
            return
        self._closed = True
        if self._pool is not None:
            self._pool.close()
        self._engine_thread.close()
        self.outbox.fail(self.requests.open(), ShutdownError("the manager was closed"))
        if id(self) in _gc_frozen_by:
            _gc_frozen_by.discard(id(self))
            # The model and the rest become collectable again — but not under gevent, where a manager closes
            # as its worker exits: unfreezing there only hands the interpreter's final collection the
            # suspended hub greenlet, whose traversal then crashed the process (3 exits in 8 here).
            if not _gc_frozen_by and not isinstance(self.waker, GeventWaker):
                gc.unfreeze()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
