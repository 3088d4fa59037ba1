"""Llama (2, 3.x; SmolLM2, TinyLlama): the family the others are written against. Its GGUF, as llama.cpp's
converter writes it, has q/k rows permuted for interleaved RoPE, and Llama 3.x's RoPE scaling as a tensor of
per-frequency divisors (`rope_freqs`), which transformers' GGUF reader drops."""
from rosefast.models.family import Family
from rosefast.models.families.gguf_keys import llama3_factors, tensor_values


def _gguf_fixes(reader, config, head_dim):
    """Llama 3's own RoPE parameters when the file's divisors are theirs (factor = the largest divisor, 1 and 4,
    8192 positions: every Llama 3.1 / 3.2), else the divisors themselves as a RoPE that never switches (the
    `longrope` form with one set of factors), so the numbers are the file's either way."""
    divisors = tensor_values(reader, "rope_freqs.weight")
    if not divisors:
        return {}
    theta = float(reader.value("llama.rope.freq_base", 10000.0))
    inv_freq = [1.0 / theta ** (i / head_dim) for i in range(0, head_dim, 2)]
    llama3 = {"rope_type": "llama3", "rope_theta": theta, "factor": max(divisors), "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    standard = llama3_factors(inv_freq, max(divisors), 1.0, 4.0, 8192)
    if len(standard) == len(divisors) and all(abs(a - b) <= 1e-5 * b for a, b in zip(standard, divisors)):
        return {"rope_parameters": llama3}
    positions = config["max_position_embeddings"]
    return {"original_max_position_embeddings": positions, "rope_parameters": {
        "rope_type": "longrope", "rope_theta": theta, "short_factor": divisors, "long_factor": divisors,
        "original_max_position_embeddings": positions, "attention_factor": 1.0}}


FAMILY = Family(
    "llama", "llama", "Llama (Llama 2/3.x, SmolLM2, TinyLlama)", gguf_qk_permuted=True, gguf_fixes=_gguf_fixes,
    hf_config="LlamaConfig", tiny_random_norms=False,
    tiny=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=1024, rope_theta=10000.0, rms_norm_eps=1e-5,
              tie_word_embeddings=True, attention_bias=False, initializer_range=0.1),
)
