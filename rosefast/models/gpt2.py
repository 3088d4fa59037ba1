"""GPT-2 on the paged KV cache: learned positions, LayerNorm, fused qkv, tanh-GELU, tied lm_head."""
import torch.nn.functional as F
from torch import nn

from rosefast.kernels import layer_ops
from rosefast.models.layers import attention, embedding


class GPT2Layer(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.args = args
        d = args.hidden_size
        self.ln_1 = nn.LayerNorm(d, eps=args.norm_eps)
        self.qkv = nn.Linear(d, 3 * d)
        self.o = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d, eps=args.norm_eps)
        self.fc = nn.Linear(d, args.intermediate_size)
        self.proj = nn.Linear(args.intermediate_size, d)
        self.scale = args.head_dim ** -0.5

    def forward(self, x, meta, k_cache, v_cache, ops):
        a = self.args
        qkv = self.qkv(self.ln_1(x))                                                 # [T, 3*H*D]
        ops.store_kv(qkv, a.num_heads, a.num_heads, meta.slot_mapping, k_cache, v_cache)
        x = x + self.o(attention(qkv, a.num_heads, a.num_heads, k_cache, v_cache, meta, self.scale, ops))
        return x + self.proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT2Model(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.args = args
        self.wte = embedding(args.vocab_size, args.hidden_size)
        self.wpe = embedding(args.max_position_embeddings, args.hidden_size)
        self.layers = nn.ModuleList(GPT2Layer(args) for _ in range(args.num_layers))
        self.ln_f = nn.LayerNorm(args.hidden_size, eps=args.norm_eps)

    def forward(self, input_ids, positions, meta, kv_caches):
        x = self.wte(input_ids) + self.wpe(positions)
        ops = layer_ops.for_tensor(x)
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches):
            x = layer(x, meta, k_cache, v_cache, ops)
        return x

    def logits(self, hidden):
        return F.linear(self.final_norm(hidden), self.wte.weight)

    def final_norm(self, hidden):
        return self.ln_f(hidden)


def gpt2_state_dict(hf, args):
    """Our names from a Hugging Face GPT-2 state dict (its Conv1D weights are [in, out]: transposed)."""
    pre = "transformer." if "transformer.wte.weight" in hf else ""
    out = {"wte.weight": hf[pre + "wte.weight"], "wpe.weight": hf[pre + "wpe.weight"],
           "ln_f.weight": hf[pre + "ln_f.weight"], "ln_f.bias": hf[pre + "ln_f.bias"]}
    names = {"ln_1": "ln_1", "ln_2": "ln_2", "attn.c_attn": "qkv", "attn.c_proj": "o", "mlp.c_fc": "fc",
             "mlp.c_proj": "proj"}
    for i in range(args.num_layers):
        for theirs, ours in names.items():
            w = hf[f"{pre}h.{i}.{theirs}.weight"]
            out[f"layers.{i}.{ours}.weight"] = w if theirs.startswith("ln") else w.t().contiguous()
            out[f"layers.{i}.{ours}.bias"] = hf[f"{pre}h.{i}.{theirs}.bias"]
    return out
