"""A mixture-of-experts MLP (Qwen3-MoE, Qwen2-MoE, Mixtral, OLMoE): a router picks each row's top-k experts, the
step's rows are grouped by expert and each expert's linears run once over its rows (one weight read per expert per
step), the outputs weighted and summed per row; a shared expert, where the family has one, runs over every row
under its sigmoid gate.

    moe = MoE(args)                       # moe.router, moe.experts[e].gate_up / .down, moe.shared, moe.shared_gate
    out = moe(h, ops)                     # h [T, hidden] -> [T, hidden]

The routing is Hugging Face's: softmax over all experts in fp32, the top k, renormalized to sum 1 when the config
says so (Mixtral always), the weights cast to the hidden dtype. A row's expert outputs are summed in ascending
expert order (Hugging Face's; on the block kernels' one call and the loop), or in its picks' order (the grouped
matmul: deterministic on a GPU). An expert's linears are any of the model's linears (nn.Linear, or the block
kernels' on a file's blocks), so a row's result does not depend on which other rows picked the same expert beyond
the kernels' own row-count paths.
"""
import torch
from torch import nn

from rosefast.kernels import quant_ops


class Expert(nn.Module):
    """One expert's SwiGLU MLP: fused gate|up, then down."""
    stacked_linears = True   # left dense (not packed for oneDNN): MoE.plan stacks every expert's weights

    def __init__(self, hidden, width):
        super().__init__()
        self.gate_up = nn.Linear(hidden, 2 * width, bias=False)
        self.down = nn.Linear(width, hidden, bias=False)

    def forward(self, h, ops):
        return self.down.forward(ops.silu_mul(self.gate_up.forward(h)))


def route(logits, top_k, renormalize):
    """(weights [T, k] fp32, experts [T, k]) of router logits [T, E]: the top k of the softmax over all
    experts, renormalized to sum 1 when asked."""
    probs = torch.softmax(logits.float(), dim=-1)
    weights, experts = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, experts


def expert_groups(experts, num_experts):
    """The step's (row, slot) picks grouped by expert: (order [T*k] of the flattened picks sorted by expert, stably,
    so each group keeps its rows ascending; counts [E] of each expert's picks). No host sync (a GPU step's graph
    holds it)."""
    flat = experts.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)
    return order, counts.scatter_add_(0, flat, torch.ones_like(flat))


def _grouped_mm_runs(device, dtype):
    """Whether torch's grouped matmul runs here (a GPU's needs sm90 and bf16; a CPU's any float)."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    try:
        x, w = torch.zeros(2, 16, dtype=dtype, device=device), torch.zeros(2, 16, 16, dtype=dtype, device=device)
        torch._grouped_mm(x, w, offs=torch.tensor([1, 2], dtype=torch.int32, device=device))
        return True
    except (RuntimeError, NotImplementedError):
        return False


class MoE(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.num_experts, self.top_k, self.renormalize = args.num_experts, args.experts_per_token, args.norm_topk_prob
        self.router = nn.Linear(args.hidden_size, args.num_experts, bias=False)
        self.experts = nn.ModuleList(Expert(args.hidden_size, args.expert_size) for _ in range(args.num_experts))
        if args.shared_expert_size:   # Qwen2-MoE style: one more expert over every row, under a sigmoid gate
            self.shared = Expert(args.hidden_size, args.shared_expert_size)
            self.shared_gate = nn.Linear(args.hidden_size, 1, bias=False)
        self.grouped = None   # (a block-kernel tier, its ExpertWeights): the routed experts in one call (plan)
        self.stacked = None   # (gate|up [E, 2I, H], down [E, H, I]): every expert's dense weights in one tensor

    def plan(self):
        """How the routed experts run, once the model is built: in one call on the block kernels (Tier.experts,
        csrc/quant_experts.h: the loop's numbers) when every expert's linears are on one compiled tier of them; as
        torch's grouped matmul over their weights stacked (each expert's weight a view of the stack) when they are
        dense and the op runs on their device — no host sync, so a GPU's decode graphs hold it; else ("loop") one
        expert at a time. Returns which: "one call", "grouped" or "loop"."""
        linears = [linear for e in self.experts for linear in (e.gate_up, e.down)]
        tiers = {id(getattr(linear, "kernels", None)) for linear in linears}
        tier = getattr(linears[0], "kernels", None)
        self.grouped = self.stacked = None
        if len(tiers) == 1 and hasattr(tier, "experts") and all(hasattr(x, "weights") for x in linears):
            self.grouped = (tier, quant_ops.impl.ExpertWeights([e.gate_up.weights for e in self.experts],
                                                               [e.down.weights for e in self.experts]))
            return "one call"
        first = linears[0].weight if type(linears[0]) is nn.Linear else None
        if first is None or not all(type(x) is nn.Linear and x.bias is None for x in linears) or \
                not _grouped_mm_runs(first.device, first.dtype):
            return "loop"
        stacks = []
        for name in ("gate_up", "down"):
            stack = torch.stack([getattr(e, name).weight.detach() for e in self.experts])
            for e, expert in enumerate(self.experts):
                getattr(expert, name).weight = nn.Parameter(stack[e], requires_grad=False)
            stacks.append(stack)
        self.stacked = tuple(stacks)
        return "grouped"

    def forward(self, h, ops):
        """h [T, hidden] -> the weighted sum of each row's experts' outputs [T, hidden] (h's dtype)."""
        weights, experts = route(self.router.forward(h), self.top_k, self.renormalize)
        weights = weights.to(h.dtype).reshape(-1)                                       # [T*k]
        order, counts = expert_groups(experts, self.num_experts)
        if self.grouped is not None:
            tier, grouped = self.grouped
            out = tier.experts(h.contiguous(), grouped, order, counts, weights, self.top_k, quant_ops.step.sequences)
        elif self.stacked is not None:
            out = self._grouped_mm(h, ops, order, counts, weights)
        else:
            out = self._loop(h, ops, order, counts, weights)
        if hasattr(self, "shared"):
            gate = torch.sigmoid(self.shared_gate.forward(h))                           # [T, 1]
            out += gate * self.shared(h, ops)
        return out

    def _grouped_mm(self, h, ops, order, counts, weights):
        """Every expert's rows in two grouped matmuls over the stacked weights; each row's k outputs, weighted,
        summed in its picks' order (deterministic on a GPU, where index_add_ adds in any order)."""
        gate_up, down = self.stacked
        offsets = counts.cumsum(0).to(torch.int32)
        rows = order // self.top_k
        y = torch._grouped_mm(ops.silu_mul(torch._grouped_mm(h.index_select(0, rows), gate_up.transpose(1, 2),
                                                             offs=offsets)), down.transpose(1, 2), offs=offsets)
        picks = torch.empty_like(y).index_copy_(0, order, y)                         # [T*k, H] in (row, slot) order
        return (picks.view(h.shape[0], self.top_k, -1) * weights.view(-1, self.top_k, 1)).sum(1)

    def _loop(self, h, ops, order, counts, weights):
        """Each expert with picks over its rows, each output times its pick's weight added into its row."""
        rows_of = order // self.top_k                                                   # each pick's row
        out = torch.zeros_like(h)
        start = 0
        for e, count in enumerate(counts.tolist()):
            if count:
                picks = order[start:start + count]
                rows = rows_of[start:start + count]
                y = self.experts[e](h.index_select(0, rows), ops)
                out.index_add_(0, rows, y * weights[picks, None])
                start += count
        return out


def moe_state_dict(hf, prefix, args):
    """Our names (relative to the layer's `moe.`) from a Hugging Face layer's `mlp.` tensors: the router (`gate`),
    the experts as transformers 5 holds them (3-D `experts.gate_up_proj` [E, 2I, H], `experts.down_proj`
    [E, H, I]) or as checkpoints store them (`experts.{e}.{gate,up,down}_proj.weight`), the shared expert and its
    gate."""
    out = {"router.weight": hf[prefix + "gate.weight"]}
    fused = hf.get(prefix + "experts.gate_up_proj")
    for e in range(args.num_experts):
        if fused is not None:
            out[f"experts.{e}.gate_up.weight"] = fused[e]
            out[f"experts.{e}.down.weight"] = hf[prefix + "experts.down_proj"][e]
        else:
            p = f"{prefix}experts.{e}."
            out[f"experts.{e}.gate_up.weight"] = torch.cat([hf[p + "gate_proj.weight"], hf[p + "up_proj.weight"]])
            out[f"experts.{e}.down.weight"] = hf[p + "down_proj.weight"]
    if args.shared_expert_size:
        p = prefix + "shared_expert."
        out["shared.gate_up.weight"] = torch.cat([hf[p + "gate_proj.weight"], hf[p + "up_proj.weight"]])
        out["shared.down.weight"] = hf[p + "down_proj.weight"]
        out["shared_gate.weight"] = hf[prefix + "shared_expert_gate.weight"]
    return out


def expert_linears(args):
    """The paths (within a layer) of an MoE layer's linears the block kernels may run: each expert's, the shared
    expert's (the router and the shared gate stay dense: llama.cpp's quantizer leaves them F32 too)."""
    names = [f"moe.experts.{e}.{n}" for e in range(args.num_experts) for n in ("gate_up", "down")]
    if args.shared_expert_size:
        names += ["moe.shared.gate_up", "moe.shared.down"]
    return names
