"""A GGUF file's quantized blocks, taken as they are for the quantized linears (rosefast.models.quantized): the
layers' linears in any mix of Q4_0/Q4_1, Q5_0/Q5_1, Q8_0, Q4_K, Q5_K and Q6_K (as K-quant files such as Q4_K_M
mix them), and the lm_head (the tied embedding, or `output.weight`) in its own.

    blocks = gguf_blocks(gguf_path, args)
    # {"linears": "q4_1" | "q8_0" | "blocks", "types": {...}, i: {"qkv": [(fmt, blocks), ...], ...}, "head": [...]}

The block formats themselves are rosefast.quant.formats. What the kernels read is these blocks re-laid out (quant_tiles), kept beside the
converted model after the first start (tiles_cache).
"""
import torch

from rosefast.models.llama import partial_rotary_rows
from rosefast.models.registry import FAMILIES
from rosefast.quant.formats import (unpack_q4_0, unpack_q4_1, unpack_q4_k, unpack_q5_0, unpack_q5_1, unpack_q5_k,
                                    unpack_q6_k, unpack_q8_0)
from rosefast.sources.gguf_file import GGUFFile

def _rope_rows(n, heads):
    """The row order that undoes llama.cpp's q/k permutation (what transformers applies to these tensors)."""
    return torch.arange(n).reshape(heads, n // heads // 2, 2).transpose(1, 2).reshape(n)


def _qkv_rows(args, family):
    """{part: the row order that puts the file's q / k (or fused q|k|v) rows in our model's order}: llama.cpp's
    q/k reordering undone where the family has it, then a partial rotary's pairs placed as our model places
    them at load (llama.partial_rotary_rows)."""
    q, k = args.num_heads * args.head_dim, args.num_kv_heads * args.head_dim
    if family.fused_weights:
        return {"qkv": partial_rotary_rows(args)} if args.rotary_dim else {}
    rows = {}
    if family.gguf_qk_permuted:
        rows = {"q": _rope_rows(q, args.num_heads), "k": _rope_rows(k, args.num_kv_heads)}
    if args.rotary_dim:   # within each head, so the q and k parts each take their slice of the fused order
        order = partial_rotary_rows(args)
        for name, part in (("q", order[:q]), ("k", order[q:q + k] - q)):
            rows[name] = rows[name][part] if name in rows else part
    return rows


def _kinds():
    import gguf

    t = gguf.GGMLQuantizationType
    return {t.Q4_1: ("q4_1", unpack_q4_1), t.Q4_0: ("q4_1", unpack_q4_0), t.Q8_0: ("q8_0", unpack_q8_0),
            t.Q5_1: ("q5_1", unpack_q5_1), t.Q5_0: ("q5_0", unpack_q5_0), t.Q4_K: ("q4_k", unpack_q4_k),
            t.Q5_K: ("q5_k", unpack_q5_k), t.Q6_K: ("q6_k", unpack_q6_k)}


def _merge(parts):
    """[(fmt, blocks), ...] one after another along the rows -> the same with neighbours of one format joined"""
    out = []
    for fmt, blocks in parts:
        if out and out[-1][0] == fmt:
            out[-1] = (fmt, tuple(torch.cat((a, b)) for a, b in zip(out[-1][1], blocks)))
        else:
            out.append((fmt, blocks))
    return out


def _linear_names(family, moe=False, shared=False):
    """{our part: llama.cpp's tensor name} of a layer's linears; `moe`: a mixture-of-experts layer's (its experts
    as 3-D tensors, `shared`: a shared expert's beside them)"""
    if family.fused_weights:   # Phi-3: llama.cpp keeps q|k|v fused (attn_qkv) and gate|up fused (as ffn_up)
        return {"qkv": "attn_qkv", "o": "attn_output", "gate_up": "ffn_up", "down": "ffn_down"}
    attention = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output"}
    if not moe:
        return {**attention, "gate": "ffn_gate", "up": "ffn_up", "down": "ffn_down"}
    experts = {"gate_exps": "ffn_gate_exps", "up_exps": "ffn_up_exps", "down_exps": "ffn_down_exps"}
    if shared:
        experts.update(gate_shexp="ffn_gate_shexp", up_shexp="ffn_up_shexp", down_shexp="ffn_down_shexp")
    return {**attention, **experts}


#: a Gated DeltaNet layer's linears (rosefast.models.delta_net) as the hybrid families' files hold them: q|k|v and z
#: apart, the output projection (its b and a rows are read dense: two a v head)
DELTA_NET = {"delta_qkv": "attn_qkv", "delta_z": "attn_gate", "delta_out": "ssm_out"}


def _layer_names(tensors, family, i):
    """Layer i's linears as _linear_names gives them, a mixture of experts where the file has experts there, a
    Gated DeltaNet's in place of attention's where the file has one there"""
    moe = f"blk.{i}.ffn_gate_exps.weight" in tensors
    names = _linear_names(family, moe, moe and f"blk.{i}.ffn_gate_shexp.weight" in tensors)
    if f"blk.{i}.ssm_out.weight" in tensors:
        names = {**DELTA_NET, **{k: v for k, v in names.items() if not v.startswith("attn_")}}
    return names


EMBEDDING = "token_embd.weight"   # the GGUF's embedding table


def head_name(tie_word_embeddings):
    """The GGUF tensor the lm_head is: the tied embedding, or `output.weight`."""
    return EMBEDDING if tie_word_embeddings else "output.weight"


def _served_head(tensor, kinds):
    """The head is taken from its blocks in a format other than Q4_0/Q4_1 (an int4 head costs the most accuracy)."""
    return tensor is not None and tensor.tensor_type in kinds and kinds[tensor.tensor_type][0] != "q4_1"


def block_linears(tensors, family, num_layers, tie_word_embeddings):
    """The names of the GGUF tensors served from their blocks when every layer linear (`blk.{i}.attn_q.weight` ...)
    is in a block format the kernels take: those, the head (the tied embedding too) where it is in one other
    than Q4_0/Q4_1, and an untied embedding in any of them (looked up in its blocks) — the conversion leaves them
    out; else None. `tensors`: GGUFFile.tensors; `family`: a families.Family."""
    return _left_in_file(tensors, family, num_layers, tie_word_embeddings, _kinds())


def _left_in_file(tensors, family, num_layers, tie_word_embeddings, kinds):
    if family.module != "llama":
        return None
    names = [f"blk.{i}.{name}.weight" for i in range(num_layers) for name in _layer_names(tensors, family, i).values()]
    if not all(n in tensors and tensors[n].tensor_type in kinds for n in names):
        return None
    head = head_name(tie_word_embeddings)
    if _served_head(tensors.get(head), kinds):
        names.append(head)
    if _own_embedding(tensors, kinds, tie_word_embeddings):
        names.append(EMBEDDING)
    return names


def _own_embedding(tensors, kinds, tie_word_embeddings):
    """An untied embedding in a block format the kernels take: looked up in its own blocks."""
    embedding = tensors.get(EMBEDDING)
    return not tie_word_embeddings and embedding is not None and embedding.tensor_type in kinds


def gguf_blocks(path, args, pack=None, sink=None):
    """The blocks of a GGUF whose layers' linear weights are all in block formats the kernels take (Q4_0/Q4_1,
    Q5_0/Q5_1, Q8_0, Q4_K, Q5_K, Q6_K; mixed as K-quant files mix them), as our fused q|k|v and gate|up: each a
    list of parts [(fmt, blocks)] along the rows, one per run of one format (quant_tiles' formats; q/k rows in
    Hugging Face's order: llama.cpp's reordering undone where the family has it); "head": [(fmt, blocks)] for the
    lm_head (the tied embedding, or `output.weight`) when it is in one of those formats other than Q4_0/Q4_1;
    "embed": [(fmt, blocks)] for an untied embedding in any of them; "linears": "q4_1" or "q8_0" when every linear
    is that, else "blocks"; "types": {GGML type name: tensors}.
    None when a linear is in another type (F16, IQ, Q2_K, Q3_K ...): the model is then served as converted.
    `pack(fmt, blocks)`, when given, replaces each part as it is read (one layer's blocks held at a time);
    `sink(key, parts)`, when given, takes each layer's linears (key i) and each whole tensor ("head", "embed") as
    they are made, and they are not kept (the file's pages are let go as each layer is read: nothing of a large
    file but one layer is held)."""
    pack = pack or (lambda fmt, blocks: (fmt, blocks))
    gguf = GGUFFile(path)
    tensors = gguf.tensors
    layers = {}

    def done(key, parts, *read):
        if sink is None:
            layers[key] = parts
            return
        sink(key, parts)
        for t in read:
            gguf.release(t)
    kinds = _kinds()
    family = FAMILIES[args.family]
    if _left_in_file(tensors, family, args.num_layers, args.tie_word_embeddings, kinds) is None:
        return None
    rows = _qkv_rows(args, family)
    types, fmts = {}, set()
    for i in range(args.num_layers):
        parts = {}
        names = [f"blk.{i}.{name}.weight" for name in _layer_names(tensors, family, i).values()]
        for short, name in _layer_names(tensors, family, i).items():
            t = tensors[f"blk.{i}.{name}.weight"]
            types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
            if short.endswith("_exps"):   # [E, N, bytes]: unpacked one expert at a time, below
                parts[short] = t
                continue
            part = _unpacked(t, kinds)
            if short == "q" and args.attn_gate:   # each head's q rows then its gate's: the gate apart
                part, parts["q_gate"] = (_rows(part, r) for r in _gated_q_rows(args))
            if short in rows:
                part = _rows(part, rows[short])
            parts[short] = part
        layer, packed = _mixer(parts, args, family), {}
        if "gate_exps" in parts:   # a mixture of experts (rosefast.models.moe): each expert's gate|up and down,
            for e in range(args.num_experts):   # packed as it is unpacked (one expert's integers held at a time)
                gate, up, down = (_unpacked(parts[x], kinds, e) for x in ("gate_exps", "up_exps", "down_exps"))
                for name, linear in ((f"moe.experts.{e}.gate_up", _merge([gate, up])), (f"moe.experts.{e}.down", [down])):
                    fmts.update(fmt for fmt, _ in linear)
                    packed[name] = [pack(*part) for part in linear]
            if "gate_shexp" in parts:
                layer["moe.shared.gate_up"] = _merge([parts["gate_shexp"], parts["up_shexp"]])
                layer["moe.shared.down"] = [parts["down_shexp"]]
        else:
            layer["gate_up"] = [parts["gate_up"]] if family.fused_weights else _merge([parts["gate"], parts["up"]])
            layer["down"] = [parts["down"]]
        fmts.update(fmt for linear in layer.values() for fmt, _ in linear)
        done(i, {**{name: [pack(*part) for part in linear] for name, linear in layer.items()}, **packed},
             *(tensors[n] for n in names))
    layers["linears"] = fmts.pop() if len(fmts) == 1 and fmts <= {"q4_1", "q8_0"} else "blocks"
    layers["types"] = types
    head = tensors.get(head_name(args.tie_word_embeddings))
    if _served_head(head, kinds):
        done("head", [pack(*_unpacked(head, kinds))], head)
    if _own_embedding(tensors, kinds, args.tie_word_embeddings):
        done("embed", [pack(*_unpacked(tensors[EMBEDDING], kinds))], tensors[EMBEDDING])
    return layers


def _mixer(parts, args, family):
    """A layer's token-mixer linears under our names: q|k|v (fused, or joined) and o, a gated attention's gate;
    or a Gated DeltaNet's q|k|v|z and output."""
    if "delta_qkv" in parts:
        return {"linear_attn.qkvz": _merge([parts["delta_qkv"], parts["delta_z"]]),
                "linear_attn.out": [parts["delta_out"]]}
    mixer = {"qkv": [parts["qkv"]] if family.fused_weights else _merge([parts[x] for x in "qkv"]), "o": [parts["o"]]}
    if args.attn_gate:
        mixer["attn_gate"] = [parts["q_gate"]]
    return mixer


def _gated_q_rows(args):
    """(the q rows, the gate rows) of a gated attention's q projection, which holds each head's q then its gate"""
    d = args.head_dim
    q = (torch.arange(args.num_heads)[:, None] * 2 * d + torch.arange(d)).reshape(-1)
    return q, q + d


def _rows(part, rows):
    fmt, blocks = part
    return fmt, tuple(x[rows] for x in blocks)


def _unpacked(tensor, kinds, expert=None):
    """(fmt, blocks) of a whole 2-D tensor, or of one expert of a 3-D one."""
    fmt, unpack = kinds[tensor.tensor_type]
    k, n = (int(x) for x in tensor.shape[:2])    # GGUF lists the shape innermost first
    return fmt, unpack(tensor.data if expert is None else tensor.data[expert], n, k)
