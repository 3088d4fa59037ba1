"""Gemma 3 (text: 270M, 1B and the text of the larger ones) as Llama with Gemma's layer (ModelArgs.gemma: RMSNorm
as x * (1 + w), four norms a layer, embeddings x sqrt(hidden), tanh-GELU), q/k norms, an attention scale from
query_pre_attn_scalar, and local layers on a sliding window with a RoPE of their own beside global ones. Its GGUF
(`gemma3`, not permuted) stores the norms as 1 + w and says the local layers by `sliding_window_pattern`."""
from dataclasses import replace

from rosefast.errors import ModelError
from rosefast.models.families import llama
from rosefast.models.families.gguf_keys import rope_scaling
from rosefast.models.rope_config import rope_of


def _args_fields(config):
    """Its layer types (local ones on the window) and each type's RoPE."""
    n = config["num_hidden_layers"]
    types = config.get("layer_types") or [
        "full_attention" if (i + 1) % config.get("sliding_window_pattern", 6) == 0 else "sliding_attention"
        for i in range(n)]
    params = config.get("rope_parameters") or {}
    if "full_attention" in params:   # one set of RoPE parameters per layer type
        full, local = (rope_of({"rope_parameters": params.get(t)}) for t in ("full_attention", "sliding_attention"))
    else:                            # the older layout: rope_theta / rope_scaling, rope_local_base_freq
        full = rope_of(config)
        local = (float(config.get("rope_local_base_freq", 10000.0)), (("rope_type", "default"),))
    for name in ("final_logit_softcapping", "attn_logit_softcapping"):
        if config.get(name):
            raise ModelError(f"Gemma: {name} {config[name]} is not supported (Gemma 2's; Gemma 3 has none)")
    return {"rope": full, "local_rope": local,
            "local_layers": tuple(i for i, t in enumerate(types) if t == "sliding_attention"),
            "attention_scale": float(config.get("query_pre_attn_scalar") or config["head_dim"]) ** -0.5}


def _gguf_fixes(reader, config, head_dim):
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
    full = {**rope_scaling(reader, "gemma3"), "rope_theta": float(reader.value("gemma3.rope.freq_base", 1e6))}
    scalar = config["hidden_size"] // config["num_attention_heads"] if n == 62 else head_dim
    return {"layer_types": ["sliding_attention" if x else "full_attention" for x in local],
            "sliding_window": int(window) or None, "query_pre_attn_scalar": scalar,
            "rope_parameters": {"full_attention": full, "sliding_attention": {
                "rope_type": "default", "rope_theta": float(reader.value("gemma3.rope.freq_base_swa", 10000.0))}}}


FAMILY = replace(
    llama.FAMILY, model_type="gemma3_text", label="Gemma 3 (text: 270M, 1B; local layers on a sliding window)",
    qk_norm=True, gemma=True, args_fields=_args_fields, gguf_arch="gemma3", gguf_qk_permuted=False,
    gguf_fixes=_gguf_fixes, hf_config="Gemma3TextConfig", tiny_random_norms=True,
    # a local layer and a global one, each with its RoPE; attention scale from its own scalar
    tiny=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=32, layer_types=["sliding_attention", "full_attention"],
              sliding_window=512, max_position_embeddings=1024, query_pre_attn_scalar=24, rms_norm_eps=1e-6,
              tie_word_embeddings=True,
              rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                               "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}},
              initializer_range=0.1),
)
