"""A GGUF file's quantized blocks, taken as they are for the quantized linears (rosefast.models.quant): the
layers' linears in any mix of Q4_0/Q4_1, Q5_0/Q5_1, Q8_0, Q4_K, Q5_K and Q6_K (as K-quant files such as Q4_K_M
mix them), and the lm_head (the tied embedding, or `output.weight`) in its own.

    blocks = gguf_blocks(gguf_path, args)
    # {"linears": "q4_1" | "q8_0" | "blocks", "types": {...}, i: {"qkv": [(fmt, blocks), ...], ...}, "head": [...]}

Q4_1 is 20 bytes per 32 weights (fp16 d, fp16 m, 16 bytes of nibbles: weights 0-15 low, 16-31 high),
W = d q + m; Q4_0 18 (fp16 d, the nibbles), W = d (q - 8); Q8_0 34 (fp16 d, 32 int8), W = d q; Q5_0/Q5_1 add
4 bytes of fifth bits; the K formats hold 256 weights a super-block with 6- or 8-bit scales per 32 or 16 (the
unpack functions say how). What the kernels read is these blocks re-laid out (quant_tiles), kept beside the
converted model after the first start (tiles_cache).
"""
import numpy as np
import torch

from rosefast.models.families import FAMILIES
from rosefast.models.gguf_file import GGUFFile

GROUP = 32
LINEARS = ("qkv", "o", "gate_up", "down")
_Q4_0_BYTES, _Q4_1_BYTES, _Q8_0_BYTES = 18, 20, 34


def unpack_q4_1(raw, n, k):
    """Q4_1 blocks of an [n, k] tensor (uint8 [n, k / 32 x 20]) -> (q [n, k] uint8, d, m [n, k / 32] fp16)."""
    blocks = np.ascontiguousarray(raw).reshape(n, k // GROUP, _Q4_1_BYTES)
    d = torch.from_numpy(blocks[..., 0:2].copy().view(np.float16)[..., 0])
    m = torch.from_numpy(blocks[..., 2:4].copy().view(np.float16)[..., 0])
    nib = torch.from_numpy(blocks[..., 4:].copy())                                          # [n, k/32, 16]
    q = torch.cat((nib & 0x0F, nib >> 4), dim=-1)                                           # [n, k/32, 32]
    return q.reshape(n, k), d, m


def unpack_q4_0(raw, n, k):
    """Q4_0 blocks of an [n, k] tensor -> Q4_1's (q, d, m): d (q - 8) = d q + m with m = -8 d, exact in fp16."""
    blocks = np.ascontiguousarray(raw).reshape(n, k // GROUP, _Q4_0_BYTES)
    d = torch.from_numpy(blocks[..., 0:2].copy().view(np.float16)[..., 0])
    nib = torch.from_numpy(blocks[..., 2:].copy())
    q = torch.cat((nib & 0x0F, nib >> 4), dim=-1)
    return q.reshape(n, k), d, d * -8


def unpack_q8_0(raw, n, k):
    """Q8_0 blocks of an [n, k] tensor (uint8 [n, k / 32 x 34]) -> (q [n, k] int8, d [n, k / 32] fp16)."""
    blocks = np.ascontiguousarray(raw).reshape(n, k // GROUP, _Q8_0_BYTES)
    d = torch.from_numpy(blocks[..., 0:2].copy().view(np.float16)[..., 0])
    q = torch.from_numpy(blocks[..., 2:].copy().view(np.int8))
    return q.reshape(n, k), d


_Q5_0_BYTES, _Q5_1_BYTES, _Q4_K_BYTES, _Q5_K_BYTES, _Q6_K_BYTES = 22, 24, 144, 176, 210
SUPER = 256   # a K-quant super-block's values


def _blocks(raw, n, k, per, size):
    return np.ascontiguousarray(raw).reshape(n, k // per, size)


def _half(b):
    """uint8 [..., 2] -> fp16 [...]"""
    return torch.from_numpy(np.ascontiguousarray(b).view(np.float16)[..., 0])


def _bits(b, count):
    """uint8 [..., B] -> their bits, least significant first: uint8 [..., B * 8][:count]"""
    return np.unpackbits(b, axis=-1, bitorder="little")[..., :count]


def unpack_q5_1(raw, n, k):
    """Q5_1 blocks (fp16 d, fp16 m, 4 bytes of fifth bits, 16 of nibbles) -> (q [n, k] uint8 0..31, d, m):
    W = d q + m."""
    blocks = _blocks(raw, n, k, GROUP, _Q5_1_BYTES)
    return _five_bits(blocks[..., 4:8], blocks[..., 8:], n, k), _half(blocks[..., 0:2]), _half(blocks[..., 2:4])


def unpack_q5_0(raw, n, k):
    """Q5_0 blocks (fp16 d, 4 bytes of fifth bits, 16 of nibbles) -> (q [n, k] uint8 0..31, d): W = d (q - 16)."""
    blocks = _blocks(raw, n, k, GROUP, _Q5_0_BYTES)
    return _five_bits(blocks[..., 2:6], blocks[..., 6:], n, k), _half(blocks[..., 0:2])


def _five_bits(qh, qs, n, k):
    """a 32-value block's fifth bits (uint32, bit j: value j) and nibbles (value j low, j + 16 high)"""
    low = np.concatenate((qs & 0x0F, qs >> 4), axis=-1)                                    # [n, k/32, 32]
    return torch.from_numpy((low | (_bits(qh, 32) << 4)).reshape(n, k))


def _k_scales(s):
    """a Q4_K/Q5_K super-block's 12 bytes -> its 8 six-bit scales and 8 mins (llama.cpp's get_scale_min_k4)"""
    s = s.astype(np.uint8)
    sc = np.concatenate((s[..., 0:4] & 63, (s[..., 8:12] & 0x0F) | ((s[..., 0:4] >> 6) << 4)), axis=-1)
    mn = np.concatenate((s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)), axis=-1)
    return sc, mn


def _k_nibbles(qs):
    """128 bytes -> 256 values: each 32 bytes hold two 32-value sub-blocks, low nibbles then high"""
    c = qs.reshape(*qs.shape[:-1], 4, 32)
    return np.stack((c & 0x0F, c >> 4), axis=-2).reshape(*qs.shape[:-1], SUPER)


def unpack_q4_k(raw, n, k):
    """Q4_K super-blocks (fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins, 128 of nibbles) -> (q [n, k]
    0..15, d, dmin [n, k / 256] fp16, sc, mn [n, k / 32] uint8): W = d sc q - dmin mn per 32 values."""
    blocks = _blocks(raw, n, k, SUPER, _Q4_K_BYTES)
    sc, mn = _k_scales(blocks[..., 4:16])
    q = _k_nibbles(blocks[..., 16:])
    return (torch.from_numpy(q.reshape(n, k)), _half(blocks[..., 0:2]), _half(blocks[..., 2:4]),
            torch.from_numpy(sc.reshape(n, -1)), torch.from_numpy(mn.reshape(n, -1)))


def unpack_q5_k(raw, n, k):
    """Q5_K super-blocks (Q4_K's, then 32 bytes of fifth bits before the nibbles: bit i of byte l is value l of
    sub-block i) -> Q4_K's tuple with q 0..31."""
    blocks = _blocks(raw, n, k, SUPER, _Q5_K_BYTES)
    sc, mn = _k_scales(blocks[..., 4:16])
    q = _k_nibbles(blocks[..., 48:]).reshape(n, k // SUPER, 8, 32)
    high = _bits(blocks[..., 16:48, None], 8)                                              # [n, S, 32 (l), 8 (i)]
    q = q | (np.swapaxes(high, -1, -2) << 4)
    return (torch.from_numpy(q.reshape(n, k)), _half(blocks[..., 0:2]), _half(blocks[..., 2:4]),
            torch.from_numpy(sc.reshape(n, -1)), torch.from_numpy(mn.reshape(n, -1)))


def unpack_q6_k(raw, n, k):
    """Q6_K super-blocks (128 bytes of low nibbles, 64 of 2-bit highs, 16 int8 scales, fp16 d) -> (q [n, k]
    0..63, d [n, k / 256] fp16, sc [n, k / 16] int8): W = d sc (q - 32) per 16 values."""
    blocks = _blocks(raw, n, k, SUPER, _Q6_K_BYTES)
    ql = blocks[..., 0:128].reshape(n, -1, 2, 2, 32)            # [n, S, half, byte run r2, l]
    qh = blocks[..., 128:192].reshape(n, -1, 2, 32)             # [n, S, half, l]
    low = np.stack((ql & 0x0F, ql >> 4), axis=-3)               # [n, S, half, nibble, r2, l]: value 64 nib + 32 r2 + l
    high = np.stack([(qh >> (2 * r)) & 3 for r in range(4)], axis=-2)   # [n, S, half, r, l]: value 32 r + l
    q = low.reshape(n, -1, 2, 4, 32) | (high << 4)
    sc = blocks[..., 192:208].copy().view(np.int8)
    return torch.from_numpy(q.reshape(n, k)), _half(blocks[..., 208:210]), torch.from_numpy(sc.reshape(n, -1))


def dequantize_q4_1(q, d, m):
    """Q4_1 in fp32 as gguf computes it: d q + m per group."""
    n, k = q.shape
    w = d.to(torch.float32)[..., None] * q.reshape(n, k // GROUP, GROUP).to(torch.float32) + m.to(torch.float32)[..., None]
    return w.reshape(n, k)


def dequantize_q8_0(q, d):
    n, k = q.shape
    return (d.to(torch.float32)[..., None] * q.reshape(n, k // GROUP, GROUP).to(torch.float32)).reshape(n, k)


def _rope_rows(n, heads):
    """The row order that undoes llama.cpp's q/k permutation (what transformers applies to these tensors)."""
    return torch.arange(n).reshape(heads, n // heads // 2, 2).transpose(1, 2).reshape(n)


def _qkv_rows(args, family):
    """{part: the row order that puts the file's q / k (or fused q|k|v) rows in our model's order}: llama.cpp's
    q/k reordering undone where the family has it, then a partial rotary's pairs placed as our model places
    them at load (llama.partial_rotary_rows)."""
    # imported here: llama's decode plan imports quant_tiles, which imports this module (a cycle at import time
    # would leave the compiled plan unimportable, and its pure twin would run)
    from rosefast.models.llama import partial_rotary_rows

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


def _linear_names(family):
    """{our part: llama.cpp's tensor name} of a layer's linears"""
    if family.fused_weights:   # Phi-3: llama.cpp keeps q|k|v fused (attn_qkv) and gate|up fused (as ffn_up)
        return {"qkv": "attn_qkv", "o": "attn_output", "gate_up": "ffn_up", "down": "ffn_down"}
    return {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output", "gate": "ffn_gate", "up": "ffn_up",
            "down": "ffn_down"}


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
    names = [f"blk.{i}.{name}.weight" for i in range(num_layers) for name in _linear_names(family).values()]
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


def gguf_blocks(path, args, pack=None):
    """The blocks of a GGUF whose layers' linear weights are all in block formats the kernels take (Q4_0/Q4_1,
    Q5_0/Q5_1, Q8_0, Q4_K, Q5_K, Q6_K; mixed as K-quant files mix them), as our fused q|k|v and gate|up: each a
    list of parts [(fmt, blocks)] along the rows, one per run of one format (quant_tiles' formats; q/k rows in
    Hugging Face's order: llama.cpp's reordering undone where the family has it); "head": [(fmt, blocks)] for the
    lm_head (the tied embedding, or `output.weight`) when it is in one of those formats other than Q4_0/Q4_1;
    "embed": [(fmt, blocks)] for an untied embedding in any of them; "linears": "q4_1" or "q8_0" when every linear
    is that, else "blocks"; "types": {GGML type name: tensors}.
    None when a linear is in another type (F16, IQ, Q2_K, Q3_K ...): the model is then served as converted.
    `pack(fmt, blocks)`, when given, replaces each part as it is read (one layer's blocks held at a time)."""
    pack = pack or (lambda fmt, blocks: (fmt, blocks))
    tensors = GGUFFile(path).tensors
    kinds = _kinds()
    family = FAMILIES[args.family]
    if _left_in_file(tensors, family, args.num_layers, args.tie_word_embeddings, kinds) is None:
        return None
    names = _linear_names(family)
    rows = _qkv_rows(args, family)
    layers, types, fmts = {}, {}, set()
    for i in range(args.num_layers):
        parts = {}
        for short, name in names.items():
            t = tensors[f"blk.{i}.{name}.weight"]
            fmt, unpack = kinds[t.tensor_type]
            k, n = (int(x) for x in t.shape)    # GGUF lists the shape innermost first
            part = unpack(t.data, n, k)
            if short in rows:
                part = tuple(x[rows[short]] for x in part)
            parts[short] = (fmt, part)
            types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
        qkv = [parts["qkv"]] if family.fused_weights else _merge([parts[x] for x in "qkv"])
        gate_up = [parts["gate_up"]] if family.fused_weights else _merge([parts["gate"], parts["up"]])
        layer = {"qkv": qkv, "o": [parts["o"]], "gate_up": gate_up, "down": [parts["down"]]}
        fmts.update(fmt for linear in layer.values() for fmt, _ in linear)
        layers[i] = {name: [pack(*part) for part in linear] for name, linear in layer.items()}
    layers["linears"] = fmts.pop() if len(fmts) == 1 and fmts <= {"q4_1", "q8_0"} else "blocks"
    layers["types"] = types
    head = tensors.get(head_name(args.tie_word_embeddings))
    if _served_head(head, kinds):
        layers["head"] = [pack(*_unpacked(head, kinds))]
    if _own_embedding(tensors, kinds, args.tie_word_embeddings):
        layers["embed"] = [pack(*_unpacked(tensors[EMBEDDING], kinds))]
    return layers


def _unpacked(tensor, kinds):
    """(fmt, blocks) of a whole tensor."""
    fmt, unpack = kinds[tensor.tensor_type]
    k, n = (int(x) for x in tensor.shape)    # GGUF lists the shape innermost first
    return fmt, unpack(tensor.data, n, k)
