"""Phi-3 / Phi-4-mini as Llama with q|k|v and gate|up stored fused, a partial rotary (Phi-4-mini: 3/4 of each head)
and long-RoPE. Its GGUF (not permuted) says the partial rotary as `rope.dimension_count` and carries the long-RoPE
factors as two tensors beside the weights, which transformers' GGUF reader leaves out."""
from dataclasses import replace

from rosefast.models.families import llama
from rosefast.models.families.gguf_keys import tensor_values


def _gguf_fixes(reader, config, head_dim):
    fixes = {}
    rope_dims = reader.value("phi3.rope.dimension_count")
    if rope_dims and rope_dims != head_dim:
        fixes["partial_rotary_factor"] = rope_dims / head_dim
    long, short = tensor_values(reader, "rope_factors_long.weight"), tensor_values(reader, "rope_factors_short.weight")
    original = reader.value("phi3.rope.scaling.original_context_length")
    if original:
        fixes["original_max_position_embeddings"] = int(original)
    if long and short:
        rope = {"rope_type": "longrope", "rope_theta": float(reader.value("phi3.rope.freq_base", 10000.0)),
                "long_factor": long, "short_factor": short,
                "original_max_position_embeddings": int(original or config["max_position_embeddings"])}
        attn_factor = reader.value("phi3.rope.scaling.attn_factor")
        if attn_factor:
            rope["attention_factor"] = float(attn_factor)
        if "partial_rotary_factor" in fixes:
            rope["partial_rotary_factor"] = fixes["partial_rotary_factor"]
        fixes["rope_parameters"] = rope
    return fixes


FAMILY = replace(
    llama.FAMILY, model_type="phi3", label="Phi-3 / Phi-4-mini (a partial rotary, long-RoPE)", fused_weights=True,
    gguf_qk_permuted=False, gguf_fixes=_gguf_fixes, hf_config="Phi3Config", tiny_random_norms=True,
    tiny=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=1024, original_max_position_embeddings=1024,
              rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, initializer_range=0.1),
)
