"""A reference quantizer for the K formats (the gguf package quantizes Q4_0..Q8_0 but not these): an [n, k]
float array -> GGUF's Q4_K / Q5_K / Q6_K bytes, laid out as llama.cpp's ggml-quants.c lays them (checked by the
tests against the gguf package's own dequantization). Plain min/max scales, not llama.cpp's search: blocks a
file could hold, not the best ones."""
import numpy as np

SUPER = 256


def _half(x):
    return np.asarray(x, dtype=np.float16)


def _div(a, b):
    return np.divide(a, b, out=np.zeros_like(a, dtype=np.float32), where=b != 0)


def _pack_scales(sc, mn):
    """8 six-bit scales and mins [..., 8] -> llama.cpp's 12 bytes (the inverse of get_scale_min_k4)"""
    out = np.zeros((*sc.shape[:-1], 12), dtype=np.uint8)
    out[..., 0:4] = (sc[..., 0:4] & 63) | ((sc[..., 4:8] >> 4) << 6)
    out[..., 4:8] = (mn[..., 0:4] & 63) | ((mn[..., 4:8] >> 4) << 6)
    out[..., 8:12] = (sc[..., 4:8] & 0x0F) | ((mn[..., 4:8] & 0x0F) << 4)
    return out


def _affine(w, levels):
    """w [n, S, 8, 32] -> (q, d, dmin, sc, mn): w ~ d sc q - dmin mn, q in 0..levels"""
    lo = np.minimum(w.min(axis=-1), 0)
    scale = (w.max(axis=-1) - lo) / levels                                   # [n, S, 8]
    d = _half(scale.max(axis=-1) / 63)
    dmin = _half(-lo.min(axis=-1) / 63)
    sc = np.clip(np.rint(_div(scale, d.astype(np.float32)[..., None])), 0, 63).astype(np.uint8)
    mn = np.clip(np.rint(_div(-lo, dmin.astype(np.float32)[..., None])), 0, 63).astype(np.uint8)
    step = d.astype(np.float32)[..., None] * sc
    base = dmin.astype(np.float32)[..., None] * mn
    q = np.clip(np.rint(_div(w + base[..., None], step[..., None])), 0, levels).astype(np.uint8)
    return q, d, dmin, sc, mn


def _k_head(d, dmin, sc, mn):
    return np.concatenate((d[..., None].view(np.uint8), dmin[..., None].view(np.uint8), _pack_scales(sc, mn)), -1)


def _k_nibbles(q):
    """[n, S, 8, 32] -> 128 bytes: sub-blocks 2c and 2c + 1 as the low and high nibbles of bytes 32c .. 32c + 31"""
    pairs = q.reshape(*q.shape[:-2], 4, 2, 32)
    return ((pairs[..., 0, :] & 0x0F) | ((pairs[..., 1, :] & 0x0F) << 4)).reshape(*q.shape[:-2], 128)


def quantize_q4_k(w):
    n, k = w.shape
    q, d, dmin, sc, mn = _affine(w.astype(np.float32).reshape(n, k // SUPER, 8, 32), 15)
    return np.concatenate((_k_head(d, dmin, sc, mn), _k_nibbles(q)), -1).reshape(n, -1)


def quantize_q5_k(w):
    n, k = w.shape
    q, d, dmin, sc, mn = _affine(w.astype(np.float32).reshape(n, k // SUPER, 8, 32), 31)
    high = ((q >> 4) & 1).transpose(0, 1, 3, 2)                           # [n, S, l, sub-block i]
    qh = np.packbits(high, axis=-1, bitorder="little")[..., 0]              # [n, S, 32]: bit i of byte l
    return np.concatenate((_k_head(d, dmin, sc, mn), qh, _k_nibbles(q)), -1).reshape(n, -1)


def quantize_q6_k(w):
    n, k = w.shape
    x = w.astype(np.float32).reshape(n, k // SUPER, 16, 16)
    big = np.take_along_axis(x, np.abs(x).argmax(axis=-1)[..., None], -1)[..., 0]   # signed, as llama.cpp's
    scale = -big / 32                                                        # [n, S, 16]
    d = _half(np.abs(scale).max(axis=-1) / 127)
    sc = np.clip(np.rint(_div(scale, d.astype(np.float32)[..., None])), -128, 127).astype(np.int8)
    step = d.astype(np.float32)[..., None] * sc
    q = (np.clip(np.rint(_div(x, step[..., None])), -32, 31) + 32).astype(np.uint8).reshape(n, -1, 2, 4, 32)
    ql = (q[..., 0:2, :] & 0x0F) | ((q[..., 2:4, :] & 0x0F) << 4)            # [n, S, half, r2, l]
    qh = sum(((q[..., r, :] >> 4) & 3) << (2 * r) for r in range(4)).astype(np.uint8)   # [n, S, half, l]
    return np.concatenate((ql.reshape(n, -1, 128), qh.reshape(n, -1, 64), sc.view(np.uint8),
                           d[..., None].view(np.uint8)), -1).reshape(n, -1)
