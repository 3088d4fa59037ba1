"""The tiles the quantized-linear kernels read (csrc/quant_kernels.h): 16 output rows interleaved per block
of 32 inputs, so that one int32 lane of an integer dot product holds one row's block; the scales beside them,
16 rows innermost.

    tiles = pack_tiles("q4_k", (q, d, dmin, sc, mn))    # a GGUF tensor's blocks (gguf_blocks) -> Tiles
    q, s, m = unpack_tiles(tiles)                        # the integers and scales back (the twin, tests)

Formats (FORMATS, csrc's RF_FMT_* order) and what pack_tiles takes, for an [N, K] weight:
    q4_1  q [N, K] 0..15, d, m [N, K/32] fp16                      W = d q + m
    q8_0  q [N, K] int8, d [N, K/32]                                W = d q
    q5_1  q [N, K] 0..31, d, m [N, K/32]                            W = d q + m
    q5_0  q [N, K] 0..31, d [N, K/32]                               W = d (q - 16)
    q4_k  q [N, K] 0..15, d, dmin [N, K/256], sc, mn [N, K/32] 0..63  W = d sc q - dmin mn
    q5_k  the same, q 0..31
    q6_k  q [N, K] 0..63, d [N, K/256], sc [N, K/16] int8          W = d sc (q - 32)
Rows past N (to a whole tile) are zero.
"""
from dataclasses import dataclass

import torch

from rosefast.quant.formats import GROUP

ROWS = 16
FORMATS = ("q4_1", "q8_0", "q5_1", "q4_k", "q5_k", "q6_k", "q5_0")
_PLANES = {"q5_1": 1, "q5_k": 1, "q6_k": 2, "q5_0": 1}
_OFFSET = {"q6_k": 32, "q5_0": 16}   # what the stored integers are above the weights' own (Q8_0's 128 aside)
K_FORMATS = ("q4_k", "q5_k", "q6_k")
SUPER = 256   # a K format's inputs per d


@dataclass
class Tiles:
    """One weight (or one part of a fused one: a q|k|v whose parts differ in type) as the kernels read it."""
    fmt: str
    n: int                 # output rows
    w: torch.Tensor        # uint8 [T, K/32, block bytes]
    d: torch.Tensor        # fp16 [T, K/32, 16], or [T, K/256, 16] for the K formats
    m: torch.Tensor = None     # fp16: Q4_1/Q5_1's min [T, K/32, 16], Q4_K/Q5_K's dmin [T, K/256, 16]
    sc: torch.Tensor = None    # uint8 [T, K/32, 16] (Q4_K/Q5_K), Q6_K's int8 as uint8 [T, K/16, 16]
    mn: torch.Tensor = None    # uint8 [T, K/32, 16] (Q4_K/Q5_K)

    @property
    def in_features(self):
        return self.w.shape[1] * GROUP

    def tensors(self):
        return [t for t in (self.w, self.d, self.m, self.sc, self.mn) if t is not None]

    def nbytes(self):
        return sum(t.numel() * t.element_size() for t in self.tensors())


def block_bytes(fmt):
    return 512 if fmt == "q8_0" else 256 + 64 * _PLANES.get(fmt, 0)


def _pad_rows(t, n):
    tiles = -(-n // ROWS)
    if tiles * ROWS == n:
        return t, tiles
    pad = torch.zeros((tiles * ROWS - n, *t.shape[1:]), dtype=t.dtype)
    return torch.cat((t, pad)), tiles


def _scales(s, n, tiles, dtype=torch.float16):
    """[N, S] -> [T, S, 16]"""
    s, _ = _pad_rows(s.to(dtype), n)
    return s.reshape(tiles, ROWS, -1).transpose(1, 2).contiguous()


def _nibbles(q, n, k):
    """q [N, K] (low 4 bits taken) -> uint8 [T, K/32, 256]"""
    qp, tiles = _pad_rows((q & 0x0F).to(torch.uint8), n)
    g = qp.reshape(tiles, ROWS, k // GROUP, 4, 2, 4)        # [t, row j, block, chunk c, half, b]: weight 8c + 4half + b
    w = (g[..., 0, :] | (g[..., 1, :] << 4)).permute(0, 2, 3, 1, 4)   # [t, block, c, j, b]
    return w.reshape(tiles, k // GROUP, 256)


def _plane(q, n, k, p):
    """bit 4 + p of q [N, K] -> uint8 [T, K/32, 64]: byte 4 j + b holds in its bit k that bit of weight 4 k + b"""
    qp, tiles = _pad_rows(((q.to(torch.int32) >> (4 + p)) & 1).to(torch.uint8), n)
    bits = qp.reshape(tiles, ROWS, k // GROUP, 8, 4)        # [t, j, block, k, b]
    byte = (bits << torch.arange(8, dtype=torch.uint8)[:, None]).sum(dim=3, dtype=torch.uint8)   # [t, j, block, b]
    return byte.permute(0, 2, 1, 3).reshape(tiles, k // GROUP, 64)


def pack_tiles(fmt, parts):
    """A tensor's blocks (the tuple the module docstring lists for `fmt`) -> Tiles."""
    q = parts[0]
    n, k = q.shape
    if fmt == "q8_0":
        qp, tiles = _pad_rows(q.to(torch.int8), n)
        shifted = (qp.to(torch.int16) + 128).to(torch.uint8)
        w = shifted.reshape(tiles, ROWS, k // GROUP, 8, 4).permute(0, 2, 3, 1, 4)   # [t, block, chunk i, j, b]
        return Tiles(fmt, n, w.reshape(tiles, k // GROUP, 512).contiguous(), _scales(parts[1], n, tiles))
    tiles = -(-n // ROWS)
    w = torch.cat([_nibbles(q, n, k)] + [_plane(q, n, k, p) for p in range(_PLANES.get(fmt, 0))], dim=-1).contiguous()
    if fmt in ("q4_1", "q5_1"):
        return Tiles(fmt, n, w, _scales(parts[1], n, tiles), _scales(parts[2], n, tiles))
    if fmt == "q5_0":
        return Tiles(fmt, n, w, _scales(parts[1], n, tiles))
    if fmt == "q6_k":
        sc = _scales(parts[2].to(torch.int8).view(torch.uint8), n, tiles, torch.uint8)
        return Tiles(fmt, n, w, _scales(parts[1], n, tiles), sc=sc)
    if fmt in ("q4_k", "q5_k"):
        return Tiles(fmt, n, w, _scales(parts[1], n, tiles), _scales(parts[2], n, tiles),
                     _scales(parts[3], n, tiles, torch.uint8), _scales(parts[4], n, tiles, torch.uint8))
    raise ValueError(f"unknown block format {fmt!r}; the formats are {', '.join(FORMATS)}")


def _unscales(s, n):
    return s.transpose(1, 2).reshape(-1, s.shape[1])[:n]


def unpack_tiles(t):
    """Tiles -> (q [n, K] int16: the integers the kernels multiply (Q8_0's and Q6_K's signed), s [n, K/16] fp32:
    the scale of each 16 inputs, m [n, K/32] fp32 or None: the min of each 32)."""
    tiles, groups, _ = t.w.shape
    n = t.n
    if t.fmt == "q8_0":
        c = t.w.reshape(tiles, groups, 8, ROWS, 4).permute(0, 3, 1, 2, 4)
        q = c.to(torch.int16) - 128
    else:
        c = t.w[..., :256].reshape(tiles, groups, 4, ROWS, 4).permute(0, 3, 1, 2, 4)   # [t, j, block, c, b]
        q = torch.stack((c & 0x0F, c >> 4), dim=-2).to(torch.int16)                     # [t, j, block, c, half, b]
        q = q.reshape(tiles, ROWS, groups, 8, 4)                                         # [t, j, block, k, b]
        for p in range(_PLANES.get(t.fmt, 0)):
            plane = t.w[..., 256 + 64 * p: 320 + 64 * p].reshape(tiles, groups, ROWS, 4).permute(0, 2, 1, 3)
            bits = (plane[:, :, :, None, :].to(torch.int16) >> torch.arange(8, dtype=torch.int16)[:, None]) & 1
            q = q | (bits << (4 + p))
        q = q - _OFFSET.get(t.fmt, 0)
    q = q.reshape(tiles * ROWS, groups * GROUP)[:n]
    d = _unscales(t.d, n).to(torch.float32)
    if t.fmt in K_FORMATS:
        d = d.repeat_interleave(SUPER // GROUP, dim=1)                                   # [n, G]
        if t.fmt == "q6_k":
            sc = _unscales(t.sc, n).view(torch.int8).to(torch.float32)                   # [n, 2G]
            return q, d.repeat_interleave(2, dim=1) * sc, None
        s = d * _unscales(t.sc, n).to(torch.float32)
        m = -(_unscales(t.m, n).to(torch.float32).repeat_interleave(SUPER // GROUP, dim=1)
              * _unscales(t.mn, n).to(torch.float32))
        return q, s.repeat_interleave(2, dim=1), m
    m = None if t.m is None else _unscales(t.m, n).to(torch.float32)
    return q, d.repeat_interleave(2, dim=1), m


def dequantize_tiles(t):
    """Tiles -> the fp32 weight [n, K] they hold."""
    q, s, m = unpack_tiles(t)
    n, k = q.shape
    w = q.to(torch.float32).reshape(n, k // 16, 16) * s[..., None]
    w = w.reshape(n, k // GROUP, GROUP)
    if m is not None:
        w = w + m[..., None]
    return w.reshape(n, k)


def dequantize_parts(tiles):
    """A GGUF tensor's Tiles along the rows (tiles_cache) -> its fp32 weight, bit for bit gguf's dequantization."""
    return torch.cat([dequantize_tiles(t) for t in tiles])
