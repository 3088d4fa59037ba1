"""What a GGUF's metadata says about its model that transformers' GGUF reader leaves out, read as llama.cpp reads it.

    fixes = gguf_config_fixes(GGUFFile(path), config.to_dict())   # {} for a file transformers reads whole
    config = type(config).from_dict({**config.to_dict(), **fixes})

transformers maps a fixed list of keys per architecture; an explicit head_dim (`key_length`: Qwen3's is not
hidden / heads) is not in it for any, and each family's own (Phi-3's partial rotary and long-RoPE factors, Gemma
3's layer pattern and local RoPE, Llama 3's RoPE scaling written as a tensor, SmolLM3's architecture itself) are
read by its module (Family.gguf_fixes, rosefast.models.families).
"""
from rosefast.errors import ModelError
from rosefast.models.registry import gguf_family


def gguf_config_fixes(reader, config):
    """The Hugging Face config fields (a dict) that `config` (transformers' reading of the file, as a dict) gets
    wrong or lacks, from the GGUF `reader`'s metadata."""
    arch = reader.value("general.architecture")
    experts = reader.value(f"{arch}.expert_count")
    if arch == "llama" and experts:
        raise ModelError(f"this GGUF is Mixtral as llama.cpp writes it (`llama` with {experts} experts a layer): not "
                         "served from a GGUF yet; serve Mixtral from its Hugging Face directory")
    fixes = {}
    key_length = reader.value(f"{arch}.attention.key_length")
    head_dim = key_length or config["hidden_size"] // config["num_attention_heads"]
    if key_length and key_length != config.get("head_dim"):
        fixes["head_dim"] = int(key_length)
    family = gguf_family(arch)
    if family is not None and family.gguf_fixes is not None:
        fixes.update(family.gguf_fixes(reader, {**config, **fixes}, head_dim))
    return fixes
