"""Decode step time: ours vs Hugging Face's forward with its own cache, next to the matmul-only floor.

    python -m benches.decode_step                       # SmolLM2, fp32 and bf16, batch 1/8/32, context 128/512
    python -m benches.decode_step --device cuda --dtypes bfloat16 --batches 1,32,256   # on a GPU

The floor is the step's linear layers alone (per layer fused qkv, o, gate|up, down; then lm_head)
at the same batch and dtype: no attention, norms, RoPE or dispatch. Two floors: *F.linear* runs
torch's plain linear on weights of the model's shapes (the matmul cost as torch gives it), *ours* runs
our model's own linears the way the model runs them (on CPU bf16, weights packed once for oneDNN,
rosefast.models.packed), so ours/our-linears is what attention, norms, RoPE and dispatch add.
Each figure is the median of --steps steps after warm-up; all in one run, so ratios compare.
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from rosefast.config import EngineConfig
from rosefast.engine.model_runner import ModelRunner, SeqInput
from rosefast.sources import load_hf_model, resolve_model


def timed(fn, steps, warmup=3):
    sync = torch.cuda.synchronize if torch.cuda.is_available() and torch.cuda.is_initialized() else (lambda: None)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(steps):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def plain_linears(model, dtype, device="cpu"):
    """F.linear on weights of the model's linear shapes (the values do not change the time): the floor as
    torch's own matmul gives it, for the model's (qkv, o, gate_up, down) x layers and its lm_head."""
    def linear(out_features, in_features):
        w = torch.empty(out_features, in_features, dtype=dtype, device=device).normal_(std=0.02)
        return lambda x: F.linear(x, w)
    first = model.layers[0]
    layers = [tuple(linear(m.out_features, m.in_features) for m in (first.qkv, first.o, first.gate_up, first.down))
              for _ in model.layers]
    return layers, linear(model.args.vocab_size, model.args.hidden_size)


def model_linears(model):
    """The model's own linears, run the way the model runs them (packed on CPU bf16), and its lm_head."""
    return [(l.qkv.forward, l.o.forward, l.gate_up.forward, l.down.forward) for l in model.layers], model.head


def floor_step(model, batch, dtype, linears=None):
    """The linear layers of one decode step (default: the model's own, see model_linears)."""
    layers, head = linears or model_linears(model)
    first = model.layers[0]
    device = next(model.parameters()).device
    x = torch.randn(batch, first.o.out_features, dtype=dtype, device=device)
    attn_in = torch.randn(batch, first.o.in_features, dtype=dtype, device=device)
    act = torch.randn(batch, first.down.in_features, dtype=dtype, device=device)

    @torch.inference_mode()
    def run():
        for qkv, o, gate_up, down in layers:
            qkv(x)
            o(attn_in)
            gate_up(x)
            down(act)
        head(x)
    return run


def ours_step(runner, batch, ctx):
    bs = runner.block_size
    nblocks = -(-(ctx + 1) // bs)
    windowed = runner.kv.window_data is not None   # the sliding-window layers' own pool: its tables too
    # a token of its own a row (a mixture of experts routes each row by it: a step reads the experts they pick)
    seqs = [SeqInput([1 + i * 7919 % 30000], ctx, list(range(i * nblocks, (i + 1) * nblocks)),
                     window_table=list(range(i * nblocks, (i + 1) * nblocks)) if windowed else None)
            for i in range(batch)]
    return lambda: runner.forward(seqs, False)


def hf_step(hf, batch, ctx, dtype):
    from transformers import DynamicCache

    cfg = hf.config
    kv_heads = getattr(cfg, "num_key_value_heads", cfg.num_attention_heads)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    dev = hf.device
    cache = DynamicCache(config=cfg)
    for layer in range(cfg.num_hidden_layers):
        cache.update(torch.randn(batch, kv_heads, ctx, head_dim, dtype=dtype, device=dev),
                     torch.randn(batch, kv_heads, ctx, head_dim, dtype=dtype, device=dev), layer)
    ids = torch.ones(batch, 1, dtype=torch.long, device=dev)
    pos = torch.full((batch, 1), ctx, dtype=torch.long, device=dev)
    mask = torch.ones(batch, ctx + 1, dtype=torch.long, device=dev)

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
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (Hugging Face's model goes there too)")
    a = p.parse_args(argv)
    resolved = resolve_model(a.model)
    batches = [int(b) for b in a.batches.split(",")]
    contexts = [int(c) for c in a.contexts.split(",")]
    rows = []
    print(f"model {resolved.name}, torch {torch.__version__}, {torch.get_num_threads()} threads, {a.device}")
    print("| dtype | batch | context | F.linear floor ms | our linears ms | ours ms | ours/F.linear floor "
          "| ours/our linears | HF ms | HF/ours |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for dtype_name in a.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        tokens = max(batches) * (-(-(max(contexts) + 1) // 16)) * 16
        runner = ModelRunner(EngineConfig(model=resolved, dtype=dtype_name, kv_cache_tokens=tokens, device=a.device,
                                          max_batch_size=max(64, *batches),   # graphs (CUDA) for every batch
                                          quantization="none"))   # the dtype's own linears, beside F.linear's
        hf = None if a.no_hf else load_hf_model(resolved, dtype=dtype).to(runner.device)
        plain = plain_linears(runner.model, dtype, runner.device)
        for batch in batches:
            floor = timed(floor_step(runner.model, batch, dtype, plain), a.steps)
            mine = timed(floor_step(runner.model, batch, dtype), a.steps)
            for ctx in contexts:
                ours = timed(ours_step(runner, batch, ctx), a.steps)
                theirs = timed(hf_step(hf, batch, ctx, dtype), a.steps) if hf is not None else float("nan")
                rows.append((dtype_name, batch, ctx, floor, ours, theirs, mine))
                print(f"| {dtype_name} | {batch} | {ctx} | {floor:.1f} | {mine:.1f} | {ours:.1f} | {ours / floor:.2f}x | "
                      f"{ours / mine:.2f}x | {theirs:.1f} | {theirs / ours:.2f}x |", flush=True)
        del runner, hf, plain
    return rows


if __name__ == "__main__":
    main()
