"""StandInRunner: the engine's model runner with no model — for sizing the frontend and a load balancer.

`ROSEFAST_MODEL=stand-in` (or `EngineConfig(model="stand-in")`) keeps everything of a real server — the
default model's tokenizer and limits, admission, tokenize workers, the scheduler with its batch and KV
limits, the detokenizer and stop strings, fan-out, collectors, waker, SSE — and replaces only the forward
pass and the sampler: each step waits `stand_in_step_ms` (the GIL released) and gives every sequence its
next token from STAND_IN_TEXT, output token i being `stand_in_tokens[i % len]`. Its logprobs are 0.0 (the
one token it can give has probability 1).
"""
import time
from dataclasses import replace

import torch

from rosefast.engine.kv_cache import plan_blocks
from rosefast.engine.sampler import SampleResult
from rosefast.models.args import load_model_args

# Real tokens of the default model's vocabulary, multibyte characters (split across byte tokens) included.
STAND_IN_TEXT = ("The quick brown fox jumps over the lazy dog. Café crème, naïve façade — 日本語のテキスト, "
                 "emoji 🚀✨ and math ∑ x² ≤ ∞. "
                 "Continuous batching keeps every stream moving.\n")


def stand_in_tokens(tokenizer):
    """The cycle of token ids the stand-in generates (the text without special tokens)."""
    return tokenizer(STAND_IN_TEXT, add_special_tokens=False)["input_ids"]


def stand_in_text(tokenizer, num_tokens):
    """The exact text of a stand-in completion of `num_tokens` tokens (stop strings aside)."""
    cycle = stand_in_tokens(tokenizer)
    ids = [cycle[i % len(cycle)] for i in range(num_tokens)]
    return tokenizer.decode(ids, skip_special_tokens=True)


class _Rows:
    """The stand-in's logits: only how many rows there are, selected as the engine selects a tensor's rows
    (`index_select` with an index tensor on `device`)."""
    __slots__ = ("n",)
    device = torch.device("cpu")

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, rows):
        return _Rows(len(rows))

    def index_select(self, dim, index):
        return _Rows(len(index))


class _StandInKV:
    """Block counts as the real model's cache would have them (from `kv_cache_tokens` or the memory
    fraction, at bf16); no memory behind them."""

    window_blocks = 0   # every layer's blocks in the one pool (the stand-in computes nothing to window)

    def __init__(self, num_blocks):
        self.num_blocks = num_blocks

    def copy_blocks(self, copies):
        pass


class StandInSampler:
    def __init__(self, cycle):
        self.cycle = cycle

    def __call__(self, logits, seqs, allowed=None):
        cycle, n = self.cycle, len(self.cycle)
        tokens = [cycle[s.num_output_tokens % n] for s in seqs]
        if all(s.params.logprobs is None for s in seqs):
            return SampleResult(tokens)
        return SampleResult(tokens, [None if s.params.logprobs is None else (0.0, [(t, 0.0)][:s.params.logprobs])
                                     for s, t in zip(seqs, tokens)])

    def prompt_logprobs(self, logits, targets, k):
        return [(0.0, [(t, 0.0)][:k]) for t in targets]

    def release(self, request_id):
        pass


class StandInRunner:
    """What LLMEngine uses of a ModelRunner: args, max_model_len, kv, forward, sampler (and a device and dtype
    to show)."""

    def __init__(self, config, model):
        from rosefast.build import load_tokenizer

        self.config = config
        self.device, self.dtype = torch.device("cpu"), "no model"
        self.args = load_model_args(model.path)
        self.max_model_len = min(config.max_model_len or self.args.max_position_embeddings,
                                 self.args.max_position_embeddings)
        self.kv = _StandInKV(plan_blocks(config, replace(self.args, sliding_window=0), torch.bfloat16,
                                          torch.device("cpu"))[0])
        self.sampler = StandInSampler(stand_in_tokens(load_tokenizer(model)))
        self.step_seconds = config.stand_in_step_ms / 1000.0
        self.token_seconds = config.stand_in_token_ms / 1000.0

    def forward(self, seqs, is_prefill, all_logits=False):
        wait = self.step_seconds + (self.token_seconds * sum(len(s.token_ids) for s in seqs) if is_prefill else 0)
        if wait:
            time.sleep(wait)
        if all_logits and all_logits is not True:
            return _Rows(sum(len(s.token_ids) if i in all_logits else 1 for i, s in enumerate(seqs)))
        return _Rows(sum(len(s.token_ids) for s in seqs) if all_logits else len(seqs))
