"""A layer's small ops on CUDA: the torch twin's, but paged attention is two Triton kernels.

Decode reads each sequence's blocks through its block table only up to its context length (so a table
padded to any width costs nothing), one program per (sequence, KV head) holding that head's group of query
heads. Prefill is one launch for the whole step, no loop over its sequences: a program per (16-query tile
of one sequence, head) attends causally over the sequence's context in the pools (the chunk's own K/V
stored there first by store_kv, a cached prefix or earlier chunks read in place). Both keep an online
softmax over 64-token tiles with fp32 scores whatever the cache's dtype. They are torch custom ops with
fake implementations, so FakeTensorMode (the CPU-side checks of the CUDA path) traces through them, and
TRITON_INTERPRET=1 runs them on CPU tensors (their tests against the twins). Importing this module needs
Triton, which ships with torch's CUDA builds.
"""
import os

import torch
import triton
import triton.language as tl

from rosefast.device import upload

from rosefast.kernels._layer_ops_py import (  # noqa: F401 (the flavour's API)
    decode_shapes,
    delta_decode,
    delta_sequence,
    delta_step,
    gelu_tanh_mul,
    rms_norm,
    silu_mul,
    store_kv,
)

FOLLOWS_CONTEXT = True     # a padded block table is never read past a row's context
TILE_TOKENS = 64
# Triton's interpreter multiplies bf16 tiles wrongly (numpy has no bf16): there the tiles go to fp32 first
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@triton.jit
def _attend_tile(q, k_pool, v_pool, offs, kvmask, keep, scale, m_i, l_i, acc, IEEE: tl.constexpr,
                 UPCAST: tl.constexpr):
    """One tile of an online softmax: the tile's K and V rows at `offs`, its scores (fp32; `keep` says which
    count), then the running max, sum and weighted values."""
    k = tl.load(k_pool + offs, mask=kvmask, other=0.0)                          # [TILE, DP]
    if UPCAST:
        k = k.to(tl.float32)
    if IEEE:
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale              # [rows, TILE] fp32
    else:
        s = tl.dot(q, tl.trans(k)) * scale
    s = tl.where(keep, s, float("-inf"))
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
    return m_new, l_i, acc


@triton.jit
def _paged_decode(qkv, k_pool, v_pool, tables, context_lens, out, parts, lse, stride_qkv, stride_table,
                  stride_head, stride_out, scale, window, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr,
                  DP: tl.constexpr, BS: tl.constexpr, TILE: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
                  H: tl.constexpr, P: tl.constexpr, PART: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    part = tl.program_id(2)                  # with P > 1: this program's share of the context (flash-decoding)
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
    first = part * PART
    end = tl.minimum(ctx, first + PART) if P > 1 else ctx
    lo = tl.maximum(ctx - window, 0)   # a sliding window's first position (no window: a width past any context)
    for start in range(tl.maximum(first, lo - lo % TILE), end, TILE):
        pos = start + t
        valid = (pos < end) & (pos >= lo)
        block = tl.load(tables + b * stride_table + pos // BS, mask=valid, other=0)
        rows = block.to(tl.int64) * BS + pos % BS
        offs = h.to(tl.int64) * stride_head + rows[:, None] * D + d[None, :]
        kvmask = valid[:, None] & (d < D)[None, :]
        m_i, l_i, acc = _attend_tile(q, k_pool, v_pool, offs, kvmask, valid[None, :], scale, m_i, l_i, acc,
                                     IEEE, UPCAST)
    if P > 1:   # this part's normalized output and log-sum-exp, for _combine_parts (an empty part: lse -inf)
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        row = (b * H + heads) * P + part
        tl.store(parts + row[:, None] * DP + d[None, :], o, mask=qmask)
        tl.store(lse + row, tl.where(l_i > 0, m_i + tl.log(l_i), float("-inf")), mask=g < G)
    else:
        o = acc / l_i[:, None]
        tl.store(out + b * stride_out + heads[:, None] * D + d[None, :], o.to(out.dtype.element_ty), mask=qmask)


@triton.jit
def _combine_parts(parts, lse, out, stride_out, H: tl.constexpr, D: tl.constexpr, DP: tl.constexpr,
                   P: tl.constexpr, PP: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    p = tl.arange(0, PP)
    d = tl.arange(0, DP)
    row = (b * H + h) * P + p
    w = tl.load(lse + row, mask=p < P, other=float("-inf"))                 # [PP]; part 0 is never empty
    w = tl.exp(w - tl.max(w, 0))
    o = tl.load(parts + row[:, None] * DP + d[None, :], mask=(p < P)[:, None] & (d < D)[None, :], other=0.0)
    res = tl.sum(o * w[:, None], 0) / tl.sum(w, 0)
    tl.store(out + b * stride_out + h * D + d, res.to(out.dtype.element_ty), mask=d < D)


SPLIT_BELOW = 128      # (rows x KV heads) under which a step's context is split over programs
PART_TOKENS = 512      # tokens per part then (a multiple of TILE_TOKENS)
MAX_PARTS = 32


def decode_parts(rows, kv_heads, table_tokens):
    """How many parts each row's context is split into: a few programs (one stream, long contexts) would
    leave most of a GPU idle, so their contexts are shared out; static for a given batch and table width (a
    CUDA graph's)."""
    if rows * kv_heads >= SPLIT_BELOW:
        return 1
    return max(1, min(MAX_PARTS, -(-table_tokens // PART_TOKENS)))


@torch.library.custom_op("rosefast::paged_decode_attention", mutates_args=())
def paged_decode_attention(qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, num_heads: int,
                           num_kv_heads: int, scale: float, window: int = 0) -> torch.Tensor:
    """[B, H*D] attention of each row's query heads (in qkv [B, (H + 2Hkv) * D]) over its context (its last
    `window` positions when given)."""
    B = qkv.shape[0]
    _, _, block_size, D = k_cache.shape
    out = torch.empty(B, num_heads * D, dtype=qkv.dtype, device=qkv.device)
    G, DP, tile = num_heads // num_kv_heads, max(16, triton.next_power_of_2(D)), max(TILE_TOKENS, block_size)
    P = decode_parts(B, num_kv_heads, block_tables.shape[1] * block_size)
    part = -(-PART_TOKENS // tile) * tile
    parts = torch.empty(B * num_heads * P, DP, dtype=torch.float32, device=qkv.device) if P > 1 else out
    lse = torch.empty(B * num_heads * P, dtype=torch.float32, device=qkv.device) if P > 1 else out
    _paged_decode[(B, num_kv_heads, P)](
        qkv, k_cache, v_cache, block_tables, context_lens, out, parts, lse, qkv.stride(0), block_tables.stride(0),
        k_cache.stride(0), out.stride(0), scale, window if window > 0 else 2**31 - 1, G=G, GP=max(16, triton.next_power_of_2(G)), D=D, DP=DP,
        BS=block_size, TILE=tile, IEEE=qkv.dtype == torch.float32 or INTERPRET, UPCAST=INTERPRET, H=num_heads, P=P,
        PART=part)
    if P > 1:
        _combine_parts[(B, num_heads)](parts, lse, out, out.stride(0), H=num_heads, D=D, DP=DP, P=P,
                                       PP=triton.next_power_of_2(P))
    return out


@paged_decode_attention.register_fake
def _(qkv, k_cache, v_cache, block_tables, context_lens, num_heads, num_kv_heads, scale, window=0):
    tensors = (qkv, k_cache, v_cache, block_tables, context_lens)
    if len({t.device for t in tensors}) != 1:
        raise RuntimeError(f"paged_decode_attention: tensors on {[str(t.device) for t in tensors]}")
    return qkv.new_empty(qkv.shape[0], num_heads * k_cache.shape[-1])


@triton.jit
def _paged_prefill(qkv, k_pool, v_pool, tables, tile_seq, tile_start, seq_info, out, stride_qkv, stride_table,
                   stride_head, stride_out, scale, H: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
                   DP: tl.constexpr, BS: tl.constexpr, BLOCK_M: tl.constexpr, TILE: tl.constexpr,
                   IEEE: tl.constexpr, UPCAST: tl.constexpr):
    tile = tl.program_id(0)
    h = tl.program_id(1)
    seq = tl.load(tile_seq + tile)
    m0 = tl.load(tile_start + tile)                     # the tile's first query, counted in its sequence's chunk
    first = tl.load(seq_info + 3 * seq)                 # the chunk's first row in the step's packed tokens
    qlen = tl.load(seq_info + 3 * seq + 1)
    ctx = tl.load(seq_info + 3 * seq + 2)               # the sequence's tokens in the cache after this chunk
    m = m0 + tl.arange(0, BLOCK_M)
    d = tl.arange(0, DP)
    valid_m = m < qlen
    qmask = valid_m[:, None] & (d < D)[None, :]
    q = tl.load(qkv + (first + m)[:, None] * stride_qkv + h * D + d[None, :], mask=qmask, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    pos_m = ctx - qlen + m                              # each query's position
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DP], tl.float32)
    t = tl.arange(0, TILE)
    hk = (h // G).to(tl.int64)
    end = tl.minimum(ctx - qlen + m0 + BLOCK_M, ctx)    # keys past the tile's last query are never seen
    for start in range(0, end, TILE):
        pos = start + t
        valid = pos < ctx
        block = tl.load(tables + seq * stride_table + pos // BS, mask=valid, other=0)
        offs = hk * stride_head + (block.to(tl.int64) * BS + pos % BS)[:, None] * D + d[None, :]
        kvmask = valid[:, None] & (d < D)[None, :]
        m_i, l_i, acc = _attend_tile(q, k_pool, v_pool, offs, kvmask, valid[None, :] & (pos[None, :] <= pos_m[:, None]),
                                     scale, m_i, l_i, acc, IEEE, UPCAST)
    o = acc / l_i[:, None]
    tl.store(out + (first + m)[:, None] * stride_out + h * D + d[None, :], o.to(out.dtype.element_ty), mask=qmask)


PREFILL_BLOCK_M = 16


@torch.library.custom_op("rosefast::paged_prefill_attention", mutates_args=())
def paged_prefill_attention(qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            block_tables: torch.Tensor, tile_seq: torch.Tensor, tile_start: torch.Tensor,
                            seq_info: torch.Tensor, num_heads: int, num_kv_heads: int, scale: float) -> torch.Tensor:
    """[T, H*D]: each packed token's query heads (in qkv [T, (H + 2Hkv) * D]) over its sequence's context up to
    its own position. seq_info: per sequence (first row, chunk length, context after the chunk); tile_seq /
    tile_start: each 16-query tile's sequence and first query."""
    T = qkv.shape[0]
    _, _, block_size, D = k_cache.shape
    out = torch.empty(T, num_heads * D, dtype=qkv.dtype, device=qkv.device)
    _paged_prefill[(tile_seq.shape[0], num_heads)](
        qkv, k_cache, v_cache, block_tables, tile_seq, tile_start, seq_info, out, qkv.stride(0),
        block_tables.stride(0), k_cache.stride(0), out.stride(0), scale, H=num_heads, G=num_heads // num_kv_heads,
        D=D, DP=max(16, triton.next_power_of_2(D)), BS=block_size, BLOCK_M=PREFILL_BLOCK_M,
        TILE=max(TILE_TOKENS, block_size), IEEE=qkv.dtype == torch.float32 or INTERPRET, UPCAST=INTERPRET)
    return out


@paged_prefill_attention.register_fake
def _(qkv, k_cache, v_cache, block_tables, tile_seq, tile_start, seq_info, num_heads, num_kv_heads, scale):
    tensors = (qkv, k_cache, v_cache, block_tables, tile_seq, tile_start, seq_info)
    if len({t.device for t in tensors}) != 1:
        raise RuntimeError(f"paged_prefill_attention: tensors on {[str(t.device) for t in tensors]}")
    return qkv.new_empty(qkv.shape[0], num_heads * k_cache.shape[-1])


def prefill_plan(meta, device):
    """The step's (tile_seq, tile_start, seq_info) on the device, made once (in one copy) for all its layers."""
    if meta.plan is None:
        tile_seq, tile_start, info, first = [], [], [], 0
        for i, (qlen, ctx) in enumerate(zip(meta.query_lens, meta.context_lens)):
            starts = range(0, qlen, PREFILL_BLOCK_M)
            tile_seq += [i] * len(starts)
            tile_start += starts
            info += (first, qlen, ctx)
            first += qlen
        n = len(tile_seq)
        flat = upload(tile_seq + tile_start + info, torch.long, device)
        meta.plan = (flat[:n], flat[n:2 * n], flat[2 * n:])
    return meta.plan


def prefill_attention(qkv, num_heads, num_kv_heads, k_cache, v_cache, meta, scale):
    """The whole step's prefill attention in one launch; this call's K/V already in the pools (store_kv)."""
    if qkv.stride(-1) != 1 or not supports(k_cache):
        return None
    tile_seq, tile_start, info = prefill_plan(meta, qkv.device)
    return paged_prefill_attention(qkv, k_cache, v_cache, meta.block_tables, tile_seq, tile_start, info, num_heads,
                                   num_kv_heads, float(scale))


def supports(k_cache):
    """The kernel's layout needs: each head's pool contiguous, a power-of-two block size."""
    _, blocks, bs, D = k_cache.shape
    return bs & (bs - 1) == 0 and k_cache.stride()[1:] == (bs * D, D, 1)


def attention_kernel():
    """Which decode attention runs: this module's Triton kernel (torch's ops where it does not take a cache)."""
    return "triton"


def decode_attention(qkv, num_heads, num_kv_heads, k_cache, v_cache, meta, scale, window=0):
    decode_shapes(qkv, num_heads, num_kv_heads, k_cache, meta)
    if qkv.stride(-1) != 1 or not supports(k_cache):
        from rosefast.kernels import _layer_ops_py as _kernels_py

        return _kernels_py.decode_attention(qkv, num_heads, num_kv_heads, k_cache, v_cache, meta, scale, window)
    return paged_decode_attention(qkv, k_cache, v_cache, meta.block_tables, meta.context_lens, num_heads,
                                  num_kv_heads, float(scale), int(window))
