"""SamplingParams: what one request asks of the sampler, validated where it is made (a ValueError names the
field). The batched sampler that carries them out is rosefast.engine.sampler."""
import math
from dataclasses import dataclass, field, fields

_INF = float("inf")
_PLAIN_NUMBER = (float, int)   # exact types: a bool is neither
MAX_LOGPROBS = 20              # top logprobs per token, at most (OpenAI's limit)
MAX_LOGIT_BIAS = 100.0         # |bias| at most (OpenAI's limit)
POOLING_MODES = ("last", "mean", "cls")   # rosefast.sources.pooling.MODES
MAX_LOGIT_BIAS_TOKENS = 1024   # entries in one logit_bias at most (ours: checking and uploading it is bounded)


def _int(name, value, low, high=None):
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    if high is not None and value > high:
        raise ValueError(f"{name} must be <= {high}, got {value}")


def _number(name, value, low=-_INF, high=_INF):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")


@dataclass(slots=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0       # 0: greedy (the argmax of the processed logits)
    top_p: float = 1.0             # in (0, 1]
    top_k: int = 0                 # 0 (or -1): all tokens
    min_p: float = 0.0             # in [0, 1]: drop tokens below min_p x the most likely one's probability
    presence_penalty: float = 0.0  # in [-2, 2]: subtracted from a token's logit once it has been generated
    frequency_penalty: float = 0.0 # in [-2, 2]: subtracted once per time it has been generated
    repetition_penalty: float = 1.0  # > 0: a seen token's (prompt or output) logit divided by it (x it if < 0)
    logit_bias: dict = None        # {token id: bias in [-100, 100]} added to the logits (at most 1,024 entries)
    min_tokens: int = 0            # EOS and stop token ids are masked until this many tokens are out
    seed: int = None               # the same seed gives the same tokens, whatever else is in the batch
    stop_token_ids: tuple = ()     # extra tokens that end the request (besides EOS)
    stop: tuple = ()               # stop strings (the detokenizer cuts the text there)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int = None           # per generated token: its logprob and this many top ones (0-20); None: none
    prompt_logprobs: int = None    # the same for each prompt token after the first (0-20); None: none
    grammar: object = None         # structured output: a rosefast.engine.grammar.Grammar the tokens must follow
    pooling: str = None            # embeddings: last, mean or cls (rosefast.sources.pooling): the prompt's final
                                   # hidden states pooled into its one output, nothing sampled
    priority: int = 0              # scheduling (not sampling; it travels with the request's params): lower runs
                                   # first where the engine schedules by priority (EngineConfig.scheduling)
    processed: bool = field(default=False, init=False, repr=False, compare=False)  # any logit processing

    def __post_init__(self):
        # The common, plainly typed request (it is on the submit path) is checked in one expression: its usual
        # fields inline, every other field at its default (_at_defaults, built from the fields themselves, so a
        # new field is never skipped); anything else gets the full check.
        if not (type(self.max_tokens) is int and self.max_tokens >= 1
                and type(self.temperature) in _PLAIN_NUMBER and 0.0 <= self.temperature < _INF
                and type(self.top_p) in _PLAIN_NUMBER and 0.0 < self.top_p <= 1.0
                and type(self.top_k) is int and self.top_k >= -1
                and type(self.ignore_eos) is bool and type(self.include_stop_str_in_output) is bool
                and _at_defaults(self)):
            self._validate()

    def _validate(self):
        _int("max_tokens", self.max_tokens, 1)
        _number("temperature", self.temperature, 0.0)
        _number("top_p", self.top_p)
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        _int("top_k", self.top_k, -1)
        _number("min_p", self.min_p, 0.0, 1.0)
        _int("priority", self.priority, -(1 << 31), (1 << 31) - 1)
        if self.pooling is not None and self.pooling not in POOLING_MODES:
            raise ValueError(f"pooling must be one of {', '.join(POOLING_MODES)}, got {self.pooling!r}")
        _number("presence_penalty", self.presence_penalty, -2.0, 2.0)
        _number("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        _number("repetition_penalty", self.repetition_penalty)
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise ValueError(f"logit_bias must be a mapping of token ids to numbers, got {self.logit_bias!r}")
            if len(self.logit_bias) > MAX_LOGIT_BIAS_TOKENS:
                raise ValueError(f"logit_bias has {len(self.logit_bias)} entries; at most {MAX_LOGIT_BIAS_TOKENS} "
                                 f"are allowed")
            bias = {}
            for token, value in self.logit_bias.items():
                token = int(token) if isinstance(token, str) and token.strip().lstrip("-").isdigit() else token
                _int("logit_bias key", token, 0)
                _number("logit_bias value", value, -MAX_LOGIT_BIAS, MAX_LOGIT_BIAS)
                bias[token] = float(value)
            self.logit_bias = bias or None
        _int("min_tokens", self.min_tokens, 0, self.max_tokens)
        if self.seed is not None:
            _int("seed", self.seed, 0, 2**63 - 1)
        if isinstance(self.stop, str):
            self.stop = (self.stop,)
        self.stop = tuple(self.stop)
        if not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop must be a non-empty string or a list of them, got {self.stop!r}")
        for name in ("ignore_eos", "include_stop_str_in_output"):
            if type(getattr(self, name)) is not bool:
                raise ValueError(f"{name} must be a boolean, got {getattr(self, name)!r}")
        self.stop_token_ids = tuple(self.stop_token_ids)
        for t in self.stop_token_ids:
            _int("stop_token_ids", t, 0)
        if self.logprobs is not None:
            _int("logprobs", self.logprobs, 0, MAX_LOGPROBS)
        if self.prompt_logprobs is not None:
            _int("prompt_logprobs", self.prompt_logprobs, 0, MAX_LOGPROBS)
        if self.grammar is not None:
            from rosefast.engine.grammar import Grammar

            if not isinstance(self.grammar, Grammar):
                raise ValueError(f"grammar must be a Grammar (LLMEngine.grammars.compile), got {self.grammar!r}")
        self.processed = bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                              or self.logit_bias or self.min_tokens)

    @property
    def greedy(self):
        return self.temperature == 0

    @property
    def penalized(self):
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0)


_USUAL = ("max_tokens", "temperature", "top_p", "top_k", "ignore_eos",   # checked inline in __post_init__
          "include_stop_str_in_output")


def _at_default(name, default):
    """A test that field `name` holds its default in a plain type (the source of one clause)."""
    if default is None or isinstance(default, bool):
        return f"s.{name} is {default!r}"
    if default == ():
        return f"s.{name} == ()"
    if isinstance(default, int):
        return f"type(s.{name}) is int and s.{name} == {default!r}"
    if isinstance(default, float):
        return f"type(s.{name}) in _PLAIN_NUMBER and s.{name} == {default!r}"
    raise TypeError(f"SamplingParams.{name}: no fast-path test for a default of {default!r}; add one here")


def _fast_check():
    """One compiled expression: every init field but the usual ones at its default."""
    clauses = [_at_default(f.name, f.default) for f in fields(SamplingParams) if f.init and f.name not in _USUAL]
    return eval("lambda s: " + " and ".join(clauses), {"_PLAIN_NUMBER": _PLAIN_NUMBER})   # noqa: S307 - our text


_at_defaults = _fast_check()
