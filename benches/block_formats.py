"""The block formats side by side (a GGUF's Q4_0/Q4_1, Q5_0/Q5_1, Q8_0, Q4_K, Q5_K, Q6_K as the kernels take them),
one run: for each format and each tier this CPU runs, the bits a weight as served, microseconds per call of a
1024x3072 linear (Qwen3-0.6B's down projection: K formats need rows of 256) at batch 1, 8 and 32 with the
weights streaming from memory (a copy per repeat, as a step reads each layer's once), and the read rate at
batch 1.

    python -m benches.block_formats [--tiers avx512vnni,avx2] [--batches 1,8,32] [--copies 24]
"""
import argparse
import time

import numpy as np
import torch

from rosefast.sources import gguf_blocks
from rosefast.kernels import quant_ops
from rosefast.quant.tiles import pack_tiles

N, K = 1024, 3072
# (name, how the blocks are made): our own Q4_1 / Q8_0 quantizers, random blocks for the others (their bytes
# are what the kernels read; any bytes are a valid block, the scales kept finite)
FORMATS = ("q4_1", "q8_0", "q5_0", "q4_k", "q5_k", "q6_k")


def _blocks(fmt, seed):
    from gguf import GGML_QUANT_SIZES
    from gguf import GGMLQuantizationType as T

    from rosefast.quant.formats import quantize_q4_1, quantize_q8_0

    w = torch.randn(N, K, generator=torch.Generator().manual_seed(seed)) * 0.05
    if fmt == "q4_1":
        return "q4_1", quantize_q4_1(w)
    if fmt == "q8_0":
        return "q8_0", quantize_q8_0(w)
    kind, unpack, ours, scales = {"q5_0": (T.Q5_0, gguf_blocks.unpack_q5_0, "q5_0", (0,)),
                                  "q4_k": (T.Q4_K, gguf_blocks.unpack_q4_k, "q4_k", (0, 2)),
                                  "q5_k": (T.Q5_K, gguf_blocks.unpack_q5_k, "q5_k", (0, 2)),
                                  "q6_k": (T.Q6_K, gguf_blocks.unpack_q6_k, "q6_k", (208,))}[fmt]
    rng = np.random.default_rng(seed)
    per, size = GGML_QUANT_SIZES[kind]
    raw = rng.integers(0, 256, (N, K // per, size), dtype=np.uint8)
    for at in scales:
        raw[..., at:at + 2] = (rng.random((N, K // per)) * 1e-3).astype(np.float16).view(np.uint8).reshape(N, -1, 2)
    return ours, unpack(raw.reshape(N, -1), N, K)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiers", default=",".join(quant_ops.impl.tiers()), help="default: every tier this CPU runs")
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--copies", type=int, default=24, help="weight copies cycled through (more than the caches hold)")
    p.add_argument("--formats", default=",".join(FORMATS))
    a = p.parse_args(argv)
    batches = [int(b) for b in a.batches.split(",")]
    print(f"{torch.get_num_threads()} threads; a {N}x{K} linear, {a.copies} copies of its weights cycled")
    print("| format | tier | bits a weight | " + " | ".join(f"B={b} us" for b in batches) + " | B=1 GB/s |")
    print("|---|---|---|" + "---|" * (len(batches) + 1))
    rows = []
    warm = quant_ops.impl.Weights([pack_tiles(*_blocks("q4_1", 1))], None, K)   # the first format timed was
    for tier in (t for t in a.tiers.split(",") if t):                         # ~1.5x slow without this
        for _ in range(50):
            quant_ops.pick(tier).linear(torch.randn(32, K), warm)
    for fmt in a.formats.split(","):
        ours, blocks = _blocks(fmt, 0)
        tiles = pack_tiles(ours, blocks)
        copies = [quant_ops.impl.Weights([pack_tiles(ours, tuple(x.clone() for x in blocks))], None, K)
                  for _ in range(a.copies)]
        bits = 8 * tiles.nbytes() / (N * K)
        for tier in (t for t in a.tiers.split(",") if t):
            kernels = quant_ops.pick(tier)
            times = []
            for b in batches:
                x = torch.randn(b, K)
                for w in copies:
                    kernels.linear(x, w)
                best = float("inf")
                for _ in range(3):
                    t = time.perf_counter()
                    for w in copies:
                        kernels.linear(x, w)
                    best = min(best, (time.perf_counter() - t) / len(copies))
                times.append(best * 1e6)
            gbs = tiles.nbytes() / (times[0] * 1e-6) / 1e9 if batches[0] == 1 else float("nan")
            rows.append((fmt, tier, bits, times))
            print(f"| {fmt.upper()} | {tier} | {bits:.3f} | " + " | ".join(f"{t:.0f}" for t in times) +
                  f" | {gbs:.1f} |", flush=True)
    return rows


if __name__ == "__main__":
    main()
