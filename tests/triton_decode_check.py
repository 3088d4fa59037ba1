"""Run under TRITON_INTERPRET=1 (tests/test_cuda_path.py does): the Triton paged decode attention against the
torch twin on CPU tensors; prints one JSON line, a result per case."""
import json
import os

import torch

from rosefast.models import _kernels_py as twin
from rosefast.models.layers import AttentionMetadata


def case(kernels, dtype, heads, kv_heads, head_dim):
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
                                   AttentionMetadata(False, None, tables, context_lens=lens), head_dim ** -0.5)
    ref = twin.decode_attention(qkv.float(), heads, kv_heads, k_cache.float(), v_cache.float(),
                                AttentionMetadata(False, None, tables, context_lens=lens), head_dim ** -0.5)
    assert got.dtype == dtype and got.shape == ref.shape
    return {"dtype": str(dtype).split(".")[-1], "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim,
            "max_abs_diff": (got.float() - ref).abs().max().item()}


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    from rosefast.models import _kernels_triton

    print(json.dumps([case(_kernels_triton, dtype, *shape) for dtype in (torch.float32, torch.bfloat16)
                      for shape in ((9, 3, 64), (4, 4, 32), (6, 2, 48))]))
