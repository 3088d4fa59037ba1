"""The tiles the quantized-linear kernels read (csrc/quant_kernels.h): 16 output rows interleaved per block
of 32 inputs, so that one int32 lane of an integer dot product holds one row's block.

    w, d, m = pack_q4_1_tiles(q, d, m)      # q [N, K] 0..15, d, m [N, K/32]  ->  uint8 [T, K/32, 256], fp16 x2
    w, d = pack_q8_0_tiles(q, d)            # q [N, K] int8, d [N, K/32]      ->  uint8 [T, K/32, 512], fp16

Rows past N (to a whole tile) are zero. The unpack functions invert the packing (the twin and tests use them).
"""
import torch

from rosefast.models.gguf_blocks import GROUP

ROWS = 16


def _pad_rows(t, n):
    tiles = -(-n // ROWS)
    if tiles * ROWS == n:
        return t, tiles
    pad = torch.zeros((tiles * ROWS - n, *t.shape[1:]), dtype=t.dtype)
    return torch.cat((t, pad)), tiles


def _scales(s, n, tiles):
    """[N, G] -> fp16 [T, G, 16]"""
    s, _ = _pad_rows(s.to(torch.float16), n)
    return s.reshape(tiles, ROWS, -1).transpose(1, 2).contiguous()


def pack_q4_1_tiles(q, d, m):
    n, k = q.shape
    qp, tiles = _pad_rows(q.to(torch.uint8), n)
    g = qp.reshape(tiles, ROWS, k // GROUP, 4, 2, 4)        # [t, row j, block, chunk c, half, b]: weight 8c + 4half + b
    w = (g[..., 0, :] | (g[..., 1, :] << 4)).permute(0, 2, 3, 1, 4)   # [t, block, c, j, b]
    return w.reshape(tiles, k // GROUP, 256).contiguous(), _scales(d, n, tiles), _scales(m, n, tiles)


def pack_q8_0_tiles(q, d):
    n, k = q.shape
    qp, tiles = _pad_rows(q.to(torch.int8), n)
    shifted = (qp.to(torch.int16) + 128).to(torch.uint8)
    w = shifted.reshape(tiles, ROWS, k // GROUP, 8, 4).permute(0, 2, 3, 1, 4)   # [t, block, chunk i, j, b]
    return w.reshape(tiles, k // GROUP, 512).contiguous(), _scales(d, n, tiles)


def _unscales(s, n):
    return s.transpose(1, 2).reshape(-1, s.shape[1])[:n]


def unpack_q4_1_tiles(w, d, m, n):
    """-> (q [n, K] uint8, d, m [n, K/32] fp16)"""
    tiles, groups, _ = w.shape
    c = w.reshape(tiles, groups, 4, ROWS, 4).permute(0, 3, 1, 2, 4)              # [t, j, block, c, b]
    q = torch.stack((c & 0x0F, c >> 4), dim=-2)                                    # [t, j, block, c, half, b]
    return q.reshape(tiles * ROWS, groups * GROUP)[:n], _unscales(d, n), _unscales(m, n)


def unpack_q8_0_tiles(w, d, n):
    """-> (q [n, K] int8, d [n, K/32] fp16)"""
    tiles, groups, _ = w.shape
    c = w.reshape(tiles, groups, 8, ROWS, 4).permute(0, 3, 1, 2, 4)
    q = (c.to(torch.int16) - 128).to(torch.int8)
    return q.reshape(tiles * ROWS, groups * GROUP)[:n], _unscales(d, n)
