"""SamplingParams (validated) and the batched Sampler: greedy, temperature, top-k, top-p, per-request seed."""
import math
from dataclasses import dataclass

import torch

_INF = float("inf")
_PLAIN_NUMBER = (float, int)   # exact types: a bool is neither


def _int(name, value, low):
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")


def _number(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")


@dataclass(slots=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0     # 0: greedy
    top_p: float = 1.0           # in (0, 1]
    top_k: int = 0               # 0 (or -1): all tokens
    seed: int = None             # per-request generator: the same seed gives the same tokens
    stop_token_ids: tuple = ()   # extra tokens that end the request (besides EOS)
    stop: tuple = ()             # stop strings (the detokenizer cuts the text there)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False

    def __post_init__(self):
        # One expression for the common, plainly typed request (it is on the submit path); anything
        # else — an int temperature, a seed, stop strings, a bad value — gets the full check.
        if not (type(self.max_tokens) is int and self.max_tokens >= 1
                and type(self.temperature) in _PLAIN_NUMBER and 0.0 <= self.temperature < _INF
                and type(self.top_p) in _PLAIN_NUMBER and 0.0 < self.top_p <= 1.0
                and type(self.top_k) is int and self.top_k >= -1
                and self.seed is None and self.stop == () and self.stop_token_ids == ()):
            self._validate()

    def _validate(self):
        _int("max_tokens", self.max_tokens, 1)
        _number("temperature", self.temperature)
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        _number("top_p", self.top_p)
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        _int("top_k", self.top_k, -1)
        if self.seed is not None:
            _int("seed", self.seed, 0)
        if isinstance(self.stop, str):
            self.stop = (self.stop,)
        self.stop = tuple(self.stop)
        if not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop must be a non-empty string or a list of them, got {self.stop!r}")
        self.stop_token_ids = tuple(self.stop_token_ids)
        for t in self.stop_token_ids:
            _int("stop_token_ids", t, 0)

    @property
    def greedy(self):
        return self.temperature == 0


class Sampler:
    """Samples one token per row; rows with temperature 0 take the argmax."""

    def __init__(self, seed=0):
        self.default_generator = torch.Generator().manual_seed(seed)

    @staticmethod
    def make_generator(seed):
        return None if seed is None else torch.Generator().manual_seed(seed)

    def __call__(self, logits, params, generators):
        """logits [B, V] (any device); params, generators: per row. Returns a list of B token ids."""
        greedy = logits.argmax(dim=-1).tolist()
        if all(p.greedy for p in params):
            return greedy
        logits = logits.float().cpu()
        out = greedy
        for i, p in enumerate(params):
            if p.greedy:
                continue
            row = logits[i] / p.temperature
            if p.top_k > 0 and p.top_k < row.shape[-1]:
                kth = torch.topk(row, p.top_k).values[-1]
                row = row.masked_fill(row < kth, float("-inf"))
            probs = torch.softmax(row, dim=-1)
            if p.top_p < 1.0:
                sorted_probs, order = probs.sort(descending=True)
                # keep the smallest prefix whose mass reaches top_p (the token crossing it included)
                drop = sorted_probs.cumsum(-1) - sorted_probs >= p.top_p
                sorted_probs[drop] = 0.0
                probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
            out[i] = int(torch.multinomial(probs, 1, generator=generators[i] or self.default_generator))
        return out
