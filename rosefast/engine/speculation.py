"""Speculative decoding by prompt lookup: each running sequence proposes the tokens that followed the latest
earlier occurrence of its last n tokens (n from NGRAM_MAX down to NGRAM_MIN) in its prompt and output; the
engine verifies every proposal of a step in one forward pass and keeps the longest prefix the model agrees
with (LLMEngine._run_speculative).

    spec = Speculator(config.speculative, config.speculative_tokens, config.block_size)
    plan = spec.plan(seqs, max_model_len, free_blocks)   # {i: [proposed ids]} for this decode step's seqs[i]
    spec.record(seq, proposed, accepted)       # after verification: the sequence's acceptance so far

Verification is a decode step with more rows: a sequence's last token and its k proposals each take a row at
their own position (the rows store their K/V first, then each attends up to itself, so the rows of one
sequence see each other causally), and each row's numbers are what a one-token decode step at that position
computes. So greedy output is the same tokens as without speculation, and a sampled row draws from the same
processed distribution with the same (seed, position) uniform: a proposal is kept exactly when the draw equals
it. For a proposal that is one token x (a deterministic proposer) that is the standard acceptance rule: x is
kept with probability p(x), and on rejection the draw is from p with x removed, renormalized.

When it is used (`speculative`): `ngram` proposes wherever a match is found (tests, measurements); `auto`
only where it pays: a step whose running batch is at most `AUTO_MAX_BATCH` (past that the step's linears are
no longer bound by reading the weights, and the extra rows cost nearly what they bring), and a sequence
whose recent proposals were kept often enough (its proposals stop for a while after each step that kept
none, the pause doubling while they keep failing). The proposer (`NgramIndex`) is one small class: a draft
model would be another proposer behind the same plan / record calls.
"""
from rosefast.engine.sequence import SequenceStatus

NGRAM_MAX = 4          # the longest suffix looked up
NGRAM_MIN = 2          # the shortest: a single token repeats too often to predict what follows
AUTO_MAX_BATCH = 8     # auto: steps with more running sequences do not speculate (README: the measurements)
BACKOFF_MAX = 64       # auto: the longest pause (in steps) of a sequence whose proposals keep failing


class NgramIndex:
    """The latest end position of every n-gram (NGRAM_MIN <= n <= NGRAM_MAX) of a sequence's tokens but its
    last one: the last n tokens are looked up in it, never found at their own place. Grows with the tokens
    (O(n range) per token); kept while the sequence lives (a preemption keeps its tokens, so its index)."""
    __slots__ = ("latest", "indexed")

    def __init__(self):
        self.latest = {}     # n-gram tuple -> position of its last token
        self.indexed = 0     # positions < indexed have their n-grams in `latest`

    def propose(self, tokens, k):
        """Up to k tokens that followed the latest earlier occurrence of the longest suffix found; [] if none."""
        latest, end = self.latest, len(tokens) - 1
        for p in range(self.indexed, end):   # every position before the last token
            for n in range(NGRAM_MIN, min(NGRAM_MAX, p + 1) + 1):
                latest[tuple(tokens[p - n + 1:p + 1])] = p
        self.indexed = max(self.indexed, end)
        for n in range(min(NGRAM_MAX, len(tokens)), NGRAM_MIN - 1, -1):
            p = latest.get(tuple(tokens[-n:]))
            if p is not None:
                return tokens[p + 1:p + 1 + k]
        return []


class SeqSpeculation:
    """One sequence's speculation state: its index and how its proposals fared (Sequence.speculation)."""
    __slots__ = ("index", "pause", "backoff", "proposed", "accepted")

    def __init__(self):
        self.index = NgramIndex()
        self.pause = 0       # auto: steps to go before it proposes again
        self.backoff = 1     # auto: the next pause after a step that kept nothing
        self.proposed = self.accepted = 0


class Speculator:
    """Chooses each decode step's proposals and keeps the counts /metrics shows."""

    def __init__(self, mode, max_tokens, block_size):
        """mode: EngineConfig.speculative (checked there); max_tokens: its speculative_tokens."""
        self.mode, self.max_tokens, self.block_size = mode, max_tokens, block_size
        self.proposed = self.accepted = self.steps = 0   # tokens proposed, kept; steps that verified some

    @property
    def enabled(self):
        return self.mode != "off" and self.max_tokens > 0

    def plan(self, seqs, max_model_len, free_blocks):
        """{i: proposal} for the decode step's sequences `seqs` (those that propose). A proposal never runs a
        sequence past its max_tokens or the context, nor forbids what its grammar does, and takes at most
        `free_blocks` new KV blocks in all (the step's own blocks are already given)."""
        if self.mode == "auto" and len(seqs) > AUTO_MAX_BATCH:
            return {}
        plan, bs = {}, self.block_size
        for i, seq in enumerate(seqs):
            spec = seq.speculation
            if spec is None:
                spec = seq.speculation = SeqSpeculation()
            if self.mode == "auto" and spec.pause:
                spec.pause -= 1
                continue
            n = seq.num_tokens
            room = min(self.max_tokens, seq.params.max_tokens - seq.num_output_tokens - 1, max_model_len - n - 1)
            if room <= 0:
                continue
            proposal = spec.index.propose(seq.token_ids, room)
            if proposal and seq.matcher is not None:   # only what the grammar takes, in order
                proposal = proposal[:seq.matcher.validate_tokens(proposal)]
            if not proposal:
                continue
            # the rows' slots: positions n .. n + k - 1; past its last block they need new ones
            need = -(-(n + len(proposal)) // bs) - len(seq.block_table)
            if need > free_blocks:
                proposal = proposal[:len(seq.block_table) * bs - n + free_blocks * bs]
                if not proposal:
                    continue
                need = -(-(n + len(proposal)) // bs) - len(seq.block_table)
            free_blocks -= max(need, 0)
            plan[i] = proposal
        return plan

    def record(self, seq, proposed, accepted):
        """A sequence's verified proposal: `accepted` of its `proposed` tokens were kept."""
        self.proposed += proposed
        self.accepted += accepted
        spec = seq.speculation
        spec.proposed += proposed
        spec.accepted += accepted
        if accepted:
            spec.backoff = 1
        elif seq.status is SequenceStatus.RUNNING:
            spec.pause = spec.backoff
            spec.backoff = min(2 * spec.backoff, BACKOFF_MAX)

    def stats(self):
        return {"spec_proposed": self.proposed, "spec_accepted": self.accepted, "spec_steps": self.steps}
