"""Mixtral (8x7B, 8x22B) as Mistral with a mixture of experts in place of the MLP (rosefast.models.moe): the top k
of the softmax, always renormalized (the softmax of the top k's logits), each expert as wide as the config's
intermediate_size. llama.cpp writes its GGUF under `llama` with experts: such a file is refused by name
(rosefast.sources.gguf_config) until it is served."""
from dataclasses import replace

from rosefast.models.families import mistral
from rosefast.models.families.moe_keys import moe_fields

FAMILY = replace(
    mistral.FAMILY, model_type="mixtral", label="Mixtral (8x7B, 8x22B)", args_fields=moe_fields,
    gguf_arch="llama", hf_config="MixtralConfig",
    tiny=dict(hidden_size=64, intermediate_size=32, num_local_experts=8, num_experts_per_tok=2, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024,
              sliding_window=512, rope_theta=1000000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
              initializer_range=0.1),
)
