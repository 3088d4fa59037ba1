"""A GGUF file's quantized blocks, taken as they are for the quantized linears (rosefast.models.quant): the
layers' linears when all are Q4_1 (or Q4_0: the same with m = -8 d) or all Q8_0, and a Q8_0 lm_head (the tied
embedding, or `output.weight`).

    blocks = cached_blocks(gguf_path, args, cache_dir)
    # {"linears": "q4_1" | "q8_0", i: {"qkv": (q, d, m) or (q, d), ...}, "head": (q, d) or absent} or None

Q4_1 is 20 bytes per 32 weights (fp16 d, fp16 m, 16 bytes of nibbles: weights 0-15 low, 16-31 high),
W = d q + m; Q4_0 18 (fp16 d, the nibbles), W = d (q - 8); Q8_0 34 (fp16 d, 32 int8), W = d q. The blocks are kept beside the converted model after the
first start: the gguf package's reader parses every metadata field in Python (~4 s for the embedded model's
tokenizer on this machine), the blocks' own file loads in milliseconds.
"""
import logging
import os
from pathlib import Path

import numpy as np
import torch

from rosefast.models.families import FAMILIES

log = logging.getLogger("rosefast.engine")

GROUP = 32
LINEARS = ("qkv", "o", "gate_up", "down")
_Q4_0_BYTES, _Q4_1_BYTES, _Q8_0_BYTES = 18, 20, 34
BLOCKS_FILE = "gguf_blocks.v2.safetensors"   # v2: Qwen q/k rows no longer reordered as Llama's (v1 files are stale)
_FORMAT = "3"    # 1: Q4_1 linears only, 2: no Q8_0 linears; a file of another format is rebuilt from the GGUF


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


def gguf_blocks(path, args):
    """The blocks of a GGUF whose linear weights are all Q4_1, all Q4_0 (as Q4_1) or all Q8_0 (our fused q|k|v and gate|up rows;
    q/k rows in Hugging Face's order: llama.cpp's reordering undone where the family has it), plus "head": (q, d) when its lm_head is Q8_0; or None when the linears
    are neither."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    tensors = {t.name: t for t in reader.tensors}
    names = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output", "gate": "ffn_gate", "up": "ffn_up",
             "down": "ffn_down"}
    kinds = {gguf.GGMLQuantizationType.Q4_1: ("q4_1", unpack_q4_1), gguf.GGMLQuantizationType.Q4_0: ("q4_1", unpack_q4_0),
             gguf.GGMLQuantizationType.Q8_0: ("q8_0", unpack_q8_0)}
    first = tensors.get(f"blk.0.{names['q']}.weight")
    if first is None or first.tensor_type not in kinds:
        return None
    kind, unpack = kinds[first.tensor_type]
    layers = {"linears": kind}
    for i in range(args.num_layers):
        parts = {}
        for short, name in names.items():
            t = tensors.get(f"blk.{i}.{name}.weight")
            if t is None or t.tensor_type != first.tensor_type:
                return None
            k, n = (int(x) for x in t.shape)    # GGUF lists the shape innermost first
            part = unpack(t.data, n, k)
            if short in ("q", "k") and FAMILIES[args.family].gguf_qk_permuted:
                rows = _rope_rows(n, args.num_heads if short == "q" else args.num_kv_heads)
                part = tuple(x[rows] for x in part)
            parts[short] = part
        cat = lambda *keys: tuple(torch.cat([parts[x][j] for x in keys]) for j in range(len(parts["q"])))  # noqa: E731
        layers[i] = {"qkv": cat("q", "k", "v"), "o": parts["o"], "gate_up": cat("gate", "up"), "down": parts["down"]}
    head = tensors.get("token_embd.weight" if args.tie_word_embeddings else "output.weight")
    if head is not None and head.tensor_type == gguf.GGMLQuantizationType.Q8_0:
        k, n = (int(x) for x in head.shape)
        layers["head"] = unpack_q8_0(head.data, n, k)
    return layers


def cached_blocks(gguf_path, args, cache_dir):
    """gguf_blocks, kept in `cache_dir` (the converted model's directory) after the first start. A file whose
    linears are not Q4_1 is remembered as such."""
    if cache_dir is None:
        return gguf_blocks(gguf_path, args)
    path = Path(cache_dir) / BLOCKS_FILE
    if path.is_file():
        try:
            return _load_blocks(path, args)
        except Exception as e:  # noqa: BLE001 - a damaged cache is rebuilt from the file
            log.warning("quantization: ignoring the unreadable %s (%s); reading the GGUF again", path, e)
    layers = gguf_blocks(gguf_path, args)
    try:
        _save_blocks(path, layers)
    except OSError as e:
        log.warning("quantization: could not keep the GGUF's blocks in %s (%s)", path, e)
    return layers


def _save_blocks(path, layers):
    from safetensors.torch import save_file

    tensors = {}
    for i, parts in (layers or {}).items():
        if i == "linears":
            continue
        if i == "head":
            tensors["head.q"], tensors["head.d"] = parts[0].contiguous(), parts[1].contiguous()
            continue
        for name, part in parts.items():
            if len(part) == 3:   # Q4_1: two 4-bit values a byte
                q, d, m = part
                tensors[f"{i}.{name}.q"] = (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous()
                tensors[f"{i}.{name}.m"] = m.contiguous()
            else:
                q, d = part
                tensors[f"{i}.{name}.q8"] = q.contiguous()
            tensors[f"{i}.{name}.d"] = d.contiguous()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    save_file(tensors, str(tmp), metadata={"format": _FORMAT, "linears": layers["linears"] if layers else "none"})
    os.replace(tmp, path)
    (path.parent / "q4_1_blocks.safetensors").unlink(missing_ok=True)   # the first format's file, superseded


def _load_blocks(path, args):
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
        if meta.get("format") != _FORMAT:
            raise ValueError(f"format {meta.get('format')!r}, not {_FORMAT}")
        if meta.get("linears") not in ("q4_1", "q8_0"):
            return None
        layers = {"linears": meta["linears"]}
        for i in range(args.num_layers):
            layers[i] = {}
            for name in LINEARS:
                # copies: nothing may keep the file's mapping (a later start may replace the file)
                d = f.get_tensor(f"{i}.{name}.d").clone()
                if layers["linears"] == "q4_1":
                    packed = f.get_tensor(f"{i}.{name}.q")
                    q = torch.stack((packed & 0x0F, packed >> 4), dim=-1).reshape(packed.shape[0], -1)
                    layers[i][name] = (q, d, f.get_tensor(f"{i}.{name}.m").clone())
                else:
                    layers[i][name] = (f.get_tensor(f"{i}.{name}.q8").clone(), d)
        if "head.q" in f.keys():
            layers["head"] = (f.get_tensor("head.q").clone(), f.get_tensor("head.d").clone())
    return layers
