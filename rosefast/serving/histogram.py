"""Histogram: Prometheus-style bucket counts, observed on the hot path — a bisect and three additions, no
lock (prometheus_client's takes one and ~5 µs; the serving path observes once per streamed event). Meant
for one writer thread: under gevent every consumer runs on the hub thread; with consumer threads two
observations can race and one be lost."""
from bisect import bisect_left

DEPTH_BOUNDS = tuple(float(1 << i) for i in range(13))   # 1, 2, 4, ... 4096 chunks
LATENCY_BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)   # seconds


class Histogram:
    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds):
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)   # the last: above every bound (+Inf)
        self.sum = 0
        self.count = 0

    def observe(self, value):
        self.counts[bisect_left(self.bounds, value)] += 1   # the first bucket whose bound is >= value
        self.sum += value
        self.count += 1

    def buckets(self):
        """[(upper bound, cumulative count)], the last bound inf: as Prometheus exposes them."""
        out, total = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts):
            total += n
            out.append((bound, total))
        return out
