"""ModelArgs: the shape of a model, read from its Hugging Face config."""
import json
from dataclasses import dataclass
from pathlib import Path

from rosefast.errors import ModelError
from rosefast.models.registry import FAMILIES, check_architecture


@dataclass(frozen=True)
class ModelArgs:
    arch: str                    # our model code: "llama" (also qwen2, qwen3) or "gpt2" (families.Family.module)
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False        # a per-head RMSNorm of q and k before RoPE (Qwen3)
    rope_theta: float = 10000.0
    rope_scaling: tuple = ()     # sorted (key, value) pairs of the config's rope parameters
    rotary_dim: int = 0          # RoPE on each head's first rotary_dim dims (0: all; Phi-4-mini: 3/4 of them)
    eos_token_ids: tuple = ()
    family: str = "llama"        # the Hugging Face model_type (a key of rosefast.models.registry.FAMILIES)
    sliding_window: int = 0      # attention sees the last W positions (0: all): every layer, or Gemma's local ones
    gemma: bool = False          # Gemma's layer and embedding (families.Family.gemma)
    attention_scale: float = 0.0 # 0: head_dim ** -0.5
    local_layers: tuple = ()     # Gemma: the layers on the sliding window, with their own RoPE (local_rope)
    local_rope: tuple = ()       # (theta, scaling) of the local layers' RoPE

    @property
    def q_size(self):
        return self.num_heads * self.head_dim

    @property
    def kv_size(self):
        return self.num_kv_heads * self.head_dim

    def layer_window(self, i):
        """Layer i's sliding window (0: none): every layer's (Mistral), or the local layers' (Gemma 3)."""
        if not self.sliding_window or (self.gemma and i not in self.local_layers):
            return 0
        return self.sliding_window


def _eos(config):
    eos = config.get("eos_token_id")
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list) else (eos,)


def _rope(config):
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    theta = params.pop("rope_theta", None) or config.get("rope_theta") or 10000.0
    rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params["rope_type"] = rope_type
    if rope_type == "longrope" and "original_max_position_embeddings" not in params:   # Phi-3's top-level field
        params["original_max_position_embeddings"] = config.get("original_max_position_embeddings")
    return float(theta), tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in params.items()))


def _gemma(config):
    """Gemma 3's extra ModelArgs: its layer types (local ones on the window) and each type's RoPE."""
    n = config["num_hidden_layers"]
    types = config.get("layer_types") or [
        "full_attention" if (i + 1) % config.get("sliding_window_pattern", 6) == 0 else "sliding_attention"
        for i in range(n)]
    params = config.get("rope_parameters") or {}
    if "full_attention" in params:   # one set of RoPE parameters per layer type
        full, local = (_rope({"rope_parameters": params.get(t)}) for t in ("full_attention", "sliding_attention"))
    else:                            # the older layout: rope_theta / rope_scaling, rope_local_base_freq
        full = _rope(config)
        local = (float(config.get("rope_local_base_freq", 10000.0)), (("rope_type", "default"),))
    for name in ("final_logit_softcapping", "attn_logit_softcapping"):
        if config.get(name):
            raise ModelError(f"Gemma: {name} {config[name]} is not supported (Gemma 2's; Gemma 3 has none)")
    return {"gemma": True, "rope": full, "local_rope": local,
            "local_layers": tuple(i for i, t in enumerate(types) if t == "sliding_attention"),
            "attention_scale": float(config.get("query_pre_attn_scalar") or config["head_dim"]) ** -0.5}


def model_args_from_config(config):
    """ModelArgs from a config dict (config.json)."""
    model_type = config.get("model_type")
    check_architecture(model_type, "config.json")
    if model_type == "gpt2":
        hidden = config["n_embd"]
        heads = config["n_head"]
        return ModelArgs(
            arch="gpt2", vocab_size=config["vocab_size"], hidden_size=hidden, num_layers=config["n_layer"],
            num_heads=heads, num_kv_heads=heads, head_dim=hidden // heads,
            intermediate_size=config.get("n_inner") or 4 * hidden, norm_eps=config.get("layer_norm_epsilon", 1e-5),
            max_position_embeddings=config["n_positions"], tie_word_embeddings=True,
            qkv_bias=True, o_bias=True, mlp_bias=True, eos_token_ids=_eos(config), family="gpt2",
        )
    family = FAMILIES[model_type]
    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    gemma = _gemma(config) if family.gemma else {}
    theta, scaling = gemma.pop("rope") if family.gemma else _rope(config)
    head_dim = config.get("head_dim") or hidden // heads
    partial = dict(scaling).get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    rotary_dim = int(head_dim * partial) if partial != 1.0 else 0
    if rotary_dim % 2 or rotary_dim > head_dim:
        raise ModelError(f"{family.label}: partial_rotary_factor {partial} gives {rotary_dim} of {head_dim} head "
                         "dims: RoPE needs an even number of them, at most the head's")
    attention_bias = bool(config.get("attention_bias", False))
    return ModelArgs(
        arch=family.module, vocab_size=config["vocab_size"], hidden_size=hidden,
        num_layers=config["num_hidden_layers"], num_heads=heads, num_kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=head_dim, intermediate_size=config["intermediate_size"], rotary_dim=rotary_dim,
        norm_eps=config.get("rms_norm_eps", 1e-6), max_position_embeddings=config.get("max_position_embeddings", 2048),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        qkv_bias=attention_bias if family.qkv_bias is None else family.qkv_bias,
        o_bias=attention_bias if family.o_bias is None else family.o_bias,
        mlp_bias=bool(config.get("mlp_bias", False)), qk_norm=family.qk_norm, rope_theta=theta, rope_scaling=scaling,
        eos_token_ids=_eos(config), family=model_type, sliding_window=int(config.get("sliding_window") or 0)
        if config.get("use_sliding_window", True) else 0, **gemma,
        **(family.args_fields(config) if family.args_fields is not None else {}),
    )


def load_model_args(path):
    with open(Path(path) / "config.json", encoding="utf-8") as f:
        return model_args_from_config(json.load(f))
