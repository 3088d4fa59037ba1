"""Tokenize workers: native threads that encode queued prompts in batches, off the submit path."""
import _queue
import logging
import time

from rosefast._native import native_lock, start_native_thread
from rosefast.errors import EngineError

log = logging.getLogger("rosefast.serving.manager")
MAX_BATCH = 32
_STOP = object()


def batch_encoder(tokenizer):
    """prompts -> lists of ids. A Hugging Face fast tokenizer is called through its Rust backend, which
    encodes with the GIL released (no Python per prompt that a submitting thread would wait behind);
    anything else — a wrapper, a slow tokenizer — through its own __call__. Same ids either way."""
    from transformers import PreTrainedTokenizerFast

    if isinstance(tokenizer, PreTrainedTokenizerFast):
        backend = tokenizer.backend_tokenizer
        return lambda prompts: [e.ids for e in backend.encode_batch(prompts, add_special_tokens=True)]
    return lambda prompts: tokenizer(prompts, add_special_tokens=True)["input_ids"]


class TokenizePool:
    """`submit(record, prompt)`; `on_done(record, ids, t_done)` / `on_error(record, exc)` are called from a
    worker thread (a record is the request's rosefast.serving.request.Request)."""

    def __init__(self, tokenizer, workers, on_done, on_error):
        self._encode_batch = batch_encoder(tokenizer)
        self._queue = _queue.SimpleQueue()     # native: a greenlet's put wakes a native worker
        self._on_done, self._on_error = on_done, on_error
        self._exited = []
        for _ in range(workers):
            done = native_lock()
            done.acquire()
            self._exited.append(done)
            start_native_thread(self._run, done)

    def submit(self, record, prompt):
        self._queue.put((record, prompt))

    def _run(self, done):
        try:
            while True:
                item = self._queue.get()
                if item is _STOP:
                    return
                batch = [item]
                while len(batch) < MAX_BATCH:
                    try:
                        nxt = self._queue.get_nowait()
                    except _queue.Empty:
                        break
                    if nxt is _STOP:
                        self._queue.put(_STOP)   # leave it for this worker's next get
                        break
                    batch.append(nxt)
                self._encode(batch)
        finally:
            done.release()

    def _encode(self, batch):
        try:
            encoded = self._encode_batch([p for _, p in batch])
        except Exception:  # noqa: BLE001 - find the culprit one by one, fail only it
            encoded = None
        now = time.perf_counter()
        for i, (record, prompt) in enumerate(batch):
            try:
                ids = encoded[i] if encoded is not None else self._encode_batch([prompt])[0]
            except Exception as e:  # noqa: BLE001
                log.warning("tokenization failed for request %s: %r", record.id, e)
                self._on_error(record, EngineError(f"tokenization failed: {e}"))
                continue
            self._on_done(record, ids, now)

    def close(self, timeout=5.0):
        for _ in self._exited:
            self._queue.put(_STOP)
        for done in self._exited:
            if done.acquire(True, timeout):
                done.release()
