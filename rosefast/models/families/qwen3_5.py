"""Qwen3.5 / Qwen3.6 (dense: 27B; the text model) as Qwen3-Next's layers with a dense MLP: its DeltaNet's
projections stored apart (in_proj_qkv, in_proj_z, in_proj_b, in_proj_a), RoPE as multimodal RoPE, which for text
(every position the same in its three sections) is plain RoPE on a quarter of each head. Its GGUF (`qwen35`):
rosefast.models.families.linear_gguf."""
from dataclasses import replace

from rosefast.models.families import qwen3, qwen3_next
from rosefast.models.families.linear_gguf import LinearTensors, gguf_linear_fixes

FAMILY = replace(
    qwen3.FAMILY, model_type="qwen3_5_text", label="Qwen3.5/3.6 (hybrid attention, dense)",
    args_fields=qwen3_next.linear_fields, gguf_arch="qwen35", gguf_read_as="qwen3",
    gguf_fixes=gguf_linear_fixes, gguf_tensors=LinearTensors(), hf_config="Qwen3_5TextConfig",
    tiny=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
              head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
              linear_value_head_dim=24, linear_conv_kernel_dim=4, max_position_embeddings=1024,
              rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                               "mrope_section": [2, 1, 1], "mrope_interleaved": True},
              rms_norm_eps=1e-6, tie_word_embeddings=True, initializer_range=0.04),
)
