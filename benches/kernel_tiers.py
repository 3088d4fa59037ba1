"""The quantized linears' kernels, tier against tier (ROSEFAST_CPU_KERNELS), one run: microseconds per call of
SmolLM2-135M's own linear shapes as Q4_1 (q|k|v, o, gate|up, down) and its Q8_0 head at batch 1, 8 and 32,
each compiled tier this CPU runs beside torch's weight-only ops; the last column is one decode step's linears
(30 layers and the head), the weights streaming from memory as in serving (not hot in cache). A tier with two
paths (amx: its tiles from 12 rows; avx2: its fp32 FMAs from 8) has a second row at each batch from there, "(path
of < n rows)": the same rows on the path below it (as a speculative step of fewer sequences takes), so the two
compare.

    python -m benches.kernel_tiers [--batches 1,8,32] [--repeat 20]
"""
import argparse
import time

import torch

from rosefast.models.quantized import Int4Linear, Int8Linear
from rosefast.quant.formats import quantize_q4_1, quantize_q8_0
from rosefast.kernels.quant_ops import available, decoding, pick

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}
LAYERS, VOCAB = 30, 49152


def _layers(kernels, vocab):
    """A model's worth of linears (a copy of the tiles per layer, so a step reads them all from memory) and its head."""
    g = torch.Generator().manual_seed(0)
    weights = {name: torch.randn(n, k, generator=g) * 0.05 for name, (n, k) in SHAPES.items()}
    blocks = {name: quantize_q4_1(w) for name, w in weights.items()}
    layers = [{name: Int4Linear(*blocks[name], kernels=kernels) for name in SHAPES} for _ in range(LAYERS)]
    head = Int8Linear(*quantize_q8_0(torch.randn(vocab, 576, generator=g) * 0.05), kernels=kernels)
    return layers, head


def _us(fn, repeat):
    fn()
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(repeat):
            fn()
        best = min(best, (time.perf_counter() - t) / repeat)
    return best * 1e6


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--vocab", type=int, default=VOCAB, help="the head's rows (smaller for a smoke test)")
    p.add_argument("--tiers", default=",".join(available()), help="the tiers to run (default: all that run here)")
    a = p.parse_args(argv)
    print(f"{torch.get_num_threads()} threads; tiers here: {', '.join(available())}")
    print("| tier | B | " + " | ".join(f"{n} {SHAPES[n][0]}x{SHAPES[n][1]} us" for n in SHAPES) +
          f" | head {a.vocab}x576 us | step's linears ms |")
    print("|---|---|" + "---|" * (len(SHAPES) + 2))
    rows = []
    for tier in a.tiers.split(","):
        layers, head = _layers(tier, a.vocab)
        kernels = pick(tier)
        own = kernels.own_numbers_from(torch.float32) if kernels is not None else None
        for batch in (int(b) for b in a.batches.split(",")):
            x = {name: torch.randn(batch, k) for name, (_, k) in SHAPES.items()}

            def step():
                for layer in layers:
                    for name in SHAPES:
                        layer[name](x[name])
                head(x["qkv"])

            def measure(label):
                per_op = [_us(lambda n=name: layers[0][n](x[n]), a.repeat) for name in SHAPES]
                head_us = _us(lambda: head(x["qkv"]), max(1, a.repeat // 10))
                step_ms = _us(step, max(1, a.repeat // 10)) / 1e3
                rows.append((label, batch, per_op, head_us, step_ms))
                print(f"| {label} | {batch} | " + " | ".join(f"{u:.1f}" for u in per_op) + f" | {head_us:.0f} | "
                      f"{step_ms:.2f} |", flush=True)

            measure(tier)
            if own is not None and batch >= own:
                with decoding(1):   # the same rows on the path below `own`
                    measure(f"{tier} (path of < {own} rows)")
    return rows


if __name__ == "__main__":
    main()
