"""A layer's small ops on CUDA: the torch twin's, but paged decode attention is a Triton kernel.

The kernel reads each sequence's blocks through its block table only up to its context length (so a
table padded to any width costs nothing), one program per (sequence, KV head) holding that head's group of
query heads, with an online softmax over 64-token tiles; scores and the softmax are fp32 whatever the
cache's dtype. It is a torch custom op with a fake implementation, so FakeTensorMode (the CPU-side checks
of the CUDA path) traces through it, and TRITON_INTERPRET=1 runs it on CPU tensors (its tests against the
twin). Importing this module needs Triton, which ships with torch's CUDA builds.
"""
import os

import torch
import triton
import triton.language as tl

from rosefast.models._kernels_py import decode_shapes, rms_norm, silu_mul, store_kv  # noqa: F401 (the flavour's API)

FOLLOWS_CONTEXT = True     # a padded block table is never read past a row's context
TILE_TOKENS = 64
# Triton's interpreter multiplies bf16 tiles wrongly (numpy has no bf16): there the tiles go to fp32 first
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@triton.jit
def _paged_decode(qkv, k_pool, v_pool, tables, context_lens, out, stride_qkv, stride_table, stride_head,
                  stride_out, scale, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, DP: tl.constexpr,
                  BS: tl.constexpr, TILE: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    ctx = tl.load(context_lens + b)
    g = tl.arange(0, GP)
    d = tl.arange(0, DP)
    qmask = (g < G)[:, None] & (d < D)[None, :]
    heads = h * G + g                                                           # this group's query heads
    q = tl.load(qkv + b * stride_qkv + heads[:, None] * D + d[None, :], mask=qmask, other=0.0)   # [GP, DP]
    if UPCAST:
        q = q.to(tl.float32)
    m_i = tl.full([GP], float("-inf"), tl.float32)
    l_i = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, DP], tl.float32)
    t = tl.arange(0, TILE)
    for start in range(0, ctx, TILE):
        pos = start + t
        valid = pos < ctx
        block = tl.load(tables + b * stride_table + pos // BS, mask=valid, other=0)
        rows = block.to(tl.int64) * BS + pos % BS
        offs = h.to(tl.int64) * stride_head + rows[:, None] * D + d[None, :]
        kvmask = valid[:, None] & (d < D)[None, :]
        k = tl.load(k_pool + offs, mask=kvmask, other=0.0)                      # [TILE, DP]
        if UPCAST:
            k = k.to(tl.float32)
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale          # [GP, TILE] fp32
        else:
            s = tl.dot(q, tl.trans(k)) * scale
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_pool + offs, mask=kvmask, other=0.0)
        if UPCAST:
            v = v.to(tl.float32)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    o = acc / l_i[:, None]
    tl.store(out + b * stride_out + heads[:, None] * D + d[None, :], o.to(out.dtype.element_ty), mask=qmask)


@torch.library.custom_op("rosefast::paged_decode_attention", mutates_args=())
def paged_decode_attention(qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, num_heads: int,
                           num_kv_heads: int, scale: float) -> torch.Tensor:
    """[B, H*D] attention of each row's query heads (in qkv [B, (H + 2Hkv) * D]) over its context."""
    B = qkv.shape[0]
    _, _, block_size, D = k_cache.shape
    out = torch.empty(B, num_heads * D, dtype=qkv.dtype, device=qkv.device)
    G = num_heads // num_kv_heads
    _paged_decode[(B, num_kv_heads)](
        qkv, k_cache, v_cache, block_tables, context_lens, out, qkv.stride(0), block_tables.stride(0),
        k_cache.stride(0), out.stride(0), scale, G=G, GP=max(16, triton.next_power_of_2(G)), D=D,
        DP=max(16, triton.next_power_of_2(D)), BS=block_size, TILE=max(TILE_TOKENS, block_size),
        IEEE=qkv.dtype == torch.float32 or INTERPRET, UPCAST=INTERPRET)
    return out


@paged_decode_attention.register_fake
def _(qkv, k_cache, v_cache, block_tables, context_lens, num_heads, num_kv_heads, scale):
    tensors = (qkv, k_cache, v_cache, block_tables, context_lens)
    if len({t.device for t in tensors}) != 1:
        raise RuntimeError(f"paged_decode_attention: tensors on {[str(t.device) for t in tensors]}")
    return qkv.new_empty(qkv.shape[0], num_heads * k_cache.shape[-1])


def supports(k_cache):
    """The kernel's layout needs: each head's pool contiguous, a power-of-two block size."""
    _, blocks, bs, D = k_cache.shape
    return bs & (bs - 1) == 0 and k_cache.stride()[1:] == (bs * D, D, 1)


def decode_attention(qkv, num_heads, num_kv_heads, k_cache, v_cache, meta, scale):
    decode_shapes(qkv, num_heads, num_kv_heads, k_cache, meta)
    if qkv.stride(-1) != 1 or not supports(k_cache):
        from rosefast.models import _kernels_py

        return _kernels_py.decode_attention(qkv, num_heads, num_kv_heads, k_cache, v_cache, meta, scale)
    return paged_decode_attention(qkv, k_cache, v_cache, meta.block_tables, meta.context_lens, num_heads,
                                  num_kv_heads, float(scale))
