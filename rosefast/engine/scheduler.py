"""Scheduler: which sequences run in the next step, prefill or decode.

Each step is a prefill of admitted waiting sequences (at most `prefill_max_batch_size` sequences and
`max_num_batched_tokens` tokens; a longer prompt is prefilled in chunks across steps) or a decode of
all running sequences. After a prefill step, running decodes go next, so a long prompt never stalls
them for more than one bounded step — bounded by what the decoding streams may wait
(rosefast.engine.step_budget: the prefill's tokens sized from the steps' measured costs). When blocks run out
for decode, the newest running sequence is preempted (its KV freed, recomputed later; its tokens and sampler
state are kept, so the output is the same). A counted window pool (rosefast.engine.window_blocks) is counted
as well: it sizes prefill chunks and admits, grows and preempts as the other pool does.

Scheduling by priority (`scheduling="priority"`, the default): the waiting sequence with the best key — its
params' `priority` (lower first) less one for every `priority_aging_s` seconds since it arrived, then its
arrival — is admitted next; where the batch is full or blocks are short, the running sequence with the worst key
is preempted for it if that key is worse than the waiting one's. The aging bounds a wait: a request of priority
p passes requests of priority q < p that arrive after it (p - q) x priority_aging_s seconds. With every
priority equal this is first come, first served; `scheduling="fcfs"` ignores `priority` altogether.
"""
import time
from dataclasses import dataclass, field

from rosefast.engine.sequence import SequenceStatus
from rosefast.engine.step_budget import StepBudget
from rosefast.engine.waiting import WaitingQueue


@dataclass
class ScheduledStep:
    is_prefill: bool
    seqs: list           # the sequences in this step (may be empty: nothing can run)
    chunks: list         # prefill: new tokens computed per sequence; decode: 1 each
    cut_short: list = field(default_factory=list)   # finished now by the scheduler: no KV room to go on

    def completes(self, i):
        """Whether sequence i reaches its last token in this step (and so samples a new token)."""
        seq = self.seqs[i]
        return seq.num_cached + self.chunks[i] >= seq.num_tokens


class Scheduler:
    def __init__(self, config, block_manager):
        self.block_manager = block_manager
        self.max_running = min(config.max_batch_size, config.max_active_requests or config.max_batch_size)
        self.prefill_max_batch_size = config.prefill_max_batch_size
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.by_priority = getattr(config, "scheduling", "fcfs") == "priority"
        self.aging_s = getattr(config, "priority_aging_s", 0.0)
        self.waiting = WaitingQueue(self.by_priority)
        self.budget = StepBudget(config.max_num_batched_tokens, getattr(config, "itl_target_ms", 0.0),
                                 getattr(config, "block_size", 16))   # a prefill step's tokens beside decodes
        self.running = []
        self.preemptions = 0
        self._decode_next = False

    def add(self, seq):
        seq.arrival = time.perf_counter()
        self.waiting.append(seq)

    def key(self, seq, now):
        """Where a sequence stands under priority scheduling: lower runs first."""
        priority = seq.params.priority
        if self.aging_s:
            priority -= int((now - seq.arrival) / self.aging_s)
        return priority, seq.arrival

    def _next_waiting(self, now):
        return self.waiting.first(lambda s: self.key(s, now))

    def _victim_for(self, seq, now, busy):
        """Priority scheduling: the running sequence (not in this step) to preempt for waiting `seq` — the one
        with the worst key, where that is worse than seq's —, or None."""
        if not self.by_priority:
            return None
        mine = self.key(seq, now)[0]
        worst = max((s for s in self.running if s not in busy), key=lambda s: self.key(s, now), default=None)
        return worst if worst is not None and self.key(worst, now)[0] > mine else None

    def has_room(self):
        """Whether one more sequence may run now (max_batch_size / max_active_requests)."""
        return len(self.running) < self.max_running

    def add_running(self, seq):
        """A sequence that already has its blocks and its K/V (a forked choice) joins the running ones."""
        seq.status = SequenceStatus.RUNNING
        if seq.arrival is None:
            seq.arrival = time.perf_counter()
        self.running.append(seq)

    def has_work(self):
        return bool(self.waiting or self.running)

    def schedule(self):
        """The next step (with no sequences when nothing can run)."""
        decodable = any(not s.in_prefill for s in self.running)
        if not (self._decode_next and decodable):
            step = self._schedule_prefill(self.budget.tokens if decodable else None)
            if step is not None:
                self._decode_next = True
                return step
        self._decode_next = False
        return self._schedule_decode()

    def _schedule_prefill(self, cap=None):
        """A prefill step: at most prefill_max_batch_size sequences and max_num_batched_tokens tokens; with
        streams decoding, `cap` (the ITL budget's tokens) bounds what the step gives a long prompt — one with
        more tokens left than `cap`, chunked to what the step's other tokens leave of it —, while a prompt within
        it goes whole, as without streams (short prompts are not held back for a bound they do not threaten)."""
        seqs, chunks = [], []
        budget = self.max_num_batched_tokens
        bm = self.block_manager
        window = bm.counted_window
        pooled = None   # a step pools (embeddings) or samples, not both: its first sequence says which
        # sequences already admitted whose prefill is unfinished (chunked) go first
        for seq in list(self.running):
            if (seq.status is SequenceStatus.RUNNING and seq.in_prefill and budget > 0
                    and len(seqs) < self.prefill_max_batch_size
                    and (pooled is None or pooled == (seq.params.pooling is not None))):
                chunk = self._chunk(seq, budget, cap)
                if chunk <= 0:
                    continue
                pooled = seq.params.pooling is not None
                if window is not None:
                    chunk = self._window_chunk(seq, chunk, seqs)
                    if chunk <= 0:
                        continue
                seqs.append(seq)
                chunks.append(chunk)
                budget -= chunk
        now = time.perf_counter()
        while self.waiting and budget > 0 and len(seqs) < self.prefill_max_batch_size:
            seq = self._next_waiting(now)
            if pooled is not None and pooled != (seq.params.pooling is not None):
                break   # the next step takes it
            if cap is not None and seq.num_tokens > cap and cap <= self.max_num_batched_tokens - budget:
                break   # a long prompt, and nothing left of the cap: the next step
            room = len(self.running) < self.max_running
            hit = bm.lookup(seq) if room else None
            if not (room and bm.can_allocate(seq, hit)):   # the batch is full or blocks are short: a worse one
                victim = self._victim_for(seq, now, seqs)   # running gives way, if there is one
                if victim is None:
                    break
                self.preempt(victim)
                continue
            bm.allocate(seq, hit)   # (then out of the queue: a failure here leaves it there, to be aborted)
            self.waiting.remove(seq)
            pooled = seq.params.pooling is not None
            if seq.scheduled_at is None:
                seq.scheduled_at = time.perf_counter()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            chunk = self._chunk(seq, budget, cap)
            if window is not None:   # (can_allocate left its first new tokens a block)
                chunk = self._window_chunk(seq, chunk, seqs)
            seqs.append(seq)
            chunks.append(chunk)
            budget -= chunk
        return ScheduledStep(True, seqs, chunks) if seqs else None

    def _chunk(self, seq, budget, cap):
        """What this step computes of seq's prompt: all that is left within the step's tokens, a long prompt's
        share of the cap beside decoding streams."""
        left = seq.num_tokens - seq.num_cached
        chunk = min(left, budget)
        if cap is not None and left > cap:
            chunk = min(chunk, cap - (self.max_num_batched_tokens - budget))
        return chunk

    def _window_chunk(self, seq, chunk, seqs):
        """A counted window pool: the part of `chunk` its free blocks hold, taken now (so the next sequence's
        room is what is left). Where none is left and nothing can give blocks back — no other sequence in this
        step, none decoding — the newest others are preempted until there is (the pool holds one sequence's
        window and a prefill step's: kv_cache.all_windowed)."""
        bm = self.block_manager
        window = bm.counted_window
        room = window.room(seq)
        while room <= 0 and not seqs and not any(not s.in_prefill for s in self.running):
            victim = self._newest_running(exclude=seq)
            if victim is None:
                break
            self.preempt(victim)
            room = window.room(seq)
        chunk = min(chunk, room)
        if chunk > 0:
            bm.prepare(seq, seq.num_cached + chunk)
        return chunk

    def _schedule_decode(self):
        bm = self.block_manager
        bs, running = bm.block_size, SequenceStatus.RUNNING
        window = bm.counted_window
        seqs, cut_short = [], []
        for seq in list(self.running):
            n = len(seq.token_ids)
            if seq.num_cached < n - 1 or seq.status is not running:   # in prefill, or preempted above
                continue
            # the common case: its newest token fits in its last block (and in a counted window pool's: a prefix
            # hit up to its last token left that pool's table a block short of the other's)
            if len(seq.block_table) * bs >= n and (window is None or len(seq.window_table) * bs >= n):
                seqs.append(seq)
                continue
            while not bm.can_append(seq):
                victim = self._newest_running(exclude=seq)
                if victim is None:          # alone and still no room: the KV budget is its length limit
                    self.finish(seq, "length")
                    cut_short.append(seq)
                    break
                self.preempt(victim)
                if victim in seqs:
                    seqs.remove(victim)
            if seq.status is SequenceStatus.RUNNING:   # not preempted nor cut short above
                bm.grow(seq)
                seqs.append(seq)
        return ScheduledStep(False, seqs, [1] * len(seqs), cut_short)

    def _newest_running(self, exclude):
        """The sequence that gives its blocks back first: the newest (by priority: the one with the worst key)."""
        if self.by_priority:
            now = time.perf_counter()
            return max((s for s in self.running if s is not exclude), key=lambda s: self.key(s, now), default=None)
        for seq in reversed(self.running):
            if seq is not exclude:
                return seq
        return None

    def preempt(self, seq):
        """Free the sequence's KV and put it back in the queue (rosefast.engine.waiting), to be recomputed."""
        self.block_manager.free(seq)
        self.running.remove(seq)
        if seq.wants_prompt_logprobs:   # its prompt is computed again from the start: so are they
            seq.prompt_logprobs = [None]
        seq.pooled = None               # (and an embedding's pooling)
        seq.status = SequenceStatus.WAITING
        self.waiting.put_back(seq)
        self.preemptions += 1

    def finish(self, seq, reason):
        self.block_manager.free(seq)
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
