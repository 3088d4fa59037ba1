"""Recurrent-state slots: a sequence of a model with linear-attention layers (rosefast.models.delta_net) holds one
slot of the state pools (rosefast.engine.kv_cache.KVCache.states) from its admission to its end, beside its KV
blocks; the block manager takes and gives them back with the blocks, so the scheduler and admission count them
alike. A slot's state is never shared: a forked choice gets a slot of its own and a copy of its parent's state.

A sequence's state is its whole past: a prefill from its first token starts from zeros, and a later chunk (or
decode) goes on from the slot. So a sequence preempted (its slot given back) is recomputed from its first token,
and no prefix-cache hit can skip its past (the engine runs such a model without the prefix cache).
"""


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
