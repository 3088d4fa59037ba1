"""GGUF's block formats in numpy and torch: each format's blocks unpacked to integers and scales, dequantized
as gguf computes it, and Q4_1 / Q8_0 / per-channel int8 quantized as llama.cpp makes them.

Q4_1 is 20 bytes per 32 weights (fp16 d, fp16 m, 16 bytes of nibbles: weights 0-15 low, 16-31 high),
W = d q + m; Q4_0 18 (fp16 d, the nibbles), W = d (q - 8); Q8_0 34 (fp16 d, 32 int8), W = d q; Q5_0/Q5_1 add
4 bytes of fifth bits; the K formats hold 256 weights a super-block with 6- or 8-bit scales per 32 or 16 (the
unpack functions say how).
"""
import numpy as np
import torch

GROUP = 32
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


def quantize_q8_0(weight):
    """[N, K] float -> (q [N, K] int8, d [N, K / 32] fp16): Q8_0 as llama.cpp makes it."""
    n, k = weight.shape
    w = weight.to(torch.float32).reshape(n, k // GROUP, GROUP)
    amax = w.abs().amax(dim=-1)
    d = (amax / 127).to(torch.float16)
    inv = torch.where(amax > 0, 127 / amax, torch.zeros_like(amax))
    return (w * inv[..., None]).round().clamp(-127, 127).to(torch.int8).reshape(n, k), d


def quantize_int8(weight):
    """[N, K] float -> (q int8, scale [N] fp32): symmetric per output channel."""
    w = weight.to(torch.float32)
    scale = w.abs().amax(dim=1).clamp_min(1e-12) / 127
    return (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8), scale
