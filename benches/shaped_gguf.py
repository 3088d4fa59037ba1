"""A random-weight GGUF with a real model's shapes (SmolLM2's tokenizer and vocabulary), for benchmarks on a model
bigger than the embedded one: written in F16 by tests/gguf_writer.py, then quantized to what people download by
llama.cpp's own `llama-quantize` (Q4_K_M, Q4_0, ...). llama.cpp loads random weights as it loads real ones.

    python -m benches.shaped_gguf --shape llama-3.2-1b --out /tmp/llama1b-f16.gguf
    llama-quantize /tmp/llama1b-f16.gguf /tmp/llama1b-q4_k_m.gguf Q4_K_M
    python -m benches.shaped_gguf --shape qwen3-4b --layers 12 --out ...   # cut to fit: each layer as the model's

A bigger model cut to fewer layers (--layers) keeps its per-layer shapes, so a step's per-layer work and the
kernels' sizes are the real model's; the step is that fraction of the whole model's (the embedding and head
whole). Written from fp32 weights in memory: ~4 bytes a parameter while it runs.
"""
import argparse

from gguf import GGMLQuantizationType

SHAPES = {   # (family, the Hugging Face config's own numbers: the vocabulary aside, the tokenizer is SmolLM2's)
    "tiny-256": ("llama", dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2)),   # the suite's smoke test
    "llama-3.2-1b": ("llama", dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8, rope_theta=500000.0, tie_word_embeddings=True,
                         max_position_embeddings=4096, initializer_range=0.02)),
    "llama-3.2-1b-untied": ("llama", dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,   # its own
                                num_attention_heads=32, num_key_value_heads=8, rope_theta=500000.0,   # head, as Llama
                                tie_word_embeddings=False, max_position_embeddings=4096,   # 3.1 8B, Mistral 7B and
                                initializer_range=0.02)),                                   # Qwen3-8B have
    "smollm2-360m": ("llama", dict(hidden_size=960, intermediate_size=2560, num_hidden_layers=32, num_attention_heads=15,
                         num_key_value_heads=5, rope_theta=100000.0, tie_word_embeddings=True,
                         max_position_embeddings=4096, initializer_range=0.02)),
    "qwen3-0.6b": ("qwen3", dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, rope_theta=1000000.0,
                                 tie_word_embeddings=True, max_position_embeddings=4096, initializer_range=0.02)),
    "qwen3-4b": ("qwen3", dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
                               num_key_value_heads=8, head_dim=128, rope_theta=1000000.0, tie_word_embeddings=True,
                               max_position_embeddings=4096, initializer_range=0.02)),
    "llama-3.1-8b": ("llama", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                                   num_key_value_heads=8, rope_theta=500000.0, tie_word_embeddings=False,
                                   max_position_embeddings=4096, initializer_range=0.02)),
    # Qwen3-30B-A3B: 128 experts, top-8, each 768 wide (its dense intermediate_size unused: every layer sparse)
    "qwen3-30b-a3b": ("qwen3_moe", dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                                        num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
                                        mlp_only_layers=[], num_hidden_layers=48, num_attention_heads=32,
                                        num_key_value_heads=4, head_dim=128, rope_theta=1000000.0,
                                        tie_word_embeddings=False, max_position_embeddings=4096,
                                        initializer_range=0.02)),
    # OLMoE-1B-7B: 64 experts, top-8, each 1024 wide, never renormalized; q/k norms over their whole width
    "olmoe-1b-7b": ("olmoe", dict(hidden_size=2048, intermediate_size=1024, num_experts=64, num_experts_per_tok=8,
                                  norm_topk_prob=False, num_hidden_layers=16, num_attention_heads=16,
                                  num_key_value_heads=16, rope_theta=10000.0, rms_norm_eps=1e-5,
                                  tie_word_embeddings=False, max_position_embeddings=4096, initializer_range=0.02)),
    # Qwen3.6-35B-A3B (Qwen3.5-MoE's text model): 3 Gated DeltaNet layers (16 k / 32 v heads of 128) to 1 gated full
    # attention (16 / 2 heads of 256, RoPE on a quarter); 256 experts, top-8 + a shared one, each 512 wide
    "qwen3.6-35b-a3b": ("qwen3_5_moe_text", dict(hidden_size=2048, intermediate_size=512, moe_intermediate_size=512,
                                                 shared_expert_intermediate_size=512, num_experts=256,
                                                 num_experts_per_tok=8, num_hidden_layers=40, num_attention_heads=16,
                                                 num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
                                                 linear_num_value_heads=32, linear_key_head_dim=128,
                                                 linear_value_head_dim=128, linear_conv_kernel_dim=4,
                                                 layer_types=None, full_attention_interval=4,
                                                 rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                                                                  "partial_rotary_factor": 0.25,
                                                                  "mrope_section": [11, 11, 10],
                                                                  "mrope_interleaved": True},
                                                 tie_word_embeddings=False, max_position_embeddings=8192,
                                                 initializer_range=0.02)),
    "gemma3-1b": ("gemma3_text", dict(hidden_size=1152, intermediate_size=6912, num_hidden_layers=26,   # 22 local
                                      num_attention_heads=4, num_key_value_heads=1, head_dim=256,   # layers on a
                                      sliding_window=512, query_pre_attn_scalar=256,   # window
                                      max_position_embeddings=4096, initializer_range=0.02, layer_types=None)),
}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.2-1b")
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, default=0, help="cut the model to this many layers (0: all of them)")
    a = p.parse_args(argv)
    from rosefast.sources import tiny_random
    from tests.gguf_writer import write_gguf

    family, shape = SHAPES[a.shape]
    if a.layers:
        if not 0 < a.layers <= shape["num_hidden_layers"]:
            raise SystemExit(f"--layers: 1 to {shape['num_hidden_layers']} for {a.shape}, not {a.layers}")
        shape = {**shape, "num_hidden_layers": a.layers}
    model = tiny_random(family, seed=a.seed, **shape)
    args = write_gguf(a.out, model, lambda name: GGMLQuantizationType.F16)
    print(f"{a.out}: {a.shape} ({family}), {args.num_layers} layers{' (cut)' if a.layers else ''}, hidden "
          f"{args.hidden_size}, vocab {args.vocab_size}, F16")
    return a.out


if __name__ == "__main__":
    main()
