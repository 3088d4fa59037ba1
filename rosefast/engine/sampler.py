"""The batched sampler: one pass of torch ops over a step's [B, V] logits, on their own device.

    result = sampler(logits, seqs)        # seqs: the Sequence of each row (its params, tokens, seed)
    result.token_ids                      # B ints: the only host copy, with the logprobs when asked

Rows with different settings share the pass; each stage runs only when some row needs it:
1. logit processing (in fp32): repetition, frequency and presence penalties from per-sequence token
   counts kept on the device (updated with each sampled token, not rebuilt), logit_bias (uploaded once per
   sequence and kept on the device while it runs), min_tokens
   (EOS and stop ids masked until reached), and an allowed-token bitmask per row (`allowed`: the hook
   structured output plugs into; xgrammar's layout: bit j of int32 word i allows token 32 i + j);
2. greedy rows take the argmax of the processed logits;
3. sampled rows: temperature, top_k, top_p, min_p (vLLM's order), then one draw by inverse CDF: the
   first token whose cumulative probability reaches u x total (rosefast.engine.sample_ops: C kernels on
   the CPU that find the top_k / top_p thresholds with a histogram instead of a sort; the torch twin
   elsewhere). u is one uniform per row, a stateless integer hash of the sequence's (seed, position), so
   its tokens do not depend on the batch it is in or its size; a request without a seed gets one drawn
   from the engine's generator (seeded by the config's seed) when it arrives. One uniform per row costs
   one pass over the row; Gumbel-max would need B x V hashed noise per step. No torch generator is
   involved: the pass is the same on every device.
Logprobs are of the raw model distribution (log_softmax of the unprocessed logits, fp32), as vLLM and
OpenAI report them: what the model thought of each token, whatever the request's sampling settings did.
"""
from dataclasses import dataclass

import torch

from rosefast.engine import sample_ops
from rosefast.device import upload

_NEG_INF = float("-inf")
_MASK32 = 0xFFFFFFFF


@dataclass
class SampleResult:
    token_ids: list               # one per row
    logprobs: list = None         # per row: None, or (chosen token's logprob, [(token, logprob)] top k)


def _mul32(x, c):
    """(x * c) mod 2**32 for int64 tensors x < 2**32: in 16-bit halves, so no int64 product overflows."""
    lo = (x & 0xFFFF) * c
    hi = ((x >> 16) * c) & 0xFFFF
    return (lo + (hi << 16)) & _MASK32


def _hash32(x):
    """A 32-bit integer hash (Wellons' lowbias32) on int64 tensors holding values < 2**32."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def seeded_uniform(seeds, positions):
    """One uniform in (0, 1] per row from (seed, position) alone: int64 tensors -> float32, any device."""
    h = _hash32(positions & _MASK32)
    h = _hash32(h ^ (seeds & _MASK32))
    h = _hash32(h ^ ((seeds >> 32) & _MASK32))
    return ((h >> 8) + 1).to(torch.float32) / float(1 << 24)


class PenaltyState:
    """Per-sequence token counts on the device for the sequences that ask for penalties: a row of
    `counts` (output tokens) and of `seen` (prompt or output) per sequence, kept while it runs."""

    def __init__(self, vocab_size, device):
        self.vocab_size, self.device = vocab_size, device
        self.counts = torch.zeros(0, vocab_size, dtype=torch.int32, device=device)
        self.seen = torch.zeros(0, vocab_size, dtype=torch.bool, device=device)
        self._free = []
        self._slots = {}   # request id -> row

    def __len__(self):
        return len(self._slots)

    def rows(self, seqs):
        """The state rows of these sequences (a new one made from each sequence's tokens so far)."""
        out = []
        for seq in seqs:
            row = self._slots.get(seq.request_id)
            if row is None:
                row = self._slots[seq.request_id] = self._new_row()
                seen = upload(seq.token_ids, torch.long, self.device)          # prompt, then output tokens
                outputs = seen[seq.num_prompt_tokens:]
                self.seen[row].index_put_((seen,), torch.ones_like(seen, dtype=torch.bool))
                self.counts[row].index_add_(0, outputs, torch.ones_like(outputs, dtype=torch.int32))
            out.append(row)
        return out

    def _new_row(self):
        if not self._free:
            old = self.counts.shape[0]
            grow = max(8, old)
            self.counts = torch.cat((self.counts, self.counts.new_zeros(grow, self.vocab_size)))
            self.seen = torch.cat((self.seen, self.seen.new_zeros(grow, self.vocab_size)))
            self._free = list(range(old + grow - 1, old - 1, -1))
        return self._free.pop()

    def add(self, rows, tokens):
        """Count each row's new token: rows a [R] long tensor, tokens [R] long, on the device."""
        self.counts.index_put_((rows, tokens), torch.ones_like(tokens, dtype=torch.int32), accumulate=True)
        self.seen.index_put_((rows, tokens), torch.ones_like(tokens, dtype=torch.bool))

    def release(self, request_id):
        row = self._slots.pop(request_id, None)
        if row is not None:
            self.counts[row].zero_()
            self.seen[row].zero_()
            self._free.append(row)


class Sampler:
    def __init__(self, vocab_size, device="cpu"):
        self.vocab_size = vocab_size
        self.device = torch.device(device)
        self.penalties = PenaltyState(vocab_size, self.device)
        self._bias = {}   # request id -> (token ids [K] long, biases [K] fp32) on the device, made once

    def release(self, request_id):
        """The sequence has ended: forget its sampling state."""
        self.penalties.release(request_id)
        self._bias.pop(request_id, None)

    def _bias_of(self, seq):
        bias = self._bias.get(seq.request_id)
        if bias is None:
            b = seq.params.logit_bias
            bias = self._bias[seq.request_id] = (self._tensor(list(b), torch.long),
                                                 self._tensor(list(b.values()), torch.float32))
        return bias

    def _tensor(self, values, dtype):
        return upload(values, dtype, self.device)

    # -- 1. logit processing -----------------------------------------------------------------------------

    def process(self, x, seqs, allowed=None):
        """Penalties, logit_bias, min_tokens and the allowed-token mask, in place on fp32 logits x [B, V].
        Returns the penalized rows' state rows (a tensor) for counting the sampled tokens, or None."""
        params = [s.params for s in seqs]
        state_rows = None
        pen = [i for i, p in enumerate(params) if p.processed and p.penalized]
        if pen:
            state_rows = self._tensor(self.penalties.rows([seqs[i] for i in pen]), torch.long)
            rows = self._tensor(pen, torch.long)
            xr = x.index_select(0, rows)
            counts = self.penalties.counts.index_select(0, state_rows).to(torch.float32)
            seen = self.penalties.seen.index_select(0, state_rows)
            rep = self._tensor([params[i].repetition_penalty for i in pen], torch.float32)[:, None]
            xr = torch.where(seen, torch.where(xr > 0, xr / rep, xr * rep), xr)
            freq = self._tensor([params[i].frequency_penalty for i in pen], torch.float32)[:, None]
            pres = self._tensor([params[i].presence_penalty for i in pen], torch.float32)[:, None]
            xr = xr - freq * counts - pres * (counts > 0).to(torch.float32)
            x.index_copy_(0, rows, xr)
            state_rows = (rows, state_rows)
        ban_rows, ban_tokens = [], []
        for i, p in enumerate(params):
            if not p.processed:
                continue
            if p.logit_bias:   # its own tensors, uploaded when the sequence first came: one op a step
                tokens, values = self._bias_of(seqs[i])
                x[i].index_add_(0, tokens, values)
            if p.min_tokens and seqs[i].num_output_tokens < p.min_tokens:
                stops = list(seqs[i].stop_ids)
                ban_rows += [i] * len(stops)
                ban_tokens += stops
        if ban_rows:
            x.index_put_((self._tensor(ban_rows, torch.long), self._tensor(ban_tokens, torch.long)),
                         torch.tensor(_NEG_INF, device=x.device))
        if allowed is not None:
            rows, bitmask = allowed
            sample_ops.for_tensor(x).mask(x, upload(rows, torch.long, x.device), upload(bitmask, torch.int32, x.device))
        return state_rows

    # -- the whole pass ----------------------------------------------------------------------------------

    @staticmethod
    def plain(seqs):
        """Whether every row would take the pass's greedy fast path (greedy, nothing to process, no logprobs)."""
        return all(s.params.greedy and not s.params.processed and s.params.logprobs is None for s in seqs)

    def greedy(self, logits):
        """Each row's argmax, as the pass gives rows that take its fast path (`plain`): a list."""
        return sample_ops.for_tensor(logits).argmax(logits).tolist()

    def __call__(self, logits, seqs, allowed=None):
        """logits [B, V] (any device, any float dtype), seqs: the Sequence of each row; `allowed`, when
        given: (rows [R] long tensor, bitmask [R, ceil(V/32)] int32), on any device. Returns a SampleResult."""
        params = [s.params for s in seqs]
        want_lp = [i for i, p in enumerate(params) if p.logprobs is not None]
        if allowed is None and not want_lp and all(p.greedy and not p.processed for p in params):
            return SampleResult(self.greedy(logits))
        raw_lp = None
        if want_lp:
            lp_rows = self._tensor(want_lp, torch.long)
            raw_lp = torch.log_softmax(logits.index_select(0, lp_rows).to(torch.float32), dim=-1)   # unprocessed
        state_rows = None
        x = logits
        if allowed is not None or any(p.processed for p in params):
            x = logits.to(torch.float32, copy=True)                              # [B, V], processed in place
            state_rows = self.process(x, seqs, allowed)
        sampled = [i for i, p in enumerate(params) if not p.greedy]
        if len(sampled) == len(seqs):
            tokens = self._sample(x, seqs)
        else:
            tokens = sample_ops.for_tensor(x).argmax(x)                          # the greedy rows keep theirs
            if sampled:
                rows = self._tensor(sampled, torch.long)
                tokens.index_copy_(0, rows, self._sample(x.index_select(0, rows), [seqs[i] for i in sampled]))
        result = SampleResult(tokens.tolist()) if raw_lp is None else \
            self._with_logprobs(tokens, raw_lp, lp_rows, want_lp, params)
        if state_rows is not None:   # counted last: a pass that failed before here changed no state
            rows, srows = state_rows
            self.penalties.add(srows, tokens.index_select(0, rows))
        return result

    def _sample(self, x, seqs):
        """One token per row of logits x [S, V], each row by its own settings (sample_ops: the C kernels on
        CPU, the torch twin elsewhere)."""
        params = [s.params for s in seqs]
        u = seeded_uniform(self._tensor([s.seed for s in seqs], torch.long),
                           self._tensor([s.num_tokens for s in seqs], torch.long))
        return sample_ops.for_tensor(x).sample(x, [p.temperature for p in params], [max(p.top_k, 0) for p in params],
                                               [p.top_p for p in params], [p.min_p for p in params], u)

    def prompt_logprobs(self, logits, targets, k):
        """Logprobs of the given next tokens under logits [L, V] (raw, fp32) and the top k of each row: a list
        of (logprob, [(token, logprob)]), in one host copy."""
        lp = torch.log_softmax(logits.to(torch.float32), dim=-1)
        chosen = lp.gather(1, self._tensor(targets, torch.long)[:, None])
        parts = [chosen]
        if k:
            top = lp.topk(k, dim=-1)
            parts += [top.values, top.indices.to(torch.float32)]
        host = torch.cat(parts, dim=1).to(torch.float64).tolist()
        return [(row[0], [(int(t), v) for v, t in zip(row[1:1 + k], row[1 + k:])]) for row in host]

    def _with_logprobs(self, tokens, raw_lp, lp_rows, want_lp, params):
        """The ids and the asked logprobs in one host copy: [B] ids, then per asking row its chosen logprob
        and the top k (values, then ids) at the largest k asked."""
        k = max(params[i].logprobs for i in want_lp)
        chosen = raw_lp.gather(1, tokens.index_select(0, lp_rows)[:, None])                 # [L, 1]
        top = raw_lp.topk(k, dim=-1) if k else None
        parts = [chosen] + ([top.values, top.indices.to(torch.float32)] if k else [])
        packed = torch.cat((tokens.to(torch.float64), torch.cat(parts, dim=1).to(torch.float64).flatten()))
        host = packed.tolist()
        B = tokens.shape[0]
        ids = [int(t) for t in host[:B]]
        width = 1 + 2 * k
        logprobs = [None] * B
        for j, i in enumerate(want_lp):
            row = host[B + j * width:B + (j + 1) * width]
            n = params[i].logprobs
            logprobs[i] = (row[0], [(int(t), lp) for lp, t in zip(row[1:1 + n], row[1 + k:1 + k + n])])
        return SampleResult(ids, logprobs)
