"""Recurrent-state slots: a sequence of a model with linear-attention layers (rosefast.models.delta_net) holds one
slot of the state pools (rosefast.engine.kv_cache.KVCache.states) from its admission to its end, beside its KV
blocks; the block manager takes and gives them back with the blocks, so the scheduler and admission count them
alike. A slot's state is never shared: a forked choice gets a slot of its own and a copy of its parent's state.

A sequence's state is its whole past: a prefill from its first token starts from zeros, and a later chunk (or
decode) goes on from the slot. So a sequence preempted (its slot given back) is recomputed from its first token,
and a prefix-cache hit can skip only a past whose state was saved: StateCheckpoints.
"""
from collections import OrderedDict


class StateSlots:
    def __init__(self, num_slots):
        self.num_slots = num_slots
        self.free = list(range(num_slots - 1, -1, -1))   # popped from the end: slot 0 first

    @property
    def num_free(self):
        return len(self.free)

    def take(self, seq):
        assert seq.state_slot is None, "a sequence holds one state slot"
        seq.state_slot = self.free.pop()

    def give_back(self, seq):
        if seq.state_slot is not None:
            self.free.append(seq.state_slot)
            seq.state_slot = None

    def fork(self, parent, child):
        """A slot for `child` and the copy to make, (parent's slot, child's); None when none is free."""
        if not self.free:
            return None
        self.take(child)
        return parent.state_slot, child.state_slot

    def check(self, held):
        """Consistency (tests): the free slots and the ones `held` by live sequences are every slot, once."""
        assert sorted(self.free + list(held)) == list(range(self.num_slots)), (self.free, held)


class StateCheckpoints:
    """Saved states: a prefill saves its sequence's state (its recurrent states and conv tails, every linear layer)
    in a checkpoint slot of the state pools at every `every`-th token, found later by the chain hash of the block
    that ends there; a prompt whose cached prefix reaches such a block starts from a copy of that state
    (BlockManager.lookup cuts the hit back to the last block with one). `count` slots from `first` on; the least
    recently used saved state is dropped for a new one. A slot being filled (reserved for a step) or copied from
    in this step is never another's."""

    def __init__(self, first, count, every):
        self.every = every
        self.free = list(range(first + count - 1, first - 1, -1))
        self.by_hash = OrderedDict()   # block chain hash -> checkpoint slot, least recently used first
        self.saved = self.restored = 0

    def reserve(self):
        """A slot to save a state into (a free one, else the least recently used one's), or None: none left."""
        if self.free:
            return self.free.pop()
        if self.by_hash:
            return self.by_hash.popitem(last=False)[1]
        return None

    def register(self, h, slot):
        """The state saved in `slot` is the one after the block whose chain hash is `h`."""
        old = self.by_hash.pop(h, None)
        if old is not None:
            self.free.append(old)
        self.by_hash[h] = slot
        self.saved += 1

    def release(self, slot):
        self.free.append(slot)

    def find(self, h):
        """The slot of the state after block `h` (marked recently used), or None."""
        slot = self.by_hash.get(h)
        if slot is not None:
            self.by_hash.move_to_end(h)
        return slot
