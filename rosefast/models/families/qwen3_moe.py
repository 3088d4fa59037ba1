"""Qwen3-MoE (30B-A3B, 235B-A22B) as Qwen3 with a mixture of experts in place of the MLP (rosefast.models.moe):
softmax over the experts, the top k, renormalized when `norm_topk_prob` (the published models: yes; llama.cpp
always); `mlp_only_layers` / `decoder_sparse_step` leave layers dense. Its GGUF (`qwen3moe`) stores each
layer's experts as 3-D tensors and an expert's width as `expert_feed_forward_length`."""
from dataclasses import replace

from rosefast.models.families import qwen3
from rosefast.models.families.moe_keys import gguf_moe_fixes, moe_fields

FAMILY = replace(
    qwen3.FAMILY, model_type="qwen3_moe", label="Qwen3-MoE (30B-A3B, 235B-A22B)", args_fields=moe_fields,
    gguf_arch="qwen3moe", gguf_fixes=lambda reader, config, head_dim: gguf_moe_fixes(reader, "qwen3moe", True),
    hf_config="Qwen3MoeConfig",
    # 8 experts, top-2, renormalized; a dense layer after the sparse one
    tiny=dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
              norm_topk_prob=True, mlp_only_layers=[1], num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=32,
              max_position_embeddings=1024, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
              initializer_range=0.1),
)
