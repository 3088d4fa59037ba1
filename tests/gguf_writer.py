"""A whole GGUF (metadata, tokenizer, tensors) of a tiny random Llama, each weight in the block type a test asks
for: the embedded SmolLM2 file's metadata and tokenizer (the tiny models share its tokenizer) with the tiny
model's shapes, the tensors laid out as llama.cpp's converter lays them (q/k rows reordered). rosefast loads it
as any downloaded file: converted once, its blocks served as they lie."""
import gguf
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType, quants

from tests.kquants import quantize_q4_k, quantize_q5_k, quantize_q6_k
from rosefast.models.args import load_model_args
from rosefast.models.gguf_blocks import _rope_rows
from rosefast.models.loader import read_hf_state_dict
from rosefast.models.sources import default_gguf_path

_OURS = {T.Q4_K: quantize_q4_k, T.Q5_K: quantize_q5_k, T.Q6_K: quantize_q6_k}


def quantize(w, kind):
    """float [n, k] -> the GGUF bytes of `kind` (ours for the K formats, the gguf package's for the rest)"""
    w = np.ascontiguousarray(w, dtype=np.float32)
    return _OURS[kind](w) if kind in _OURS else quants.quantize(w, kind)


_FLOATS = {T.F16: np.float16, T.F32: np.float32}


def write_llama_gguf(path, model, kind_of):
    """Write tiny Llama `model` (a ResolvedModel) to `path`; kind_of(gguf tensor name) -> its GGMLQuantizationType
    (norms are always F32)."""
    import torch

    args = load_model_args(model.path)
    hf = read_hf_state_dict(model.path)
    source = gguf.GGUFReader(str(default_gguf_path()))
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, field in source.fields.items():
        if key.startswith(("GGUF.", "llama.")) or key in ("general.architecture", "general.file_type"):
            continue
        vtype = field.types[0]
        writer.add_key_value(key, field.contents(), vtype, sub_type=field.types[-1] if vtype == GGUFValueType.ARRAY else None)
    writer.add_block_count(args.num_layers)
    writer.add_context_length(args.max_position_embeddings)
    writer.add_embedding_length(args.hidden_size)
    writer.add_feed_forward_length(args.intermediate_size)
    writer.add_head_count(args.num_heads)
    writer.add_head_count_kv(args.num_kv_heads)
    writer.add_rope_freq_base(args.rope_theta)
    writer.add_layer_norm_rms_eps(args.norm_eps)
    writer.add_vocab_size(args.vocab_size)
    writer.add_rope_dimension_count(args.head_dim)

    def add(name, weight, heads=None):
        w = weight.float()
        if heads:   # llama.cpp's order: ours is file[rows]
            file = torch.empty_like(w)
            file[_rope_rows(w.shape[0], heads)] = w
            w = file
        kind = kind_of(name) if w.dim() > 1 else T.F32
        if kind in _FLOATS:
            writer.add_tensor(name, w.numpy().astype(_FLOATS[kind]))
        else:
            writer.add_tensor(name, quantize(w.numpy(), kind), raw_dtype=kind)

    add("token_embd.weight", hf["model.embed_tokens.weight"])
    add("output_norm.weight", hf["model.norm.weight"])
    if not args.tie_word_embeddings:
        add("output.weight", hf["lm_head.weight"])
    for i in range(args.num_layers):
        p = f"model.layers.{i}."
        add(f"blk.{i}.attn_norm.weight", hf[p + "input_layernorm.weight"])
        add(f"blk.{i}.ffn_norm.weight", hf[p + "post_attention_layernorm.weight"])
        add(f"blk.{i}.attn_q.weight", hf[p + "self_attn.q_proj.weight"], args.num_heads)
        add(f"blk.{i}.attn_k.weight", hf[p + "self_attn.k_proj.weight"], args.num_kv_heads)
        for name, key in (("attn_v", "self_attn.v_proj"), ("attn_output", "self_attn.o_proj"),
                          ("ffn_gate", "mlp.gate_proj"), ("ffn_up", "mlp.up_proj"), ("ffn_down", "mlp.down_proj")):
            add(f"blk.{i}.{name}.weight", hf[p + key + ".weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return args
