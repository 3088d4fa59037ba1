"""How far consumers lag: the depth of each chunk a stream takes (1 + the deltas merged into it), as a
histogram with power-of-two buckets, and the merged deltas in all. Counted by the consumers at take (under
gevent all on the hub thread; with consumer threads an increment can race another's and be lost)."""

BOUNDS = tuple(1 << i for i in range(13))   # depth upper bounds: 1, 2, 4, ... 4096, then +Inf


class BacklogHistogram:
    __slots__ = ("counts", "merged")

    def __init__(self):
        self.counts = [0] * (len(BOUNDS) + 1)
        self.merged = 0   # deltas that reached a client inside another one's chunk

    def take(self, merged):
        """A consumer took a chunk with `merged` later deltas in it (depth merged + 1)."""
        if merged:
            self.merged += merged
            self.counts[min(merged.bit_length(), len(BOUNDS))] += 1
        else:
            self.counts[0] += 1

    def buckets(self):
        """[(upper bound as a string, cumulative count)], Prometheus style, ending with +Inf."""
        out, total = [], 0
        for bound, count in zip((*map(str, BOUNDS), "+Inf"), self.counts):
            total += count
            out.append((bound, total))
        return out

    @property
    def depth_sum(self):
        return sum(self.counts) + self.merged
