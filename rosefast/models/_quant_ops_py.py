"""Linears on Q4_1 / Q8_0 tiles in torch: the reference twin of _quant_ops_c, the same arithmetic (the
activations as two int8 digits per 32 inputs, integer dot products per block, then the block scales) up to
the order of the float sums. Unpacks the tiles each call: for tests, not for serving (its `tiers()` is empty)."""
import torch

from rosefast.models.quant_tiles import unpack_q4_1_tiles, unpack_q8_0_tiles


def tiers():
    """No compiled tier: this is the pure-Python flavour (layers take torch's ops)."""
    return []


def tier(name):
    raise ValueError(f"the {name} kernels need the compiled build; this is the pure-Python flavour "
                     "(ROSEFAST_NO_EXTENSIONS, or no extensions built)")


def check_tiles(w, d, m, bias, out_features, in_features, q8):
    """Raise when tiles (quant_tiles) do not fit an [out_features, in_features] layer: the kernels trust them."""
    tiles, groups = -(-out_features // 16), in_features // 32
    ok = (in_features % 32 == 0 and w.dtype == torch.uint8 and tuple(w.shape) == (tiles, groups, 512 if q8 else 256)
          and d.dtype == torch.float16 and tuple(d.shape) == (tiles, groups, 16) and (m is None) == bool(q8)
          and (m is None or (m.dtype == torch.float16 and m.shape == d.shape))
          and (bias is None or (bias.dtype == torch.float32 and bias.numel() == out_features))
          and all(t is None or t.is_contiguous() for t in (w, d, m, bias)))
    if not ok:
        raise ValueError(f"quantized linear: tiles {tuple(w.shape)} / scales {tuple(d.shape)} do not fit a "
                         f"[{out_features}, {in_features}] {'Q8_0' if q8 else 'Q4_1'} layer")


def quantize_activations(x):
    """x [B, K] -> (x1, x2 [B, K/32, 32]: the two digits, integers as float32; scale sx, exact sum [B, K/32]):
    x ~ sx (x1 + x2 / 254), as csrc/quant_kernels.h makes them."""
    B, K = x.shape
    g = x.to(torch.float32).reshape(B, K // 32, 32)
    amax = g.abs().amax(dim=-1)
    scale = amax / 127.0
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))[..., None]
    x1 = torch.round(g * inv)
    x2 = torch.round((g - x1 * scale[..., None]) * (254.0 * inv))
    return x1, x2, scale, g.sum(dim=-1)


def linear(x, w, d, m, bias, out_features, q8):
    if x.dim() != 2 or x.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"quantized linear: x must be a 2-D float32/bfloat16 tensor, got {x.dtype} {tuple(x.shape)}")
    q, dd, mm = unpack_q8_0_tiles(w, d, out_features) + (None,) if q8 else unpack_q4_1_tiles(w, d, m, out_features)
    N, K = q.shape
    if x.shape[1] != K:
        raise ValueError(f"quantized linear: x {tuple(x.shape)} does not fit [{N}, {K}] weights")
    x1, x2, sx, sumx = quantize_activations(x)
    qg = q.to(torch.float32).reshape(N, K // 32, 32)
    dots = torch.einsum("ngj,bgj->bng", qg, x1) + torch.einsum("ngj,bgj->bng", qg, x2) / 254   # exact integers
    y = (dots * (dd.to(torch.float32)[None] * sx[:, None])).sum(-1)
    if mm is not None:
        y = y + sumx @ mm.to(torch.float32).t()
    if bias is not None:
        y = y + bias
    return y.to(x.dtype)
