"""Gated DeltaNet: the linear-attention layers of Qwen3-Next and Qwen3.5/3.6, over a recurrent state per sequence.

Each head keeps a d_k x d_v matrix S (fp32) and a short causal convolution keeps its last K - 1 inputs; a token
decays S by exp(g), corrects what S recalls for its key towards its value by the delta rule, and reads S with its
query:

    S <- exp(g) S;   delta = beta (v - S^T k);   S <- S + k delta^T;   o = S^T q        (q, k L2-normed; q / sqrt(d_k))

A decode step runs that update once for every row at once, the states gathered from and put back into the pool by
the rows' slots. A prefill runs it a chunk of C tokens at a time in the chunked form (each chunk: one triangular
solve and a few matmuls, never a token-by-token loop), from the state its slot holds when the sequence was computed
before (a later chunk of a chunked prefill), else from zeros. The states live beside the paged KV cache
(rosefast.engine.kv_cache.KVCache.states; a sequence's slot: rosefast.engine.state_slots).
"""
import torch
import torch.nn.functional as F
from torch import nn

CHUNK = 64   # tokens per chunk of a prefill's delta rule


class DeltaNet(nn.Module):
    """One Gated DeltaNet token mixer. Its projections, in our order: qkvz = q|k|v|z rows (the q and k heads', then
    the v heads' and their output gates'), ba = b|a rows (one per v head); the conv's channels are q|k|v."""

    def __init__(self, args):
        super().__init__()
        self.k_heads, self.v_heads = args.linear_k_heads, args.linear_v_heads
        self.k_dim, self.v_dim = args.linear_k_dim, args.linear_v_dim
        self.key_size, self.value_size = self.k_heads * self.k_dim, self.v_heads * self.v_dim
        self.conv_size = 2 * self.key_size + self.value_size
        self.eps = args.norm_eps
        self.qkvz = nn.Linear(args.hidden_size, self.conv_size + self.value_size, bias=False)
        self.ba = nn.Linear(args.hidden_size, 2 * self.v_heads, bias=False)
        self.conv = nn.Parameter(torch.empty(self.conv_size, args.linear_conv))   # [channels, K]
        self.A_log = nn.Parameter(torch.empty(self.v_heads))
        self.dt_bias = nn.Parameter(torch.empty(self.v_heads))
        self.norm = nn.Parameter(torch.ones(self.v_dim))                          # the gated RMSNorm's weight
        self.out = nn.Linear(self.value_size, args.hidden_size, bias=False)

    def forward(self, h, meta, states):
        """h: the normed residual rows [T, hidden] -> the mixer's output [T, hidden]; states: this layer's (recurrent
        [slots + 1, Hv, dk, dv] fp32, conv tails [slots + 1, K - 1, channels]) pools, updated in place."""
        mixed, z = self.qkvz.forward(h).split((self.conv_size, self.value_size), dim=-1)
        b, a = self.ba.forward(h).split(self.v_heads, dim=-1)
        beta = b.sigmoid()
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)      # [T, Hv], <= 0
        recurrent, tails = states
        if meta.is_prefill:
            outs, start = [], 0
            for n, slot, fresh in zip(meta.query_lens, meta.state_slots, meta.state_fresh):
                rows = slice(start, start + n)
                tail = tails[slot].zero_() if fresh else tails[slot]
                x = self._conv(mixed[rows], tail)
                state = recurrent[slot].zero_() if fresh else recurrent[slot]
                outs.append(self._chunked(x, g[rows], beta[rows], state))
                start += n
            core = outs[0] if len(outs) == 1 else torch.cat(outs)
        else:
            slots = meta.state_slots
            x = self._conv_step(mixed, tails, slots)
            core = self._step(x, g, beta, recurrent, slots)
        return self.out.forward(self._gated_norm(core.to(h.dtype), z))

    # -- the causal conv: each channel's last K inputs, weighted, then SiLU --------------------------------------

    def _conv(self, x, tail):
        """One sequence's new rows x [n, C] after its tail [K - 1, C] (updated in place) -> [n, C]."""
        k = self.conv.shape[1]
        padded = torch.cat((tail.to(x.dtype), x))                                    # [n + K - 1, C]
        out = F.conv1d(padded.t()[None], self.conv[:, None, :], groups=self.conv_size)[0].t()
        tail.copy_(padded[-(k - 1):])
        return F.silu(out)

    def _conv_step(self, x, tails, slots):
        """A decode step's rows x [B, C], each after its slot's tail (updated) -> [B, C]."""
        window = torch.cat((tails.index_select(0, slots).to(x.dtype), x[:, None]), dim=1)   # [B, K, C]
        tails.index_copy_(0, slots, window[:, 1:].to(tails.dtype))
        return F.silu((window * self.conv.t()[None]).sum(1))

    # -- the delta rule -------------------------------------------------------------------------------------------

    def _heads(self, x):
        """q, k [n, Hv, dk] (L2-normed, fp32, q scaled; the k heads repeated for their v heads) and v [n, Hv, dv]."""
        q, k, v = x.float().split((self.key_size, self.key_size, self.value_size), dim=-1)
        rep = self.v_heads // self.k_heads
        q, k = (t.view(t.shape[0], self.k_heads, self.k_dim).repeat_interleave(rep, dim=1) for t in (q, k))
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) * self.k_dim ** -0.5
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        return q, k, v.view(v.shape[0], self.v_heads, self.v_dim)

    def _step(self, x, g, beta, recurrent, slots):
        """One token of each row from its slot's state (updated) -> [B, Hv, dv] fp32. The rows' states are gathered
        into one scratch buffer that every layer and step reuses, and worked on in place there: a fresh one per op
        page-faulted its megabytes (2 MiB a row a layer at Qwen3.6's shapes) at a tenth of the memory's speed."""
        q, k, v = self._heads(x)
        b, h = q.shape[:2]
        state = _scratch(recurrent, b)                                                # [B, Hv, dk, dv]
        torch.index_select(recurrent, 0, slots, out=state)
        state.mul_(g.exp()[:, :, None, None])
        rows = state.view(b * h, self.k_dim, self.v_dim)
        recalled = torch.bmm(k.reshape(b * h, 1, self.k_dim), rows)                   # [B Hv, 1, dv]
        delta = (v.reshape(b * h, 1, self.v_dim) - recalled) * beta.float().reshape(b * h, 1, 1)
        rows.baddbmm_(k.reshape(b * h, self.k_dim, 1), delta)
        recurrent.index_copy_(0, slots, state)
        return torch.bmm(q.reshape(b * h, 1, self.k_dim), rows).view(b, h, self.v_dim)

    def _chunked(self, x, g, beta, state):
        """One sequence's n tokens from `state` [Hv, dk, dv] (updated in place) -> [n, Hv, dv] fp32, C at a time.

        Within a chunk, with G_i the decay summed to token i and S0 the state before it, the rule unrolls to
        (I + A) delta = beta v - beta e^G (K S0), A_ij = beta_i e^(G_i - G_j) k_i.k_j for j < i: a unit lower
        triangular system; then o = e^G (Q S0) + (e^(G_i - G_j) q_i.k_j)_(j <= i) delta, and the state leaves as
        e^(G_C) S0 + sum_j e^(G_C - G_j) k_j delta_j^T."""
        q, k, v = (t.transpose(0, 1) for t in self._heads(x))                          # [Hv, n, d]
        g, beta = g.t(), beta.float().t()                                              # [Hv, n]
        n = q.shape[1]
        outs = []
        for s in range(0, n, CHUNK):
            e = min(s + CHUNK, n)
            qc, kc, vc, bc = q[:, s:e], k[:, s:e], v[:, s:e], beta[:, s:e]
            G = g[:, s:e].cumsum(-1)                                                   # [Hv, c]
            c = e - s
            diff = G[:, :, None] - G[:, None, :]                                       # G_i - G_j
            lower = torch.ones(c, c, dtype=torch.bool, device=x.device).tril()
            decay = diff.masked_fill(~lower, float("-inf")).exp()                      # e^(G_i - G_j), j <= i
            eye = torch.eye(c, dtype=q.dtype, device=x.device)
            a = (bc[:, :, None] * decay * (kc @ kc.transpose(1, 2))).masked_fill(lower.logical_not() | eye.bool(), 0)
            rhs = bc[:, :, None] * (vc - G.exp()[:, :, None] * (kc @ state))           # [Hv, c, dv]
            delta = torch.linalg.solve_triangular(eye + a, rhs, upper=False, unitriangular=True)
            outs.append(G.exp()[:, :, None] * (qc @ state) + (decay * (qc @ kc.transpose(1, 2))) @ delta)
            last = G[:, -1:]                                                           # [Hv, 1]
            state.mul_(last.exp()[:, :, None]).add_((kc * (last - G).exp()[:, :, None]).transpose(1, 2) @ delta)
        return torch.cat(outs, dim=1).transpose(0, 1)

    def _gated_norm(self, core, z):
        """Each v head's output RMS-normed over dv (in fp32, weighted in the input's dtype), times SiLU(z)."""
        shape = core.shape
        x = core.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        x = self.norm * x.to(core.dtype)
        z = z.reshape(shape)
        return (x * F.silu(z.float())).to(core.dtype).reshape(shape[0], -1)


_SCRATCH = {}   # (device, tensor type) -> the decode step's state buffer, grown as needed (the engine thread's)


def _scratch(recurrent, rows):
    key = (recurrent.device, type(recurrent))
    per = recurrent[0].numel()
    buf = _SCRATCH.get(key)
    if buf is None or buf.numel() < rows * per:
        buf = _SCRATCH[key] = torch.empty(rows * per, dtype=recurrent.dtype, device=recurrent.device)
    return buf[:rows * per].view(rows, *recurrent.shape[1:])


def delta_net_state_dict(hf, prefix, args, interleaved):
    """Our DeltaNet's parameters (names within the layer's `linear_attn.`) from a Hugging Face checkpoint's: Qwen3.5's
    separate in_proj_qkv|z|b|a, or Qwen3-Next's (`interleaved`) in_proj_qkvz and in_proj_ba, whose rows go by k head
    group (each group: its q, k, then its v heads' v and z rows; b then a rows per group): reordered to ours."""
    Hk, Hv, dk, dv = args.linear_k_heads, args.linear_v_heads, args.linear_k_dim, args.linear_v_dim
    if interleaved:
        r = Hv // Hk
        qkvz = hf[prefix + "in_proj_qkvz.weight"].view(Hk, 2 * dk + 2 * r * dv, -1)
        q, k, v, z = qkvz.split((dk, dk, r * dv, r * dv), dim=1)
        qkvz = torch.cat([t.reshape(-1, t.shape[-1]) for t in (q, k, v, z)])
        b, a = hf[prefix + "in_proj_ba.weight"].view(Hk, 2 * r, -1).split((r, r), dim=1)
        ba = torch.cat((b.reshape(Hv, -1), a.reshape(Hv, -1)))
    else:
        qkvz = torch.cat((hf[prefix + "in_proj_qkv.weight"], hf[prefix + "in_proj_z.weight"]))
        ba = torch.cat((hf[prefix + "in_proj_b.weight"], hf[prefix + "in_proj_a.weight"]))
    return {"qkvz.weight": qkvz, "ba.weight": ba, "conv": hf[prefix + "conv1d.weight"][:, 0],
            "A_log": hf[prefix + "A_log"], "dt_bias": hf[prefix + "dt_bias"], "norm": hf[prefix + "norm.weight"],
            "out.weight": hf[prefix + "out_proj.weight"]}


def state_shapes(args):
    """One sequence's state in each linear-attention layer: the recurrent state's shape (fp32) and the conv tail's."""
    return ((args.linear_v_heads, args.linear_k_dim, args.linear_v_dim),
            (args.linear_conv - 1, 2 * args.linear_k_heads * args.linear_k_dim + args.linear_v_heads * args.linear_v_dim))
