"""Gated DeltaNet: the linear-attention layers of Qwen3-Next and Qwen3.5/3.6, over a recurrent state per sequence.

Each head keeps a d_k x d_v matrix S (fp32) and a short causal convolution keeps its last K - 1 inputs; a token
decays S by exp(g), corrects what S recalls for its key towards its value by the delta rule, and reads S with its
query:

    S <- exp(g) S;   delta = beta (v - S^T k);   S <- S + k delta^T;   o = S^T q        (q, k L2-normed; q / sqrt(d_k))

A decode step runs the conv's step, that update and the gated norm once for every row in one call (the kernels'
delta_decode: rosefast.kernels.layer_ops; the compiled one csrc/delta_decode.h). A prefill
runs a sequence's tokens from the state its slot holds when the sequence was computed before (a later chunk of a
chunked prefill), else from zeros (delta_sequence: torch's twin in the chunked form, C as each head's recurrence
with its state cache-resident). The states live beside the paged KV cache
(rosefast.engine.kv_cache.KVCache.states; a sequence's slot: rosefast.engine.state_slots).
"""
import torch
import torch.nn.functional as F
from torch import nn

from rosefast.kernels.layer_ops import reference

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
        proj, ba = self.qkvz.forward(h), self.ba.forward(h)
        recurrent, tails = states
        if not meta.is_prefill:   # the conv step, the rule and the gated norm in one call
            core = ops.delta_decode(proj, ba, self.conv, tails, recurrent, meta.state_slots, self.A_log, self.dt_bias,
                                    self.norm, self.eps, self.k_heads, self.tiled)
            return self.out.forward(core)
        mixed, z = proj.split((self.conv_size, self.value_size), dim=-1)
        beta, g = reference.delta_gates(*ba.split(self.v_heads, dim=-1), self.A_log, self.dt_bias)   # g [T, Hv] <= 0
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
        return self.out.forward(reference.gated_rms_norm(core.to(h.dtype), z, self.norm, self.eps))

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

    # -- the delta rule -------------------------------------------------------------------------------------------

    def _sequence(self, x, g, beta, state, ops):
        """One sequence's n tokens from `state` [Hv, dk, dv] (updated in place) -> [n, Hv, dv] fp32: the kernels'
        delta_sequence (the torch twin's chunked form; the compiled one's per-head recurrence in C)."""
        q, k, v = reference.delta_heads(x, self.k_heads, self.k_dim, self.v_heads, self.v_dim, self.tiled)
        return ops.delta_sequence(state, q, k, v.contiguous(), g.contiguous(), beta.float().contiguous())


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
