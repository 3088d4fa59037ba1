"""Linears on GGUF block tiles in torch: the reference twin of _quant_ops_c, the same arithmetic (the activations
as two int8 digits per 32 inputs, or one, integer dot products per block — per 16 inputs where Q6_K's scales change —,
then the scales and mins) up to the order of the float sums. Unpacks the tiles each call: for tests, not for
serving (its `tiers()` is empty)."""
import torch

from rosefast.quant.tiles import FORMATS, K_FORMATS, SUPER, Tiles, block_bytes, dequantize_tiles, unpack_tiles

MAX_PARTS = 8   # csrc's RF_QPARTS


def tiers():
    """No compiled tier: this is the pure-Python flavour (layers take torch's ops)."""
    return []


def check_digits(digits):
    """The activations' digits a tier takes: 2 (the default) or 1 (llama.cpp's Q8 activations)."""
    if digits not in (1, 2):
        raise ValueError(f"the activations are quantized to 1 or 2 int8 digits, not {digits!r}")
    return digits


def tier(name, digits=2):
    raise ValueError(f"the {name} kernels need the compiled build; this is the pure-Python flavour "
                     "(ROSEFAST_NO_EXTENSIONS, or no extensions built)")


def _check_part(t, in_features):
    tiles, groups = -(-t.n // 16), in_features // 32
    per = in_features // SUPER if t.fmt in K_FORMATS else groups

    def fits(x, dtype, shape):
        return x is not None and x.dtype == dtype and tuple(x.shape) == shape and x.is_contiguous()

    ok = (isinstance(t, Tiles) and t.fmt in FORMATS and in_features % 32 == 0
          and (t.fmt not in K_FORMATS or in_features % SUPER == 0)
          and fits(t.w, torch.uint8, (tiles, groups, block_bytes(t.fmt)))
          and fits(t.d, torch.float16, (tiles, per, 16)))
    if ok and t.fmt in ("q4_1", "q5_1", "q4_k", "q5_k"):
        ok = fits(t.m, torch.float16, (tiles, per, 16))
    if ok and t.fmt in ("q4_k", "q5_k"):
        ok = fits(t.sc, torch.uint8, (tiles, groups, 16)) and fits(t.mn, torch.uint8, (tiles, groups, 16))
    if ok and t.fmt == "q6_k":
        ok = fits(t.sc, torch.uint8, (tiles, 2 * groups, 16))
    if not ok:
        raise ValueError(f"quantized linear: {getattr(t, 'fmt', t)!r} tiles {tuple(t.w.shape)} / scales "
                         f"{tuple(t.d.shape)} do not fit [{t.n}, {in_features}] weights")


class Weights:
    """A linear's weights for the kernels: its parts (quant_tiles.Tiles, one after another along the outputs)
    and a float32 bias or None, checked once (the kernels trust them)."""

    def __init__(self, parts, bias, in_features):
        parts = list(parts)
        if not 1 <= len(parts) <= MAX_PARTS:
            raise ValueError(f"quantized linear: 1 to {MAX_PARTS} parts, got {len(parts)}")
        for t in parts:
            _check_part(t, in_features)
        self.parts, self.in_features = parts, in_features
        self.out_features = sum(t.n for t in parts)
        if bias is not None and (bias.dtype != torch.float32 or bias.numel() != self.out_features
                                 or not bias.is_contiguous()):
            raise ValueError(f"quantized linear: the bias must be {self.out_features} contiguous float32 values")
        self.bias = bias


def quantize_activations(x, digits=2):
    """x [B, K] -> (x1, x2 [B, K/32, 32]: the two digits, integers as float32, x2 zeros for one digit; scale sx,
    exact sum [B, K/32]): x ~ sx (x1 + x2 / 254), as csrc/quant_kernels.h makes them."""
    B, K = x.shape
    g = x.to(torch.float32).reshape(B, K // 32, 32)
    amax = g.abs().amax(dim=-1)
    scale = amax / 127.0
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))[..., None]
    x1 = torch.round(g * inv)
    x2 = torch.round((g - x1 * scale[..., None]) * (254.0 * inv)) if check_digits(digits) == 2 else torch.zeros_like(x1)
    return x1, x2, scale, g.sum(dim=-1)


def linear(x, weights, digits=2):
    """x [B, K] float32/bfloat16 -> [B, out_features] of x's dtype, the activations as `digits` int8 digits."""
    if x.dim() != 2 or x.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"quantized linear: x must be a 2-D float32/bfloat16 tensor, got {x.dtype} {tuple(x.shape)}")
    B, K = x.shape
    if K != weights.in_features:
        raise ValueError(f"quantized linear: x {tuple(x.shape)} does not fit {weights.in_features} inputs")
    x1, x2, sx, sumx = quantize_activations(x, digits)
    x1, x2 = x1.reshape(B, K // 16, 16), x2.reshape(B, K // 16, 16)
    sx16 = sx.repeat_interleave(2, dim=1)                                                   # [B, K/16]
    out = []
    for t in weights.parts:
        q, s, m = unpack_tiles(t)
        qh = q.to(torch.float32).reshape(t.n, K // 16, 16)
        dots = torch.einsum("nhj,bhj->bnh", qh, x1) + torch.einsum("nhj,bhj->bnh", qh, x2) / 254   # exact integers
        y = (dots * (s[None] * sx16[:, None])).sum(-1)
        if m is not None:
            y = y + sumx @ m.t()
        out.append(y)
    y = torch.cat(out, dim=1)
    if weights.bias is not None:
        y = y + weights.bias
    return y.to(x.dtype)


class ExpertWeights:
    """A mixture-of-experts layer's experts: each one's fused gate|up and down Weights, checked once (every
    gate|up [2 I, H], every down [H, I])."""

    def __init__(self, gate_up, down):
        self.gate_up, self.down = list(gate_up), list(down)
        if not self.gate_up or len(self.gate_up) != len(self.down):
            raise ValueError(f"experts: as many gate|up weights as down ones, not {len(self.gate_up)} and "
                             f"{len(self.down)}")
        self.num_experts, self.hidden, self.width = len(self.gate_up), self.gate_up[0].in_features, \
            self.down[0].in_features
        for g, d in zip(self.gate_up, self.down):
            if (g.in_features, g.out_features, d.in_features, d.out_features) != \
                    (self.hidden, 2 * self.width, self.width, self.hidden) or g.bias is not None or d.bias is not None:
                raise ValueError(f"experts: each gate|up must be [{2 * self.width}, {self.hidden}] and each down "
                                 f"[{self.hidden}, {self.width}], without a bias")


def check_experts_call(x, experts, order, counts, weights, top_k):
    """ValueError naming what does not fit a call of experts()."""
    if x.dtype not in (torch.float32, torch.bfloat16) or x.dim() != 2 or not x.is_contiguous() or \
            x.shape[1] != experts.hidden:
        raise ValueError(f"experts: x must be a contiguous [T, {experts.hidden}] float32/bfloat16 tensor, got "
                         f"{x.dtype} {tuple(x.shape)}")
    picks = x.shape[0] * top_k
    for name, t, dtype, n in (("order", order, torch.int64, picks), ("counts", counts, torch.int64,
                                                                     experts.num_experts),
                              ("weights", weights, x.dtype, picks)):
        if t.dtype != dtype or t.dim() != 1 or t.numel() != n or not t.is_contiguous():
            raise ValueError(f"experts: {name} must be {n} contiguous {dtype} values, got {t.dtype} {tuple(t.shape)}")


def experts(x, experts, order, counts, weights, top_k, digits=2):
    """A mixture-of-experts layer's routed experts in one call, as _quant_ops_c's Tier.experts: each expert's
    linears over its rows (linear() here), SiLU(gate) * up, each pick's output times its weight added into its row
    in `order`, rounded to x's dtype where the per-op path rounds."""
    check_experts_call(x, experts, order, counts, weights, top_k)
    out = torch.zeros_like(x)
    start = 0
    for e, count in enumerate(counts.tolist()):
        if count:
            picks = order[start:start + count]
            rows = picks // top_k
            h = linear(x.index_select(0, rows), experts.gate_up[e], digits)
            gate, up = h.chunk(2, dim=-1)
            h = torch.nn.functional.silu(gate) * up   # as _layer_ops_py.silu_mul
            out.index_add_(0, rows, linear(h, experts.down[e], digits) * weights[picks, None])
            start += count
    return out


def rows(weights, ids, dtype):
    """The rows `ids` (any shape) of a one-part weight as `dtype` [*ids.shape, K]: the tiles that hold them
    dequantized, the rows picked."""
    if len(weights.parts) != 1:
        raise ValueError(f"rows: a weight of one part, not {len(weights.parts)}")
    t = weights.parts[0]
    flat = ids.reshape(-1).long()
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= t.n):
        raise IndexError(f"rows: an id out of 0..{t.n - 1}")
    tiles, where = torch.unique(flat // 16, return_inverse=True)
    pick = lambda x: None if x is None else x[tiles]   # noqa: E731 - every tile field is tile-major
    sub = Tiles(t.fmt, len(tiles) * 16, pick(t.w), pick(t.d), pick(t.m), pick(t.sc), pick(t.mn))
    return dequantize_tiles(sub)[where * 16 + flat % 16].to(dtype).view(*ids.shape, -1)
