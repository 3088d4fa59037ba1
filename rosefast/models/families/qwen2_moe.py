"""Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B) as Qwen2 with a mixture of experts and a shared expert under a
sigmoid gate beside it (rosefast.models.moe); the top k not renormalized unless the config says so (llama.cpp:
never). Its GGUF (`qwen2moe`) adds the shared expert's tensors (`ffn_*_shexp`)."""
from dataclasses import replace

from rosefast.models.families import qwen2
from rosefast.models.families.moe_keys import gguf_moe_fixes, moe_fields

FAMILY = replace(
    qwen2.FAMILY, model_type="qwen2_moe", label="Qwen2-MoE (a shared expert)", args_fields=moe_fields,
    gguf_arch="qwen2moe", gguf_fixes=lambda reader, config, head_dim: gguf_moe_fixes(reader, "qwen2moe", False),
    hf_config="Qwen2MoeConfig", tiny_random_norms=True,
    tiny=dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=32, shared_expert_intermediate_size=64,
              num_experts=8, num_experts_per_tok=2, norm_topk_prob=False, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, rope_theta=10000.0,
              rms_norm_eps=1e-6, tie_word_embeddings=False, initializer_range=0.1),
)
