"""Mixtures of experts (rosefast.models.moe): a step's rows grouped by expert give each row what its own experts
give it, whatever its neighbours picked; the families' logits against Hugging Face's are tests/test_model_runner.py's
and tests/test_gguf_families.py's."""
import pytest
import torch
from gguf import GGMLQuantizationType as T

from rosefast.errors import ModelError
from rosefast.models.moe import MoE, expert_groups, route
from rosefast.sources import tiny_random
from rosefast.sources.resolve import resolve_model
from tests.gguf_writer import write_gguf
from tests.paged import run_ours
from tests.test_model_runner import runner_for


class _Ops:
    @staticmethod
    def silu_mul(x):
        gate, up = x.chunk(2, dim=-1)
        return torch.nn.functional.silu(gate) * up


def _moe(shared=0, renormalize=True, seed=0):
    from types import SimpleNamespace

    args = SimpleNamespace(hidden_size=32, num_experts=6, experts_per_token=2, expert_size=16,
                           norm_topk_prob=renormalize, shared_expert_size=shared)
    torch.manual_seed(seed)
    moe = MoE(args)
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return moe


def _one_row_at_a_time(moe, h, experts, weights):
    """Each row alone: the weighted sum of its own experts' outputs, in ascending expert order."""
    out = torch.zeros_like(h)
    for t in range(h.shape[0]):
        for e, w in sorted(zip(experts[t].tolist(), weights[t])):
            out[t] += w * moe.experts[e](h[t:t + 1], _Ops)[0]
        if hasattr(moe, "shared"):
            out[t] += torch.sigmoid(moe.shared_gate(h[t:t + 1]))[0] * moe.shared(h[t:t + 1], _Ops)[0]
    return out


@pytest.mark.parametrize("picks", ["one expert for every row", "every expert", "some experts none"])
@pytest.mark.parametrize("shared", [0, 16])
def test_grouped_rows_give_each_row_what_its_own_experts_give_it(picks, shared):
    moe = _moe(shared)
    h = torch.randn(7, 32)
    with torch.no_grad():
        if picks == "one expert for every row":   # the router made to prefer experts 4 then 1 for all rows
            moe.router.weight.zero_()
            moe.router.weight[4, 0], moe.router.weight[1, 0] = 3.0, 2.0
            h[:, 0] = 1.0
        elif picks == "some experts none":        # experts 0 and 3 never win
            h[:, 0] = 1.0
            moe.router.weight[[0, 3], 0] = -100.0
        weights, experts = route(moe.router(h), 2, True)
        _, counts = expert_groups(experts, 6)
        got = moe(h, _Ops)
    if picks == "one expert for every row":
        assert counts.tolist() == [0, 7, 0, 0, 7, 0]
    elif picks == "every expert":
        assert (counts > 0).all()
    else:
        assert (counts == 0).any() and (counts > 0).sum() >= 2
    torch.testing.assert_close(got, _one_row_at_a_time(moe, h, experts, weights.tolist()), atol=1e-5, rtol=1e-5)


def test_expert_groups_keep_each_experts_rows_in_order():
    experts = torch.tensor([[2, 0], [0, 2], [1, 2], [2, 1]])        # rows 0..3, top-2
    order, counts = expert_groups(experts, 4)
    assert counts.tolist() == [2, 2, 4, 0]
    rows = (order // 2).tolist()
    assert rows == [0, 1, 2, 3, 0, 1, 2, 3]                          # expert 0's rows, then 1's, then 2's
    assert experts.reshape(-1)[order].tolist() == [0, 0, 1, 1, 2, 2, 2, 2]


@pytest.mark.parametrize("renormalize", [True, False])
def test_routing_takes_the_top_k_of_the_softmax_over_every_expert(renormalize):
    logits = torch.tensor([[1.0, 3.0, 2.0, -1.0]])
    weights, experts = route(logits, 2, renormalize)
    probs = torch.softmax(logits, -1)[0]
    assert experts.tolist() == [[1, 2]]
    want = probs[[1, 2]] / (probs[[1, 2]].sum() if renormalize else 1)
    torch.testing.assert_close(weights[0], want)


def test_a_sequences_logits_do_not_depend_on_what_its_neighbours_route_to(default_model):
    """Prefill and decode of one prompt alone and beside two others that pick other experts: its logits agree
    to fp32 rounding, and so do its greedy tokens."""
    runner = runner_for(tiny_random("qwen2_moe"))
    prompts = [[17, 923, 4410, 88, 1024, 3], [5000, 5001, 77, 12], [31000, 2, 9, 401, 8, 8, 15, 33]]
    alone = run_ours(runner, prompts[:1], 6)[0]
    beside = run_ours(runner, prompts, 6)[0]
    for a, b in zip(alone, beside):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    assert [int(x[-1].argmax()) for x in alone] == [int(x[-1].argmax()) for x in beside]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_grouped_matmul_gives_the_loops_logits(default_model, dtype):
    """Dense experts (a directory in fp32 or bf16) run as torch's grouped matmul over their stacked weights; the
    same steps one expert at a time give the same logits, to the sums' order (and greedy tokens in fp32)."""
    runner = runner_for(tiny_random("qwen2_moe"), dtype=dtype)
    layers = runner.model.layers
    assert all(layer.moe.stacked is not None for layer in layers)
    assert layers[0].moe.experts[3].down.weight.data_ptr() == layers[0].moe.stacked[1][3].data_ptr()   # a view
    prompts = [[17, 923, 4410, 88, 1024, 3], [5000, 5001, 77, 12], [31000, 2, 9, 401, 8, 8, 15, 33]]
    grouped = run_ours(runner, prompts, 4)
    for layer in layers:
        layer.moe.stacked = None
    loop = run_ours(runner, prompts, 4, next_tokens=[[int(x[-1].argmax()) for x in g[:-1]] for g in grouped])
    tol = 1e-5 if dtype == "float32" else 0.1
    for a, b in zip(grouped, loop):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, atol=tol, rtol=0)


def test_the_one_call_decode_plan_refuses_expert_layers_by_name(tmp_path, default_model):
    """A file served from its blocks: the dense layers would take the one-call plan; the expert layers are
    named as the reason they run per op."""
    model = tiny_random("qwen3_moe", mlp_only_layers=[])
    path = tmp_path / "q8_0.gguf"
    write_gguf(path, model, lambda name: T.Q8_0)
    served = runner_for(resolve_model(str(path)), quantization="auto").model
    assert served.decode_plans is None
    assert "moe" in served.plan_decode_layers()


def test_a_file_larger_than_the_memory_is_refused_naming_both_sizes(tmp_path):
    from rosefast.sources.memory import available_bytes

    path = tmp_path / "huge.Q4_K_M.gguf"
    with open(path, "wb") as f:   # sparse: no disk taken
        f.write(b"GGUF")
        f.truncate(available_bytes() + 10**9)
    with pytest.raises(ModelError, match=r"huge.Q4_K_M.gguf' is \d+\.\d GB, more than the \d+\.\d GB of memory"):
        resolve_model(str(path))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_experts_one_call_gives_the_per_op_loops_numbers(tmp_path, default_model, dtype):
    """A file served from its blocks (Q4_K experts, 256 wide): the routed experts in one call on the block
    kernels (csrc/quant_experts.h) and the per-op loop over each expert give the same logits, bit for bit, over
    a packed prefill (of 2,236 picks: two passes of whole experts) and decode steps."""
    from rosefast.kernels import quant_ops

    if quant_ops.pick("auto") is None:
        pytest.skip("torch's ops in force (the pure-Python flavour, or ROSEFAST_CPU_KERNELS=torch): no tier")
    model = tiny_random("qwen2_moe", hidden_size=256, intermediate_size=256, moe_intermediate_size=256,
                        shared_expert_intermediate_size=256, max_position_embeddings=2048)
    path = tmp_path / "q4_k.gguf"
    write_gguf(path, model, lambda name: T.Q4_K)
    runner = runner_for(resolve_model(str(path)), quantization="auto", dtype=dtype)
    layers = runner.model.layers
    assert all(layer.moe.grouped is not None for layer in layers)
    prompts = [[17, 923, 4410, 88, 1024, 3], [5000, 5001, 77, 12], [(i * 7919) % 30000 + 5 for i in range(1100)]]
    grouped = run_ours(runner, prompts, 4)
    for layer in layers:
        layer.moe.grouped = None
    loop = run_ours(runner, prompts, 4)
    for a, b in zip(grouped, loop):
        for x, y in zip(a, b):
            assert torch.equal(x, y)


def test_the_experts_twin_computes_what_the_compiled_call_does():
    """_quant_ops_py.experts (torch) against the compiled Tier.experts on the same tiles: the same integers, the
    float sums in another order."""
    from rosefast.kernels import _quant_ops_py, quant_ops
    from tests.test_kquants import _tiles

    if quant_ops.pick("auto") is None:
        pytest.skip("torch's ops in force (the pure-Python flavour, or ROSEFAST_CPU_KERNELS=torch): no tier")
    gen = torch.Generator().manual_seed(3)
    E, H, I, rows, k = 5, 256, 256, 6, 2
    gate_up = [[_tiles(T.Q4_K, 2 * I, H, seed=e)] for e in range(E)]
    down = [[_tiles(T.Q6_K, H, I, seed=10 + e)] for e in range(E)]
    x = torch.randn(rows, H, generator=gen)
    experts = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(rows)])
    route_w = torch.rand(rows * k, generator=gen)
    order, counts = expert_groups(experts, E)
    tier = quant_ops.pick("auto")
    compiled = tier.experts(x, quant_ops.impl.ExpertWeights(
        [quant_ops.impl.Weights(p, None, H) for p in gate_up], [quant_ops.impl.Weights(p, None, I) for p in down]),
        order, counts, route_w, k)
    twin = _quant_ops_py.experts(x, _quant_ops_py.ExpertWeights(
        [_quant_ops_py.Weights(p, None, H) for p in gate_up], [_quant_ops_py.Weights(p, None, I) for p in down]),
        order, counts, route_w, k, tier.digits)
    # the activation's exp differs in its last bits (a polynomial in C, torch's own here); the down linear's
    # digits then may round apart: a step of the largest input's 1/508 at most
    assert (compiled - twin).abs().max() <= 2e-3 * twin.abs().max()
    assert (twin != 0).any(dim=1).all()
    with pytest.raises(ValueError, match="order must be 12 contiguous"):
        tier.experts(x, quant_ops.impl.ExpertWeights(
            [quant_ops.impl.Weights(p, None, H) for p in gate_up], [quant_ops.impl.Weights(p, None, I) for p in down]),
            order[:5], counts, route_w, k)


def test_a_mixtral_gguf_as_llama_cpp_writes_it_is_refused_by_name(tmp_path, default_model):
    """llama.cpp writes Mixtral under the `llama` architecture with its experts: not served from a GGUF yet, and
    said so (not a Llama without its MLP, nor a stack trace)."""
    path = tmp_path / "mixtral.gguf"
    write_gguf(path, tiny_random("mixtral"), lambda name: T.F32)
    with pytest.raises(ModelError, match=r"Mixtral as llama.cpp writes it \(`llama` with 8 experts"):
        resolve_model(str(path))
