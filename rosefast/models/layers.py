"""Building blocks shared by our model code: RoPE, and attention over the paged KV cache."""
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rosefast.models.sources import ModelError


@dataclass
class AttentionMetadata:
    """What attention needs to know about one forward call (built once per step, shared by all layers)."""
    is_prefill: bool
    slot_mapping: torch.Tensor          # [T] where each new token's K/V goes in the flattened block pool
    block_tables: torch.Tensor          # [B, max_blocks] block ids per sequence (padding: the scratch block)
    query_lens: list = None             # prefill: new tokens per sequence
    context_lens: list = None           # prefill: tokens in the cache after this step, per sequence
    decode_mask: torch.Tensor = None    # decode: [Hkv*B, 1, L] additive mask (0 / -inf) over the gathered context
    gather_index: torch.Tensor = None   # decode: [Hkv*B*nb] rows of the [Hkv*blocks, block_size*D] pool view


def rope_inv_freq(args):
    """Inverse frequencies [head_dim / 2] for the config's rope_theta and rope scaling."""
    dim = args.head_dim
    inv_freq = 1.0 / (args.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    params = dict(args.rope_scaling)
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / params["factor"]
    if rope_type == "llama3":
        factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
        old_len = params["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(medium, smoothed, scaled)
    raise ModelError(f"Unsupported rope_type {rope_type!r}; supported: default, linear, llama3")


def rope_cache(args, max_positions, dtype, device):
    """cos and sin tables [max_positions, head_dim] (HF's non-interleaved layout: halves repeated)."""
    inv_freq = rope_inv_freq(args).to(torch.float32)
    t = torch.arange(max_positions, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)                      # [P, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)               # [P, D]
    return emb.cos().to(dtype=dtype, device=device), emb.sin().to(dtype=dtype, device=device)


def apply_rope(x, cos, sin):
    """x: [T, heads, D]; cos/sin: [T, 1, D] for each token's position."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def paged_attention(q, k, v, k_cache, v_cache, meta, num_kv_heads, scale):
    """Write this call's K/V into the block pools, then attend. q: [T, H, D]; k, v: [T, Hkv, D] -> [T, H*D].

    k_cache / v_cache: one layer's pools, stored head-major [Hkv, num_blocks, block_size, D]. Prefill
    attends each sequence causally to its whole context (earlier chunks and cached prefix included);
    decode attends each sequence's one query to its gathered context, the GQA group of query heads
    taking the place of query rows.
    """
    T, H, D = q.shape
    _, _, block_size, _ = k_cache.shape
    k_cache.view(num_kv_heads, -1, D).index_copy_(1, meta.slot_mapping, k.transpose(0, 1))
    v_cache.view(num_kv_heads, -1, D).index_copy_(1, meta.slot_mapping, v.transpose(0, 1))
    if not meta.is_prefill:
        return _decode_attention(q, k_cache, v_cache, meta, num_kv_heads, scale)
    outs = []
    start = 0
    gqa = H != num_kv_heads
    for i, (qlen, ctx) in enumerate(zip(meta.query_lens, meta.context_lens)):
        qi = q[start:start + qlen].transpose(0, 1)                                         # [H, q, D]
        if ctx == qlen:  # nothing cached before this chunk: attend to the fresh K/V
            ki = k[start:start + qlen].transpose(0, 1)
            vi = v[start:start + qlen].transpose(0, 1)
            oi = F.scaled_dot_product_attention(qi, ki, vi, is_causal=True, scale=scale, enable_gqa=gqa)
        else:
            blocks = meta.block_tables[i, :-(-ctx // block_size)]
            ki = k_cache.index_select(1, blocks).view(num_kv_heads, -1, D)[:, :ctx]        # [Hkv, ctx, D]
            vi = v_cache.index_select(1, blocks).view(num_kv_heads, -1, D)[:, :ctx]
            qpos = torch.arange(ctx - qlen, ctx, device=q.device)
            mask = torch.arange(ctx, device=q.device)[None, :] <= qpos[:, None]          # [q, ctx]
            oi = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, scale=scale, enable_gqa=gqa)
        outs.append(oi.transpose(0, 1).reshape(qlen, H * D))
        start += qlen
    return outs[0] if len(outs) == 1 else torch.cat(outs)


def _decode_attention(q, k_cache, v_cache, meta, num_kv_heads, scale):
    B, H, D = q.shape
    _, pool_blocks, block_size, _ = k_cache.shape
    n = meta.gather_index.numel()                                                        # Hkv * B * nb
    k_ctx, v_ctx = k_cache.workspace.gather_buffers(n // num_kv_heads)
    # dim-0 gathers of whole (head, block) rows: the fast contiguous-copy path
    torch.index_select(k_cache.view(-1, block_size * D), 0, meta.gather_index, out=k_ctx.view(n, -1))
    torch.index_select(v_cache.view(-1, block_size * D), 0, meta.gather_index, out=v_ctx.view(n, -1))
    L = meta.block_tables.shape[1] * block_size
    k_ctx = k_ctx.view(num_kv_heads * B, L, D)
    v_ctx = v_ctx.view(num_kv_heads * B, L, D)
    G = H // num_kv_heads
    qg = q.view(B, num_kv_heads, G, D).transpose(0, 1).reshape(num_kv_heads * B, G, D)  # [Hkv*B, G, D]
    scores = torch.baddbmm(meta.decode_mask, qg, k_ctx.transpose(1, 2), alpha=scale)      # [Hkv*B, G, L]
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    out = torch.bmm(probs, v_ctx).view(num_kv_heads, B, G, D)
    return out.transpose(0, 1).reshape(B, H * D)
