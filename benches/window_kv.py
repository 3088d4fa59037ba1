"""What the sliding-window layers' own KV pool saves (rosefast.engine.window_blocks).

    python -m benches.window_kv [--context 8192] [--sequences 4] [--max-batch-sizes 64,8] [--budget-gib 2]

First, planned from real models' shapes (bf16, the engine's defaults but max_batch_size): the KV memory of
N sequences at the context in one pool against the two pools, and how many tokens of context a fixed budget
holds either way (kv_cache.split_budget: what the engine allocates; a model whose every layer is windowed, on a
budget below its windows' need: the window pool counted by the scheduler, how many whole windows it holds). Then measured on a tiny random Gemma 3
(one local layer on a 512-position window, one global) at that context: the blocks each pool holds at its
peak while the sequences run, and the bytes of the two pools' tensors.
"""
import argparse

import torch

from rosefast.config import EngineConfig
from rosefast.engine.kv_cache import layer_bytes_per_token, split_budget, windowed_layers
from rosefast.engine.llm_engine import LLMEngine
from rosefast.engine.sampling_params import SamplingParams
from rosefast.engine.window_blocks import pool_blocks
from rosefast.sources import tiny_random
from rosefast.models.args import model_args_from_config

GEMMA3_1B = {"model_type": "gemma3_text", "vocab_size": 262144, "hidden_size": 1152, "intermediate_size": 6912,
             "num_hidden_layers": 26, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
             "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "sliding_window": 512,
             "query_pre_attn_scalar": 256, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
             "sliding_window_pattern": 6, "tie_word_embeddings": True}
SHAPES = {
    "Gemma 3 1B": GEMMA3_1B,
    "Gemma 3 270M": {**GEMMA3_1B, "hidden_size": 640, "intermediate_size": 2048, "num_hidden_layers": 18},
    "Mistral 7B v0.1": {**GEMMA3_1B, "model_type": "mistral", "vocab_size": 32000, "hidden_size": 4096,
                        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
                        "num_key_value_heads": 8, "head_dim": 128, "sliding_window": 4096},
}


def planned(context, sequences, max_batch, budget):
    """Rows: (model, max_batch_size, window layers, one pool GiB, two pools GiB, budget tokens one pool, two)."""
    rows = []
    for name, config in SHAPES.items():
        args = model_args_from_config(config)
        windowed = len(windowed_layers(args))
        engine = EngineConfig(model="unused", max_batch_size=max_batch)
        bs = engine.block_size
        layer_block = layer_bytes_per_token(args, torch.bfloat16) * bs
        blocks = sequences * -(-context // bs)
        need = pool_blocks(engine, args.sliding_window)
        one = blocks * layer_block * args.num_layers
        two = blocks * layer_block * (args.num_layers - windowed) + min(need, blocks) * layer_block * windowed
        if windowed == args.num_layers and need > blocks:   # the pool would be larger than what it replaces
            two = one
        whole = budget // (layer_block * args.num_layers)
        most = max_batch * -(-args.max_position_embeddings // bs)
        prefill = pool_blocks(engine, args.sliding_window, running=0)   # one prefill step's blocks
        per_sequence = pool_blocks(engine, args.sliding_window, running=1) - prefill
        held, window, counted = split_budget(budget, layer_block, args.num_layers, windowed, need, most,
                                             per_sequence + prefill)
        if windowed == args.num_layers and counted:   # the window pool is the memory, the scheduler counts it
            held = f"any; {(window - prefill) // per_sequence} whole windows at once (counted)"
        elif windowed == args.num_layers and window == need:   # the other blocks hold no memory
            held = "any (admission alone bounds it)"
        else:
            held *= bs
        rows.append((name, max_batch, f"{windowed} of {args.num_layers} (W {args.sliding_window})", one / 2**30,
                     two / 2**30, whole * bs, held))
    return rows


def measured(context, sequences):
    """(peak blocks of the other pool, peak window blocks, their tensors' MiB, the window pool's blocks)."""
    model = tiny_random("gemma3_text", max_position_embeddings=context + 64)
    peaks = [0, 0]
    engine = None

    def record(step, rids):
        bm = engine.block_manager
        peaks[0], peaks[1] = max(peaks[0], bm.num_used_blocks), max(peaks[1], bm.window.num_used_blocks)

    engine = LLMEngine(model=model, dtype="bfloat16", kv_cache_tokens=sequences * (context + 64),
                       max_batch_size=sequences, max_model_len=context + 64, before_step=record)
    prompts = [[(7 * i + j) % 5000 + 10 for j in range(context)] for i in range(sequences)]
    engine.generate(prompts, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True), use_tqdm=False)
    record(None, None)
    kv = engine.runner.kv
    return peaks[0], peaks[1], kv.data.nbytes / 2**20, kv.window_data.nbytes / 2**20, kv.window_blocks


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--sequences", type=int, default=4)
    p.add_argument("--max-batch-sizes", default="64,8")
    p.add_argument("--budget-gib", type=float, default=2.0)
    a = p.parse_args(argv)
    budget = int(a.budget_gib * 2**30)
    rows = [r for mb in map(int, a.max_batch_sizes.split(",")) for r in planned(a.context, mb, mb, budget)]
    print(f"Planned, bf16, max_batch_size sequences at {a.context} tokens; a {a.budget_gib:g} GiB budget's context:\n")
    print("| model | max_batch_size | window layers | one pool GiB | two pools GiB | saved | budget: tokens, one pool "
          "| budget: tokens, two pools |")
    print("|---|---|---|---|---|---|---|---|")
    for name, mb, layers, one, two, whole, held in rows:
        print(f"| {name} | {mb} | {layers} | {one:.2f} | {two:.2f} | {100 * (1 - two / one):.0f}% | {whole} | {held} |")
    main_peak, window_peak, main_mib, window_mib, window_blocks = measured(a.context, a.sequences)
    print(f"\nMeasured: tiny Gemma 3 (1 local layer, W 512, 1 global), {a.sequences} sequences of {a.context} "
          f"prompt tokens + 16, 16-token blocks: peak blocks held: other pool {main_peak}, window pool "
          f"{window_peak} (of {window_blocks}); tensors: other pool {main_mib:.1f} MiB, window pool "
          f"{window_mib:.1f} MiB")
    return rows, (main_peak, window_peak, window_blocks)


if __name__ == "__main__":
    main()
