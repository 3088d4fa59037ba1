"""The design the collector replaces: every merge rebuilds the ids list and re-concatenates the text.

Kept only as a yardstick for the benchmarks: merge cost grows with the backlog, so a lagging
consumer makes the producer slower, which makes the consumer lag more.
"""


class QuadraticCollector:
    def __init__(self):
        self._pending = None
        self.merges = 0

    def put_nowait(self, chunk):
        p = self._pending
        if p is None:
            self._pending = {"token_ids": list(chunk.token_ids), "text": chunk.text,
                             "finished": chunk.finished, "finish_reason": chunk.finish_reason}
            return True
        self._pending = {
            "token_ids": p["token_ids"] + list(chunk.token_ids),
            "text": p["text"] + chunk.text,
            "finished": p["finished"] or chunk.finished,
            "finish_reason": chunk.finish_reason or p["finish_reason"],
        }
        self.merges += 1
        return False

    def get_nowait(self):
        p, self._pending = self._pending, None
        return p
