"""FanOut: one call per engine step puts every request's new chunk into its collector.

    fan = FanOut()
    c = fan.register("req-1")                      # a StreamOutputCollector of the same flavour
    ready = fan.publish(["req-1"], [[42]], ["Hi"], [False], [None])
    waker.wake(ready)                              # exactly one wakeup per step, for all of them
    fan.unregister("req-1")                        # at finish or abort

`publish(request_ids, token_ids, texts, finished=None, finish_reasons=None)` takes the step's
outputs as parallel lists (None for `finished`/`finish_reasons` means "none finished" for the
whole step) and returns the ids whose collectors went from empty to ready, in step order. Ids
that are not registered (aborted a moment ago) are skipped and counted in `dropped`.
`publish_error(request_ids, exc)` fails those streams. The compiled flavour loops in C and calls
no Python function per token. Called from the engine thread; register/unregister/get from any
thread (single dict operations, GIL-atomic).
"""
from rosefast.frontend._select import select

_impl = select("fanout")
FanOut = _impl.FanOut

__all__ = ["FanOut"]
