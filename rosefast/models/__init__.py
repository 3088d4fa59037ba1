"""Model sources (embedded default, Hugging Face directory, .gguf) and loading helpers."""
from rosefast.models.sources import (
    DEFAULT_MODEL,
    SUPPORTED_ARCHITECTURES,
    ModelError,
    ResolvedModel,
    cache_root,
    resolve_model,
)
from rosefast.models.tiny import tiny_random


def load_tokenizer(model):
    """The Hugging Face (fast) tokenizer of a model spec or ResolvedModel."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model(model).path)


def load_hf_model(model, dtype=None):
    """Hugging Face's own model for a spec (the reference our forward is checked against)."""
    import torch
    from transformers import AutoModelForCausalLM

    from rosefast.models.sources import left_in_gguf

    resolved = resolve_model(model)
    gguf, _ = left_in_gguf(resolved.path)
    if gguf is not None:   # a conversion that left the linears in the file: transformers reads the file itself
        from rosefast.models.gguf_convert import hf_model_from_gguf

        return hf_model_from_gguf(gguf, dtype)
    m = AutoModelForCausalLM.from_pretrained(resolved.path, dtype=dtype or torch.float32)
    return m.eval()


__all__ = [
    "DEFAULT_MODEL", "SUPPORTED_ARCHITECTURES", "ModelError", "ResolvedModel", "cache_root",
    "load_hf_model", "load_tokenizer", "resolve_model", "tiny_random",
]
