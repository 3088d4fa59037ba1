"""The sampler's per-row ops in torch: the reference twin of _sample_ops_c, and the path on CUDA and for
other dtypes. Same arguments and results as the compiled flavour (draws agree but for rounding at a
boundary)."""
import torch

from rosefast.device import upload   # per-row values onto the logits' device

_NEG_INF = float("-inf")


def argmax(logits):
    """[S, V] -> [S] long: each row's first largest entry."""
    return logits.argmax(dim=-1)


def mask(x, rows, bitmask):
    """In place on fp32 logits x [B, V]: -inf where row rows[r]'s bitmask [R, W] (int32; bit j of word w is
    token 32 w + j) has a 0 bit, and past W x 32 tokens."""
    R, W = bitmask.shape
    V = x.shape[1]
    bits = (bitmask[:, :, None] >> torch.arange(32, dtype=torch.int32, device=bitmask.device)) & 1   # [R, W, 32]
    allowed = bits.reshape(R, W * 32)[:, :V] != 0
    if W * 32 < V:
        allowed = torch.cat((allowed, allowed.new_zeros(R, V - W * 32)), dim=1)
    xr = x.index_select(0, rows)
    x.index_copy_(0, rows, xr.masked_fill_(~allowed, _NEG_INF))
    return x


def sample(logits, temperature, top_k, top_p, min_p, u):
    """One token per row of logits [S, V] (not modified): per-row lists temperature (> 0), top_k (0: all),
    top_p, min_p; u an [S] float32 tensor of uniforms in (0, 1] on the logits' device. Temperature, top_k,
    top_p, min_p (vLLM's order), then the first token whose cumulative probability reaches u x total."""
    S, V = logits.shape
    dev = logits.device
    x = logits.to(torch.float32, copy=True)
    x.div_(upload(temperature, torch.float32, dev)[:, None])
    limited = [0 < k < V for k in top_k]
    if any(limited):   # one topk at the largest k asked; rows that ask none keep every token
        k_max = max(k for k, lim in zip(top_k, limited) if lim)
        kth = x.topk(k_max, dim=-1, sorted=True).values.gather(
            1, upload([k - 1 if lim else 0 for k, lim in zip(top_k, limited)], torch.long, dev)[:, None])
        x.masked_fill_(upload(limited, torch.bool, dev)[:, None] & (x < kth), _NEG_INF)
    probs = torch.softmax(x, dim=-1)
    nucleus = [i for i, p in enumerate(top_p) if p < 1.0]
    if nucleus:
        rows = upload(nucleus, torch.long, dev)
        pr = probs if len(nucleus) == S else probs.index_select(0, rows)
        ordered, order = pr.sort(dim=-1, descending=True)
        p = upload([top_p[i] for i in nucleus], torch.float32, dev)[:, None]
        # keep the smallest prefix whose mass reaches top_p (the token that crosses it included)
        drop = (ordered.cumsum(dim=-1) - ordered) >= p
        kept = torch.zeros_like(pr).scatter_(1, order, ordered.masked_fill_(drop, 0.0))
        probs = kept if pr is probs else probs.index_copy_(0, rows, kept)
    if any(m > 0 for m in min_p):
        floor = upload(min_p, torch.float32, dev)[:, None] * probs.amax(dim=-1, keepdim=True)
        probs.masked_fill_(probs < floor, 0.0)
    cdf = probs.cumsum_(dim=-1)
    return torch.searchsorted(cdf, u[:, None] * cdf[:, -1:]).clamp_(max=V - 1).squeeze(1)
