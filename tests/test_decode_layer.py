"""A Llama layer's decode step as one call (rosefast.kernels.decode_layer) gives the per-op path's bits."""
import pytest
import torch

from rosefast.engine.llm_engine import LLMEngine
from rosefast.kernels import _decode_layer_py, decode_layer, quant_ops
from rosefast.sources.tiny import tiny_random
from tests.paged import run_ours

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9] * 7, [42]]

# the compiled flavour has a plan on every CPU (its block kernels' portable tier at least); that the build is
# compiled when promised is test_build's to check
compiled = decode_layer.impl is not _decode_layer_py
needs = pytest.mark.skipif(not compiled, reason="the one-call-per-layer plan is the compiled flavour's")
TIERS = quant_ops.impl.tiers() if compiled else []


def _engine(model, dtype, quantization="int4", kernels="auto", activations="two-digit"):
    return LLMEngine(model=model, dtype=dtype, device="cpu", kv_cache_tokens=1024, quantization=quantization,
                     quantize_lm_head="int8", cpu_kernels=kernels, activations=activations)


def _decode_logits(runner):
    """Decode steps' logits (greedy, 5 steps after a packed prefill), from a fresh cache state."""
    return [step for seq in run_ours(runner, PROMPTS, 5) for step in seq[1:]]


@needs
@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("variant", ["llama", "qkv-bias", "mistral-window", "qwen3-qk-norm", "gemma3"])
def test_one_call_per_layer_gives_the_per_op_paths_bits(dtype, variant, tier):
    model = {"llama": lambda: tiny_random("llama"), "qkv-bias": lambda: tiny_random("llama", attention_bias=True),
             "mistral-window": lambda: tiny_random("mistral", sliding_window=8),   # a window the 21-token
             # prompt and its decode steps cross (the layers' own window pool)
             "qwen3-qk-norm": lambda: tiny_random("qwen3"),   # per-head q/k norms, head_dim 32 of 64
             # four norms a layer, tanh-GELU, a local layer on a window of 8 with its own RoPE beside a global one
             "gemma3": lambda: tiny_random("gemma3_text", sliding_window=8)}[variant]()
    runner = _engine(model, dtype, kernels=tier).runner
    plans = runner.model.decode_plans
    assert plans is not None and all(type(p) is decode_layer.impl.LayerPlan for p in plans)
    assert runner.model.layers[0].qkv.kernels.name == tier
    fused = _decode_logits(runner)
    runner.model.decode_plans = [_decode_layer_py.LayerPlan(layer) for layer in runner.model.layers]   # the twin
    per_op = _decode_logits(runner)
    runner.model.decode_plans = None                                                                    # no plans
    plain = _decode_logits(runner)
    assert len(fused) == 15
    assert all(torch.equal(a, b) and torch.equal(a, c) for a, b, c in zip(fused, per_op, plain))


@needs
@pytest.mark.parametrize("tier", TIERS)
def test_one_digit_activations_reach_the_one_call_plan(tier, tiny_llama):
    """ROSEFAST_ACTIVATIONS=one-digit: every linear, the plan's included, on the tier's one-digit numbers — the plan
    gives the per-op path's bits, and they are not the two digits' logits."""
    runner = _engine(tiny_llama, "float32", kernels=tier, activations="one-digit").runner
    assert runner.model.layers[0].qkv.kernels.digits == 1 and runner.model.decode_plans is not None
    fused = _decode_logits(runner)
    runner.model.decode_plans = None
    per_op = _decode_logits(runner)
    assert all(torch.equal(a, b) for a, b in zip(fused, per_op))
    two = _decode_logits(_engine(tiny_llama, "float32", kernels=tier).runner)
    assert not any(torch.equal(a, b) for a, b in zip(fused, two))


@needs
def test_only_block_kernel_layers_get_a_plan_and_bad_inputs_are_named(tiny_llama):
    assert _engine(tiny_llama, "float32", quantization="none").runner.model.decode_plans is None
    assert _engine(tiny_llama, "float32", kernels="torch").runner.model.decode_plans is None   # torch's ops
    runner = _engine(tiny_llama, "float32", kernels=TIERS[-1]).runner   # any compiled tier (the portable one)
    plan, layer = runner.model.decode_plans[0], runner.model.layers[0]
    assert not _decode_layer_py.fits(layer) and decode_layer.impl.fits(layer)
    k, v = runner.kv.layers[0]
    with pytest.raises(ValueError, match=r"x must be \[B, "):
        plan(torch.zeros(1, layer.args.hidden_size + 1), None, None, k, v)


@needs
def test_a_layer_with_parts_the_plan_does_not_implement_is_refused_by_name(tiny_llama):
    """A layer part the one-call plan does not know (here a norm added to a Llama layer) refuses the plan, naming
    it, and decode runs per op (with it) on the same block kernels; never a plan that would skip it. Every family's
    own parts are planned (Gemma 3's four norms among them)."""
    model = _engine(tiny_llama, "float32", kernels=TIERS[-1]).runner.model
    assert model.decode_plans is not None
    model.layers[0].register_parameter("extra_norm", torch.nn.Parameter(torch.ones(model.args.hidden_size)))
    assert decode_layer.impl.fits(model.layers[0])   # its linears alone would fit
    assert model.plan_decode_layers() == "the one-call plan does not implement this layer's extra_norm"
    assert model.decode_plans is None
    for family in ("llama", "qwen3", "gemma3_text"):
        layer = _engine(tiny_random(family), "float32", kernels=TIERS[-1]).runner.model.layers[0]
        assert decode_layer.unplanned(layer) == []
