"""The Llama family on the paged KV cache: Llama, SmolLM2, TinyLlama, Qwen2 (q/k/v bias) and Qwen3 (per-head
q/k RMSNorm before RoPE); what each family adds is a flag of its ModelArgs (rosefast.models.registry)."""
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from rosefast.kernels import decode_layer, layer_ops
from rosefast.models.registry import FAMILIES
from rosefast.models.delta_net import DeltaNet, delta_net_state_dict
from rosefast.models.layers import attention, embedding, rope_cache
from rosefast.models.moe import MoE, moe_state_dict


class LlamaLayer(nn.Module):
    def __init__(self, args, window=0, moe=False, linear=False):
        """window: attention over the last `window` positions (a sliding window; 0: all); moe: a mixture of experts
        (rosefast.models.moe) in place of the dense MLP; linear: a Gated DeltaNet (rosefast.models.delta_net) in
        place of attention."""
        super().__init__()
        self.args, self.window = args, window
        self.input_norm = nn.Parameter(torch.ones(args.hidden_size))
        if linear:
            self.linear_attn = DeltaNet(args)
        else:
            self.qkv = nn.Linear(args.hidden_size, args.q_size + 2 * args.kv_size, bias=args.qkv_bias)  # fused q|k|v
            self.o = nn.Linear(args.q_size, args.hidden_size, bias=args.o_bias)
            if args.attn_gate:   # Qwen3-Next: the attention's output gated per channel (a name the decode plan refuses)
                self.attn_gate = nn.Linear(args.hidden_size, args.q_size, bias=False)
        self.post_norm = nn.Parameter(torch.ones(args.hidden_size))
        if moe:
            self.moe = MoE(args)
        else:
            self.gate_up = nn.Linear(args.hidden_size, 2 * args.intermediate_size, bias=args.mlp_bias)   # gate|up
            self.down = nn.Linear(args.intermediate_size, args.hidden_size, bias=args.mlp_bias)
        self.scale = args.attention_scale or args.head_dim ** -0.5
        if args.qk_norm and not linear:   # Qwen3, Gemma 3: RMSNorm over each head of q and k, before RoPE
            self.q_norm = nn.Parameter(torch.ones(args.head_dim))
            self.k_norm = nn.Parameter(torch.ones(args.head_dim))
        if args.qk_norm_full and not linear:   # OLMoE: RMSNorm over all of q and all of k (names the decode plan refuses)
            self.q_width_norm = nn.Parameter(torch.ones(args.q_size))
            self.k_width_norm = nn.Parameter(torch.ones(args.kv_size))
        if args.gemma:     # Gemma: the attention's and the MLP's outputs normed too, before the residual add
            self.post_attn_norm = nn.Parameter(torch.ones(args.hidden_size))
            self.post_mlp_norm = nn.Parameter(torch.ones(args.hidden_size))

    def forward(self, x, residual, cos, sin, meta, k_cache, v_cache, ops):
        """x: the residual stream [T, hidden], updated in place; residual: the previous layer's MLP output
        (added here, fused with the norm); a DeltaNet layer's k_cache, v_cache are its recurrent and conv state pools.
        Returns (x, this layer's MLP output)."""
        a = self.args
        # the linears' forward, not their __call__: ~30 layers x 4 calls per step of hook plumbing saved
        # (nn.Linear, or a PackedLinear on CPU bf16)
        h = ops.rms_norm(x, self.input_norm, a.norm_eps, residual)
        if hasattr(self, "linear_attn"):
            return x, self._mlp(x, self.linear_attn(h, meta, (k_cache, v_cache), ops), ops)
        qkv = self.qkv.forward(h)                                                      # [T, (H+2Hkv)*D]
        if a.qk_norm:
            _norm_heads(qkv, a.num_heads, a.num_kv_heads, self.q_norm, self.k_norm, a.norm_eps, ops)
        if a.qk_norm_full:
            for part, weight in ((qkv[:, :a.q_size], self.q_width_norm),
                                 (qkv[:, a.q_size:a.q_size + a.kv_size], self.k_width_norm)):
                part.copy_(ops.rms_norm(part.contiguous(), weight, a.norm_eps))
        ops.store_kv(qkv, a.num_heads, a.num_kv_heads, meta.slot_mapping, k_cache, v_cache, cos, sin)
        attn = attention(qkv, a.num_heads, a.num_kv_heads, k_cache, v_cache, meta, self.scale, ops, self.window)
        if a.attn_gate:
            attn = attn * torch.sigmoid(self.attn_gate.forward(h))
        if a.gemma:   # post_norm is Gemma's pre-feedforward norm; the MLP is tanh-GELU gated
            attn = ops.rms_norm(self.o.forward(attn), self.post_attn_norm, a.norm_eps)
            h = ops.rms_norm(x, self.post_norm, a.norm_eps, attn)
            mlp = self.down.forward(ops.gelu_tanh_mul(self.gate_up.forward(h)))
            return x, ops.rms_norm(mlp, self.post_mlp_norm, a.norm_eps)
        return x, self._mlp(x, self.o.forward(attn), ops)

    def _mlp(self, x, mixed, ops):
        """The token mixer's output added to x, normed, through the MLP (or the experts)."""
        h = ops.rms_norm(x, self.post_norm, self.args.norm_eps, mixed)
        if hasattr(self, "moe"):
            return self.moe(h, ops)
        return self.down.forward(ops.silu_mul(self.gate_up.forward(h)))


def _norm_heads(qkv, num_heads, num_kv_heads, q_weight, k_weight, eps, ops):
    """In place on qkv [T, (H+2Hkv)*D]: each q and k head RMS-normalized over D by the kernels' RMSNorm (the
    compiled one computes in fp32 and rounds once; the one-call decode plan runs the same rows in place)."""
    heads = qkv.view(qkv.shape[0], num_heads + 2 * num_kv_heads, -1)                  # [T, H+2Hkv, D]
    for part, weight in ((heads[:, :num_heads], q_weight), (heads[:, num_heads:num_heads + num_kv_heads], k_weight)):
        part.copy_(ops.rms_norm(part.contiguous(), weight, eps))


class LlamaModel(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.args = args
        self.embed = embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(LlamaLayer(args, args.layer_window(i), args.is_moe_layer(i), args.is_linear_layer(i))
                                    for i in range(args.num_layers))
        self.norm = nn.Parameter(torch.ones(args.hidden_size))
        self.lm_head = None if args.tie_word_embeddings else nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        # [P, D] tables for every position the model knows; not weights (no state-dict entry). Computed on
        # the CPU even while the module is built on the meta device; .to() casts and moves them.
        cos, sin = rope_cache(args, args.max_position_embeddings)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        if args.local_layers:   # Gemma: the local layers' own RoPE base
            theta, scaling = args.local_rope
            cos, sin = rope_cache(replace(args, rope_theta=theta, rope_scaling=scaling), args.max_position_embeddings)
            self.register_buffer("local_cos", cos, persistent=False)
            self.register_buffer("local_sin", sin, persistent=False)
        self.decode_plans = None   # one call per layer for decode steps (plan_decode_layers)
        # a step without host syncs (plan_experts says for experts); a DeltaNet's prefill loops over its sequences
        self.graph_safe = not args.num_experts and not args.linear_layers

    def plan_experts(self):
        """How each mixture-of-experts layer's routed experts run (moe.MoE.plan), once the model is built: returns
        {"one call" | "grouped" | "loop": layers}; the model's steps are then host-sync free unless one is "loop"."""
        ways = {}
        for layer in self.layers:
            if hasattr(layer, "moe"):
                way = layer.moe.plan()
                ways[way] = ways.get(way, 0) + 1
        self.graph_safe = "loop" not in ways and not self.args.linear_layers
        return ways

    def plan_decode_layers(self):
        """Decode steps as one call per layer (rosefast.kernels.decode_layer) when every layer fits there (its
        linears on the block kernels, on the CPU, and nothing the plan does not implement). Returns None when
        they do, else why not (the plan refuses a layer part it does not know by its name, never skips it)."""
        impl = decode_layer.impl
        unknown = sorted({part for layer in self.layers for part in decode_layer.unplanned(layer)})
        if unknown:
            self.decode_plans = None
            return f"the one-call plan does not implement this layer's {', '.join(unknown)}"
        fits = all(impl.fits(layer) for layer in self.layers)
        self.decode_plans = [impl.LayerPlan(layer) for layer in self.layers] if fits else None
        return None if fits else "the linears are not on the compiled block kernels"

    def forward(self, input_ids, positions, meta, kv_caches):
        """input_ids, positions: [T] -> hidden states [T, hidden] (before the final norm)."""
        x = self.embed(input_ids)
        if self.args.gemma:   # x sqrt(hidden), rounded to the weights' dtype first (as Gemma's own)
            x = x * torch.tensor(self.args.hidden_size ** 0.5, dtype=x.dtype)
        ops = layer_ops.for_tensor(x)
        cos, sin = self.rope_cos[positions], self.rope_sin[positions]     # [T, D] each
        if self.args.local_layers:   # (local_layers: a tuple of a few layer numbers)
            local = (self.local_cos[positions], self.local_sin[positions])
            ropes = [local if i in self.args.local_layers else (cos, sin) for i in range(len(self.layers))]
        residual = None
        metas = (meta, meta if meta.window is None else meta.window)   # a layer's: [its window's pool or not]
        if self.decode_plans is not None and not meta.is_prefill:
            steps = {}   # one StepInputs per (RoPE, metadata) the layers take (Gemma: local and global ones)
            for i, (plan, (k_cache, v_cache)) in enumerate(zip(self.decode_plans, kv_caches)):
                key = (i in self.args.local_layers, plan.layer.window > 0)
                step = steps.get(key)
                if step is None:
                    c, s = local if key[0] else (cos, sin)
                    step = steps[key] = decode_layer.impl.StepInputs(c, s, metas[key[1]])
                x, residual = plan(x, residual, step, k_cache, v_cache)
            return x.add_(residual)
        for i, (layer, (k_cache, v_cache)) in enumerate(zip(self.layers, kv_caches)):
            if self.args.local_layers:
                cos, sin = ropes[i]
            x, residual = layer.forward(x, residual, cos, sin, metas[layer.window > 0], k_cache, v_cache, ops)
        return x.add_(residual)

    def logits(self, hidden):
        return self.head(self.final_norm(hidden))

    def final_norm(self, hidden):
        """The final norm: the model's last hidden states, as Hugging Face's last_hidden_state."""
        return layer_ops.for_tensor(hidden).rms_norm(hidden, self.norm, self.args.norm_eps)

    def head(self, h):
        """The lm_head alone: hidden [N, hidden] -> logits [N, vocab] (tied: the embedding's weight)."""
        return F.linear(h, self.embed.weight) if self.lm_head is None else self.lm_head.forward(h)


def partial_rotary_rows(args):
    """The q|k|v row order that puts a partial rotary's pairs at (i, i + head_dim / 2) in every q and k head
    (Hugging Face rotates dims i and i + r / 2 of the first r = rotary_dim; the rest pass through), so that
    whole-head RoPE with zero frequencies past r / 2 (layers.rope_inv_freq) computes the same thing; q . k is
    the same under one reordering of both, and v is left as it is."""
    D, r = args.head_dim, args.rotary_dim
    half, rest = r // 2, (D - r) // 2
    head = torch.cat((torch.arange(half), r + torch.arange(rest), half + torch.arange(half), r + rest + torch.arange(rest)))
    qk = args.num_heads + args.num_kv_heads
    order = torch.cat([h * D + head for h in range(qk)])
    return torch.cat((order, qk * D + torch.arange(args.kv_size)))


def llama_state_dict(hf, args):
    """Our parameter names from a Hugging Face Llama/Qwen2/Qwen3 state dict (q|k|v and gate|up fused)."""
    # Gemma's and Qwen3-Next's x * (1 + w), as a plain RMSNorm weight
    norm = (lambda w: w + 1) if args.gemma or args.norm_offset else (lambda w: w)
    out = {"embed.weight": hf["model.embed_tokens.weight"], "norm": norm(hf["model.norm.weight"])}
    if not args.tie_word_embeddings:
        out["lm_head.weight"] = hf["lm_head.weight"]
    for i in range(args.num_layers):
        p = f"model.layers.{i}."
        o = f"layers.{i}."
        out[o + "input_norm"] = norm(hf[p + "input_layernorm.weight"])
        if args.gemma:   # four norms: around the attention and around the MLP
            out[o + "post_attn_norm"] = norm(hf[p + "post_attention_layernorm.weight"])
            out[o + "post_norm"] = norm(hf[p + "pre_feedforward_layernorm.weight"])
            out[o + "post_mlp_norm"] = norm(hf[p + "post_feedforward_layernorm.weight"])
        else:
            out[o + "post_norm"] = norm(hf[p + "post_attention_layernorm.weight"])
        if args.is_linear_layer(i):
            interleaved = p + "linear_attn.in_proj_qkvz.weight" in hf   # Qwen3-Next's layout (else Qwen3.5's)
            out.update({o + "linear_attn." + k: v for k, v in
                        delta_net_state_dict(hf, p + "linear_attn.", args, interleaved).items()})
        else:
            _attention_state_dict(hf, p, o, args, norm, out)
        if args.is_moe_layer(i):
            out.update({o + "moe." + k: v for k, v in moe_state_dict(hf, p + "mlp.", args).items()})
            continue
        fused = FAMILIES[args.family].fused_weights
        out[o + "gate_up.weight"] = hf[p + "mlp.gate_up_proj.weight"] if fused else \
            torch.cat([hf[p + "mlp.gate_proj.weight"], hf[p + "mlp.up_proj.weight"]])
        out[o + "down.weight"] = hf[p + "mlp.down_proj.weight"]
        if args.mlp_bias:
            out[o + "gate_up.bias"] = torch.cat([hf[p + "mlp.gate_proj.bias"], hf[p + "mlp.up_proj.bias"]])
            out[o + "down.bias"] = hf[p + "mlp.down_proj.bias"]
    return out


def _attention_state_dict(hf, p, o, args, norm, out):
    """An attention layer's q|k|v (its rows reordered for a partial rotary), o, their biases and q/k norms; a gated
    attention's q_proj holds each head's q rows then its gate rows (Qwen3-Next): split into q and the gate."""
    fused = FAMILIES[args.family].fused_weights   # Phi-3 stores q|k|v and gate|up fused, in our order
    if fused:
        out[o + "qkv.weight"] = hf[p + "self_attn.qkv_proj.weight"]
    else:
        q = hf[p + "self_attn.q_proj.weight"]
        if args.attn_gate:
            q, gate = q.view(args.num_heads, 2, args.head_dim, -1).unbind(1)
            q = q.reshape(args.q_size, -1)
            out[o + "attn_gate.weight"] = gate.reshape(args.q_size, -1)
        out[o + "qkv.weight"] = torch.cat([q] + [hf[p + f"self_attn.{n}_proj.weight"] for n in "kv"])
    if args.qkv_bias:
        out[o + "qkv.bias"] = torch.cat([hf[p + f"self_attn.{n}_proj.bias"] for n in "qkv"])
    if args.rotary_dim:
        rows = partial_rotary_rows(args)
        out[o + "qkv.weight"] = out[o + "qkv.weight"][rows]
        if args.qkv_bias:
            out[o + "qkv.bias"] = out[o + "qkv.bias"][rows]
    out[o + "o.weight"] = hf[p + "self_attn.o_proj.weight"]
    if args.o_bias:
        out[o + "o.bias"] = hf[p + "self_attn.o_proj.bias"]
    if args.qk_norm:   # (with a partial rotary, each head's dims reordered as its rows are: partial_rotary_rows)
        head = partial_rotary_rows(args)[:args.head_dim] if args.rotary_dim else slice(None)
        out[o + "q_norm"] = norm(hf[p + "self_attn.q_norm.weight"])[head]
        out[o + "k_norm"] = norm(hf[p + "self_attn.k_norm.weight"])[head]
    if args.qk_norm_full:
        out[o + "q_width_norm"] = hf[p + "self_attn.q_norm.weight"]
        out[o + "k_width_norm"] = hf[p + "self_attn.k_norm.weight"]
