"""What a GGUF's metadata says about its model that transformers' GGUF reader leaves out, read as llama.cpp reads it.

    fixes = gguf_config_fixes(GGUFFile(path), config.to_dict())   # {} for a file transformers reads whole
    config = type(config).from_dict({**config.to_dict(), **fixes})

transformers maps a fixed list of keys per architecture; a Qwen3's `key_length` (its head_dim is not
hidden / heads), a Phi-3's `rope.dimension_count` (a partial rotary) and long-RoPE factors (two tensors beside
the weights), and Gemma 3's layer pattern, local RoPE base and attention scale are not in it, and its defaults
for them would build a model of other shapes or other numbers than the file's; nor is Llama 3's RoPE scaling,
which llama.cpp writes as a tensor.
"""
import math

from rosefast.models.registry import gguf_family


def _tensor(reader, name):
    t = reader.tensors.get(name)
    return None if t is None else [float(x) for x in t.data.reshape(-1)]


def _rope_scaling(reader, arch):
    """The global RoPE's scaling as a Hugging Face rope_parameters fragment (linear: Gemma 3's 4B and larger)."""
    kind = reader.value(f"{arch}.rope.scaling.type")
    factor = reader.value(f"{arch}.rope.scaling.factor")
    if kind == "linear" and factor and factor != 1.0:
        return {"rope_type": "linear", "factor": float(factor)}
    return {"rope_type": "default"}


def _phi3(reader, config, head_dim):
    """Partial rotary (Phi-4-mini: 96 of 128 dims) and long-RoPE (its factors are tensors in the file)."""
    fixes = {}
    rope_dims = reader.value("phi3.rope.dimension_count")
    if rope_dims and rope_dims != head_dim:
        fixes["partial_rotary_factor"] = rope_dims / head_dim
    long, short = _tensor(reader, "rope_factors_long.weight"), _tensor(reader, "rope_factors_short.weight")
    original = reader.value("phi3.rope.scaling.original_context_length")
    if original:
        fixes["original_max_position_embeddings"] = int(original)
    if long and short:
        rope = {"rope_type": "longrope", "rope_theta": float(reader.value("phi3.rope.freq_base", 10000.0)),
                "long_factor": long, "short_factor": short,
                "original_max_position_embeddings": int(original or config["max_position_embeddings"])}
        attn_factor = reader.value("phi3.rope.scaling.attn_factor")
        if attn_factor:
            rope["attention_factor"] = float(attn_factor)
        if "partial_rotary_factor" in fixes:
            rope["partial_rotary_factor"] = fixes["partial_rotary_factor"]
        fixes["rope_parameters"] = rope
    return fixes


def _gemma3(reader, config, head_dim):
    """Which layers are local (llama.cpp: `sliding_window_pattern`, a period or one flag a layer, default 6),
    the local layers' RoPE base (default 10000) and the attention scale (1/sqrt(head_dim); hidden/heads on the
    62-layer 27B, as llama.cpp has it)."""
    n = config["num_hidden_layers"]
    window = reader.value("gemma3.attention.sliding_window") or 0
    pattern = reader.value("gemma3.attention.sliding_window_pattern", 6)
    if not window:
        local = [False] * n
    elif isinstance(pattern, list):
        local = [bool(x) for x in pattern]
    else:
        local = [(i % pattern) < pattern - 1 for i in range(n)]
    full = {**_rope_scaling(reader, "gemma3"), "rope_theta": float(reader.value("gemma3.rope.freq_base", 1e6))}
    scalar = config["hidden_size"] // config["num_attention_heads"] if n == 62 else head_dim
    return {"layer_types": ["sliding_attention" if x else "full_attention" for x in local],
            "sliding_window": int(window) or None, "query_pre_attn_scalar": scalar,
            "rope_parameters": {"full_attention": full, "sliding_attention": {
                "rope_type": "default", "rope_theta": float(reader.value("gemma3.rope.freq_base_swa", 10000.0))}}}


def _llama3_factors(inv_freq, factor, low, high, old_len):
    """llama.cpp's converter's `rope_freqs` for Llama 3's RoPE scaling: each frequency's divisor."""
    out = []
    for freq in inv_freq:
        wavelen = 2 * math.pi / freq
        if wavelen < old_len / high:
            out.append(1.0)
        elif wavelen > old_len / low:
            out.append(factor)
        else:
            smooth = (old_len / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return out


def _llama(reader, config, head_dim):
    """Llama 3.x's RoPE scaling, which llama.cpp writes as a tensor of per-frequency divisors (`rope_freqs`), not
    as parameters: Llama 3's own parameters when the divisors are theirs (factor = the largest divisor, 1 and 4,
    8192 positions: every Llama 3.1 / 3.2), else the divisors themselves as a RoPE that never switches (the
    `longrope` form with one set of factors), so the numbers are the file's either way."""
    divisors = _tensor(reader, "rope_freqs.weight")
    if not divisors:
        return {}
    theta = float(reader.value("llama.rope.freq_base", 10000.0))
    inv_freq = [1.0 / theta ** (i / head_dim) for i in range(0, head_dim, 2)]
    llama3 = {"rope_type": "llama3", "rope_theta": theta, "factor": max(divisors), "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    standard = _llama3_factors(inv_freq, max(divisors), 1.0, 4.0, 8192)
    if len(standard) == len(divisors) and all(abs(a - b) <= 1e-5 * b for a, b in zip(standard, divisors)):
        return {"rope_parameters": llama3}
    positions = config["max_position_embeddings"]
    return {"original_max_position_embeddings": positions, "rope_parameters": {
        "rope_type": "longrope", "rope_theta": theta, "short_factor": divisors, "long_factor": divisors,
        "original_max_position_embeddings": positions, "attention_factor": 1.0}}


def gguf_config_fixes(reader, config):
    """The Hugging Face config fields (a dict) that `config` (transformers' reading of the file, as a dict) gets
    wrong or lacks, from the GGUF `reader`'s metadata."""
    arch = reader.value("general.architecture")
    fixes = {}
    key_length = reader.value(f"{arch}.attention.key_length")
    head_dim = key_length or config["hidden_size"] // config["num_attention_heads"]
    if key_length and key_length != config.get("head_dim"):
        fixes["head_dim"] = int(key_length)
    if arch == "llama":
        fixes.update(_llama(reader, config, head_dim))
    elif arch == "phi3":
        fixes.update(_phi3(reader, config, head_dim))
    elif arch == "gemma3":
        fixes.update(_gemma3(reader, config, head_dim))
    family = gguf_family(arch)
    if family is not None and family.gguf_fixes is not None:
        fixes.update(family.gguf_fixes(reader, {**config, **fixes}))
    return fixes
