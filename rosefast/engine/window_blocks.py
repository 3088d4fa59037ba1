"""WindowBlocks: the sliding-window layers' own KV blocks.

A layer on a sliding window of W positions (Mistral's every layer, Gemma 3's local ones) never reads a position
W or more before its query, so those layers keep only the blocks a sequence's next query can see. Each
sequence's `window_table` is indexed as its block table (entry i: positions [i * bs, (i + 1) * bs)), with
`released` for a block that fell out of the window: given back as the sequence moves on (kept in this pool's prefix cache
until it is evicted). Blocks are taken as the steps reach them (prepare), not for a whole prompt at admission,
so a sequence holds at most (W + its step's new tokens) / bs + 2 of them whatever its length; the pool is sized
for every running sequence at once (pool_blocks) and so never runs short — or, where the budget cannot hold that
for a model whose every layer is windowed, it is `counted`: the scheduler admits and grows sequences by its free
blocks, as by the other pool's.
"""
from rosefast.engine.block_manager import BlockPool


def pool_blocks(config, window, running=None):
    """Blocks the window pool needs at most: each of `running` sequences' window and a decode step's new tokens
    (speculative ones included), plus one prefill step's tokens, each span rounded out to whole blocks (running:
    every sequence that may run at once, by default)."""
    bs = config.block_size
    if running is None:
        running = min(config.max_batch_size, config.max_active_requests or config.max_batch_size)
    proposals = config.speculative_tokens if config.speculative != "off" else 0
    per_sequence = -(-(window + 1 + proposals) // bs) + 2
    return running * per_sequence + -(-config.max_num_batched_tokens // bs) + config.prefill_max_batch_size


class WindowBlocks(BlockPool):
    def __init__(self, num_blocks, block_size, window, counted=False):
        """counted: the pool is smaller than every running sequence's window (a model whose every layer is
        windowed, on a budget that cannot hold them all): then the scheduler counts it, as it counts the other
        pool — a sequence is admitted, a prefill chunk sized, a decode step grown, a proposal or a fork made only
        where this pool has the blocks, the newest sequence preempted where it has not."""
        super().__init__(num_blocks, block_size)
        self.window = window
        self.counted = counted
        # a released entry: the pool's scratch block (KVCache's), read only where the window's mask hides it
        self.released = num_blocks

    def _first_needed(self, position):
        """The first block a query at `position` sees."""
        return max(0, position - self.window + 1) // self.block_size

    def _block_tokens(self, seq, i):
        bs = self.block_size
        return tuple(seq.token_ids[i * bs:(i + 1) * bs])

    def cached_prefix(self, seq, hashes):
        """The longest prefix hit (in blocks, at most len(hashes): the other pool's hit, with its chain hashes)
        whose window before it is cached in this pool too."""
        last_miss, misses = -1, []   # misses[k]: the last block before k this pool does not have
        for i, h in enumerate(hashes):
            misses.append(last_miss)
            if self._cached(h, self._block_tokens(seq, i)) is None:
                last_miss = i
        misses.append(last_miss)
        for k in range(len(hashes), 0, -1):
            if misses[k] < self._first_needed(k * self.block_size):
                return k
        return 0

    def allocate(self, seq, hashes):
        """A sequence's hit (cached_prefix allowed it): the window's blocks before it taken back."""
        assert not seq.window_table
        first = self._first_needed(len(hashes) * self.block_size)
        seq.window_table = [self.released] * first
        for i in range(first, len(hashes)):
            block = self._cached(hashes[i], self._block_tokens(seq, i))
            self._acquire(block)
            seq.window_table.append(block)

    def blocks_to(self, seq, num_tokens):
        """The free blocks extend(seq, num_tokens) would take."""
        return max(0, self.blocks_for(num_tokens) - len(seq.window_table))

    def room(self, seq):
        """The tokens past those the sequence has computed that this pool's free blocks let a step compute."""
        return (len(seq.window_table) + self.num_free_blocks) * self.block_size - seq.num_cached

    def revived(self, hashes, seq):
        """The free (cached, unreferenced) blocks allocate(seq, hashes) would take back."""
        first = self._first_needed(len(hashes) * self.block_size)
        return sum(1 for i in range(first, len(hashes))
                   if self.ref_counts[self._cached(hashes[i], self._block_tokens(seq, i))] == 0)

    def extend(self, seq, num_tokens):
        """Blocks for the sequence's positions up to `num_tokens` (a step is about to compute them)."""
        table = seq.window_table
        while len(table) < self.blocks_for(num_tokens):
            if not self.num_free_blocks:
                raise RuntimeError(f"the sliding-window KV pool ({self.num_blocks} blocks) ran out: it is sized for "
                                   f"every running sequence at once, so this is a bug")
            table.append(self._take_free())

    def register(self, seq, i, h, tokens):
        """Block i of the sequence is full and computed: into this pool's prefix cache under its chain hash."""
        table = seq.window_table
        if i < len(table) and table[i] != self.released:
            self._register(table[i], h, tokens)

    def advance(self, seq):
        """Give back the blocks the sequence's next query no longer sees (walked back from the newest of them to
        the run released before: each block once)."""
        table, released = seq.window_table, self.released
        i = min(self._first_needed(seq.num_cached), len(table)) - 1
        while i >= 0 and table[i] != released:
            self._release(table[i])
            table[i] = released
            i -= 1

    def trim(self, seq, keep):
        """Give back the blocks past the first `keep` (reserved for proposals that were not kept)."""
        table = seq.window_table
        while len(table) > keep:
            block = table.pop()
            assert self.ref_counts[block] == 1 and self.block_hash[block] is None, "a trimmed block was shared"
            self._release(block)

    def fork(self, parent, child, full):
        """The child shares the parent's first `full` blocks still in the window; its copy of a trailing partial
        one is a fresh block: returns (source, destination) for that copy, or None."""
        table = parent.window_table
        for block in table[:full]:
            if block != self.released:
                self.ref_counts[block] += 1
        child.window_table = table[:full]
        if len(table) == full:
            return None
        block = self._take_free()
        child.window_table.append(block)
        return table[full], block

    def free(self, seq):
        for block in reversed(seq.window_table):
            if block != self.released:
                self._release(block)
        seq.window_table = []
