"""A whole GGUF (metadata, tokenizer, tensors) of a tiny random model of any family rosefast serves, each weight in
the block type a test asks for, written as llama.cpp's converter (convert_hf_to_gguf.py) writes that family: the
embedded SmolLM2 file's tokenizer (the tiny models share it) with the tiny model's shapes; Llama's and Mistral's
q/k rows reordered and both under the `llama` architecture; Gemma 3's norms stored as 1 + w, its local layers
flagged; Phi-3's q|k|v and gate|up fused as its checkpoints are, its partial rotary as `rope.dimension_count`
and its long-RoPE factors as two tensors; the hybrids' (`qwen3next`, `qwen35`, `qwen35moe`) DeltaNets as
conversion/qwen.py writes them (checked against its files of these tiny models, tensor by tensor). rosefast loads it as any downloaded file: converted once, its blocks
served as they lie."""
import functools

import gguf
import numpy as np
import torch
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


def _metadata(writer, args, config, mtp=0):
    writer.add_block_count(args.num_layers + mtp)
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
    if args.linear_layers:   # as its Qwen3-Next / Qwen3.5 converters write a hybrid
        writer.add_ssm_conv_kernel(args.linear_conv)
        writer.add_ssm_state_size(args.linear_k_dim)
        writer.add_ssm_group_count(args.linear_k_heads)
        writer.add_ssm_time_step_rank(args.linear_v_heads)
        writer.add_ssm_inner_size(args.linear_v_dim * args.linear_v_heads)
        writer.add_array(f"{writer.arch}.attention.recurrent_layers",   # (a key newer than this gguf's writer)
                         [i in args.linear_layers for i in range(args.num_layers + mtp)])
        if mtp:
            writer.add_uint32(f"{writer.arch}.nextn_predict_layers", mtp)
        writer.add_full_attention_interval(config.get("full_attention_interval", 4))
        writer.add_rope_dimension_count(args.rotary_dim)
        if _tiled(args):   # Qwen3.5's multimodal RoPE sections
            writer.add_rope_dimension_sections(config["rope_parameters"]["mrope_section"] + [0])
    if args.num_experts:   # as the Qwen MoE converters write them
        writer.add_expert_count(args.num_experts)
        writer.add_expert_used_count(args.experts_per_token)
        writer.add_expert_feed_forward_length(args.expert_size)
        if args.shared_expert_size:
            writer.add_expert_shared_feed_forward_length(args.shared_expert_size)


def _tiled(args):
    """Whether the converter writes this hybrid's v heads tiled (Qwen3.5/3.6's, not Qwen3-Next's)"""
    return args.family.startswith("qwen3_5") and args.linear_k_heads != args.linear_v_heads


def _v_tiled(w, dim, args, head):
    """w with its v heads (of `head` each along `dim`) reordered from grouped by k head to tiled"""
    k, r = args.linear_k_heads, args.linear_v_heads // args.linear_k_heads
    shape = list(w.shape)
    return w.reshape(*shape[:dim], k, r, head, *shape[dim + 1:]).transpose(dim, dim + 1).reshape(shape)


def _delta_net(key, w, args):
    """[(HF-style name, tensor)] of one DeltaNet tensor as the converter writes it: Qwen3-Next's in_proj_qkvz as
    q|k|v and z apart; A as -exp(A_log), dt_bias as dt_proj's bias, the conv squeezed; Qwen3.5's v heads tiled."""
    stem = key.rsplit(".", 2)[0] + "."
    dk, dv, kh = args.linear_k_dim, args.linear_v_dim, args.linear_k_heads
    if key.endswith("in_proj_qkvz.weight"):
        r = args.linear_v_heads // kh
        q, k, v, z = w.view(kh, 2 * dk + 2 * r * dv, -1).split((dk, dk, r * dv, r * dv), dim=1)
        qkv = torch.cat([t.reshape(-1, t.shape[-1]) for t in (q, k, v)])
        return [(stem + "in_proj_qkv.weight", qkv), (stem + "in_proj_z.weight", z.reshape(-1, z.shape[-1]))]
    if key.endswith("A_log"):
        w = -torch.exp(w)
    if key.endswith("conv1d.weight"):
        w = w[:, 0]
    if _tiled(args):
        keys = 2 * kh * dk
        if key.endswith(("in_proj_qkv.weight", "conv1d.weight")):   # q|k rows / channels, then v's
            w = torch.cat((w[:keys], _v_tiled(w[keys:], 0, args, dv)))
        elif key.endswith("in_proj_z.weight"):
            w = _v_tiled(w, 0, args, dv)
        elif key.endswith(("in_proj_b.weight", "in_proj_a.weight", "A_log", "dt_bias")):
            w = _v_tiled(w, 0, args, 1)
        elif key.endswith("out_proj.weight"):
            w = _v_tiled(w, 1, args, dv)
    return [(stem + "dt_proj.bias" if key.endswith("dt_bias") else key, w)]


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


def write_gguf(path, model, kind_of, mtp=0, split_max_tensors=0):
    """Write tiny `model` (a ResolvedModel of a llama-module family) to `path`; kind_of(gguf tensor name) -> its
    GGMLQuantizationType (norms and RoPE factors are always F32). `mtp`: that many multi-token-prediction layers
    after the model's own, as the hybrids' converter appends a checkpoint's (`nextn_predict_layers`; here copies of
    the last layer with a `nextn.eh_proj` each, which a server of the model itself never reads).
    `split_max_tensors`: a split file of that many tensors a part, as the converter's `--split-max-tensors` writes
    it (`path`'s stem + `-00001-of-0000N.gguf` ...). Returns its ModelArgs."""
    import json

    args = load_model_args(model.path)
    config = json.loads((model.path / "config.json").read_text())
    hf = read_hf_state_dict(model.path)
    arch = FAMILIES[args.family].gguf_architecture   # as llama.cpp's converter writes the family
    writer = gguf.GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)
    for key, value, vtype, sub_type in _tokenizer_fields():
        writer.add_key_value(key, value, vtype, sub_type=sub_type)
    _metadata(writer, args, config, mtp)
    names = gguf.get_tensor_name_map(next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch),
                                     args.num_layers + mtp)
    permuted = FAMILIES[args.family].gguf_qk_permuted

    def add(name, weight):
        w = weight.float()
        heads = {"attn_q": args.num_heads, "attn_k": args.num_kv_heads}.get(name.split(".")[-2]) if permuted else None
        if heads and w.dim() > 1:   # llama.cpp's order: ours is file[rows]
            file = torch.empty_like(w)
            file[_rope_rows(w.shape[0], heads)] = w
            w = file
        if (args.gemma or args.norm_offset) and name.endswith("norm.weight") and "ssm_norm" not in name:
            w = w + 1   # Gemma's and the hybrids' x * (1 + w), stored as llama.cpp's x * w (not the gated norm's)
        # llama.cpp's quantizer leaves the routers (ffn_gate_inp, ffn_gate_inp_shexp) and the DeltaNet's conv F32
        kind = kind_of(name) if w.dim() > 1 and "ffn_gate_inp" not in name and "ssm_conv1d" not in name else T.F32
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
        if key.endswith("shared_expert_gate.weight") and not args.linear_layers:   # [1, H], written as a
            weight = weight.reshape(-1)                                             # vector (llama.cpp's {n_embd})
        for part, w in (_delta_net(key, weight, args) if ".linear_attn." in key else [(key, weight)]):
            stem, suffix = part.rsplit(".", 1)
            add(f"{names.get_name(stem)}.{suffix}" if suffix in ("weight", "bias") else names.get_name(part), w)
            last = f"model.layers.{args.num_layers - 1}."
            for extra in range(mtp if part.startswith(last) else 0):   # the draft layers after the model's own
                layer = f"model.layers.{args.num_layers + extra}."
                add(f"{names.get_name(stem.replace(last, layer))}.{suffix}" if suffix in ("weight", "bias") else
                    names.get_name(part.replace(last, layer)), w)
    for extra in range(mtp):
        add(f"blk.{args.num_layers + extra}.nextn.eh_proj.weight", torch.ones(args.hidden_size, 2 * args.hidden_size))
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


def dequantized_copy(src, dest):
    """A copy of the GGUF `src` with every tensor dequantized to F32 (gguf's dequantization): the numbers its blocks
    hold, read through the conversion's dense path rather than the blocks'."""
    reader = gguf.GGUFReader(str(src))
    writer = gguf.GGUFWriter(str(dest), reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = field.types[0]
        writer.add_key_value(key, field.contents(), vtype, sub_type=field.types[-1] if vtype == GGUFValueType.ARRAY
                             else None)
    for t in reader.tensors:
        shape = [int(x) for x in reversed(t.shape)]
        writer.add_tensor(t.name, np.ascontiguousarray(quants.dequantize(t.data, t.tensor_type).reshape(shape),
                                                       dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
