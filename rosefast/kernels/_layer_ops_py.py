"""A layer's small ops in torch: the reference twin of _kernels_c, and the path on CUDA and other dtypes.

    h = rms_norm(x, weight, eps, residual)          # x += residual (in place) first, when given
    store_kv(qkv, H, Hkv, slots, k_cache, v_cache, cos, sin)   # RoPE q, k in place; k, v into the pools
    out = decode_attention(qkv, H, Hkv, k_cache, v_cache, meta, scale[, window])   # window: the last W positions
    act = silu_mul(gate_up)                         # or gelu_tanh_mul (Gemma)
    out = delta_step(pool, slots, q, k, v, g, beta)  # the gated delta rule's decode step (Gated DeltaNet)
    out = delta_sequence(state, q, k, v, g, beta)    # and one sequence's prefill, chunk by chunk

Pools are one layer's [Hkv, blocks, block_size, D] (head-major, see rosefast.engine.kv_cache). The decode
gather goes into `meta.workspace` (a GatherWorkspace the runner keeps and passes with each step's
metadata), or into fresh buffers when there is none.
"""
import torch
import torch.nn.functional as F

from rosefast.config import forced_cpu_kernels

FOLLOWS_CONTEXT = False    # decode gathers the whole width of the block table (masked past each context)


def rms_norm(x, weight, eps, residual=None):
    if residual is not None:
        x.add_(residual)
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def apply_rope(x, cos, sin):
    """x: [T, heads, D]; cos/sin: [T, 1, D] for each token's position (halves repeated, HF's layout)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def store_kv(qkv, num_heads, num_kv_heads, slots, k_cache, v_cache, cos=None, sin=None):
    D = k_cache.shape[-1]
    heads = qkv.view(qkv.shape[0], num_heads + 2 * num_kv_heads, D)
    if cos is not None:
        qk = heads[:, :num_heads + num_kv_heads]
        qk.copy_(apply_rope(qk, cos[:, None], sin[:, None]))
    k = heads[:, num_heads:num_heads + num_kv_heads].transpose(0, 1)
    v = heads[:, num_heads + num_kv_heads:].transpose(0, 1)
    k_cache.view(num_kv_heads, -1, D).index_copy_(1, slots, k)
    v_cache.view(num_kv_heads, -1, D).index_copy_(1, slots, v)


def decode_shapes(qkv, num_heads, num_kv_heads, k_cache, meta):
    """(B, table width, head_dim, block_size, slots per head) of a decode call, checked."""
    B = qkv.shape[0]
    hkv, blocks, block_size, D = k_cache.shape
    width = meta.block_tables.shape[1]
    if qkv.numel() != B * (num_heads + 2 * num_kv_heads) * D or hkv != num_kv_heads or num_heads % hkv:
        raise ValueError(f"decode_attention: qkv {tuple(qkv.shape)} does not fit {num_heads} + 2 x "
                         f"{num_kv_heads} heads / pools {tuple(k_cache.shape)}")
    if meta.block_tables.shape[0] != B or tuple(meta.context_lens.shape) != (B,):
        raise ValueError(f"decode_attention: block_tables {tuple(meta.block_tables.shape)} and context_lens "
                         f"{tuple(meta.context_lens.shape)} must have one row per sequence ({B})")
    return B, width, D, block_size, blocks * block_size


def _gather_plan(meta, num_kv_heads, k_cache):
    """The additive mask [Hkv*B, 1, L] (fp32) and the pool rows to gather, built once per step (all layers
    share)."""
    if meta.decode_mask is None:
        tables, dev = meta.block_tables, k_cache.device
        span = tables.shape[1] * k_cache.shape[2]
        visible = torch.arange(span, device=dev)[None, :] < meta.context_lens[:, None]       # [B, L]
        mask = torch.zeros(visible.shape, dtype=torch.float32, device=dev).masked_fill_(~visible, float("-inf"))
        heads = torch.arange(num_kv_heads, device=dev)[:, None] * k_cache.shape[1]
        meta.decode_mask = mask.repeat(num_kv_heads, 1)[:, None, :]
        meta.gather_index = (heads + tables.reshape(1, -1)).reshape(-1)
    return meta.decode_mask, meta.gather_index


def _window_mask(meta, mask, num_kv_heads, window):
    """The step's decode mask with each sequence's positions before its last `window` hidden too."""
    if meta.window_masks is None:
        meta.window_masks = {}
    if window not in meta.window_masks:
        span, lens = mask.shape[-1], meta.context_lens
        early = torch.arange(span, device=mask.device)[None, :] < (lens - window)[:, None]      # [B, L]
        hide = torch.zeros(early.shape, dtype=torch.float32, device=mask.device).masked_fill_(early, float("-inf"))
        meta.window_masks[window] = mask + hide.repeat(num_kv_heads, 1)[:, None, :]
    return meta.window_masks[window]


class GatherWorkspace:
    """Two persistent gather buffers (K, V) shared by every layer and step of one runner: allocating (and
    page-faulting) megabytes per layer per step was measurable."""

    def __init__(self):
        self._buffer = None

    def buffers(self, shape, dtype, device):
        per = shape[0] * shape[1] * shape[2] * shape[3]
        buf = self._buffer
        if buf is None or buf.numel() < 2 * per or buf.dtype != dtype or buf.device != device:
            buf = self._buffer = torch.empty(2 * per * 5 // 4, dtype=dtype, device=device)
        return buf[:per].view(shape), buf[per:2 * per].view(shape)


def _gather_buffers(meta, k_cache, nblocks):
    hkv, _, block_size, D = k_cache.shape
    shape = (hkv, nblocks, block_size, D)
    if meta.workspace is None:
        return (torch.empty(shape, dtype=k_cache.dtype, device=k_cache.device),
                torch.empty(shape, dtype=k_cache.dtype, device=k_cache.device))
    return meta.workspace.buffers(shape, k_cache.dtype, k_cache.device)


def attention_kernel():
    """Which decode attention runs: torch's ops here (the compiled flavour names its C kernel)."""
    return "torch"


def decode_attention(qkv, num_heads, num_kv_heads, k_cache, v_cache, meta, scale, window=0):
    """Gather each (head, sequence) context from the pools, then GQA groups of queries as matmul rows; with a
    `window`, each query sees its sequence's last `window` positions only."""
    B, width, D, block_size, _ = decode_shapes(qkv, num_heads, num_kv_heads, k_cache, meta)
    mask, index = _gather_plan(meta, num_kv_heads, k_cache)
    if window:
        mask = _window_mask(meta, mask, num_kv_heads, window)
    n = index.numel()                                                                    # Hkv * B * width
    k_ctx, v_ctx = _gather_buffers(meta, k_cache, n // num_kv_heads)
    # dim-0 gathers of whole (head, block) rows: the fast contiguous-copy path
    torch.index_select(k_cache.view(-1, block_size * D), 0, index, out=k_ctx.view(n, -1))
    torch.index_select(v_cache.view(-1, block_size * D), 0, index, out=v_ctx.view(n, -1))
    L = width * block_size
    k_ctx = k_ctx.view(num_kv_heads * B, L, D)
    v_ctx = v_ctx.view(num_kv_heads * B, L, D)
    G = num_heads // num_kv_heads
    q = qkv.view(B, -1, D)[:, :num_heads]
    qg = q.reshape(B, num_kv_heads, G, D).transpose(0, 1).reshape(num_kv_heads * B, G, D)  # [Hkv*B, G, D]
    # scores in fp32 whatever the cache's dtype (a bf16 product would round them before the softmax)
    scores = torch.baddbmm(mask, qg.float(), k_ctx.transpose(1, 2).float(), alpha=scale)  # [Hkv*B, G, L]
    probs = torch.softmax(scores, dim=-1).to(q.dtype)
    out = torch.bmm(probs, v_ctx).view(num_kv_heads, B, G, D)
    return out.transpose(0, 1).reshape(B, num_heads * D)


def silu_mul(gate_up):
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def gelu_tanh_mul(gate_up):
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


def attention_isa_limit():
    """The widest decode attention the compiled kernels may take (2 AVX-512, 1 AVX2, 0 the portable C): within the
    tier ROSEFAST_CPU_KERNELS forces (avx2, avxvnni: AVX2; scalar, neon: the portable C). Each compiled module that
    holds the attention (csrc/decode_kernels.h) is told it at import."""
    forced = forced_cpu_kernels()
    return 1 if forced in ("avx2", "avxvnni") else 0 if forced in ("scalar", "neon") else 2


_DELTA_SCRATCH = {}   # (device, tensor type, fake mode) -> delta_step's state buffer, grown as needed (the engine
                      # thread's; a fake tensor's mode is its own: FakeTensorMode checks run with one each)


def _delta_scratch(pool, rows):
    key = (pool.device, type(pool), id(getattr(pool, "fake_mode", None)))
    per = pool[0].numel()
    buf = _DELTA_SCRATCH.get(key)
    if buf is None or buf.numel() < rows * per:
        buf = _DELTA_SCRATCH[key] = torch.empty(rows * per, dtype=pool.dtype, device=pool.device)
    return buf[:rows * per].view(rows, *pool.shape[1:])


def delta_step(pool, slots, q, k, v, g, beta):
    """The gated delta rule's decode step: each row's state in `pool` [slots, H, dk, dv] (fp32, at its slot) updated
    in place by its q, k [B, H, dk], v [B, H, dv], log-decay g and beta [B, H] (fp32) -> out [B, H, dv]:
    S <- e^g S; delta = beta (v - S^T k); S <- S + k delta^T; out = S^T q. The rows' states are gathered into one
    scratch buffer that every layer and step reuses and worked on in place: a fresh tensor per op page-faulted its
    megabytes (2 MiB a row a layer at Qwen3.6's shapes) at a tenth of the memory's speed."""
    b, h, dk = q.shape
    dv = v.shape[2]
    state = _delta_scratch(pool, b)
    torch.index_select(pool, 0, slots, out=state)
    state.mul_(g.exp()[:, :, None, None])
    rows = state.view(b * h, dk, dv)
    recalled = torch.bmm(k.reshape(b * h, 1, dk), rows)
    delta = (v.reshape(b * h, 1, dv) - recalled) * beta.reshape(b * h, 1, 1)
    rows.baddbmm_(k.reshape(b * h, dk, 1), delta)
    pool.index_copy_(0, slots, state)
    return torch.bmm(q.reshape(b * h, 1, dk), rows).view(b, h, dv)


def delta_gates(b, a, A_log, dt_bias):
    """(beta [T, Hv] in b's dtype, the log-decay g [T, Hv] fp32 <= 0) of a DeltaNet's b and a rows"""
    return b.sigmoid(), -A_log.float().exp() * F.softplus(a.float() + dt_bias)


def conv_step(x, weight, tails, slots):
    """A decode step's conv inputs x [B, C], each after its slot's tail in `tails` [slots, K - 1, C] (updated), through
    the conv `weight` [C, K] and SiLU -> [B, C] in x's dtype: K multiply-adds in fp32 (a sum over the window's dim 1
    took ~0.4 ms a layer)."""
    window = torch.cat((tails.index_select(0, slots).to(x.dtype), x[:, None]), dim=1)   # [B, K, C]
    tails.index_copy_(0, slots, window[:, 1:].to(tails.dtype))
    weight = weight.float()
    out = window[:, 0].float() * weight[:, 0]
    for j in range(1, weight.shape[1]):
        out.add_(window[:, j].float() * weight[:, j])
    return F.silu(out).to(x.dtype)


def delta_heads(x, k_heads, k_dim, v_heads, v_dim, tiled):
    """q, k [n, Hv, dk] (L2-normed, fp32, q scaled by 1/sqrt(dk); each v head's k head: j % k_heads when `tiled`,
    llama.cpp's order, else j // (Hv / k_heads)) and v [n, Hv, dv] of the conv's output x [n, q|k|v]."""
    key = k_heads * k_dim
    q, k, v = x.float().split((key, key, v_heads * v_dim), dim=-1)
    rep = v_heads // k_heads
    if tiled:
        q, k = (t.view(t.shape[0], k_heads, k_dim).repeat(1, rep, 1) for t in (q, k))
    else:
        q, k = (t.view(t.shape[0], k_heads, k_dim).repeat_interleave(rep, dim=1) for t in (q, k))
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) * k_dim ** -0.5
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    return q, k, v.view(v.shape[0], v_heads, v_dim)


def gated_rms_norm(core, z, weight, eps):
    """Each v head's output core [T, Hv, dv] RMS-normed over dv (in fp32, weighted in core's dtype), times SiLU(z)
    -> [T, Hv dv]"""
    shape = core.shape
    x = core.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    x = weight * x.to(core.dtype)
    z = z.reshape(shape)
    return (x * F.silu(z.float())).to(core.dtype).reshape(shape[0], -1)


def delta_decode(proj, ba, conv, tails, pool, slots, A_log, dt_bias, norm, eps, k_heads, tiled):
    """A Gated DeltaNet's decode step after its projections: proj [B, C + Hv dv] (q|k|v, the conv's C channels, then
    z), ba [B, 2 Hv] (b then a); the conv [C, K] over each row's tail in `tails` (updated), the delta rule on each
    row's state in `pool` [slots, Hv, dk, dv] (fp32, updated) at `slots` [B]; A_log, dt_bias [Hv], the gated norm's
    weight [dv] -> out [B, Hv dv] in proj's dtype. The compiled flavour runs it as one call
    (csrc/delta_decode.h)."""
    hv, dk, dv = pool.shape[1:]
    mixed, z = proj.split((conv.shape[0], hv * dv), dim=-1)
    b, a = ba.split(hv, dim=-1)
    beta, g = delta_gates(b, a, A_log, dt_bias)
    q, k, v = delta_heads(conv_step(mixed, conv, tails, slots), k_heads, dk, hv, dv, tiled)
    core = delta_step(pool, slots, q, k, v.contiguous(), g.contiguous(), beta.float().contiguous())
    return gated_rms_norm(core.to(proj.dtype), z, norm, eps)


DELTA_CHUNK = 64   # tokens per chunk of delta_sequence's chunked form


def delta_sequence(state, q, k, v, g, beta):
    """One sequence's n tokens of the gated delta rule from `state` [H, dk, dv] (fp32, updated in place): q, k [n, H,
    dk], v [n, H, dv], g and beta [n, H] (fp32) -> out [n, H, dv], DELTA_CHUNK tokens at a time.

    Within a chunk, with G_i the decay summed to token i and S0 the state before it, the rule unrolls to
    (I + A) delta = beta v - beta e^G (K S0), A_ij = beta_i e^(G_i - G_j) k_i.k_j for j < i: a unit lower
    triangular system; then o = e^G (Q S0) + (e^(G_i - G_j) q_i.k_j)_(j <= i) delta, and the state leaves as
    e^(G_C) S0 + sum_j e^(G_C - G_j) k_j delta_j^T."""
    q, k, v = (t.transpose(0, 1) for t in (q, k, v))                                   # [H, n, d]
    g, beta = g.t(), beta.t()                                                          # [H, n]
    n = q.shape[1]
    outs = []
    for s in range(0, n, DELTA_CHUNK):
        e = min(s + DELTA_CHUNK, n)
        qc, kc, vc, bc = q[:, s:e], k[:, s:e], v[:, s:e], beta[:, s:e]
        G = g[:, s:e].cumsum(-1)                                                       # [H, c]
        c = e - s
        lower = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
        decay = (G[:, :, None] - G[:, None, :]).masked_fill(~lower, float("-inf")).exp()   # e^(G_i - G_j), j <= i
        eye = torch.eye(c, dtype=q.dtype, device=q.device)
        a = (bc[:, :, None] * decay * (kc @ kc.transpose(1, 2))).masked_fill(~lower | eye.bool(), 0)
        rhs = bc[:, :, None] * (vc - G.exp()[:, :, None] * (kc @ state))               # [H, c, dv]
        delta = torch.linalg.solve_triangular(eye + a, rhs, upper=False, unitriangular=True)
        outs.append(G.exp()[:, :, None] * (qc @ state) + (decay * (qc @ kc.transpose(1, 2))) @ delta)
        last = G[:, -1:]                                                               # [H, 1]
        state.mul_(last.exp()[:, :, None]).add_((kc * (last - G).exp()[:, :, None]).transpose(1, 2) @ delta)
    return torch.cat(outs, dim=1).transpose(0, 1)
