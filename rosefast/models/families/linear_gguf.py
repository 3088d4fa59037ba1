"""The hybrid-attention families' GGUFs (`qwen35`, `qwen35moe`, `qwen3next`) as llama.cpp's converter writes them
(its conversion/qwen.py), read back for the families qwen3_5, qwen3_5_moe and qwen3_next.

transformers' GGUF reader knows none of the three: the file is shown to it as Qwen3's or Qwen3-MoE's (the same
keys for what those have: Family.gguf_read_as), gguf_fixes puts the rest back from the `ssm.*` keys, and
`LinearTensors` names the tensors by gguf's map of the file's own architecture and undoes what the converter did
to them:

- the DeltaNet's A_log written as A = -exp(A_log), dt_bias as `ssm_dt.bias`, the conv's [C, 1, K] squeezed;
- every RMSNorm weight but the gated one (`ssm_norm`) written as 1 + w (llama.cpp's x * w);
- Qwen3-Next's interleaved in_proj_qkvz written as q|k|v (`attn_qkv`) and z (`attn_gate`), its in_proj_ba kept
  interleaved (`ssm_ba`): read back as Qwen3.5's separate in_proj_qkv / in_proj_z / in_proj_b / in_proj_a, the
  layout our loader takes either family in (rosefast.models.delta_net.delta_net_state_dict);
- Qwen3.5/3.6's v heads reordered from grouped by k head to tiled (every per-v-head row, vector and conv channel,
  and out_proj's columns): kept so — the blocks of out_proj's columns cannot be reordered — and the model told
  (the config's `linear_value_heads_tiled`: v head j reads k head j % k heads).

A file's multi-token-prediction layers (`nextn_predict_layers`, past the model's own) are not served.
"""
import numpy as np

from rosefast.models.families.moe_keys import gguf_moe_fixes

#: the config key a conversion writes when the v heads are in llama.cpp's tiled order (a checkpoint's are grouped by
#: k head; rosefast.models.families.qwen3_next.linear_fields reads it)
TILED = "linear_value_heads_tiled"

#: llama.cpp's architecture -> (the model_type it is served as, whether its converter tiles the v heads)
ARCHES = {"qwen35": ("qwen3_5_text", True), "qwen35moe": ("qwen3_5_moe_text", True), "qwen3next": ("qwen3_next", False)}


def gguf_linear_fixes(reader, config, head_dim):
    """The config fields of a hybrid file that transformers' reading of it (as Qwen3's / Qwen3-MoE's) lacks or
    gets wrong: the family, the DeltaNet's heads and conv, which layers are linear, the partial rotary (and
    Qwen3.5's multimodal RoPE sections), the experts' widths, the MTP layers left out."""
    arch = reader.value("general.architecture")
    model_type, tiled = ARCHES[arch]

    def key(name, default=None):
        return reader.value(f"{arch}.{name}", default)
    blocks = int(key("block_count"))
    layers = blocks - int(key("nextn_predict_layers", 0) or 0)
    v_heads = int(key("ssm.time_step_rank"))
    recurrent = key("attention.recurrent_layers")
    interval = int(key("full_attention_interval", 4))
    kinds = [bool(x) for x in recurrent][:layers] if recurrent is not None else \
        [(i + 1) % interval != 0 for i in range(layers)]
    rope = {"rope_type": "default", "rope_theta": float(key("rope.freq_base", 10000.0)),
            "partial_rotary_factor": int(key("rope.dimension_count", head_dim)) / head_dim}
    sections = key("rope.dimension_sections")
    if sections is not None:   # Qwen3.5's interleaved multimodal RoPE: for text, plain RoPE (kept as the config has it)
        rope.update(mrope_section=[int(x) for x in sections][:3], mrope_interleaved=True)
    fixes = {"model_type": model_type, "num_hidden_layers": layers,
             "layer_types": ["linear_attention" if k else "full_attention" for k in kinds],
             "full_attention_interval": interval, "linear_conv_kernel_dim": int(key("ssm.conv_kernel")),
             "linear_key_head_dim": int(key("ssm.state_size")), "linear_num_key_heads": int(key("ssm.group_count")),
             "linear_num_value_heads": v_heads, "linear_value_head_dim": int(key("ssm.inner_size")) // v_heads,
             "rope_parameters": rope, "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon", 1e-6)),
             TILED: tiled and int(key("ssm.group_count")) != v_heads}
    if key("expert_count"):
        fixes.update(gguf_moe_fixes(reader, arch, True), num_experts=int(key("expert_count")),
                     num_experts_per_tok=int(key("expert_used_count")))
        fixes["decoder_sparse_step"], fixes["mlp_only_layers"] = 1, []   # llama.cpp's: every layer's experts
    return fixes


def _layer(name):
    parts = name.split(".")
    return int(parts[1]) if parts[0] == "blk" else None


class LinearTensors:
    """What a hybrid family's file tensors are (Family.gguf_tensors): extra names beside gguf's map of the file's
    architecture, and each tensor with the converter's changes undone."""

    def names(self, config):
        """{file name: Hugging Face name} of the tensors gguf's name map does not name (in our loader's layout)."""
        out = {}
        for i in range(config["num_hidden_layers"]):
            stem = f"model.layers.{i}."
            out[f"blk.{i}.ssm_dt.bias"] = stem + "linear_attn.dt_bias"
            out[f"blk.{i}.attn_qkv.weight"] = stem + "linear_attn.in_proj_qkv.weight"
            out[f"blk.{i}.attn_gate.weight"] = stem + "linear_attn.in_proj_z.weight"
            out[f"blk.{i}.ssm_beta.weight"] = stem + "linear_attn.in_proj_b.weight"
            out[f"blk.{i}.ssm_alpha.weight"] = stem + "linear_attn.in_proj_a.weight"
            for part in ("gate", "up"):   # the experts' gate and up: the halves of transformers' gate_up_proj
                out[f"blk.{i}.ffn_{part}_exps"] = stem + "mlp.experts.gate_up_proj"
            out[f"blk.{i}.ffn_down_exps"] = stem + "mlp.experts.down_proj"
        return out

    def undo(self, name, weights, config):
        """[(file-style name, float array in Hugging Face's shape)] for one of the file's tensors (dequantized)."""
        layer = _layer(name)
        if layer is not None and layer >= config["num_hidden_layers"]:
            return []   # a multi-token-prediction layer: not served
        if name.endswith(".ssm_a"):
            return [(name, np.log(-weights.astype(np.float64)).astype(np.float32))]
        if name.endswith(".ssm_conv1d.weight"):
            return [(name, weights[:, None, :])]
        if name.endswith("norm.weight") and not name.endswith("ssm_norm.weight"):
            return [(name, weights - np.float32(1))]
        if name.endswith(".ssm_ba.weight"):   # Qwen3-Next's: per k head, its v heads' b rows then their a rows
            k_heads, v_heads = config["linear_num_key_heads"], config["linear_num_value_heads"]
            grouped = weights.reshape(k_heads, 2, v_heads // k_heads, -1)
            stem = name[:-len("ssm_ba.weight")]
            return [(stem + "ssm_beta.weight", grouped[:, 0].reshape(v_heads, -1)),
                    (stem + "ssm_alpha.weight", grouped[:, 1].reshape(v_heads, -1))]
        if name.endswith(".ffn_gate_inp_shexp.weight"):   # written [1, H]; transformers' reader takes a vector
            return [(name, weights.reshape(-1))]
        return [(name, weights)]

