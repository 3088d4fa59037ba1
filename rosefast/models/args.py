"""ModelArgs: the shape of a model, read from its Hugging Face config."""
import json
from dataclasses import dataclass
from pathlib import Path

from rosefast.errors import ModelError
from rosefast.models.registry import FAMILIES, check_architecture
from rosefast.models.rope_config import rope_of


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
    qk_norm_full: bool = False   # OLMoE: q and k RMS-normalized over their whole width (not per head) before RoPE
    # a mixture of experts (rosefast.models.moe): 0 experts is a dense model
    num_experts: int = 0
    experts_per_token: int = 0
    expert_size: int = 0         # an expert's intermediate width
    norm_topk_prob: bool = True  # the top k's weights renormalized to sum 1
    shared_expert_size: int = 0  # a shared expert over every row, under a sigmoid gate (0: none)
    dense_layers: tuple = ()     # layers of a mixture-of-experts model with a dense MLP (intermediate_size)
    # hybrid attention (rosefast.models.delta_net): Gated DeltaNet layers beside full-attention ones
    linear_layers: tuple = ()    # the layers whose token mixer is a Gated DeltaNet (no KV cache: a state per sequence)
    linear_k_heads: int = 0
    linear_v_heads: int = 0
    linear_k_dim: int = 0
    linear_v_dim: int = 0
    linear_conv: int = 0         # the causal conv's kernel width
    linear_v_tiled: bool = False  # the v heads in llama.cpp's tiled order (v head j reads k head j % k heads; a
                                  # checkpoint's group k head j // (v heads / k heads)'s v heads together)
    attn_gate: bool = False      # full attention's output times sigmoid of a gate projection (Qwen3-Next)
    norm_offset: bool = False    # RMSNorm weights stored as offsets from one: x * (1 + w) (Qwen3-Next, Gemma)

    def is_moe_layer(self, i):
        return self.num_experts > 0 and i not in self.dense_layers

    def is_linear_layer(self, i):
        return i in self.linear_layers

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


def model_args_from_config(config):
    """ModelArgs from a config dict (config.json): the common reading (Llama's names), with what the family's
    module reads beyond it (Family.args_fields), or the family's own reading (Family.read_args)."""
    model_type = config.get("model_type")
    check_architecture(model_type, "config.json")
    family = FAMILIES[model_type]
    if family.text_of is not None:   # a multimodal checkpoint: its text model's config; whether the head is tied is
        # the whole model's (transformers ties by the top level's), an eos the text model's or else the top level's
        text = dict(config["text_config"], model_type=family.text_of)
        if "tie_word_embeddings" in config:
            text["tie_word_embeddings"] = config["tie_word_embeddings"]
        if text.get("eos_token_id") is None and config.get("eos_token_id") is not None:
            text["eos_token_id"] = config["eos_token_id"]
        return model_args_from_config(text)
    if family.read_args is not None:
        return ModelArgs(**family.read_args(config), eos_token_ids=_eos(config), family=model_type)
    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    extra = dict(family.args_fields(config)) if family.args_fields is not None else {}
    theta, scaling = extra.pop("rope") if "rope" in extra else rope_of(config)
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
        mlp_bias=bool(config.get("mlp_bias", False)), qk_norm=family.qk_norm, qk_norm_full=family.qk_norm_full,
        rope_theta=theta, rope_scaling=scaling,
        eos_token_ids=_eos(config), family=model_type, sliding_window=int(config.get("sliding_window") or 0)
        if config.get("use_sliding_window", True) else 0, gemma=family.gemma, **extra,
    )


def load_model_args(path):
    with open(Path(path) / "config.json", encoding="utf-8") as f:
        return model_args_from_config(json.load(f))
