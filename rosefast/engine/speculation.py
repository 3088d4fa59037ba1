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

When it is used (`speculative`): `ngram` proposes up to `speculative_tokens` wherever a match is found (tests,
measurements); `auto` only what pays. The engine times its own decode steps by their row count (StepCost: the
recent mean per count, and a fit t0 + rows x t_row for the counts not seen). A sequence's proposed token j is
kept with a chance of about a^j, a its recent acceptance (per proposed token, given the ones before it were
kept); the row pays while a^j is above what the row adds to the step's time over the step's time per sequence's
token (at one stream a cheap row is worth even a likely miss; at 32 streams, where each row costs about what a
token does, almost nothing is), and a step whose first extra row needs 0.95 proposes nothing. A sequence whose
acceptance is below that pauses, then probes with one token, the pause doubling while it stays so (what a
sequence whose guesses fail costs is bounded); a proposal that kept nothing only lowers its acceptance, so the
next is shorter (a copy often resumes after one changed word: pausing there lost more than it saved). A proposal is also no
longer than twice its match's length (a long match predicts further). The proposer is a function of the
sequence and the most tokens it may propose (`prompt_lookup`, over the sequence's `NgramIndex`, by default):
a draft model would be another behind the same plan / record calls (benches/speculative_ceiling.py gives one
that proposes a recorded greedy continuation: the ceiling of any proposer on the CPU at hand).
"""

NGRAM_MAX = 4          # the longest suffix looked up
NGRAM_MIN = 1          # the shortest (a one-token match proposes at most 2 tokens: MATCH_REACH)
MATCH_REACH = 2        # a proposal is at most this many tokens per token of the match it follows
BACKOFF_MAX = 64       # auto: the longest pause (in steps) of a sequence whose proposals keep failing
PRIOR_ACCEPT = 0.6     # auto: a sequence's acceptance before it has verified anything (worth 2 tokens of evidence)
ACCEPT_DECAY = 0.8     # auto: the weight its past keeps at each verification (its acceptance follows its text)
PRIOR_ROW_SHARE = 0.4  # auto: t_row / t0 until the engine has measured its own steps (a 2-core AVX-512 VNNI
                       # Xeon: 0.37-0.43 on SmolLM2-135M int4, README)


class NgramIndex:
    """The latest end position of every n-gram (NGRAM_MIN <= n <= NGRAM_MAX) of a sequence's tokens but its
    last one: the last n tokens are looked up in it, never found at their own place. Grows with the tokens
    (O(n range) per token); kept while the sequence lives (a preemption keeps its tokens, so its index)."""
    __slots__ = ("latest", "indexed")

    def __init__(self):
        self.latest = {}     # n-gram tuple -> position of its last token
        self.indexed = 0     # positions < indexed have their n-grams in `latest`

    def propose(self, tokens, k):
        """Up to k tokens (and MATCH_REACH per token of the match) that followed the latest earlier occurrence of
        the longest suffix found; [] if none."""
        latest, end = self.latest, len(tokens) - 1
        for p in range(self.indexed, end):   # every position before the last token
            for n in range(NGRAM_MIN, min(NGRAM_MAX, p + 1) + 1):
                latest[tokens[p] if n == 1 else tuple(tokens[p - n + 1:p + 1])] = p
        self.indexed = max(self.indexed, end)
        for n in range(min(NGRAM_MAX, len(tokens)), NGRAM_MIN - 1, -1):
            p = latest.get(tokens[-1] if n == 1 else tuple(tokens[-n:]))
            if p is not None:
                return tokens[p + 1:p + 1 + min(k, MATCH_REACH * n)]
        return []


def prompt_lookup(seq, k):
    """The default proposer: up to k tokens that followed the latest earlier occurrence of the sequence's last
    tokens in its prompt and output."""
    return seq.speculation.index.propose(seq.token_ids, k)


class SeqSpeculation:
    """One sequence's speculation state: its index and how its proposals fared (Sequence.speculation)."""
    __slots__ = ("index", "pause", "backoff", "probe", "kept", "tried")

    def __init__(self):
        self.index = NgramIndex()
        self.pause = 0       # auto: steps to go before it proposes again
        self.backoff = 1     # auto: the next pause of a sequence below the threshold (a kept token resets it)
        self.probe = False   # auto: its acceptance is below the step's threshold: at the pause's end, one token
        self.kept, self.tried = 2 * PRIOR_ACCEPT, 2.0   # decayed counts: tokens kept / tokens tried (a miss ends a try)

    @property
    def acceptance(self):
        """The chance its next proposed token is kept, given the ones before it were."""
        return self.kept / self.tried

    def verified(self, proposed, accepted):
        self.kept = ACCEPT_DECAY * self.kept + accepted
        self.tried = ACCEPT_DECAY * self.tried + accepted + (accepted < proposed)


class StepCost:
    """What a decode step of R rows takes: the mean seconds of the recent steps of each row count, and a fit of
    them all as t0 + R x t_row (least squares, each step's weight decaying as newer ones come) for the counts
    not seen. `threshold(B, R)`: the chance of being kept above which row R + 1 pays in a step of B sequences —
    the time it adds over the time the step takes per sequence's token, (T(R + 1) - T(R)) / (T(B) / B); with
    nothing measured, from PRIOR_ROW_SHARE (t_row / t0)."""

    def __init__(self, decay=0.98):
        self.decay = decay
        self.w = self.r = self.rr = self.t = self.rt = 0.0
        self.by_rows = {}   # R -> recent seconds of a step of R rows (each new step a fifth of it)

    def observe(self, rows, seconds):
        d = self.decay
        self.w, self.r, self.rr = d * self.w + 1, d * self.r + rows, d * self.rr + rows * rows
        self.t, self.rt = d * self.t + seconds, d * self.rt + rows * seconds
        old = self.by_rows.get(rows)
        self.by_rows[rows] = seconds if old is None else 0.8 * old + 0.2 * seconds

    def row_share(self):
        """t_row / t0 of the fit (PRIOR_ROW_SHARE until the steps seen had rows of different counts)."""
        w = self.w
        var = self.rr / w - (self.r / w) ** 2 if w else 0.0
        if var < 0.25:   # the rows hardly varied: no slope to read
            return PRIOR_ROW_SHARE
        slope = (self.rt / w - self.r / w * self.t / w) / var
        t0 = self.t / w - slope * self.r / w
        if t0 <= 0:
            return 1.0
        return min(max(slope / t0, 0.01), 1.0)

    def threshold(self, batch, rows):
        seen = self.by_rows
        if batch in seen and rows in seen and rows + 1 in seen:
            added = seen[rows + 1] - seen[rows]
            if added > 0:   # (noise can order two counts' means the wrong way: then the fit decides)
                return added * batch / seen[batch]
        share = batch * self.row_share()
        return share / (1 + share)


class Speculator:
    """Chooses each decode step's proposals and keeps the counts /metrics shows."""

    def __init__(self, mode, max_tokens, block_size, max_rows=64, proposer=prompt_lookup):
        """mode: EngineConfig.speculative (checked there); max_tokens: its speculative_tokens; max_rows: the most
        rows a decode step may have (max_batch_size: what the engine sized its memory, and CUDA its graphs, for);
        proposer(seq, k): at most k ids of the vocabulary to verify after the sequence's last token (a wrong one
        is only not kept)."""
        self.mode, self.max_tokens, self.block_size, self.max_rows = mode, max_tokens, block_size, max_rows
        self.proposer = proposer
        self.proposed = self.accepted = self.steps = 0   # tokens proposed, kept; steps that verified some
        self.cost = StepCost()   # the engine's decode steps (LLMEngine._run)

    @property
    def enabled(self):
        return self.mode != "off" and self.max_tokens > 0

    def plan(self, seqs, max_model_len, free_blocks):
        """{i: proposal} for the decode step's sequences `seqs` (those that propose). A proposal never runs a
        sequence past its max_tokens or the context, nor forbids what its grammar does, and takes at most
        `free_blocks` new KV blocks in all (the step's own blocks are already given); the step's rows stay within
        max_rows."""
        auto, batch = self.mode == "auto", len(seqs)
        rows = batch   # the step's rows so far
        if auto and self.cost.threshold(batch, rows) >= 0.95:
            return {}
        plan, bs = {}, self.block_size
        for i, seq in enumerate(seqs):
            spec = seq.speculation
            if spec is None:
                spec = seq.speculation = SeqSpeculation()
            k = min(self.max_tokens, self.max_rows - rows)
            if k <= 0:
                break
            if auto:
                if spec.pause:
                    spec.pause -= 1
                    continue
                a, kept, most, k = spec.acceptance, 1.0, k, 0   # rows while each one's chance to be kept pays
                while k < most:
                    kept *= a
                    if kept <= self.cost.threshold(batch, rows + k):
                        break
                    k += 1
                if k < 1:   # not even one token worth its row: one token to probe, after a pause that doubles
                    if not spec.probe:
                        spec.pause, spec.probe = spec.backoff, True
                        spec.backoff = min(2 * spec.backoff, BACKOFF_MAX)
                        continue
                    k = 1
                spec.probe = False
            n = seq.num_tokens
            room = min(k, seq.params.max_tokens - seq.num_output_tokens - 1, max_model_len - n - 1)
            if room <= 0:
                continue
            proposal = list(self.proposer(seq, room))[:room]
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
            rows += len(proposal)
        return plan

    def record(self, seq, proposed, accepted):
        """A sequence's verified proposal: `accepted` of its `proposed` tokens were kept."""
        self.proposed += proposed
        self.accepted += accepted
        spec = seq.speculation
        spec.verified(proposed, accepted)
        if accepted:
            spec.backoff = 1

    def stats(self):
        return {"spec_proposed": self.proposed, "spec_accepted": self.accepted, "spec_steps": self.steps}
