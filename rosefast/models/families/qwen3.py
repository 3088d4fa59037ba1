"""Qwen3 (dense) as Qwen2 with a per-head RMSNorm of q and k before RoPE, biases as its config says (none in the
published models), an explicit head_dim (a GGUF's `qwen3.attention.key_length`), and a <think> block first."""
from dataclasses import replace

from rosefast.models.families import qwen2

FAMILY = replace(
    qwen2.FAMILY, model_type="qwen3", label="Qwen3 (dense)", qkv_bias=None, o_bias=None, qk_norm=True,
    reasoning=("<think>", "</think>"), hf_config="Qwen3Config", tiny_random_norms=True,
    # an explicit head_dim (32: q is 128 wide on a 64-wide model), q/k norms, tied embeddings
    tiny=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=32, max_position_embeddings=1024, rope_theta=1000000.0,
              rms_norm_eps=1e-6, tie_word_embeddings=True, initializer_range=0.1),
)
