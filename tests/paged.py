"""Test helpers: drive the ModelRunner directly with hand-made block tables, and Hugging Face's reference."""
import inspect
import random

import torch

from rosefast.engine.model_runner import SeqInput


class BlockPool:
    """Hands out blocks in order, or shuffled (non-contiguous tables)."""

    def __init__(self, num_blocks, shuffle_seed=None):
        self.free = list(range(num_blocks))
        if shuffle_seed is not None:
            random.Random(shuffle_seed).shuffle(self.free)

    def grow(self, table, tokens, block_size):
        while len(table) * block_size < tokens:
            table.append(self.free.pop(0))


def run_ours(runner, prompts, steps, next_tokens=None, shuffle_seed=None):
    """Packed prefill of all prompts (logits at every prompt position), then `steps` batched decode steps.

    The token fed at decode step t for sequence i is next_tokens[i][t] (or our own greedy choice).
    Returns per sequence: [prefill logits [len, V], decode logits [V] x steps].
    """
    pool = BlockPool(runner.kv.num_blocks, shuffle_seed)
    # the sliding-window layers' own pool, where they have one (its tables keep every block here)
    windows = BlockPool(runner.kv.window_blocks, shuffle_seed) if runner.kv.window_data is not None else None
    bs = runner.block_size
    tables = [[] for _ in prompts]
    wtables = [[] if windows else None for _ in prompts]
    for t, w, p in zip(tables, wtables, prompts):
        pool.grow(t, len(p), bs)
        if windows:
            windows.grow(w, len(p), bs)
    # (each sequence its own state slot, where the model has linear-attention layers)
    seqs = [SeqInput(list(p), 0, t, window_table=w, state_slot=i) for i, (p, t, w) in enumerate(zip(prompts, tables, wtables))]
    logits = runner.forward(seqs, True, all_logits=True).float()
    out, start = [], 0
    for p in prompts:
        out.append([logits[start:start + len(p)]])
        start += len(p)
    tokens = [list(p) for p in prompts]
    for step in range(steps):
        for i, seq_tokens in enumerate(tokens):
            nxt = next_tokens[i][step] if next_tokens else int(out[i][-1][-1].argmax())
            seq_tokens.append(nxt)
            pool.grow(tables[i], len(seq_tokens), bs)
            if windows:
                windows.grow(wtables[i], len(seq_tokens), bs)
        seqs = [SeqInput([t[-1]], len(t) - 1, tb, window_table=w, state_slot=i)
                for i, (t, tb, w) in enumerate(zip(tokens, tables, wtables))]
        step_logits = runner.forward(seqs, False).float()
        for i in range(len(prompts)):
            out[i].append(step_logits[i:i + 1])
    return out


def _cache_key(hf):
    """transformers 5 calls the KV cache argument `cache`; 4.x called it `past_key_values`."""
    return "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"


@torch.inference_mode()
def run_hf(hf, prompt, steps):
    """Hugging Face's own forward with its own cache, greedy: ([prefill logits, decode logits...], tokens fed)."""
    key = _cache_key(hf)
    res = hf(torch.tensor([prompt]), use_cache=True)
    logits = [res.logits[0].float()]
    fed = []
    for _ in range(steps):
        nxt = int(logits[-1][-1].argmax())
        fed.append(nxt)
        res = hf(torch.tensor([[nxt]]), use_cache=True, **{key: res[key]})
        logits.append(res.logits[0].float())
    return logits, fed


def max_abs_diff(ref, ours):
    """Compared on the reference's device: on a GPU machine our runner runs on CUDA, Hugging Face's on the CPU."""
    return max((a - b.to(a.device)).abs().max().item() for r, o in zip(ref, ours) for a, b in zip(r, o))
