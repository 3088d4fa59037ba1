"""The model families rosefast serves: one entry each, what its Hugging Face config means for our model code.

    family = FAMILIES[config["model_type"]]      # ModelError for anything else (sources.check_architecture)
    family.module                                # "llama" (LlamaModel) or "gpt2" (GPT2Model)

Adding a family = an entry here, its layer's differences in the model code (keyed by the entry's flags, not
by its name), and a tiny random model of it in tests (rosefast.models.tiny) checked against Hugging Face.
"""
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


FAMILIES = {f.model_type: f for f in (
    Family("llama", "llama", "Llama (Llama 2/3.x, SmolLM2, TinyLlama)", gguf_qk_permuted=True),
    Family("qwen2", "llama", "Qwen2 / Qwen2.5", qkv_bias=True, o_bias=False),
    Family("qwen3", "llama", "Qwen3 (dense)", qkv_bias=None, o_bias=None, qk_norm=True,
           reasoning=("<think>", "</think>")),
    Family("mistral", "llama", "Mistral (7B, Nemo, Small; a sliding window where the config has one)",
           gguf_qk_permuted=True),
    Family("phi3", "llama", "Phi-3 / Phi-4-mini (a partial rotary, long-RoPE)",
           fused_weights=True),
    Family("gemma3_text", "llama", "Gemma 3 (text: 270M, 1B; local layers on a sliding window)", qk_norm=True,
           gemma=True),
    Family("gpt2", "gpt2", "GPT-2"),
)}
