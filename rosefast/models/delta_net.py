"""Gated DeltaNet: the linear-attention layers of Qwen3-Next and Qwen3.5/3.6, over a recurrent state per sequence.

Each head keeps a d_k x d_v matrix S (fp32) and a short causal convolution keeps its last K - 1 inputs; a token
decays S by exp(g), corrects what S recalls for its key towards its value by the delta rule, and reads S with its
query:

    S <- exp(g) S;   delta = beta (v - S^T k);   S <- S + k delta^T;   o = S^T q        (q, k L2-normed; q / sqrt(d_k))

A decode step runs that update once for every row (the kernels' delta_step: rosefast.kernels.layer_ops). A prefill
runs a sequence's tokens from the state its slot holds when the sequence was computed before (a later chunk of a
chunked prefill), else from zeros (delta_sequence: torch's twin in the chunked form, C as each head's recurrence
with its state cache-resident). The states live beside the paged KV cache
(rosefast.engine.kv_cache.KVCache.states; a sequence's slot: rosefast.engine.state_slots).
"""
import torch
import torch.nn.functional as F
from torch import nn

# a prefill's tokens PIECE at a time through the conv and the rule: the fp32 temporaries of a 4k-token prompt at
# Qwen3.6's 8,192 channels were 128 MB each, page-faulted afresh per op (2.3x the whole layer's state work)
PIECE = 256


class DeltaNet(nn.Module):
    """One Gated DeltaNet token mixer. Its projections, in our order: qkvz = q|k|v|z rows (the q and k heads', then
    the v heads' and their output gates'), ba = b|a rows (one per v head); the conv's channels are q|k|v. The v
    heads go by k head (a checkpoint's order) or tiled (a GGUF's: args.linear_v_tiled), in every per-v-head weight
    alike (v, z, b, a rows, A_log, dt_bias, conv channels, out's columns), so only which k head each reads differs."""

    def __init__(self, args):
        super().__init__()
        self.k_heads, self.v_heads = args.linear_k_heads, args.linear_v_heads
        self.k_dim, self.v_dim = args.linear_k_dim, args.linear_v_dim
        self.tiled = args.linear_v_tiled
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

    def forward(self, h, meta, states, ops):
        """h: the normed residual rows [T, hidden] -> the mixer's output [T, hidden]; states: this layer's (recurrent
        [pool slots, Hv, dk, dv] fp32, conv tails [pool slots, K - 1, channels]) pools, updated in place (a prefill
        also saves the states meta.state_saves names); ops: the layer's kernels (rosefast.kernels.layer_ops)."""
        mixed, z = self.qkvz.forward(h).split((self.conv_size, self.value_size), dim=-1)
        b, a = self.ba.forward(h).split(self.v_heads, dim=-1)
        beta = b.sigmoid()
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)      # [T, Hv], <= 0
        recurrent, tails = states
        if meta.is_prefill:
            outs, start = [], 0
            for n, slot, fresh, saves in zip(meta.query_lens, meta.state_slots, meta.state_fresh, meta.state_saves):
                tail = tails[slot].zero_() if fresh else tails[slot]
                state = recurrent[slot].zero_() if fresh else recurrent[slot]
                cuts = sorted({*range(PIECE, n, PIECE), *(at for at, _ in saves), n})
                saved = dict(saves)
                at = 0
                for cut in cuts:   # the tail and the state carried from piece to piece
                    rows = slice(start + at, start + cut)
                    outs.append(self._sequence(self._conv(mixed[rows], tail), g[rows], beta[rows], state, ops))
                    if cut in saved:   # a checkpoint: the state and tail after this many of the new tokens
                        recurrent[saved[cut]].copy_(state)
                        tails[saved[cut]].copy_(tail)
                    at = cut
                start += n
            core = outs[0] if len(outs) == 1 else torch.cat(outs)
        else:
            slots = meta.state_slots
            x = self._conv_step(mixed, tails, slots)
            core = self._step(x, g, beta, recurrent, slots, ops)
        return self.out.forward(self._gated_norm(core.to(h.dtype), z))

    # -- the causal conv: each channel's last K inputs, weighted, then SiLU --------------------------------------

    def _conv(self, x, tail):
        """One sequence's new rows x [n, C] after its tail [K - 1, C] (updated in place) -> [n, C]: K shifted
        multiply-adds in fp32 (torch's depthwise conv1d on the CPU in bf16 runs a convolution per channel: 9 s for
        512 tokens of Qwen3.6's 8,192 channels)."""
        k = self.conv.shape[1]
        n = x.shape[0]
        padded = torch.cat((tail.to(x.dtype), x))                                    # [n + K - 1, C]
        weight = self.conv.float()
        out = padded[:n].float() * weight[:, 0]
        for j in range(1, k):
            out.add_(padded[j:j + n].float() * weight[:, j])
        tail.copy_(padded[-(k - 1):])
        return F.silu(out).to(x.dtype)

    def _conv_step(self, x, tails, slots):
        """A decode step's rows x [B, C], each after its slot's tail (updated) -> [B, C]."""
        window = torch.cat((tails.index_select(0, slots).to(x.dtype), x[:, None]), dim=1)   # [B, K, C]
        tails.index_copy_(0, slots, window[:, 1:].to(tails.dtype))
        weight = self.conv.float()   # (K multiply-adds: a sum over the window's dim 1 took ~0.4 ms a layer)
        out = window[:, 0].float() * weight[:, 0]
        for j in range(1, weight.shape[1]):
            out.add_(window[:, j].float() * weight[:, j])
        return F.silu(out).to(x.dtype)

    # -- the delta rule -------------------------------------------------------------------------------------------

    def _heads(self, x):
        """q, k [n, Hv, dk] (L2-normed, fp32, q scaled; the k heads repeated for their v heads) and v [n, Hv, dv]."""
        q, k, v = x.float().split((self.key_size, self.key_size, self.value_size), dim=-1)
        rep = self.v_heads // self.k_heads
        if self.tiled:   # v head j reads k head j % k_heads (llama.cpp's order), else j // rep (a checkpoint's)
            q, k = (t.view(t.shape[0], self.k_heads, self.k_dim).repeat(1, rep, 1) for t in (q, k))
        else:
            q, k = (t.view(t.shape[0], self.k_heads, self.k_dim).repeat_interleave(rep, dim=1) for t in (q, k))
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) * self.k_dim ** -0.5
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        return q, k, v.view(v.shape[0], self.v_heads, self.v_dim)

    def _step(self, x, g, beta, recurrent, slots, ops):
        """One token of each row from its slot's state (updated in place) -> [B, Hv, dv] fp32: the kernels'
        delta_step (rosefast.kernels.layer_ops; the compiled one: csrc/delta_rule.h)."""
        q, k, v = self._heads(x)
        return ops.delta_step(recurrent, slots, q, k, v.contiguous(), g.contiguous(), beta.float().contiguous())

    def _sequence(self, x, g, beta, state, ops):
        """One sequence's n tokens from `state` [Hv, dk, dv] (updated in place) -> [n, Hv, dv] fp32: the kernels'
        delta_sequence (the torch twin's chunked form; the compiled one's per-head recurrence in C)."""
        q, k, v = self._heads(x)
        return ops.delta_sequence(state, q, k, v.contiguous(), g.contiguous(), beta.float().contiguous())

    def _gated_norm(self, core, z):
        """Each v head's output RMS-normed over dv (in fp32, weighted in the input's dtype), times SiLU(z)."""
        shape = core.shape
        x = core.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        x = self.norm * x.to(core.dtype)
        z = z.reshape(shape)
        return (x * F.silu(z.float())).to(core.dtype).reshape(shape[0], -1)


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
