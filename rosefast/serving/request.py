"""Request: everything the serving core knows of one request, in one record; RequestTable: the index of them.

Where a request's state lives, and who may change it. A Request is made once, by
`SchedulerManager.add_request`, and found through the manager's RequestTable by id; its fields are
the request's whole serving-side state (no other module keeps a map keyed by request id):

    field          what                              written by (thread)
    id, params     the id, its SamplingParams        add_request, before anyone else sees the record
    prompt_tokens  the prompt's length (its lead)    add_request (token ids, inline encode) or a
                                                     tokenize worker, before the engine thread gets it
    timing         RequestTiming, or None            each stage its own field: add_request (submit),
                                                     a tokenize worker (tokenized), the engine thread
    collector      its StreamOutputCollector (the     the engine thread puts, the consumer takes
                   tokens, text and logprobs)
    signal         its waker signal                  the engine thread wakes, the consumer waits
    detok          IncrementalDetokenizer, or None   the engine thread only: made when the engine
                                                     takes the request, dropped when it ends
    finished       True once it has ended            finish(): whichever thread ends it
    aborted        True once its consumer gave up    abort (the consumer, a disconnect watch)
    the slot       its admission slot                release(): exactly once, whoever calls it
    prompt_logprobs the prompt's entries (asked; on   the engine thread, before the first chunk
                   its lead)
    prompt_ids     its prompt's ids (the same)       add_request or a tokenize worker
    cached_tokens  its prompt tokens the prefix      the engine thread, before the first chunk
                   cache served
    stop_string    the stop string that ended it     the engine thread, before the final chunk
    embedding      an embeddings request's vector    the engine thread, before the final chunk
    group, index   its RequestGroup and choice index add_request, before anyone else sees it

A prompt's facts (its length, ids and entries) are kept once, on its lead — the prompt's first choice —
and its other choices read them there (`lead`); the choices themselves are listed once, in the group
(`forks` and `choices()` read that list).

A call with several prompts or n > 1 choices makes one record per (prompt, choice) in a RequestGroup:
they share one waker signal (one consumer reads them all) and the call's admission slots — one per
prompt —, which go back when the last of them ends. The engine's own state of a request (its Sequence,
KV blocks, scheduler queues, grammar matcher) is the engine's: the engine thread reaches it only through LLMEngine's add_request / abort / step.

A record lives in the table from add_request until its consumer's stream ends (RequestTable.remove);
its slot goes back when it ends — finished, failed or aborted — even if nobody has read it yet.
Every field is one attribute store or read (GIL-atomic); release() relies on the deletion of a slot
attribute being atomic: exactly one caller finds it there.
"""
import itertools

from rosefast.frontend.collector import StreamOutputCollector


class Request:
    __slots__ = ("id", "params", "prompt_tokens", "timing", "collector", "signal", "detok", "finished",
                 "aborted", "_slot", "group", "index", "prompt_logprobs", "prompt_ids",
                 "cached_tokens", "stop_string", "embedding")

    def __init__(self, request_id, params, slot, signal, timing=None):
        self.id = request_id
        self.params = params
        self.prompt_tokens = None
        self.cached_tokens = 0
        self.stop_string = None
        self.embedding = None      # an embeddings request's vector, set with its end
        self.timing = timing
        self.collector = StreamOutputCollector()
        self.signal = signal
        self.detok = None
        self.finished = False
        self.aborted = False
        self._slot = slot          # the AdmissionCounter (or RequestGroup) it holds a slot of; see release()
        self.group = None
        self.index = 0
        self.prompt_logprobs = None
        self.prompt_ids = None     # kept only when its prompt's logprobs are asked (they are given with their ids)

    def release(self):
        """Give the admission slot back; only the first call (from any thread) does. True for that one."""
        try:
            slot = self._slot
            del self._slot         # atomic: a second caller, even one that read the slot, fails here
        except AttributeError:
            return False
        slot.release()
        return True

    def choices(self):
        """The records one consumer reads for this request, in index order."""
        return self.group.records if self.group is not None else (self,)

    @property
    def lead(self):
        """Its prompt's first choice (itself when it is one), which holds the prompt's facts."""
        group = self.group
        return self if group is None else group.records[self.index - self.index % group.n]

    @property
    def forks(self):
        """On a prompt's first choice, the prompt's other choices; elsewhere none."""
        group = self.group
        if group is None or self.index % group.n:
            return ()
        return group.records[self.index + 1:self.index + group.n]

    @property
    def holds_slot(self):
        return hasattr(self, "_slot")

    def finish(self):
        """It has ended (finished, failed or aborted): no more detokenizing, the slot back."""
        self.finished = True
        self.detok = None
        self.release()

    def __repr__(self):
        state = "finished" if self.finished else "aborted" if self.aborted else "open"
        return f"Request({self.id!r}, {state}, prompt_tokens={self.prompt_tokens})"


class RequestGroup:
    """The choices of one call (n per prompt, one record each, a prompt's n together): the call's admission
    slots, one per prompt, go back when its last choice has ended."""
    __slots__ = ("records", "n", "_admission", "_slots", "_left")

    def __init__(self, admission, slots, n):
        self.records = []
        self.n = n
        self._admission, self._slots = admission, slots
        self._left = list(range(slots * n))   # each choice pops one as it ends; the one that pops 0 is the last

    def release(self):
        """A choice has ended (each calls this once: its record's own release is exactly-once)."""
        if self._left.pop() == 0:
            for _ in range(self._slots):
                self._admission.release()


class RequestTable:
    """The open requests by id: added by add_request, removed when their consumer's stream ends."""

    def __init__(self):
        self._records = {}
        self._ids = itertools.count(1)

    def add(self, params, slot, signal, timing=None):
        record = Request(next(self._ids), params, slot, signal, timing)
        self._records[record.id] = record
        return record

    def add_group(self, params, admission, prompts, n, signal, timing=None):
        """Records for `prompts` x n choices sharing `signal` and holding one admission slot per prompt
        (already acquired); a prompt's first choice (its lead) carries its timing. Returns the group."""
        group = RequestGroup(admission, prompts, n)
        for p in range(prompts):
            for j in range(n):
                record = Request(next(self._ids), params, group, signal, timing() if timing and j == 0 else None)
                record.group, record.index = group, p * n + j
                group.records.append(record)
        for record in group.records:
            self._records[record.id] = record
        return group

    def get(self, request_id):
        return self._records.get(request_id)

    def remove(self, request_id):
        """Forget a request: its record, and the other choices of its group."""
        record = self._records.pop(request_id, None)
        if record is not None and record.group is not None:
            for other in record.group.records:
                self._records.pop(other.id, None)
        return record

    def open(self):
        """The records that have not ended (a snapshot list)."""
        return [r for r in list(self._records.values()) if not r.finished]

    def __len__(self):
        return len(self._records)

    def counts(self):
        """How many records are in the table, open, in the engine (detokenizing), holding a slot."""
        records = list(self._records.values())
        return {"requests": len(records), "open": sum(not r.finished for r in records),
                "in_engine": sum(r.detok is not None for r in records),
                "holding_slot": sum(r.holds_slot for r in records)}
