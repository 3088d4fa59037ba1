"""Request: everything the serving core knows of one request, in one record; RequestTable: the index of them.

Where a request's state lives, and who may change it. A Request is made once, by
`SchedulerManager.add_request`, and found through the manager's RequestTable by id; its fields are
the request's whole serving-side state (no other module keeps a map keyed by request id):

    field          what                              written by (thread)
    id, params     the id, its SamplingParams        add_request, before anyone else sees the record
    prompt_tokens  the prompt's length               add_request (token ids, inline encode) or a
                                                     tokenize worker, before the engine thread gets it
    timing         RequestTiming, or None            each stage its own field: add_request (submit),
                                                     a tokenize worker (tokenized), the engine thread
    collector      its StreamOutputCollector         the engine thread puts, the consumer takes
    signal         its waker signal                  the engine thread wakes, the consumer waits
    detok          IncrementalDetokenizer, or None   the engine thread only: made when the engine
                                                     takes the request, dropped when it ends
    finished       True once it has ended            finish(): whichever thread ends it
    aborted        True once its consumer gave up    abort (the consumer, a disconnect watch)
    the slot       its admission slot                release(): exactly once, whoever calls it

What comes next has its place here too: child sequences for n > 1, a grammar matcher, logprob
settings. The engine's own state of a request (its Sequence, KV blocks, scheduler queues) is the
engine's: the engine thread reaches it only through LLMEngine's add_request / abort / step.

A record lives in the table from add_request until its consumer's stream ends (RequestTable.remove);
its slot goes back when it ends — finished, failed or aborted — even if nobody has read it yet.
Every field is one attribute store or read (GIL-atomic); release() relies on the deletion of a slot
attribute being atomic: exactly one caller finds it there.
"""
import itertools

from rosefast.frontend.collector import StreamOutputCollector


class Request:
    __slots__ = ("id", "params", "prompt_tokens", "timing", "collector", "signal", "detok", "finished",
                 "aborted", "_slot")

    def __init__(self, request_id, params, slot, signal, timing=None):
        self.id = request_id
        self.params = params
        self.prompt_tokens = None
        self.timing = timing
        self.collector = StreamOutputCollector()
        self.signal = signal
        self.detok = None
        self.finished = False
        self.aborted = False
        self._slot = slot          # the AdmissionCounter it holds a slot of; deleted by release()

    def release(self):
        """Give the admission slot back; only the first call (from any thread) does. True for that one."""
        try:
            slot = self._slot
            del self._slot         # atomic: a second caller, even one that read the slot, fails here
        except AttributeError:
            return False
        slot.release()
        return True

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


class RequestTable:
    """The open requests by id: added by add_request, removed when their consumer's stream ends."""

    def __init__(self):
        self._records = {}
        self._ids = itertools.count(1)

    def add(self, params, slot, signal, timing=None):
        record = Request(next(self._ids), params, slot, signal, timing)
        self._records[record.id] = record
        return record

    def get(self, request_id):
        return self._records.get(request_id)

    def remove(self, request_id):
        return self._records.pop(request_id, None)

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
