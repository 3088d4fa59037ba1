"""What server/ takes from below the serving layer, named once here so that routes import rosefast.serving only:
the request's sampling settings and their errors, and what the served model says of itself (its reasoning tags,
its own generation defaults)."""
from rosefast.build import load_generation_defaults, reasoning_tags
from rosefast.engine.grammar import GrammarError
from rosefast.engine.sampling_params import MAX_LOGPROBS, SamplingParams

__all__ = ["MAX_LOGPROBS", "GrammarError", "SamplingParams", "load_generation_defaults", "reasoning_tags"]
