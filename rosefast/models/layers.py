"""Building blocks shared by our model code: embedding tables, RoPE, and attention over the paged KV cache."""
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rosefast.errors import ModelError
from rosefast.kernels.layer_ops import GatherWorkspace, for_device  # noqa: F401 (the engine's view of the kernels)


def embedding(rows, width):
    """An embedding table the checkpoint fills (load_model assigns it): left uninitialized, since a random
    init on the meta device, where models are built, imports torch's compiler stack (~1 s a process)."""
    return torch.nn.Embedding(rows, width, _weight=torch.empty(rows, width))


def layer_linears(args, i):
    """The paths (within layer i) of the linears the block kernels may run: its token mixer's (q|k|v and o, and a
    gated attention's gate; a Gated DeltaNet's q|k|v|z and output projections: rosefast.models.delta_net), then its
    MLP's (gate|up and down) or each expert's of a mixture of experts (rosefast.models.moe)."""
    if args.is_linear_layer(i):
        mixer = ("linear_attn.qkvz", "linear_attn.out")   # (its b|a rows, 2 per v head, stay dense)
    else:
        mixer = ("qkv", "o", "attn_gate") if args.attn_gate else ("qkv", "o")
    if not args.is_moe_layer(i):
        return (*mixer, "gate_up", "down")
    from rosefast.models.moe import expert_linears

    return (*mixer, *expert_linears(args))


def put_linear(layer, path, module):
    """Set the linear at `path` within `layer` (a dotted path: "qkv", "moe.experts.3.down") to `module`."""
    parent, _, leaf = path.rpartition(".")
    setattr(layer.get_submodule(parent) if parent else layer, leaf, module)


@dataclass
class AttentionMetadata:
    """What attention needs to know about one forward call (built once per step, shared by all layers)."""
    is_prefill: bool
    slot_mapping: torch.Tensor          # [T] where each new token's K/V goes in the flattened block pool
    block_tables: torch.Tensor          # [B, max_blocks] block ids per sequence (padding: the scratch block)
    query_lens: list = None             # prefill: new tokens per sequence
    context_lens: object = None         # tokens in the cache after this step: prefill a list, decode a [B] tensor
    decode_mask: torch.Tensor = None    # decode, torch twin: [Hkv*B, 1, L] additive fp32 mask (built by the first layer)
    gather_index: torch.Tensor = None   # decode, torch twin: [Hkv*B*nb] rows of the [Hkv*blocks, bs*D] pool view
    workspace: object = None            # decode, torch twin: its GatherWorkspace (None: fresh buffers)
    plan: object = None                 # a kernel flavour's own per-step tensors (built by the first layer)
    window_masks: dict = None           # decode, torch twin: a sliding window's mask by its width (built once a step)
    window: object = None               # the sliding-window layers' own (their pool's slots and tables), if they have one
    state_slots: object = None          # linear attention: each sequence's state slot (prefill a list, decode a [B] tensor)
    state_fresh: list = None            # linear attention, prefill: whether each sequence starts from its first token
    state_saves: list = None            # linear attention, prefill: each sequence's (token offset, slot) states to save


def rope_inv_freq(args, long=False):
    """Inverse frequencies [head_dim / 2] for the config's rope_theta and rope scaling (on the CPU). With a
    partial rotary (rotary_dim), the rotated dims' frequencies then zeros: the q/k head dims are reordered at
    load (llama.partial_rotary_rows) so that the rotated pairs are (i, i + head_dim / 2), and a zero frequency
    leaves the other dims as they are (cos 1, sin 0)."""
    dim = args.rotary_dim or args.head_dim
    inv_freq = _scaled_inv_freq(args, dim, long)
    return torch.cat((inv_freq, torch.zeros(args.head_dim // 2 - dim // 2, dtype=inv_freq.dtype, device="cpu")))


def _scaled_inv_freq(args, dim, long=False):
    inv_freq = 1.0 / (args.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64, device="cpu") / dim))
    params = dict(args.rope_scaling)
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        return inv_freq
    if rope_type == "none":   # no positional encoding (NoPE layers): cos 1, sin 0, q and k as they are
        return torch.zeros_like(inv_freq)
    if rope_type == "linear":
        return inv_freq / params["factor"]
    if rope_type == "longrope":   # its short factors, or past the switch its long ones (long_rope_switch)
        factors = params["long_factor" if long else "short_factor"]
        return inv_freq / torch.tensor(factors, dtype=torch.float64, device="cpu")
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
    raise ModelError(f"Unsupported rope_type {rope_type!r}; supported: default, linear, llama3, longrope")


def rope_attention_factor(args):
    """What cos and sin are scaled by: longrope's attention factor (given, or from the extension ratio), else 1."""
    params = dict(args.rope_scaling)
    if params.get("rope_type") != "longrope":
        return 1.0
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])
    original = params["original_max_position_embeddings"]
    factor = params.get("factor") or args.max_position_embeddings / original
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))


def long_rope_switch(args):
    """A long-RoPE model's original_max_position_embeddings: a sequence longer than that computes every key with
    the long factors (Hugging Face's Phi-3 recomputes its cache when it first gets there: the engine recomputes
    the sequence then, as a preemption does); shorter, with the short ones. None for any other model."""
    params = dict(args.rope_scaling)
    return int(params["original_max_position_embeddings"]) if params.get("rope_type") == "longrope" else None


def rope_index(args, positions, long):
    """The rows of a model's rope tables for positions of a sequence in long-RoPE's long mode (`long`) or not:
    a long-RoPE model's tables are the short factors' rows then the long ones' (rope_cache)."""
    return [p + args.max_position_embeddings for p in positions] if long else positions


def rope_cache(args, max_positions):
    """cos and sin tables [max_positions, head_dim] in fp32 on the CPU (HF's non-interleaved layout: halves
    repeated); the model keeps them as buffers, cast with its dtype and moved with it. A long-RoPE model's
    tables are the short factors' rows then the long ones' [2 max_positions, head_dim] (rope_index)."""
    if long_rope_switch(args) is not None:
        short, long = _rope_table(args, max_positions, False), _rope_table(args, max_positions, True)
        return torch.cat((short[0], long[0])), torch.cat((short[1], long[1]))
    return _rope_table(args, max_positions, False)


def _rope_table(args, max_positions, long):
    inv_freq = rope_inv_freq(args, long).to(torch.float32)
    t = torch.arange(max_positions, dtype=torch.float32, device="cpu")
    freqs = torch.outer(t, inv_freq)                      # [P, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)               # [P, D]
    scale = rope_attention_factor(args)
    if scale != 1.0:   # (the unrotated dims of a partial rotary keep cos 1: they are not scaled)
        rotated = (inv_freq != 0).repeat(2)
        return torch.where(rotated, emb.cos() * scale, emb.cos()), torch.where(rotated, emb.sin() * scale, emb.sin())
    return emb.cos(), emb.sin()


def prefill_attention(q, k, v, k_cache, v_cache, meta, num_kv_heads, scale, window=0):
    """Each sequence's new tokens attend causally to its context (to its last `window` positions when given: a
    sliding window) -> [T, H*D]. q: [T, H, D]; k, v: [T, Hkv, D].

    The call's K/V are already in the pools (store_kv). A chunk with nothing cached before it attends to
    its fresh K/V; a later chunk (or a cached prefix) gathers its context from the pools, which are
    head-major [Hkv, num_blocks, block_size, D]. SDPA gets 4-D [1, heads, tokens, D] tensors: only those
    reach its fused kernels (flash on CPU: 2-4x the 3-D math path here at 128-512 tokens; on CUDA the 3-D
    call never left the math backend).
    """
    T, H, D = q.shape
    block_size = k_cache.shape[2]
    outs = []
    start = 0
    gqa = H != num_kv_heads
    for i, (qlen, ctx) in enumerate(zip(meta.query_lens, meta.context_lens)):
        qi = q[start:start + qlen].transpose(0, 1)[None]                                  # [1, H, q, D]
        binds = window and ctx > window   # a sliding window that hides some of the context from some query
        if ctx == qlen and not binds:  # nothing cached before this chunk: attend to the fresh K/V
            ki = k[start:start + qlen].transpose(0, 1)[None]
            vi = v[start:start + qlen].transpose(0, 1)[None]
            oi = F.scaled_dot_product_attention(qi, ki, vi, is_causal=True, scale=scale, enable_gqa=gqa)
        else:
            lo = max(0, ctx - qlen - window + 1) if binds else 0   # no query sees a position before lo
            first, last = lo // block_size, -(-ctx // block_size)
            blocks = meta.block_tables[i, first:last]
            ki = k_cache.index_select(1, blocks).view(1, num_kv_heads, -1, D)[:, :, lo - first * block_size:ctx - first * block_size]
            vi = v_cache.index_select(1, blocks).view(1, num_kv_heads, -1, D)[:, :, lo - first * block_size:ctx - first * block_size]
            qpos = torch.arange(ctx - qlen, ctx, device=q.device)
            kpos = torch.arange(lo, ctx, device=q.device)[None, :]
            mask = kpos <= qpos[:, None]                                                   # [q, ctx - lo]
            if binds:
                mask &= kpos > qpos[:, None] - window
            oi = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, scale=scale, enable_gqa=gqa)
        outs.append(oi[0].transpose(0, 1).reshape(qlen, H * D))
        start += qlen
    return outs[0] if len(outs) == 1 else torch.cat(outs)


def attention(qkv, num_heads, num_kv_heads, k_cache, v_cache, meta, scale, ops, window=0):
    """Attend over the pools, this call's K/V already in them (the caller's store_kv) -> [T, H*D]: the
    flavour's decode kernel; for prefill its own kernel when it has one, else the per-sequence SDPA below on
    q, k, v views of the (rotated) qkv rows. window: a sliding window's width (0: the whole context)."""
    if not meta.is_prefill:
        if window:
            return ops.decode_attention(qkv, num_heads, num_kv_heads, k_cache, v_cache, meta, scale, window)
        return ops.decode_attention(qkv, num_heads, num_kv_heads, k_cache, v_cache, meta, scale)
    fused = getattr(ops, "prefill_attention", None)   # the Triton flavour's one launch for the whole step
    if fused is not None and not window:
        out = fused(qkv, num_heads, num_kv_heads, k_cache, v_cache, meta, scale)
        if out is not None:
            return out
    heads = qkv.view(qkv.shape[0], num_heads + 2 * num_kv_heads, -1)
    q, k, v = heads.split((num_heads, num_kv_heads, num_kv_heads), dim=1)
    return prefill_attention(q, k, v, k_cache, v_cache, meta, num_kv_heads, scale, window)
