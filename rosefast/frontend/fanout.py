"""publish: one call per engine step puts every request's new chunk into its collector.

    ready = publish(keys, collectors, [[42], [7]], ["Hi", " there"], [False, True], [None, "stop"])
    waker.wake(ready)                              # exactly one wakeup per step, for all of them

`publish(keys, collectors, token_ids, texts, finished=None, finish_reasons=None)` takes the step's
outputs as parallel lists — a key per entry (what the caller wants back: the engine passes the
requests' waker signals), the request's StreamOutputCollector, and its delta; None for
`finished`/`finish_reasons` means "none finished" for the whole step — and returns the keys whose
collectors went from empty to ready, in step order. `fail(keys, collectors, exc)` fails those streams
the same way. The fan-out holds no state: the request record (rosefast.serving.request) holds the collector.
The compiled flavour loops in C and calls no Python function per token; it takes only the compiled
StreamOutputCollector. Called from the engine thread (and from whichever thread fails a request).
"""
from rosefast._select import select

impl = select("fanout")
publish = impl.publish
fail = impl.fail

__all__ = ["fail", "publish"]
