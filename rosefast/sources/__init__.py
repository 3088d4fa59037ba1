"""Where a model comes from: the embedded default, a Hugging Face directory, a .gguf (read, converted once into the
cache, its blocks re-laid out as tiles beside it), a tiny random model for tests; and the tokenizer and Hugging
Face's own model of a spec (the reference in tests)."""
from rosefast.errors import ModelError
from rosefast.sources.resolve import (
    DEFAULT_MODEL,
    SUPPORTED_ARCHITECTURES,
    ResolvedModel,
    cache_root,
    resolve_model,
)
from rosefast.sources.tiny import tiny_random


def load_tokenizer(model):
    """The Hugging Face (fast) tokenizer of a model spec or ResolvedModel."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model(model).path)


def load_hf_model(model, dtype=None):
    """Hugging Face's own model for a spec (the reference our forward is checked against)."""
    import torch
    from transformers import AutoModelForCausalLM

    from rosefast.sources.resolve import left_in_gguf

    resolved = resolve_model(model)
    gguf, _ = left_in_gguf(resolved.path)
    if gguf is not None:   # a conversion that left the linears in the file: transformers reads the file itself
        from rosefast.sources.gguf_convert import hf_model_from_gguf

        return hf_model_from_gguf(gguf, dtype)
    m = AutoModelForCausalLM.from_pretrained(resolved.path, dtype=dtype or torch.float32)
    return m.eval()


__all__ = [
    "DEFAULT_MODEL", "SUPPORTED_ARCHITECTURES", "ModelError", "ResolvedModel", "cache_root",
    "load_hf_model", "load_tokenizer", "resolve_model", "tiny_random",
]
