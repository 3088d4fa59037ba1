"""Qwen3-Next (80B-A3B) as Qwen3-MoE with hybrid attention: three of every four layers a Gated DeltaNet (linear
attention over a recurrent state per sequence, rosefast.models.delta_net) in place of attention; the fourth full
attention with its output gated by a sigmoid (q_proj holds each head's q then its gate), RoPE on a quarter of each
head; every RMSNorm x * (1 + w); a shared expert beside the routed ones. Served from a Hugging Face directory and
from its GGUF (`qwen3next`: rosefast.models.families.linear_gguf)."""
from dataclasses import replace

from rosefast.models.families import qwen3_moe
from rosefast.models.families.linear_gguf import TILED, LinearTensors, gguf_linear_fixes
from rosefast.models.families.moe_keys import moe_fields


def linear_fields(config):
    """{ModelArgs field: value} of a hybrid config's layers: which are linear attention (`layer_types`, else every
    `full_attention_interval`-th layer full), the DeltaNet's heads and conv width; gated attention, offset norms."""
    n = config["num_hidden_layers"]
    types = config.get("layer_types") or ["full_attention" if (i + 1) % config.get("full_attention_interval", 4) == 0
                                          else "linear_attention" for i in range(n)]
    return {"linear_layers": tuple(i for i, t in enumerate(types) if t == "linear_attention"),
            "linear_k_heads": config["linear_num_key_heads"], "linear_v_heads": config["linear_num_value_heads"],
            "linear_k_dim": config["linear_key_head_dim"], "linear_v_dim": config["linear_value_head_dim"],
            "linear_conv": config.get("linear_conv_kernel_dim") or 4, "attn_gate": True, "norm_offset": True,
            "linear_v_tiled": bool(config.get(TILED))}



FAMILY = replace(
    qwen3_moe.FAMILY, model_type="qwen3_next", label="Qwen3-Next (hybrid attention, 80B-A3B)",
    args_fields=lambda config: {**moe_fields(config), **linear_fields(config)}, gguf_arch="qwen3next", gguf_read_as="qwen3moe",
    gguf_fixes=gguf_linear_fixes, gguf_tensors=LinearTensors(), hf_config="Qwen3NextConfig",
    # 3 DeltaNet layers : 1 full; 2 k heads, 4 v heads; 8 experts, top-2, a shared expert. Weights drawn at 0.04, not
    # 0.1 as for the other families: at 0.1 the DeltaNet's gated norms amplify rounding so much that Hugging Face's own
    # fp32 forward is 4e-4 off its fp64 one (at 0.04: 2e-5, ours as close), below what a 1e-4 check can tell
    tiny=dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=32, shared_expert_intermediate_size=64,
              num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_num_key_heads=2,
              linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=24, linear_conv_kernel_dim=4,
              max_position_embeddings=1024, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                             "partial_rotary_factor": 0.25},
              rms_norm_eps=1e-6, tie_word_embeddings=False, initializer_range=0.04),
)
