"""Quantized linears (ROSEFAST_QUANTIZATION), one run: decode tok/s at 1, 8 and 32 concurrent requests for
none / int8 / int4, the lm_head as loaded or quantized (int8, int4), each beside the floor that reading its
weights once per step at this machine's measured memory bandwidth allows, and one batch-1 decode step's
time at a 64-token context (the steadier measure on a shared machine: the best of --step-runs x 10 steps),
and where the layers run as one call each (rosefast.kernels.decode_layer) the same step one op at a time.

    python -m benches.quantized --tokens 64 [--cpu-kernels avx2]     # a kernel tier (ROSEFAST_CPU_KERNELS)
    python -m benches.quantized --model q4_k_m.gguf --modes none,auto  # a GGUF's own blocks (auto), any formats
    python -m benches.quantized --model q4_k_m.gguf --modes auto --activations two-digit,one-digit
"""
import argparse
import time

import torch

from rosefast.engine.llm_engine import LLMEngine
from rosefast.engine.sampling_params import SamplingParams
from rosefast.sources import resolve_model
from rosefast.models.quantized import BlockLinear, Int4Linear, Int8Linear
from rosefast.kernels.quant_ops import pick
from benches.decode_step import ours_step, timed
from rosefast.models.moe import MoE

PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "The three laws of robotics are"]


def bandwidth_gb_s():
    """Read bandwidth: the best of a few sums over a 512 MB tensor."""
    x = torch.ones(128 << 20)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t)
    return x.numel() * 4 / best / 1e9


def _linear_bytes(module):
    if isinstance(module, (Int4Linear, Int8Linear, BlockLinear)):
        return module.nbytes()
    if hasattr(module, "packed") and hasattr(module, "in_features"):   # a PackedLinear (bf16)
        return module.out_features * module.in_features * 2
    if isinstance(module, torch.nn.Linear):
        return module.weight.numel() * module.weight.element_size()
    return 0


def step_bytes(model):
    """Bytes a decode step reads at batch 1: every linear's weights and the lm_head (not the embedding table); of a
    mixture of experts' routed experts, the top k's (k / E of them, each expert the same size)."""
    total, routed = 0, set()
    for module in model.modules():
        if isinstance(module, MoE):
            linears = [x for e in module.experts for x in (e.gate_up, e.down)]
            routed.update(id(x) for x in linears)
            total += sum(_linear_bytes(x) for x in linears) * module.top_k / module.num_experts
        elif id(module) not in routed:
            total += _linear_bytes(module)
    if model.lm_head is None:   # tied: the head reads the embedding
        total += model.embed.weight.numel() * model.embed.weight.element_size()
    return total


def tok_s(engine, concurrent, tokens):
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    engine.generate(PROMPTS[:1], SamplingParams(max_tokens=4, temperature=0), use_tqdm=False)   # warm
    prompts = (PROMPTS * concurrent)[:concurrent]
    t = time.perf_counter()
    engine.generate(prompts, params, use_tqdm=False)
    return concurrent * tokens / (time.perf_counter() - t)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--concurrent", default="1,8,32")
    p.add_argument("--step-runs", type=int, default=3)
    p.add_argument("--cpu-kernels", default="auto", help="the quantized linears' kernels: auto, a tier, torch")
    p.add_argument("--activations", default="two-digit", help="ROSEFAST_ACTIVATIONS values, comma-separated: "
                   "each a row of its own (the block kernels' one or two int8 digits)")
    p.add_argument("--modes", default="none,int8,int4", help="ROSEFAST_QUANTIZATION values (auto: a GGUF's own "
                   "blocks, with its own head)")
    a = p.parse_args(argv)
    levels = [int(c) for c in a.concurrent.split(",")]
    bw = bandwidth_gb_s()
    kernels = pick(a.cpu_kernels)
    print(f"read bandwidth {bw:.1f} GB/s; {a.tokens} greedy tokens per request; dtype {a.dtype}; "
          f"{torch.get_num_threads()} threads; kernels {kernels.name if kernels is not None else 'torch'}")
    print("| quantization | lm_head | activations | MB read per step | floor tok/s at c=1 | B=1 step ms | per-op step "
          "ms | B=32 step ms | " + " | ".join(f"c={c} tok/s" for c in levels) + " |")
    print("|---|---|---|---|---|---|---|---|" + "---|" * len(levels))
    rows = []
    for mode, activations in ((m, d) for m in a.modes.split(",") for d in a.activations.split(",")):
        for head in {"none": ("none",), "int8": ("none", "int8"), "int4": ("none", "int8", "int4"),
                     "auto": ("auto",)}[mode]:
            engine = LLMEngine(model=resolve_model(a.model), dtype=a.dtype, device="cpu", kv_cache_tokens=8192,
                               quantization=mode, quantize_lm_head=head, cpu_kernels=a.cpu_kernels,
                               activations=activations)
            size = step_bytes(engine.runner.model)
            step = min(timed(ours_step(engine.runner, 1, 64), 10) for _ in range(a.step_runs))
            model, per_op = engine.runner.model, None
            plans = getattr(model, "decode_plans", None)
            if plans is not None:
                model.decode_plans = None
                per_op = min(timed(ours_step(engine.runner, 1, 64), 10) for _ in range(a.step_runs))
                model.decode_plans = plans
            step32 = min(timed(ours_step(engine.runner, 32, 64), 3) for _ in range(a.step_runs))
            rates = [tok_s(engine, c, a.tokens) for c in levels]
            rows.append((mode, head, size, rates, step))
            print(f"| {mode} | {head if head != 'none' else 'as loaded'} | {activations} | {size / 1e6:.0f} | "
                  f"{bw * 1e9 / size:.0f} | {step:.1f} | {'-' if per_op is None else f'{per_op:.1f}'} | {step32:.1f} | " +
                  " | ".join(f"{r:.1f}" for r in rates) + " |", flush=True)
    return rows


if __name__ == "__main__":
    main()
