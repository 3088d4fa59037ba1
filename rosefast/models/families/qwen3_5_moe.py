"""Qwen3.5 / Qwen3.6 mixtures of experts (35B-A3B, 122B-A10B, 397B-A17B; the text model) as Qwen3.5's layers with
Qwen3-Next's experts: routed ones, renormalized, beside a shared expert under its sigmoid gate."""
from dataclasses import replace

from rosefast.models.families import qwen3_5, qwen3_next
from rosefast.models.families.moe_keys import moe_fields

FAMILY = replace(
    qwen3_5.FAMILY, model_type="qwen3_5_moe_text", label="Qwen3.5/3.6-MoE (hybrid attention, 35B-A3B)",
    args_fields=lambda config: {**moe_fields(config), **qwen3_next.linear_fields(config)},
    gguf_arch="qwen35moe", gguf_read_as="qwen3moe", hf_config="Qwen3_5MoeTextConfig",
    tiny=dict(qwen3_5.FAMILY.tiny, moe_intermediate_size=32, shared_expert_intermediate_size=64, num_experts=8,
              num_experts_per_tok=2, tie_word_embeddings=False),
)
