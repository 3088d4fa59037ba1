"""Qwen2 / Qwen2.5 as Llama with q/k/v biases (no o bias); its GGUF keeps Hugging Face's q/k row order."""
from dataclasses import replace

from rosefast.models.families import llama

FAMILY = replace(
    llama.FAMILY, model_type="qwen2", label="Qwen2 / Qwen2.5", qkv_bias=True, o_bias=False, gguf_qk_permuted=False,
    gguf_fixes=None, hf_config="Qwen2Config",
    tiny=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=1024, rope_theta=10000.0, rms_norm_eps=1e-6,
              tie_word_embeddings=False, initializer_range=0.1),
)
