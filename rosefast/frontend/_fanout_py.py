"""FanOut, pure Python: the reference for _fanout_c.pyx."""
from rosefast.frontend._collector_py import StreamOutputCollector


def check_step(request_ids, token_ids, texts, finished, finish_reasons):
    n = len(request_ids)
    for name, seq in (("token_ids", token_ids), ("texts", texts), ("finished", finished),
                      ("finish_reasons", finish_reasons)):
        if seq is not None and len(seq) != n:
            raise ValueError(f"publish: {name} has {len(seq)} entries for {n} request_ids")


def fail_streams(collectors, request_ids, exc):
    """Put `exc` into each registered request's collector; the ids that became ready (both flavours)."""
    ready = []
    for rid in request_ids:
        collector = collectors.get(rid)
        if collector is not None and collector.put_error(exc):
            ready.append(rid)
    return ready


def check_new(collectors, request_id):
    if request_id in collectors:
        raise KeyError(f"request id {request_id!r} is already registered")


class FanOut:
    collector_type = StreamOutputCollector

    def __init__(self):
        self._collectors = {}
        self.dropped = 0

    def register(self, request_id, /):
        check_new(self._collectors, request_id)
        collector = self._collectors[request_id] = self.collector_type()
        return collector

    def unregister(self, request_id, /):
        """Forget a request (finished or aborted); its collector, or None if it was not registered."""
        return self._collectors.pop(request_id, None)

    def get(self, request_id, /):
        return self._collectors.get(request_id)

    def __contains__(self, request_id):
        return request_id in self._collectors

    def __len__(self):
        return len(self._collectors)

    def publish(self, request_ids, token_ids, texts, finished=None, finish_reasons=None):
        check_step(request_ids, token_ids, texts, finished, finish_reasons)
        ready = []
        collectors = self._collectors
        for i, rid in enumerate(request_ids):
            collector = collectors.get(rid)
            if collector is None:
                self.dropped += 1
                continue
            if collector.put(token_ids[i], texts[i], finished[i] if finished is not None else False,
                             finish_reasons[i] if finish_reasons is not None else None):
                ready.append(rid)
        return ready

    def publish_error(self, request_ids, exc):
        return fail_streams(self._collectors, request_ids, exc)
