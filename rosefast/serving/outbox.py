"""Outbox: the one way out for every request's output and end — the chunks into the collectors, one wakeup.

    step = StepBatch()
    step.add(record, [42], "Hi", False, None)     # per request with something new in this step
    outbox.send(step)                             # one publish, one wake for the whole step
    outbox.fail(records, EngineError("..."))      # they end with an error, one wake

A request that ends here (finished, failed, aborted) gives its admission slot back before its
consumer is woken, so a consumer that sees the end sees the slot free. Used by the engine thread,
the tokenize workers' failures and the manager's close.
"""
from rosefast.frontend.fanout import fail, publish


class StepBatch:
    """One step's outputs as the parallel lists `publish` takes."""
    __slots__ = ("signals", "collectors", "token_ids", "texts", "finished", "reasons", "logprobs", "any_logprobs")

    def __init__(self):
        self.signals, self.collectors, self.token_ids, self.texts, self.finished, self.reasons = [], [], [], [], [], []
        self.logprobs, self.any_logprobs = [], False

    def add(self, record, token_ids, text, finished, reason, logprobs=None):
        """`logprobs`: the tokens' logprob entries, one per token (when the request asked), merged with them."""
        self.signals.append(record.signal)
        self.collectors.append(record.collector)
        self.token_ids.append(token_ids)
        self.texts.append(text)
        self.finished.append(finished)
        self.reasons.append(reason)
        self.logprobs.append(logprobs)
        if logprobs is not None:
            self.any_logprobs = True
        if finished:
            record.finish()


class Outbox:
    def __init__(self, waker):
        self.waker = waker

    def send(self, step):
        if step.signals:
            self.waker.wake(publish(step.signals, step.collectors, step.token_ids, step.texts, step.finished,
                                    step.reasons, step.logprobs if step.any_logprobs else None))

    def end(self, records, reason):
        """End these requests with an empty final chunk (reason "abort": their consumer wakes and stops)."""
        step = StepBatch()
        for record in records:
            step.add(record, [], "", True, reason)
        self.send(step)

    def fail(self, records, exc):
        """End these requests with `exc`, raised to their consumers after what they have not read yet."""
        for record in records:
            record.finish()
        if records:
            self.waker.wake(fail([r.signal for r in records], [r.collector for r in records], exc))
