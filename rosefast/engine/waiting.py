"""The scheduler's waiting sequences: one queue per priority, each in order of arrival, so the next to admit is
found among the queues' heads (a handful), not by a scan of every waiting sequence.

First come, first served (`by_priority=False`) keeps one queue whatever the priorities, and a preempted
sequence goes back to its head; by priority, it goes back to its place by arrival in its priority's queue."""
import bisect
from collections import deque


class WaitingQueue:
    def __init__(self, by_priority):
        self.by_priority = by_priority
        self._queues = {}   # priority -> deque of sequences by arrival
        self._count = 0

    def __len__(self):
        return self._count

    def __bool__(self):
        return self._count > 0

    def __iter__(self):
        for priority in sorted(self._queues):
            yield from self._queues[priority]

    def _queue(self, seq):
        priority = seq.params.priority if self.by_priority else 0
        queue = self._queues.get(priority)
        if queue is None:
            queue = self._queues[priority] = deque()
        return queue

    def append(self, seq):
        """A sequence that has just arrived: last of its priority."""
        self._queue(seq).append(seq)
        self._count += 1

    def put_back(self, seq):
        """A preempted sequence: first again (first come, first served) or at its arrival's place (by priority)."""
        queue = self._queue(seq)
        if self.by_priority:
            queue.insert(bisect.bisect_right(queue, seq.arrival, key=lambda s: s.arrival), seq)
        else:
            queue.appendleft(seq)
        self._count += 1

    def first(self, key):
        """The sequence to admit next: the head with the lowest `key(seq)` (first come, first served: the head)."""
        return min((q[0] for q in self._queues.values() if q), key=key)

    def remove(self, seq):
        queue = self._queue(seq)
        if queue and queue[0] is seq:
            queue.popleft()
        else:
            queue.remove(seq)
        self._count -= 1
        if not queue and self.by_priority:
            del self._queues[seq.params.priority]
