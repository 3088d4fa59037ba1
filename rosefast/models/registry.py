"""The model families rosefast serves: one entry each, what its Hugging Face config means for our model code.

    family = FAMILIES[config["model_type"]]      # ModelError for anything else (sources.check_architecture)
    family.module                                # "llama" (LlamaModel) or "gpt2" (GPT2Model)

Adding a family = a module of its own that makes its Family (rosefast.models.family) from the one it resembles,
written as its differences (its config reading, its GGUF's, its tiny test model: rosefast.models.smollm3), and
one line here; its layer's differences are flags of ModelArgs the model code keys on, never its name.
"""
from rosefast.errors import ModelError
from rosefast.models import smollm3
from rosefast.models.family import Family


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
    smollm3.FAMILY,
)}

SUPPORTED_ARCHITECTURES = tuple(FAMILIES)

#: llama.cpp's architecture name -> the one transformers' GGUF reader is shown instead (it does not know the first)
GGUF_READ_AS = {f.gguf_arch: f.gguf_read_as for f in FAMILIES.values() if f.gguf_read_as}


def gguf_family(arch):
    """The family a GGUF of llama.cpp's architecture `arch` holds when it is written as its own module, else None."""
    return next((f for f in FAMILIES.values() if f.gguf_arch == arch), None)


def check_architecture(model_type, where):
    """ModelError naming what is supported, for a model_type no family here serves."""
    if model_type not in SUPPORTED_ARCHITECTURES:
        raise ModelError(
            f"Unsupported architecture {model_type!r} in {where}; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)} ({'; '.join(f.label for f in FAMILIES.values())})"
        )
