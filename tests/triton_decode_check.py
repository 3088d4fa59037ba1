"""Run under TRITON_INTERPRET=1 (tests/test_cuda_path.py does): the Triton paged decode and prefill attention
against the torch twins on CPU tensors; prints one JSON line, a result per case."""
import json
import os

import torch

from rosefast.kernels import _layer_ops_py as twin
from rosefast.models.layers import AttentionMetadata, prefill_attention


def diffs(got, ref):
    err = (got.float() - ref).abs()
    return {"max_abs_diff": err.max().item(), "max_scaled_diff": (err / (ref.abs() + 1)).max().item()}


def case(kernels, dtype, heads, kv_heads, head_dim, window=0):
    gen = torch.Generator().manual_seed(heads * 100 + head_dim)
    bs, blocks = 16, 40
    k_cache = torch.randn(kv_heads, blocks + 1, bs, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(kv_heads, blocks + 1, bs, head_dim, generator=gen).to(dtype)
    contexts = [1, 17, 100, 64, 5, 130]            # one row of one token (a padded row's shape), tile edges
    width = 12                                      # wider than any row needs: the padding must not be read
    order = torch.randperm(blocks, generator=gen).tolist()
    tables = torch.full((len(contexts), width), blocks, dtype=torch.long)
    used = 0
    for i, ctx in enumerate(contexts):
        n = -(-ctx // bs)
        tables[i, :n] = torch.tensor(order[used:used + n])
        tables[i, n:] = torch.randint(0, blocks, (width - n,), generator=gen)   # stale ids past the context
        used += n
    qkv = torch.randn(len(contexts), (heads + 2 * kv_heads) * head_dim, generator=gen).to(dtype)
    lens = torch.tensor(contexts)
    got = kernels.decode_attention(qkv, heads, kv_heads, k_cache, v_cache,
                                   AttentionMetadata(False, None, tables, context_lens=lens), head_dim ** -0.5, window)
    ref = twin.decode_attention(qkv.float(), heads, kv_heads, k_cache.float(), v_cache.float(),
                                AttentionMetadata(False, None, tables, context_lens=lens), head_dim ** -0.5, window)
    assert got.dtype == dtype and got.shape == ref.shape
    return {"kind": "decode-window" if window else "decode", "dtype": str(dtype).split(".")[-1], "heads": heads, "kv_heads": kv_heads,
            "head_dim": head_dim, **diffs(got, ref)}


def prefill_case(kernels, dtype, heads, kv_heads, head_dim):
    """One step packing fresh prompts, a later chunk over a cached prefix, a one-token chunk and tile edges."""
    gen = torch.Generator().manual_seed(7 * heads + head_dim)
    bs, blocks = 16, 64
    k_cache = torch.randn(kv_heads, blocks + 1, bs, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(kv_heads, blocks + 1, bs, head_dim, generator=gen).to(dtype)
    chunks = [(5, 0), (40, 0), (20, 37), (1, 100), (33, 16)]      # (new tokens, already cached)
    width = max(-(-(q + c) // bs) for q, c in chunks) + 2
    order = torch.randperm(blocks, generator=gen).tolist()
    tables, slots, used = torch.full((len(chunks), width), blocks, dtype=torch.long), [], 0
    for i, (q, c) in enumerate(chunks):
        n = -(-(q + c) // bs)
        tables[i, :n] = torch.tensor(order[used:used + n])
        used += n
        slots += [int(tables[i, p // bs]) * bs + p % bs for p in range(c, c + q)]
    T = sum(q for q, _ in chunks)
    qkv = torch.randn(T, (heads + 2 * kv_heads) * head_dim, generator=gen).to(dtype)
    twin.store_kv(qkv, heads, kv_heads, torch.tensor(slots), k_cache, v_cache)   # the chunks' own K/V, no RoPE
    meta = AttentionMetadata(True, torch.tensor(slots), tables, [q for q, _ in chunks], [q + c for q, c in chunks])
    got = kernels.prefill_attention(qkv, heads, kv_heads, k_cache, v_cache, meta, head_dim ** -0.5)
    rows = qkv.float().view(T, heads + 2 * kv_heads, head_dim)
    q, k, v = rows.split((heads, kv_heads, kv_heads), dim=1)
    ref = prefill_attention(q, k, v, k_cache.float(), v_cache.float(), meta, kv_heads, head_dim ** -0.5)
    assert got.dtype == dtype and got.shape == ref.shape
    return {"kind": "prefill", "dtype": str(dtype).split(".")[-1], "heads": heads, "kv_heads": kv_heads,
            "head_dim": head_dim, **diffs(got, ref)}


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    from rosefast.kernels import _layer_ops_triton as _kernels_triton

    shapes = ((9, 3, 64), (4, 4, 32), (6, 2, 48))
    dtypes = (torch.float32, torch.bfloat16)
    cases = [case(_kernels_triton, dtype, *shape) for dtype in dtypes for shape in shapes]
    cases += [case(_kernels_triton, dtype, *shape, window=24) for dtype in dtypes for shape in shapes]   # binds at 64+
    cases += [prefill_case(_kernels_triton, dtype, *shape) for dtype in dtypes for shape in shapes]
    _kernels_triton.PART_TOKENS = 64   # the same decode cases with each context split in parts of 64 tokens
    assert _kernels_triton.decode_parts(6, 3, 12 * 16) == 3
    cases += [dict(case(_kernels_triton, dtype, *shape), kind="decode-split") for dtype in dtypes for shape in shapes]
    cases += [dict(case(_kernels_triton, dtype, *shape, window=24), kind="decode-split-window")   # empty early parts
              for dtype in dtypes for shape in shapes]
    print(json.dumps(cases))
