"""OLMoE (1B-7B) as Llama with a mixture of experts in place of the MLP (rosefast.models.moe; the top k of the
softmax, not renormalized unless the config says so) and q and k RMS-normalized over their whole width, not per
head, before RoPE. Its GGUF (`olmoe`, which transformers' GGUF reader does not know) is shown to that reader as
Qwen3-MoE's (the same expert tensors and keys), then the family puts OLMoE's config back: its experts as wide as
`feed_forward_length`, never renormalized (llama.cpp's OLMoE)."""
from dataclasses import replace

from rosefast.models.families import llama
from rosefast.models.families.moe_keys import moe_fields


def _gguf_fixes(reader, config, head_dim):
    return {"model_type": "olmoe", "norm_topk_prob": False, "moe_intermediate_size": None,
            "rms_norm_eps": float(reader.value("olmoe.attention.layer_norm_rms_epsilon", 1e-5))}


FAMILY = replace(
    llama.FAMILY, model_type="olmoe", label="OLMoE (1B-7B)", qk_norm_full=True, args_fields=moe_fields,
    gguf_arch="olmoe", gguf_qk_permuted=False, gguf_read_as="qwen3moe", gguf_fixes=_gguf_fixes,
    hf_config="OlmoeConfig", tiny_random_norms=True,
    tiny=dict(hidden_size=64, intermediate_size=32, num_experts=8, num_experts_per_tok=2, norm_topk_prob=False,
              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
              rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, initializer_range=0.1),
)
