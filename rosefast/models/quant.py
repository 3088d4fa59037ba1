"""Weight-only quantized linear layers on CPU (ROSEFAST_QUANTIZATION): int4 groupwise with a scale and a min
(GGUF's Q4_1 layout, group 32) and int8 per output channel, run by torch's CPU weight-only ops.

    count = quantize_linears(model, "int4", gguf_path)   # Q4_1 blocks from the file, else quantized at load

int4 is y = x W^T with W[n, k] = d[n, g] q[n, k] + m[n, g] (g = k // 32, q in 0..15): Q4_1 exactly. A GGUF
file's Q4_1 blocks are taken as they are — no dequantize-and-requantize round trip — and d, m become the
op's bf16 scale and zero (torch's int4 op computes (q - 8) scale + zero, so zero = m + 8 d); that rounding
of d and m from fp16 to bf16 is the only change to the file's numbers. A Hugging Face directory is
quantized at load with the same scheme (per group: d = (max - min) / 15, m = min). int8: W = s[n] q[n, k],
s = max |W[n]| / 127. The ops take bf16 activations (their fp32 path is 20x slower here): a layer casts its
input to bf16 and its output back. Measured per decode step on this machine (`python -m benches.decode_step`).
"""
import logging
import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

from rosefast.models.packed import PackedLinear

log = logging.getLogger("rosefast.engine")

GROUP = 32
MODES = ("none", "int8", "int4", "auto")
LINEARS = ("qkv", "o", "gate_up", "down")
_Q4_1_BYTES = 20   # fp16 d, fp16 m, 16 bytes of nibbles: weights 0-15 in the low nibbles, 16-31 in the high
BLOCKS_FILE = "q4_1_blocks.safetensors"   # beside a converted GGUF: its linears' blocks, read in milliseconds


class Int4Linear(nn.Module):
    """y = x W^T + b with W held as 4-bit values, a bf16 scale and zero per 32 inputs (torch's int4 pack)."""

    def __init__(self, q, d, m, bias=None):
        """q: [N, K] integers 0..15; d, m: [N, K / 32] float (Q4_1's scale and min)."""
        super().__init__()
        self.out_features, self.in_features = q.shape
        scale, zero = d.to(torch.float32), m.to(torch.float32) + 8 * d.to(torch.float32)
        self.scales_zeros = torch.stack((scale.t(), zero.t()), dim=-1).to(torch.bfloat16).contiguous()  # [K/G, N, 2]
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), 2)
        self.bias = None if bias is None else bias.detach().to(torch.bfloat16)

    def forward(self, x):
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), self.packed, GROUP, self.scales_zeros)
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, int4 group {GROUP}"


class Int8Linear(nn.Module):
    """y = x W^T + b with W held as int8 with one bf16 scale per output channel."""

    def __init__(self, q, scale, bias=None):
        super().__init__()
        self.out_features, self.in_features = q.shape
        self.q = q.to(torch.int8).contiguous()
        self.scale = scale.to(torch.bfloat16).contiguous()
        self.bias = None if bias is None else bias.detach().to(torch.bfloat16)

    def forward(self, x):
        y = torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16), self.q, self.scale)
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per channel"


def quantize_q4_1(weight):
    """[N, K] float -> (q [N, K] uint8 0..15, d, m [N, K / 32] fp16): Q4_1 as llama.cpp makes it."""
    n, k = weight.shape
    w = weight.to(torch.float32).reshape(n, k // GROUP, GROUP)
    lo, hi = w.amin(dim=-1), w.amax(dim=-1)
    d = ((hi - lo) / 15).to(torch.float16)
    m = lo.to(torch.float16)
    inv = torch.where(d != 0, 1 / d.to(torch.float32), torch.zeros_like(lo))
    q = ((w - m.to(torch.float32)[..., None]) * inv[..., None]).round().clamp(0, 15).to(torch.uint8)
    return q.reshape(n, k), d, m


def quantize_int8(weight):
    """[N, K] float -> (q int8, scale [N] fp32): symmetric per output channel."""
    w = weight.to(torch.float32)
    scale = w.abs().amax(dim=1).clamp_min(1e-12) / 127
    return (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8), scale


def unpack_q4_1(raw, n, k):
    """Q4_1 blocks of an [n, k] tensor (uint8 [n, k / 32 x 20]) -> (q [n, k] uint8, d, m [n, k / 32] fp16)."""
    blocks = np.ascontiguousarray(raw).reshape(n, k // GROUP, _Q4_1_BYTES)
    d = torch.from_numpy(blocks[..., 0:2].copy().view(np.float16)[..., 0])
    m = torch.from_numpy(blocks[..., 2:4].copy().view(np.float16)[..., 0])
    nib = torch.from_numpy(blocks[..., 4:].copy())                                          # [n, k/32, 16]
    q = torch.cat((nib & 0x0F, nib >> 4), dim=-1)                                           # [n, k/32, 32]
    return q.reshape(n, k), d, m


def dequantize_q4_1(q, d, m):
    """Q4_1 in fp32 as gguf computes it: d q + m per group."""
    n, k = q.shape
    w = d.to(torch.float32)[..., None] * q.reshape(n, k // GROUP, GROUP).to(torch.float32) + m.to(torch.float32)[..., None]
    return w.reshape(n, k)


def _rope_rows(n, heads):
    """The row order that undoes llama.cpp's q/k permutation (what transformers applies to these tensors)."""
    return torch.arange(n).reshape(heads, n // heads // 2, 2).transpose(1, 2).reshape(n)


def gguf_q4_1_layers(path, args):
    """{layer index: {linear name: (q, d, m)}} from a GGUF whose linear weights are all Q4_1 (our fused q|k|v
    and gate|up rows; q/k rows in Hugging Face's order), or None when they are not."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    tensors = {t.name: t for t in reader.tensors}
    names = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output", "gate": "ffn_gate", "up": "ffn_up",
             "down": "ffn_down"}
    layers = {}
    for i in range(args.num_layers):
        parts = {}
        for short, name in names.items():
            t = tensors.get(f"blk.{i}.{name}.weight")
            if t is None or t.tensor_type != gguf.GGMLQuantizationType.Q4_1:
                return None
            k, n = (int(x) for x in t.shape)    # GGUF lists the shape innermost first
            q, d, m = unpack_q4_1(t.data, n, k)
            if short in ("q", "k"):
                rows = _rope_rows(n, args.num_heads if short == "q" else args.num_kv_heads)
                q, d, m = q[rows], d[rows], m[rows]
            parts[short] = (q, d, m)
        cat = lambda *keys: tuple(torch.cat([parts[x][j] for x in keys]) for j in range(3))  # noqa: E731
        layers[i] = {"qkv": cat("q", "k", "v"), "o": parts["o"], "gate_up": cat("gate", "up"), "down": parts["down"]}
    return layers


def cached_q4_1_layers(gguf_path, args, cache_dir):
    """gguf_q4_1_layers, kept in `cache_dir` (the converted model's directory) after the first start: the gguf
    package's reader parses every metadata field in Python (~4 s for the embedded model's tokenizer on this
    machine), while the blocks' own file (the same numbers: 4-bit values two to a byte, fp16 d and m) loads in
    milliseconds. A file whose linears are not Q4_1 is remembered as such."""
    if cache_dir is None:
        return gguf_q4_1_layers(gguf_path, args)
    path = Path(cache_dir) / BLOCKS_FILE
    if path.is_file():
        try:
            return _load_blocks(path, args)
        except Exception as e:  # noqa: BLE001 - a damaged cache is rebuilt from the file
            log.warning("quantization: ignoring the unreadable %s (%s); reading the GGUF again", path, e)
    layers = gguf_q4_1_layers(gguf_path, args)
    try:
        _save_blocks(path, layers)
    except OSError as e:
        log.warning("quantization: could not keep the Q4_1 blocks in %s (%s)", path, e)
    return layers


def _save_blocks(path, layers):
    from safetensors.torch import save_file

    tensors = {}
    for i, parts in (layers or {}).items():
        for name, (q, d, m) in parts.items():
            tensors[f"{i}.{name}.q"] = (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous()
            tensors[f"{i}.{name}.d"], tensors[f"{i}.{name}.m"] = d.contiguous(), m.contiguous()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    save_file(tensors, str(tmp), metadata={"q4_1": "1" if layers else "0"})
    os.replace(tmp, path)


def _load_blocks(path, args):
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        if f.metadata().get("q4_1") != "1":
            return None
        layers = {}
        for i in range(args.num_layers):
            layers[i] = {}
            for name in LINEARS:
                packed = f.get_tensor(f"{i}.{name}.q")
                q = torch.stack((packed & 0x0F, packed >> 4), dim=-1).reshape(packed.shape[0], -1)
                # copies: nothing may keep the file's mapping (a later start may replace the file)
                layers[i][name] = (q, f.get_tensor(f"{i}.{name}.d").clone(), f.get_tensor(f"{i}.{name}.m").clone())
    return layers


def check_mode(mode, device):
    if mode not in MODES:
        raise ValueError(f"quantization must be one of {', '.join(MODES)}, got {mode!r}")
    if mode not in ("none", "auto") and device.type != "cpu":
        raise ValueError(f"quantization {mode!r} runs on CPU only here; on {device.type} use bf16 "
                         "(ROSEFAST_QUANTIZATION=none)")


def head_mode(setting, linears):
    """The lm_head's quantization for a `quantize_lm_head` setting, the linears' mode being `linears`: "auto" is
    int8 when the linears are quantized (see README, quantized linears: 1.3-3 ms a step less than the bf16 head at
    batch 1, unlike int4's, which costs the most accuracy), else none; "true" is the linears' own mode."""
    if setting == "true":
        return linears
    if setting == "auto":
        return "int8" if linears in ("int8", "int4") else "none"
    return setting


def quantize_linears(model, mode, gguf_path=None, head="none", cache_dir=None):
    """Replace the layers' qkv, o, gate_up and down (and the lm_head, by `head_mode(head, mode)`) by quantized
    ones; int4 takes a GGUF file's Q4_1 blocks as they are when `gguf_path` has them (kept in `cache_dir` for
    the next start); "auto" is int4 when it has them, else nothing. Returns (layers replaced, source)."""
    if mode == "none":
        return 0, None
    from_file = cached_q4_1_layers(gguf_path, model.args, cache_dir) \
        if mode in ("int4", "auto") and gguf_path is not None else None
    if mode == "auto":
        if from_file is None or next(model.parameters()).device.type != "cpu":
            return 0, None
        mode = "int4"
    count = 0
    for i, layer in enumerate(model.layers):
        for name in LINEARS:
            linear = getattr(layer, name)
            bias = linear.bias
            if mode == "int4":
                q, d, m = from_file[i][name] if from_file is not None else quantize_q4_1(linear.weight)
                setattr(layer, name, Int4Linear(q, d, m, bias))
            else:
                setattr(layer, name, Int8Linear(*quantize_int8(linear.weight), bias))
            count += 1
    head = head_mode(head, mode)
    if head != "none":
        weight = model.embed.weight if model.lm_head is None else model.lm_head.weight
        model.lm_head = Int4Linear(*quantize_q4_1(weight)) if head == "int4" else Int8Linear(*quantize_int8(weight))
        count += 1
    source = "the GGUF's Q4_1 blocks" if from_file is not None else "quantized at load"
    log.info("quantization %s: %d linear layers (%s), lm_head %s", mode, count, source, head)
    return count, source


def weight_bytes(model):
    """(bytes of the weights as served, their count) — quantized layers at their packed size."""
    total = params = 0
    for module in model.modules():
        if isinstance(module, Int4Linear):
            total += module.packed.numel() * module.packed.element_size() + module.scales_zeros.numel() * 2
            params += module.out_features * module.in_features
        elif isinstance(module, Int8Linear):
            total += module.q.numel() + module.scale.numel() * 2
            params += module.out_features * module.in_features
        elif isinstance(module, PackedLinear):   # oneDNN's bf16 copy (of the embedding too, for a tied head)
            total += module.out_features * module.in_features * 2
            params += module.out_features * module.in_features
        else:
            for p in module.parameters(recurse=False):
                total += p.numel() * p.element_size()
                params += p.numel()
    return total, params
