"""A whole GGUF (metadata, tokenizer, tensors) of a tiny random model of any family rosefast serves, each weight in
the block type a test asks for, written as llama.cpp's converter (convert_hf_to_gguf.py) writes that family: the
embedded SmolLM2 file's tokenizer (the tiny models share it) with the tiny model's shapes; Llama's and Mistral's
q/k rows reordered and both under the `llama` architecture; Gemma 3's norms stored as 1 + w, its local layers
flagged; Phi-3's q|k|v and gate|up fused as its checkpoints are, its partial rotary as `rope.dimension_count`
and its long-RoPE factors as two tensors. rosefast loads it as any downloaded file: converted once, its blocks
served as they lie."""
import functools

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType, RopeScalingType, quants

from tests.kquants import quantize_q4_k, quantize_q5_k, quantize_q6_k
from rosefast.models.args import load_model_args
from rosefast.models.registry import FAMILIES
from rosefast.sources.gguf_blocks import _rope_rows
from rosefast.build import read_hf_state_dict
from rosefast.sources.resolve import default_gguf_path

_OURS = {T.Q4_K: quantize_q4_k, T.Q5_K: quantize_q5_k, T.Q6_K: quantize_q6_k}


def quantize(w, kind):
    """float [n, k] -> the GGUF bytes of `kind` (ours for the K formats, the gguf package's for the rest)"""
    w = np.ascontiguousarray(w, dtype=np.float32)
    return _OURS[kind](w) if kind in _OURS else quants.quantize(w, kind)


_FLOATS = {T.F16: np.float16, T.F32: np.float32}


def _metadata(writer, args, config):
    writer.add_block_count(args.num_layers)
    writer.add_context_length(args.max_position_embeddings)
    writer.add_embedding_length(args.hidden_size)
    writer.add_feed_forward_length(args.intermediate_size)
    writer.add_head_count(args.num_heads)
    writer.add_head_count_kv(args.num_kv_heads)
    writer.add_rope_freq_base(args.rope_theta)
    writer.add_layer_norm_rms_eps(args.norm_eps)
    writer.add_vocab_size(args.vocab_size)
    if "head_dim" in config:   # the converter writes a config's explicit head_dim as key/value length
        writer.add_key_length(args.head_dim)
        writer.add_value_length(args.head_dim)
    if args.family == "phi3":
        rope = dict(args.rope_scaling)
        writer.add_rope_dimension_count(args.rotary_dim or args.head_dim)
        writer.add_rope_scaling_orig_ctx_len(config.get("original_max_position_embeddings")
                                             or args.max_position_embeddings)
        writer.add_sliding_window(config.get("sliding_window") or 0)
        if rope.get("rope_type") == "longrope":
            writer.add_rope_scaling_attn_factors(_longrope_attn_factor(args, rope))
    elif args.gemma:
        scaling = dict(args.rope_scaling)
        if scaling.get("rope_type") == "linear":
            writer.add_rope_scaling_type(RopeScalingType.LINEAR)
            writer.add_rope_scaling_factor(scaling["factor"])
        writer.add_rope_freq_base_swa(args.local_rope[0])
        writer.add_sliding_window(args.sliding_window)
        local = [i in args.local_layers for i in range(args.num_layers)]
        if local != [i % 6 < 5 for i in range(args.num_layers)]:   # llama.cpp's default (its converter writes none)
            writer.add_sliding_window_pattern(local)
    elif FAMILIES[args.family].gguf_qk_permuted:   # llama.cpp's Llama converter and those made from it
        writer.add_rope_dimension_count(args.head_dim)
    if args.num_experts:   # as the Qwen MoE converters write them
        writer.add_expert_count(args.num_experts)
        writer.add_expert_used_count(args.experts_per_token)
        writer.add_expert_feed_forward_length(args.expert_size)
        if args.shared_expert_size:
            writer.add_expert_shared_feed_forward_length(args.shared_expert_size)


def _longrope_attn_factor(args, rope):
    import math

    scale = args.max_position_embeddings / rope["original_max_position_embeddings"]
    return math.sqrt(1 + math.log(scale) / math.log(rope["original_max_position_embeddings"])) if scale > 1 else 1.0


@functools.lru_cache(maxsize=1)
def _tokenizer_fields():
    """The embedded SmolLM2 file's tokenizer and general fields, read once (a parse of its vocabulary is seconds)."""
    fields = []
    for key, field in gguf.GGUFReader(str(default_gguf_path())).fields.items():
        if key.startswith(("tokenizer.", "general.")) and key not in ("general.architecture", "general.file_type"):
            vtype = field.types[0]
            fields.append((key, field.contents(), vtype, field.types[-1] if vtype == GGUFValueType.ARRAY else None))
    return tuple(fields)


def write_gguf(path, model, kind_of):
    """Write tiny `model` (a ResolvedModel of a llama-module family) to `path`; kind_of(gguf tensor name) -> its
    GGMLQuantizationType (norms and RoPE factors are always F32). Returns its ModelArgs."""
    import json

    import torch

    args = load_model_args(model.path)
    config = json.loads((model.path / "config.json").read_text())
    hf = read_hf_state_dict(model.path)
    arch = FAMILIES[args.family].gguf_architecture   # as llama.cpp's converter writes the family
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value, vtype, sub_type in _tokenizer_fields():
        writer.add_key_value(key, value, vtype, sub_type=sub_type)
    _metadata(writer, args, config)
    names = gguf.get_tensor_name_map(next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch), args.num_layers)
    permuted = FAMILIES[args.family].gguf_qk_permuted

    def add(name, weight):
        w = weight.float()
        heads = {"attn_q": args.num_heads, "attn_k": args.num_kv_heads}.get(name.split(".")[-2]) if permuted else None
        if heads and w.dim() > 1:   # llama.cpp's order: ours is file[rows]
            file = torch.empty_like(w)
            file[_rope_rows(w.shape[0], heads)] = w
            w = file
        if args.gemma and name.endswith("norm.weight"):   # Gemma's x * (1 + w), stored as llama.cpp's x * w
            w = w + 1
        # llama.cpp's quantizer leaves the routers (ffn_gate_inp, ffn_gate_inp_shexp) F32
        kind = kind_of(name) if w.dim() > 1 and "ffn_gate_inp" not in name else T.F32
        if kind in _FLOATS:
            writer.add_tensor(name, w.numpy().astype(_FLOATS[kind]))
        else:   # a 3-D tensor of experts as [E, N, bytes]
            rows = quantize(w.reshape(-1, w.shape[-1]).numpy(), kind)
            writer.add_tensor(name, rows.reshape(*w.shape[:-1], -1), raw_dtype=kind)

    for key, weight in hf.items():
        if key == "lm_head.weight" and args.tie_word_embeddings:
            continue
        if key.endswith("mlp.experts.gate_up_proj"):   # transformers 5's fused experts [E, 2I, H]: gate, up apart
            stem = key[:-len("gate_up_proj")]
            gate, up = weight.chunk(2, dim=1)
            add(f"{names.get_name(stem + 'gate_proj')}.weight", gate)
            add(f"{names.get_name(stem + 'up_proj')}.weight", up)
            continue
        if key.endswith("mlp.experts.down_proj"):
            add(f"{names.get_name(key)}.weight", weight)
            continue
        if key.endswith("shared_expert_gate.weight"):   # [1, H], written as a vector (llama.cpp's {n_embd})
            weight = weight.reshape(-1)
        stem, suffix = key.rsplit(".", 1)
        add(f"{names.get_name(stem)}.{suffix}", weight)
    rope = dict(args.rope_scaling)
    if rope.get("rope_type") == "llama3":   # llama.cpp's converter: the per-frequency divisors as a tensor
        from rosefast.models.families.gguf_keys import llama3_factors

        inv_freq = [1.0 / args.rope_theta ** (i / args.head_dim) for i in range(0, args.head_dim, 2)]
        writer.add_tensor("rope_freqs.weight", np.asarray(llama3_factors(
            inv_freq, rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"],
            rope["original_max_position_embeddings"]), dtype=np.float32))
    if args.family == "phi3" and rope.get("rope_type") == "longrope":
        for which in ("long", "short"):
            writer.add_tensor(f"rope_factors_{which}.weight", np.asarray(rope[f"{which}_factor"], dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return args
