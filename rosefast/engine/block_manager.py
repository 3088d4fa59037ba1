"""BlockManager: ref-counted KV blocks with prefix caching.

Each full block of a sequence gets a chained hash (previous block's hash + this block's tokens; the first
block's chain starts from the sequence's cache_salt: a long-RoPE sequence past its switch) once
its K/V are computed. A new sequence looks its leading full blocks up by hash, and a hit is confirmed
by comparing the tokens, so a hash collision can never hand out the wrong K/V. Freed blocks keep their
hash and content until they are needed again (lazy eviction, least recently freed first).

A model with sliding-window layers keeps their K/V in a pool of their own (rosefast.engine.window_blocks):
this manager's blocks are then the other layers' (and the admission's count), and each call here keeps the
window's table in step.
"""
from collections import OrderedDict, deque


def chain_hash(prev_hash, tokens):
    return hash((prev_hash, tokens))


class BlockPool:
    """One pool's blocks: reference counts, the free lists and the prefix cache's registry (hash -> block)."""

    def __init__(self, num_blocks, block_size):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_counts = [0] * num_blocks
        self.block_hash = [None] * num_blocks
        self.block_tokens = [None] * num_blocks
        self.hash_to_block = {}
        self.free_plain = deque(range(num_blocks))    # no cached content: handed out first
        self.free_cached = OrderedDict()              # cached content, least recently freed first
        self.evictions = 0

    @property
    def num_free_blocks(self):
        return len(self.free_plain) + len(self.free_cached)

    @property
    def num_used_blocks(self):
        return self.num_blocks - self.num_free_blocks

    def blocks_for(self, num_tokens):
        return -(-num_tokens // self.block_size)

    def _take_free(self):
        if self.free_plain:
            block = self.free_plain.popleft()
        else:
            block, _ = self.free_cached.popitem(last=False)   # evict the least recently freed
            del self.hash_to_block[self.block_hash[block]]
            self.block_hash[block] = self.block_tokens[block] = None
            self.evictions += 1
        self.ref_counts[block] = 1
        return block

    def _cached(self, h, tokens):
        """The block registered under `h` holding `tokens`, or None (a collision is a miss)."""
        block = self.hash_to_block.get(h)
        return block if block is not None and self.block_tokens[block] == tokens else None

    def _acquire(self, block):
        """One more reference to a block (a cached one taken back out of the free list)."""
        if self.ref_counts[block] == 0:
            del self.free_cached[block]
        self.ref_counts[block] += 1

    def _register(self, block, h, tokens):
        """Register a computed full block under its chain hash, unless it is registered already or the hash is
        taken (by an equal block cached elsewhere, or a colliding one: this one stays unregistered)."""
        if self.block_hash[block] is None and h not in self.hash_to_block:
            self.block_hash[block] = h
            self.block_tokens[block] = tokens
            self.hash_to_block[h] = block

    def _release(self, block):
        self.ref_counts[block] -= 1
        if self.ref_counts[block] < 0:
            raise RuntimeError(f"block {block} freed twice")
        if self.ref_counts[block] == 0:
            if self.block_hash[block] is not None:
                self.free_cached[block] = None
            else:
                self.free_plain.append(block)

    def check(self):
        """Consistency of the pool (tests): every block is either referenced or free, exactly once."""
        free = list(self.free_plain) + list(self.free_cached)
        assert len(free) == len(set(free)), "a block is free twice"
        assert all(self.ref_counts[b] == 0 for b in free), "a free block is referenced"
        assert sum(1 for r in self.ref_counts if r > 0) + len(free) == self.num_blocks, "a block leaked"
        assert all(self.block_hash[b] == h for h, b in self.hash_to_block.items())


class BlockManager(BlockPool):
    def __init__(self, num_blocks, block_size, enable_prefix_cache=True, hash_fn=chain_hash, window=None,
                 states=None, checkpoints=None):
        """window: the sliding-window layers' blocks (a WindowBlocks), or None when the model has none; states: the
        linear-attention layers' state slots (a StateSlots: one a sequence, taken and given back with its blocks),
        or None; checkpoints: their saved states (a StateCheckpoints): a hit must end where one was saved (none
        without them)."""
        super().__init__(num_blocks, block_size)
        self.enable_prefix_cache = enable_prefix_cache
        self.hash_fn = hash_fn
        self.window = window
        self.states = states
        self.checkpoints = checkpoints
        self.hits = self.misses = 0

    # -- allocation ---------------------------------------------------------------------------------

    def lookup(self, seq):
        """The cached leading blocks of `seq` (at most all but its last token), whether the search ended on a
        miss, and their chain hashes. Changes nothing: pass the result to can_allocate and allocate. With a
        window pool the hit ends where the window's blocks before it are cached too."""
        if not self.enable_prefix_cache or seq.computes_every_position:   # every position computed, none skipped
            return [], False, []
        bs, found, hashes, prev = self.block_size, [], [], seq.cache_salt
        missed = False
        for i in range((seq.num_tokens - 1) // bs):
            tokens = tuple(seq.token_ids[i * bs:(i + 1) * bs])
            h = self.hash_fn(prev, tokens)
            block = self._cached(h, tokens)
            if block is None:
                missed = True
                break
            found.append(block)
            hashes.append(h)
            prev = h
        if self.window is not None and found:
            k = self.window.cached_prefix(seq, hashes)
            if k < len(found):
                found, hashes, missed = found[:k], hashes[:k], True
        if self.states is not None and found:   # linear attention: back to the last block a saved state follows
            by_hash = self.checkpoints.by_hash if self.checkpoints is not None else {}
            k = len(found)
            while k and hashes[k - 1] not in by_hash:
                k -= 1
            if k < len(found):
                found, hashes, missed = found[:k], hashes[:k], True
        return found, missed, hashes

    @property
    def counted_window(self):
        """The window pool where the scheduler counts it (WindowBlocks.counted), else None."""
        window = self.window
        return window if window is not None and window.counted else None

    def can_allocate(self, seq, hit):
        """Whether `seq` fits now, given its `lookup` result (and a block for each choice it will fork; a counted
        window pool: its hit's window blocks and one for its first new tokens)."""
        found = hit[0]
        revived = sum(1 for b in found if self.ref_counts[b] == 0)
        need = self.blocks_for(seq.num_tokens) - len(found) + revived + len(seq.fork_ids)
        window = self.counted_window
        if window is not None and window.revived(hit[2], seq) + 1 > window.num_free_blocks:
            return False
        if self.states is not None and not self.states.num_free:
            return False
        return need <= self.num_free_blocks

    def allocate(self, seq, hit):
        """Give a waiting sequence blocks for all its tokens, reusing the cached leading blocks found by
        `lookup` (nothing ran between the two: the engine thread owns the block manager). The window pool
        takes its cached blocks before the hit now, the rest as the steps reach them (prepare)."""
        assert not seq.block_table
        found, missed, hashes = hit
        self.hits += len(found)
        self.misses += missed
        for block in found:
            self._acquire(block)
            seq.block_table.append(block)
        seq.num_hashed_blocks = len(seq.block_table)
        seq.last_hash = hashes[-1] if hashes else None
        seq.num_cached = len(seq.block_table) * self.block_size
        if seq.cached_prompt_tokens is None:   # what a client is told was cached: its first admission's hits
            seq.cached_prompt_tokens = min(seq.num_cached, seq.num_prompt_tokens)
        if self.window is not None:
            self.window.allocate(seq, hashes)
        if self.states is not None:
            self.states.take(seq)
            if found:   # (lookup ended the hit at a saved state: the engine copies it in before the step)
                seq.state_restore = self.checkpoints.find(hashes[-1])
                self.checkpoints.restored += 1
        self.append_slot(seq)

    def can_append(self, seq):
        """Whether the blocks up to the sequence's newest token are free (in a counted window pool too)."""
        window = self.counted_window
        if window is not None and window.blocks_to(seq, seq.num_tokens) > window.num_free_blocks:
            return False
        return self.blocks_for(seq.num_tokens) - len(seq.block_table) <= self.num_free_blocks

    def append_slot(self, seq):
        """Give the sequence blocks up to its newest token."""
        while len(seq.block_table) < self.blocks_for(seq.num_tokens):
            seq.block_table.append(self._take_free())

    def grow(self, seq):
        """A decoding sequence's blocks up to its newest token (can_append said they are free): a counted window
        pool's taken now too, so that the next sequence's check sees them gone."""
        self.append_slot(seq)
        window = self.counted_window
        if window is not None:
            window.extend(seq, seq.num_tokens)

    def spare_blocks(self):
        """The free blocks a step's proposals may take (a counted window pool's too)."""
        window = self.counted_window
        return self.num_free_blocks if window is None else min(self.num_free_blocks, window.num_free_blocks)

    def prepare(self, seq, num_tokens):
        """Before a step that computes the sequence's positions up to `num_tokens`: the window pool's blocks for
        them (this pool's the sequence has: allocate, append_slot, reserve)."""
        if self.window is not None:
            self.window.extend(seq, num_tokens)

    def reserve(self, seq, num_tokens):
        """Blocks up to `num_tokens` tokens for a step that computes past the sequence's newest token (a
        speculative step's proposals; the caller counted the free blocks). `trim` gives back what was not kept."""
        while len(seq.block_table) < self.blocks_for(num_tokens):
            seq.block_table.append(self._take_free())
        self.prepare(seq, num_tokens)

    def trim(self, seq):
        """Give back the blocks past the sequence's newest token (reserved, then not needed: their K/V are of
        rejected proposals, and no hash was registered for them)."""
        keep = self.blocks_for(seq.num_tokens)
        while len(seq.block_table) > keep:
            block = seq.block_table.pop()
            assert self.ref_counts[block] == 1 and self.block_hash[block] is None, "a trimmed block was shared"
            self._release(block)
        if self.window is not None:
            self.window.trim(seq, keep)

    def fork(self, parent, child):
        """Give `child` the parent's computed blocks: the full ones shared (ref-counted), a trailing partial
        one copied into a fresh block (and a state slot of its own, a copy of the parent's). Returns the copies to
        make, (source, destination) blocks of this pool and of the window's (None where there is no partial block)
        and slots of the state pools (None without them), or None when there is none; False when there is no free
        block or slot for it (nothing is changed then)."""
        full = parent.num_cached // self.block_size
        partial = len(parent.block_table) > full
        window = self.counted_window
        if partial and not (self.num_free_blocks and (window is None or window.num_free_blocks)):
            return False
        if self.states is not None and not self.states.num_free:
            return False
        for block in parent.block_table[:full]:
            self.ref_counts[block] += 1
        child.block_table = parent.block_table[:full]
        child.num_cached = parent.num_cached
        child.num_hashed_blocks = min(parent.num_hashed_blocks, full)
        child.last_hash = parent.last_hash
        window = self.window.fork(parent, child, full) if self.window is not None else None
        state = self.states.fork(parent, child) if self.states is not None else None
        if not partial:
            return None if state is None else (None, window, state)
        block = self._take_free()
        child.block_table.append(block)
        return (parent.block_table[full], block), window, state

    def commit(self, seq):
        """Register the full blocks whose K/V are now computed, so later requests can reuse them (and give the
        window pool's blocks that fell out of the window back)."""
        if self.enable_prefix_cache:
            bs = self.block_size
            full = min(seq.num_cached, len(seq.token_ids)) // bs
            i = seq.num_hashed_blocks
            if i < full:   # most steps: no block filled up
                self._commit_blocks(seq, i, full)
        if self.window is not None:
            self.window.advance(seq)

    def _commit_blocks(self, seq, i, full):
        bs, prev, window = self.block_size, seq.last_hash if i else seq.cache_salt, self.window
        while i < full:
            tokens = tuple(seq.token_ids[i * bs:(i + 1) * bs])
            h = self.hash_fn(prev, tokens)
            self._register(seq.block_table[i], h, tokens)   # the chain goes on past a block left unregistered
            if seq.state_saves and seq.state_saves[0][0] == (i + 1) * bs:   # its state after this block, saved
                self.checkpoints.register(h, seq.state_saves.pop(0)[1])
            if window is not None:
                window.register(seq, i, h, tokens)
            prev = h
            i += 1
        seq.num_hashed_blocks, seq.last_hash = i, prev

    def release_saves(self, seq):
        """Give back the checkpoint slots reserved for `seq`'s saves that no block hash took (a failed step, a
        save past the blocks committed)."""
        for _, slot in seq.state_saves:
            self.checkpoints.release(slot)
        seq.state_saves = []

    def free(self, seq):
        """Release the sequence's blocks (deepest first, so a prefix's root is evicted last)."""
        for block in reversed(seq.block_table):
            self._release(block)
        if self.window is not None:
            self.window.free(seq)
        if self.states is not None:
            self.states.give_back(seq)
            self.release_saves(seq)
            seq.state_restore = None
        seq.block_table = []
        seq.num_cached = 0
        seq.num_hashed_blocks = 0
        seq.last_hash = None

    def check(self):
        """Consistency of the pools (tests)."""
        super().check()
        if self.window is not None:
            self.window.check()
