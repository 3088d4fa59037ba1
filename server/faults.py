"""Fault injection for drills and tests (ROSEFAST_FAULT_*; off by default): an engine step that raises, one
that raises what a GPU's sticky error raises (the engine dies), a tokenizer that raises on marked prompts.
Each hook is a SchedulerManager argument."""
import torch


def device_fault(step):
    """What torch raises after an illegal memory access on a GPU (AcceleratorError since torch 2.8)."""
    kind = getattr(torch, "AcceleratorError", RuntimeError)
    return kind(f"CUDA error: an illegal memory access was encountered (injected in engine step {step})")


def fault_hooks(config):
    """SchedulerManager keyword arguments for the faults the config asks for (none: {})."""
    hooks = {}
    steps, device_step = config.fault_step_numbers(), config.fault_device_step
    if steps or device_step:
        def before_step(n, request_ids):
            if n == device_step:
                raise device_fault(n)
            if n in steps:
                raise RuntimeError(f"injected fault in engine step {n}")
        hooks["before_step"] = before_step
    marker = config.fault_tokenize_marker
    if marker:
        hooks["wrap_tokenizer"] = lambda tokenizer: FaultyTokenizer(tokenizer, marker)
    return hooks


class FaultyTokenizer:
    """The real tokenizer, except that a prompt containing `marker` makes it raise."""

    def __init__(self, tokenizer, marker):
        self._tokenizer, self._marker = tokenizer, marker

    def __call__(self, text, *args, **kwargs):
        texts = text if isinstance(text, list) else [text]
        if any(self._marker in t for t in texts):
            raise RuntimeError("injected tokenizer fault")
        return self._tokenizer(text, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)
