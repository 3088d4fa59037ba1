"""The compiled layer kernels against their torch twin, op by op, and the whole model on each flavour."""
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rosefast.engine.kv_cache import KVCache
from rosefast.kernels import _layer_ops_py as twin
from rosefast.kernels import layer_ops
from rosefast.models.layers import AttentionMetadata
from tests.conftest import REQUIRE_EXTENSIONS


@pytest.fixture(scope="module")
def compiled():
    try:
        return importlib.import_module("rosefast.kernels._layer_ops_c")
    except ImportError as e:
        if REQUIRE_EXTENSIONS:
            raise
        pytest.skip(f"compiled kernels not built: {e}")


DTYPES = [torch.float32, torch.bfloat16]
# (query heads, kv heads, head dim): SmolLM2's GQA 3, MHA, odd head dim (portable C path), G > 4 and
# D = 80 (AVX-512 path in head and dim chunks), a single kv head
SHAPES = [(9, 3, 64), (8, 8, 32), (10, 2, 24), (12, 2, 128), (6, 1, 80)]


def close(a, b, dtype):
    """fp32: to rounding; bf16: within a couple of bf16 steps of the value's size (each side rounds its way)."""
    a, b = a.float(), b.float()
    if dtype is torch.float32:
        return torch.allclose(a, b, atol=2e-5, rtol=1e-5)
    return torch.allclose(a, b, atol=2e-2, rtol=2e-2)


def gen(seed):
    return torch.Generator().manual_seed(seed)


def pools(hkv, blocks, block_size, D, dtype, seed=0):
    """One layer's K and V pools of a real KVCache (the twin gathers into its workspace), random content."""
    args = type("Args", (), {"num_layers": 1, "num_kv_heads": hkv, "head_dim": D, "linear_layers": ()})
    kv = KVCache(args, blocks, block_size, dtype, torch.device("cpu"))
    k, v = kv.layers[0]
    k.copy_(torch.randn(k.shape, generator=gen(seed)))
    v.copy_(torch.randn(v.shape, generator=gen(seed + 1)))
    return k, v


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_with_and_without_residual(compiled, dtype):
    x = torch.randn(5, 576, generator=gen(0)).to(dtype)
    r = torch.randn(5, 576, generator=gen(1)).to(dtype)
    w = torch.randn(576, generator=gen(2)).to(dtype)
    assert close(compiled.rms_norm(x, w, 1e-5), twin.rms_norm(x, w, 1e-5), dtype)
    xc, xt = x.clone(), x.clone()
    out_c, out_t = compiled.rms_norm(xc, w, 1e-5, r), twin.rms_norm(xt, w, 1e-5, r)
    assert torch.equal(xc, xt) and torch.equal(xc, x + r)   # the residual stream is updated in place
    assert close(out_c, out_t, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ["silu_mul", "gelu_tanh_mul"])
def test_gated_activations(compiled, dtype, act):
    gate_up = (torch.randn(7, 2 * 96, generator=gen(3)) * 4).to(dtype)
    gate_up[0, :6] = torch.tensor([-100.0, -20.0, -3.0, 0.0, 5.0, 30.0])   # far tails of the exp (GELU: of x^3)
    assert close(getattr(compiled, act)(gate_up), getattr(twin, act)(gate_up), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rope", [True, False])
@pytest.mark.parametrize("heads", SHAPES[:3])
def test_store_kv_rotates_and_writes_only_its_slots(compiled, dtype, rope, heads):
    H, Hkv, D = heads
    T = 6
    qkv = torch.randn(T, (H + 2 * Hkv) * D, generator=gen(4)).to(dtype)
    slots = torch.randperm(10 * 4, generator=gen(5))[:T]
    cos, sin = (torch.randn(T, D, generator=gen(6)).to(dtype), torch.randn(T, D, generator=gen(7)).to(dtype)) \
        if rope else (None, None)
    kc, vc = pools(Hkv, 10, 4, D, dtype)
    kt, vt = kc.clone(), vc.clone()
    qc, qt = qkv.clone(), qkv.clone()
    compiled.store_kv(qc, H, Hkv, slots, kc, vc, cos, sin)
    twin.store_kv(qt, H, Hkv, slots, kt, vt, cos, sin)
    assert close(qc, qt, dtype)
    assert close(kc, kt, dtype) and torch.equal(vc, vt)
    untouched = torch.ones(kc.view(Hkv, -1, D).shape[1], dtype=torch.bool)
    untouched[slots] = False
    before, _ = pools(Hkv, 10, 4, D, dtype)
    assert torch.equal(kc.view(Hkv, -1, D)[:, untouched], before.view(Hkv, -1, D)[:, untouched])


def decode_case(H, Hkv, D, dtype, lens, block_size=4, seed=0):
    """A batch with the given context lengths, its blocks shuffled over the pool, tables padded to scratch."""
    need = [-(-n // block_size) for n in lens]
    blocks = sum(need) + 3
    kc, vc = pools(Hkv, blocks, block_size, D, dtype, seed)
    order = torch.randperm(blocks, generator=gen(seed + 2)).tolist()
    width = max(need) + 1
    tables, at = [], 0
    for n in need:
        tables.append(order[at:at + n] + [blocks] * (width - n))   # `blocks` is the scratch block
        at += n
    meta = AttentionMetadata(False, None, torch.tensor(tables), context_lens=torch.tensor(lens))
    qkv = torch.randn(len(lens), (H + 2 * Hkv) * D, generator=gen(seed + 3)).to(dtype)
    return qkv, kc, vc, meta


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", SHAPES)
def test_decode_attention_matches_twin(compiled, dtype, heads):
    H, Hkv, D = heads
    lens = [1, 4, 5, 37, 130]    # one token, exactly one block, a block and one, many blocks
    qkv, kc, vc, meta = decode_case(H, Hkv, D, dtype, lens)
    ours = compiled.decode_attention(qkv, H, Hkv, kc, vc, meta, D ** -0.5)
    ref = twin.decode_attention(qkv, H, Hkv, kc, vc, AttentionMetadata(False, None, meta.block_tables,
                                                                       context_lens=meta.context_lens), D ** -0.5)
    assert ours.shape == (len(lens), H * D)
    assert close(ours, ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_attention_over_a_sliding_window_matches_twin(compiled, dtype):
    """Each query sees its sequence's last `window` positions: shorter contexts as before, longer ones not."""
    H, Hkv, D = 8, 2, 32
    lens = [1, 4, 5, 37, 130]
    qkv, kc, vc, meta = decode_case(H, Hkv, D, dtype, lens)
    fresh = lambda: AttentionMetadata(False, None, meta.block_tables, context_lens=meta.context_lens)  # noqa: E731
    ours = compiled.decode_attention(qkv, H, Hkv, kc, vc, fresh(), D ** -0.5, 6)
    ref = twin.decode_attention(qkv, H, Hkv, kc, vc, fresh(), D ** -0.5, 6)
    assert close(ours, ref, dtype)
    whole = twin.decode_attention(qkv, H, Hkv, kc, vc, fresh(), D ** -0.5)
    assert torch.equal(ours[:3], compiled.decode_attention(qkv, H, Hkv, kc, vc, fresh(), D ** -0.5)[:3])
    assert all(not close(ours[i:i + 1], whole[i:i + 1], dtype) for i in (3, 4))   # the window binds there


@pytest.mark.parametrize("forced, kernel", [("avx2", "avx2"), ("scalar", "portable")])
def test_a_forced_tiers_decode_attention_is_its_own_kernel_and_matches_the_twin(compiled, forced, kernel):
    """ROSEFAST_CPU_KERNELS keeps the decode attention to the forced tier's code (avx2: the AVX2 kernel an
    AVX2-only CPU runs, here too; scalar: the portable C): in a process so set, the kernel is that one and this
    file's decode attention tests pass on it (every shape: D = 24 and 80 take the AVX2 kernel, not AVX-512's)."""
    from rosefast.kernels import quant_ops

    if forced not in quant_ops.impl.tiers():
        pytest.skip(f"this CPU does not run the {forced} tier")
    env = {**os.environ, "ROSEFAST_CPU_KERNELS": forced}
    probe = subprocess.run([sys.executable, "-c", "from rosefast.kernels import _layer_ops_c as k; "
                            "print(k.attention_kernel())"], env=env, capture_output=True, text=True, timeout=120)
    assert probe.stdout.strip() == kernel, probe.stderr
    root = Path(__file__).parent.parent
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                          str(Path(__file__).relative_to(root)), "-k", "decode_attention and not forced"],
                         cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and " passed" in run.stdout, run.stdout[-3000:]


def test_decode_attention_large_batch_runs_parallel_and_matches(compiled):
    lens = [int(n) for n in torch.randint(1, 300, (24,), generator=gen(9))]
    qkv, kc, vc, meta = decode_case(9, 3, 64, torch.float32, lens, block_size=16)
    ours = compiled.decode_attention(qkv, 9, 3, kc, vc, meta, 0.125)
    ref = twin.decode_attention(qkv, 9, 3, kc, vc, AttentionMetadata(False, None, meta.block_tables,
                                                                     context_lens=meta.context_lens), 0.125)
    assert close(ours, ref, torch.float32)


def test_bad_tensors_are_refused_with_the_reason(compiled):
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        compiled.rms_norm(x.half(), torch.ones(8).half(), 1e-5)
    with pytest.raises(ValueError, match="contiguous"):
        compiled.rms_norm(torch.randn(8, 2).t(), torch.ones(8), 1e-5)
    with pytest.raises(ValueError, match="weight"):
        compiled.rms_norm(x, torch.ones(8, dtype=torch.bfloat16), 1e-5)
    with pytest.raises(ValueError, match="shapes"):
        compiled.rms_norm(x, torch.ones(7), 1e-5)
    qkv, kc, vc, meta = decode_case(9, 3, 64, torch.float32, [3, 9])
    with pytest.raises(ValueError, match="one row per sequence"):
        meta.context_lens = torch.tensor([3])
        compiled.decode_attention(qkv, 9, 3, kc, vc, meta, 0.125)
    with pytest.raises(ValueError, match="does not fit"):
        compiled.store_kv(qkv, 9, 2, torch.tensor([0, 1]), kc, vc)
    with pytest.raises(ValueError, match="differ"):
        compiled.store_kv(qkv, 9, 3, torch.tensor([0, 1]), kc, vc[:, :-1].contiguous())
    with pytest.raises(ValueError, match="2 slots for 3 tokens"):
        compiled.store_kv(torch.cat([qkv, qkv[:1]]), 9, 3, torch.tensor([0, 1]), kc, vc)


def test_flavour_follows_device_and_dtype(compiled):
    assert layer_ops.for_tensor(torch.ones(1)) is compiled
    assert layer_ops.for_tensor(torch.ones(1, dtype=torch.bfloat16)) is compiled
    assert layer_ops.for_tensor(torch.ones(1, dtype=torch.float16)) is twin


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_whole_model_same_logits_on_both_flavours(compiled, monkeypatch, arch):
    from rosefast.sources import load_tokenizer, tiny_random
    from tests.paged import max_abs_diff, run_ours
    from tests.test_model_runner import TEXTS, runner_for

    model = tiny_random(arch)
    tok = load_tokenizer(model)
    prompts = [tok(t).input_ids for t in TEXTS]
    fast = run_ours(runner_for(model), prompts, 6)
    monkeypatch.setattr(layer_ops, "impl", twin)
    ref = run_ours(runner_for(model), prompts, 6, next_tokens=[[int(s[-1].argmax()) for s in seq[:-1]] for seq in fast])
    assert max_abs_diff(fast, ref) < 1e-4
