"""StreamOutputCollector, pure Python: the reference for _collector_c.pyx."""
from rosefast._native import native_lock

FIELDS = ("token_ids", "text", "finished", "finish_reason")


def check_delta(token_ids, text, finish_reason):
    """Raise TypeError for a delta that would corrupt the stream; nothing is changed before this passes."""
    if not isinstance(text, str):
        raise TypeError(f"chunk text must be str, not {type(text).__name__}")
    if not isinstance(token_ids, (list, tuple)):
        raise TypeError(f"chunk token_ids must be a list or tuple, not {type(token_ids).__name__}")
    if finish_reason is not None and not isinstance(finish_reason, str):
        raise TypeError(f"chunk finish_reason must be str or None, not {type(finish_reason).__name__}")


def check_logprobs(token_ids, logprobs):
    """Raise for per-token logprob entries that would not line up with the delta's tokens (None: none asked)."""
    if logprobs is None:
        return
    if type(logprobs) is not list and type(logprobs) is not tuple:
        raise TypeError(f"chunk logprobs must be a list or tuple, not {type(logprobs).__name__}")
    if len(logprobs) != len(token_ids):
        raise ValueError(f"chunk logprobs has {len(logprobs)} entries for {len(token_ids)} tokens")


def plain_delta(token_ids, text, finish_reason):
    """A delta checked (TypeError for the wrong types) and read as exact builtins: a list or tuple, a str,
    None or a str. Subclasses become plain values here (str(x) may return the subclass itself; str.__str__
    does not), so nothing later runs their code."""
    check_delta(token_ids, text, finish_reason)
    if type(token_ids) is not list and type(token_ids) is not tuple:
        token_ids = list(token_ids)
    if type(text) is not str:
        text = str.__str__(text)
    if finish_reason is not None and type(finish_reason) is not str:
        finish_reason = str.__str__(finish_reason)
    return token_ids, text, finish_reason


def chunk_fields(chunk):
    """The four fields of a chunk-like object, or TypeError naming the one that is missing."""
    try:
        return chunk.token_ids, chunk.text, chunk.finished, chunk.finish_reason
    except AttributeError:
        missing = [f for f in FIELDS if not hasattr(chunk, f)]
        raise TypeError(f"chunk {type(chunk).__name__} is missing field(s): {', '.join(missing)}") from None


def chunks_equal(a, b):
    """Field-wise equality of two chunk-like objects (NotImplemented when `b` is not one)."""
    try:
        return chunk_fields(a) == chunk_fields(b)
    except TypeError:
        return NotImplemented


def chunk_repr(chunk):
    return (f"StreamChunk(token_ids={chunk.token_ids!r}, text={chunk.text!r}, "
            f"finished={chunk.finished!r}, finish_reason={chunk.finish_reason!r})")


class StreamChunk:
    __slots__ = FIELDS + ("merged", "prompt_tokens", "cached_tokens", "stop_string", "index", "logprobs",
                           "prompt_logprobs")

    def __init__(self, token_ids, text, finished=False, finish_reason=None):
        self.token_ids = token_ids
        self.text = text
        self.finished = finished
        self.finish_reason = finish_reason
        self.merged = 0   # set by the collector: how many later deltas were merged into this one
        self.logprobs = None   # its tokens' logprob entries, one per token, merged with them (when asked)
        # set by the manager's stream, never read or merged here: its prompt's length and the prompt tokens the
        # prefix cache served; on a choice's final chunk the stop string that ended it; with several choices or
        # prompt logprobs, the choice's index, its prompt's logprobs
        self.prompt_tokens = self.cached_tokens = self.stop_string = None
        self.index = self.prompt_logprobs = None

    __eq__ = chunks_equal
    __repr__ = chunk_repr


class StreamOutputCollector:
    __slots__ = ("_ids", "_text", "_pieces", "_finished", "_reason", "_has", "_error", "merges", "_merges_taken",
                 "_lock", "_logprobs")

    def __init__(self):
        # The engine thread puts while a consumer takes. The compiled twin's calls are GIL-atomic; Python
        # bytecode can switch threads mid-call (a put between a take's read and its reset), so serialize.
        self._lock = native_lock()
        self._ids = None
        self._text = None
        self._pieces = None   # None until the first merge: the common depth-1 case never builds it
        self._logprobs = None  # the waiting tokens' logprob entries, once a delta brought some
        self._finished = False
        self._reason = None
        self._has = False
        self._error = None
        self.merges = 0
        self._merges_taken = 0   # `merges` at the last take

    def put(self, token_ids, text, finished, finish_reason, logprobs=None):
        """Store or merge one delta (its tokens' logprob entries with it, one per token, when asked); True when
        the collector went from empty to ready."""
        if type(text) is not str or (type(token_ids) is not list and type(token_ids) is not tuple) \
                or (finish_reason is not None and type(finish_reason) is not str):
            # Outside the lock: a subclass's code (iteration, __str__) runs here, never under it.
            token_ids, text, finish_reason = plain_delta(token_ids, text, finish_reason)
        if logprobs is not None:
            check_logprobs(token_ids, logprobs)
        if finished is not True and finished is not False:
            finished = bool(finished)
        lock = self._lock
        lock.acquire()   # not `with`: its __exit__ call costs twice the pair
        try:
            if logprobs is not None:
                if self._logprobs is None:
                    self._logprobs = []
                self._logprobs.extend(logprobs)
            if not self._has:
                self._ids = list(token_ids)
                self._text = text
                self._finished = finished
                self._reason = finish_reason
                self._has = True
                return self._error is None
            self._ids.extend(token_ids)
            if self._pieces is None:
                self._pieces = [self._text, text]
            else:
                self._pieces.append(text)
            if finished:
                self._finished = True
            if finish_reason:
                self._reason = finish_reason
            self.merges += 1
            return False
        finally:
            lock.release()

    def put_nowait(self, chunk, /):
        """Store or merge `chunk` (any object with the four fields; its `logprobs` too where it has them); True
        when it became ready."""
        return self.put(*chunk_fields(chunk), getattr(chunk, "logprobs", None))

    def put_error(self, exc, /):
        """Fail the stream: the consumer gets `exc` raised after the chunk already waiting."""
        if not isinstance(exc, BaseException):
            raise TypeError(f"put_error needs an exception, not {type(exc).__name__}")
        with self._lock:
            was_ready = self._has or self._error is not None
            self._error = exc
            return not was_ready

    def get_nowait(self):
        """The waiting (merged) chunk as a fresh object the consumer owns, or None."""
        lock = self._lock
        lock.acquire()
        try:
            if not self._has:
                if self._error is not None:
                    raise self._error
                return None
            ids, text, pieces, logprobs = self._ids, self._text, self._pieces, self._logprobs
            finished, reason = self._finished, self._reason
            merged, self._merges_taken = self.merges - self._merges_taken, self.merges
            self._ids = self._text = self._pieces = self._reason = self._logprobs = None
            self._finished = False
            self._has = False
        finally:
            lock.release()
        # Built outside the lock: the state is this call's alone now.
        chunk = StreamChunk(ids, text if pieces is None else "".join(pieces), finished, reason)
        chunk.merged = merged
        chunk.logprobs = logprobs
        return chunk

    @property
    def ready(self):
        return self._has or self._error is not None
