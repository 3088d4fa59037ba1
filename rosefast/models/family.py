"""A model family: what its Hugging Face config, its checkpoints and its GGUF files mean for our model code. The
registry (rosefast.models.registry) names every one; a family written as its differences has a module of its own
that makes its Family (rosefast.models.smollm3)."""
from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    model_type: str          # Hugging Face's config.model_type
    module: str              # our model code: "llama" (rosefast.models.llama) or "gpt2"
    label: str               # for messages and the README
    qkv_bias: object = None  # True/False: fixed for the family; None: the config's attention_bias
    o_bias: bool = None      # None: the config's attention_bias
    qk_norm: bool = False    # a per-head RMSNorm of q and k (over head_dim) before RoPE
    reasoning: tuple = ()    # (opening, closing) tag of the reasoning block its chat models write first
    fused_weights: bool = False   # its checkpoints store q|k|v and gate|up fused (qkv_proj, gate_up_proj)
    gemma: bool = False      # Gemma's layer: RMSNorm as x * (1 + w), four norms a layer (around attention and
                             # the MLP), embeddings x sqrt(hidden), tanh-GELU, attention scale from
                             # query_pre_attn_scalar, local (sliding) layers with their own RoPE base
    gguf_qk_permuted: bool = False   # llama.cpp's converter reorders q/k rows for interleaved RoPE (Llama only;
                                     # the Qwen families keep Hugging Face's rotate-half order)
    # A family written as its own module (rosefast.models.<name>) says the rest of its differences here:
    args_fields: object = None   # config dict -> {ModelArgs field: value} it sets beyond the common reading
    gguf_arch: str = None        # llama.cpp's architecture name, where it is not the model_type
    gguf_read_as: str = None     # the architecture transformers' GGUF reader is shown (one it knows, with the
                                 # same tensors), where it does not know this one
    gguf_fixes: object = None    # (GGUF metadata reader, config dict) -> the config fields the file's reading lacks
    hf_config: str = None        # transformers' config class (tiny random models in tests)
    tiny: tuple = ()             # (key, value) pairs of its tiny random model's config
