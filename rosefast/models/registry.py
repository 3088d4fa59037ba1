"""The model families rosefast serves, one line each; each family is a module of its own
(rosefast.models.families), written as its differences from the one it resembles.

    family = FAMILIES[config["model_type"]]      # ModelError for anything else (check_architecture)
    family.module                                # "llama" (LlamaModel) or "gpt2" (GPT2Model)

Adding a family = its module (its Family, made from the one it resembles: its config reading, its GGUF's, its
tiny test model; rosefast.models.families.smollm3) and one line here; its layer's differences are flags of
ModelArgs the model code keys on, never its name.
"""
from rosefast.errors import ModelError
from rosefast.models.families import (gemma3, gpt2, llama, mistral, mixtral, olmoe, phi3, qwen2, qwen2_moe, qwen3,
                                     qwen3_5, qwen3_5_moe, qwen3_5_moe_multimodal, qwen3_5_multimodal, qwen3_moe,
                                     qwen3_next, smollm3)

FAMILIES = {f.model_type: f for f in (
    llama.FAMILY,
    qwen2.FAMILY,
    qwen3.FAMILY,
    mistral.FAMILY,
    phi3.FAMILY,
    gemma3.FAMILY,
    gpt2.FAMILY,
    smollm3.FAMILY,
    qwen3_moe.FAMILY,
    qwen2_moe.FAMILY,
    mixtral.FAMILY,
    olmoe.FAMILY,
    qwen3_next.FAMILY,
    qwen3_5.FAMILY,
    qwen3_5_moe.FAMILY,
    qwen3_5_multimodal.FAMILY,
    qwen3_5_moe_multimodal.FAMILY,
)}

SUPPORTED_ARCHITECTURES = tuple(FAMILIES)

#: llama.cpp's architecture name -> the one transformers' GGUF reader is shown instead (it does not know the first)
GGUF_READ_AS = {f.gguf_architecture: f.gguf_read_as for f in FAMILIES.values() if f.gguf_read_as}


def gguf_family(arch):
    """The family a GGUF of llama.cpp's architecture `arch` is served as (the one of that model_type first: a
    Mistral written as `llama` is served as Llama), or None."""
    own = FAMILIES.get(arch)
    if own is not None and own.gguf_architecture == arch:
        return own
    return next((f for f in FAMILIES.values() if f.gguf_architecture == arch), None)


def check_architecture(model_type, where):
    """ModelError naming what is supported, for a model_type no family here serves."""
    if model_type not in SUPPORTED_ARCHITECTURES:
        raise ModelError(
            f"Unsupported architecture {model_type!r} in {where}; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)} ({'; '.join(f.label for f in FAMILIES.values())})"
        )
