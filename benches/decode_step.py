"""Decode step time: ours vs Hugging Face's forward with its own cache, next to the matmul-only floor.

    python -m benches.decode_step                       # SmolLM2, fp32 and bf16, batch 1/8/32, context 128/512

The floor is the step's linear layers alone (per layer fused qkv, o, gate|up, down; then lm_head)
at the same batch and dtype, with our model's own weights: no attention, norms, RoPE or dispatch.
Each figure is the median of --steps steps after warm-up; all in one run, so ratios compare.
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from rosefast.config import EngineConfig
from rosefast.engine.model_runner import ModelRunner, SeqInput
from rosefast.models import load_hf_model, resolve_model


def timed(fn, steps, warmup=3):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def floor_step(model, batch, dtype):
    """The linear layers of one decode step, with the model's own (fused) weights."""
    layers = [(l.qkv.weight, l.o.weight, l.gate_up.weight, l.down.weight) for l in model.layers]
    head = model.embed.weight if model.lm_head is None else model.lm_head.weight
    hidden = head.shape[1]
    x = torch.randn(batch, hidden, dtype=dtype)
    attn_in = torch.randn(batch, layers[0][1].shape[1], dtype=dtype)
    act = torch.randn(batch, layers[0][3].shape[1], dtype=dtype)

    @torch.inference_mode()
    def run():
        for qkv, o, gate_up, down in layers:
            F.linear(x, qkv)
            F.linear(attn_in, o)
            F.linear(x, gate_up)
            F.linear(act, down)
        F.linear(x, head)
    return run


def ours_step(runner, batch, ctx):
    bs = runner.block_size
    nblocks = -(-(ctx + 1) // bs)
    seqs = [SeqInput([1], ctx, list(range(i * nblocks, (i + 1) * nblocks))) for i in range(batch)]
    return lambda: runner.forward(seqs, False)


def hf_step(hf, batch, ctx, dtype):
    from transformers import DynamicCache

    cfg = hf.config
    kv_heads = getattr(cfg, "num_key_value_heads", cfg.num_attention_heads)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    cache = DynamicCache(config=cfg)
    for layer in range(cfg.num_hidden_layers):
        cache.update(torch.randn(batch, kv_heads, ctx, head_dim, dtype=dtype),
                     torch.randn(batch, kv_heads, ctx, head_dim, dtype=dtype), layer)
    ids = torch.ones(batch, 1, dtype=torch.long)
    pos = torch.full((batch, 1), ctx, dtype=torch.long)
    mask = torch.ones(batch, ctx + 1, dtype=torch.long)

    @torch.inference_mode()
    def run():
        hf(ids, cache=cache, position_ids=pos, attention_mask=mask, use_cache=True, logits_to_keep=1)
        cache.crop(-1)   # keep the context at ctx
    return run


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--contexts", default="128,512")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--no-hf", action="store_true", help="skip Hugging Face's step")
    a = p.parse_args(argv)
    resolved = resolve_model(a.model)
    batches = [int(b) for b in a.batches.split(",")]
    contexts = [int(c) for c in a.contexts.split(",")]
    rows = []
    print(f"model {resolved.name}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| dtype | batch | context | floor ms | ours ms | ours/floor | HF ms | HF/ours |")
    print("|---|---|---|---|---|---|---|---|")
    for dtype_name in a.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        tokens = max(batches) * (-(-(max(contexts) + 1) // 16)) * 16
        runner = ModelRunner(EngineConfig(model=resolved, dtype=dtype_name, kv_cache_tokens=tokens, device="cpu"))
        hf = None if a.no_hf else load_hf_model(resolved, dtype=dtype)
        for batch in batches:
            floor = timed(floor_step(runner.model, batch, dtype), a.steps)
            for ctx in contexts:
                ours = timed(ours_step(runner, batch, ctx), a.steps)
                theirs = timed(hf_step(hf, batch, ctx, dtype), a.steps) if hf is not None else float("nan")
                rows.append((dtype_name, batch, ctx, floor, ours, theirs))
                print(f"| {dtype_name} | {batch} | {ctx} | {floor:.1f} | {ours:.1f} | {ours / floor:.2f}x | "
                      f"{theirs:.1f} | {theirs / ours:.2f}x |", flush=True)
        del runner, hf
    return rows


if __name__ == "__main__":
    main()
