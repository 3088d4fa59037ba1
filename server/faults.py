"""Fault injection for drills and tests (ROSEFAST_FAULT_*; off by default): an engine step that raises, one
that raises what a GPU's sticky error raises (the engine dies), an exception in the engine thread's own loop
(it dies too), a tokenizer that raises on marked prompts, and processes started from the engine thread (as
Triton's compiler and ctypes.util's library search start them). Each hook is a SchedulerManager argument."""
import ctypes.util
import logging
import subprocess
import sys

import torch

log = logging.getLogger("rosefast.faults")


def device_fault(step):
    """What torch raises after an illegal memory access on a GPU (AcceleratorError since torch 2.8)."""
    kind = getattr(torch, "AcceleratorError", RuntimeError)
    return kind(f"CUDA error: an illegal memory access was encountered (injected in engine step {step})")


def fault_hooks(config):
    """SchedulerManager keyword arguments for the faults the config asks for (none: {})."""
    hooks = {}
    steps, device_step = config.fault_step_numbers(), config.fault_device_step
    spawn_step, loop_step = config.fault_subprocess_step, config.fault_loop_step
    if steps or device_step or spawn_step:
        def before_step(n, request_ids):
            if n == spawn_step:
                start_processes(f"engine step {n}")
            if n == device_step:
                raise device_fault(n)
            if n in steps:
                raise RuntimeError(f"injected fault in engine step {n}")
        hooks["before_step"] = before_step
    if loop_step:
        def after_step(n):
            if n == loop_step:
                raise RuntimeError(f"injected fault in the engine thread after step {n}")
        hooks["after_step"] = after_step
    marker = config.fault_tokenize_marker
    if marker or spawn_step:
        def wrap_tokenizer(tokenizer):   # runs on the engine thread, while the model loads
            if spawn_step:
                start_processes("load")
            return FaultyTokenizer(tokenizer, marker) if marker else tokenizer
        hooks["wrap_tokenizer"] = wrap_tokenizer
    return hooks


def start_processes(when):
    """What libraries do on the engine thread: ctypes.util's library search (runs `ldconfig -p`), a compiler
    run through subprocess.run, a Popen waited on with a timeout."""
    found = ctypes.util.find_library("c")
    out = subprocess.run([sys.executable, "-c", "print('compiled')"], capture_output=True, text=True, check=True)
    with subprocess.Popen([sys.executable, "-c", "import sys; sys.stdout.write(sys.stdin.read())"],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE) as proc:
        echoed = proc.communicate(b"x" * 100_000, timeout=30)[0]
    log.info("started processes on the engine thread at %s: find_library -> %s, run -> %r, Popen echoed %d bytes",
             when, found, out.stdout.strip(), len(echoed))


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
