"""StreamOutputCollector: a per-request mailbox between the engine's output path and its consumer.

    c = StreamOutputCollector()
    c.put_nowait(StreamChunk([42], "Hi", False, None))   # True: went from empty to ready (wake the consumer)
    c.put_nowait(StreamChunk([7], " there", True, "stop"))  # not taken yet: merged into the waiting chunk
    c.get_nowait()   # StreamChunk(token_ids=[42, 7], text='Hi there', finished=True, finish_reason='stop')
    c.get_nowait()   # None

A chunk has `token_ids` (list or tuple), `text` (str), `finished` (bool) and `finish_reason`
(str or None), and `logprobs`: None, or one entry per token when the request asked for them (`put`'s fifth
argument), merged with the tokens in the same way (a list or tuple whose length is not the delta's token count
raises ValueError, another type TypeError, and the waiting chunk stays as it was). A SchedulerManager's stream
also sets `prompt_tokens` and `cached_tokens` (its prompt's length, the part the prefix cache served) and on
the final chunk `stop_string` (the collector never reads or merges them).
Merging is O(1) amortized: ids are extended in place in a list the collector owns (the producer's
list is copied once on the way in and never mutated), text is kept as pieces and joined once when
taken, `finished` is OR-ed and the last non-empty `finish_reason` wins. Merged
delivery is byte-identical to unmerged delivery. A delta whose text is not a str, or whose ids are
not a list/tuple, raises TypeError and leaves the waiting chunk as it was; an object missing a
field raises TypeError naming it. `put_error(exc)` makes the consumer's next `get_nowait()` after
the waiting chunk raise `exc` (and every one after it). `merges` counts folds.

One producer thread and one consumer: each call is GIL-atomic in both flavours (no Python code
runs between the check and the update in the compiled one; the pure one makes one reference swap
per take), which is what the engine thread / greenlet split relies on.
"""
from rosefast._select import select

impl = select("collector")
StreamChunk = impl.StreamChunk
StreamOutputCollector = impl.StreamOutputCollector

__all__ = ["StreamChunk", "StreamOutputCollector"]
