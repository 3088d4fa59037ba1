"""Weight-only quantized linears (ROSEFAST_QUANTIZATION): GGUF Q4_1 blocks taken as they are, the ops against
F.linear on their own dequantized weights, and the whole model against the unquantized one."""
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import pytest
import torch
import torch.nn.functional as F
from gguf import quants

from rosefast.config import EngineConfig
from rosefast.engine.llm_engine import LLMEngine
from rosefast.engine.sampling_params import SamplingParams
from rosefast.models.args import load_model_args
from rosefast.models.llama import llama_state_dict
from rosefast.sources import load_hf_model
from rosefast.build import load_model, read_hf_state_dict
from rosefast.kernels import _quant_ops_py, quant_ops
from rosefast.sources.tiny import tiny_random
from rosefast.quant.formats import (GROUP, dequantize_q4_1, dequantize_q8_0, quantize_int8, quantize_q4_1, quantize_q8_0,
                                    unpack_q4_1, unpack_q8_0)
from rosefast.sources.gguf_blocks import gguf_blocks
from rosefast.models.quantized import (Int4Linear, Int8Linear, block_kernels, check_mode, head_mode, quantize_linears,
                                       quantizes, weight_bytes)
from rosefast.quant.tiles import pack_tiles, unpack_tiles
from rosefast.sources.resolve import gguf_source
from rosefast.sources.tiles_cache import file_tiles
from tests.gguf_writer import write_gguf

PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "The three laws of robotics are"]
TEXT = ("The quick brown fox jumps over the lazy dog. Paris is the capital of France, and Berlin is the capital "
        "of Germany. Water boils at one hundred degrees Celsius at sea level.")


def test_q4_1_blocks_from_the_gguf_dequantize_bit_exactly_to_gguf_and_to_the_converted_model(default_model):
    path = gguf_source(default_model)
    reader = gguf.GGUFReader(str(path))
    checked = 0
    for t in reader.tensors:
        if t.tensor_type == gguf.GGMLQuantizationType.Q4_1 and t.name.startswith(("blk.0.", "blk.29.")):
            k, n = (int(x) for x in t.shape)
            ours = dequantize_q4_1(*unpack_q4_1(t.data, n, k))
            assert torch.equal(ours, torch.from_numpy(quants.dequantize(t.data, t.tensor_type)).float()), t.name
            checked += 1
    assert checked == 14
    args = load_model_args(default_model.path)
    converted = llama_state_dict(load_hf_model(default_model).state_dict(), args)   # transformers reading the file
    layers = gguf_blocks(path, args)   # fused q|k|v and gate|up, q/k rows in Hugging Face's order
    for i in (0, 17, 29):
        for name in ("qkv", "o", "gate_up", "down"):
            assert [fmt for fmt, _ in layers[i][name]] == ["q4_1"]   # one part: q, k and v of one format
            assert torch.equal(dequantize_q4_1(*layers[i][name][0][1]), converted[f"layers.{i}.{name}.weight"].float())
    # our Q4_1 quantizer, given the file's numbers, gives back the file's blocks
    q, d, m = layers[3]["gate_up"][0][1]
    assert all(torch.equal(a, b) for a, b in zip(quantize_q4_1(dequantize_q4_1(q, d, m)), (q, d, m)))


def test_q8_0_head_blocks_from_the_gguf_dequantize_bit_exactly_to_gguf(default_model):
    reader = gguf.GGUFReader(str(gguf_source(default_model)))
    t = next(t for t in reader.tensors if t.name == "token_embd.weight")
    assert t.tensor_type == gguf.GGMLQuantizationType.Q8_0
    k, n = (int(x) for x in t.shape)
    q, d = unpack_q8_0(t.data, n, k)
    assert torch.equal(dequantize_q8_0(q, d), torch.from_numpy(quants.dequantize(t.data, t.tensor_type)).float())
    assert all(torch.equal(a, b) for a, b in zip(quantize_q8_0(dequantize_q8_0(q, d)), (q, d)))


def _served_int4(q, d, m):
    """The weights torch's int4 op computes with: d and the zero m + 8 d rounded to bf16, as the op holds them."""
    scale = d.float().to(torch.bfloat16).float()
    zero = (m.float() + 8 * d.float()).to(torch.bfloat16).float()
    n, k = q.shape
    w = (q.reshape(n, k // GROUP, GROUP).float() - 8) * scale[..., None] + zero[..., None]
    return w.reshape(n, k)


@pytest.mark.parametrize("n", [40, 64, 960])
def test_tiles_hold_the_blocks_as_they_are(n):
    g = torch.Generator().manual_seed(n)
    q = torch.randint(0, 16, (n, 96), generator=g, dtype=torch.uint8)
    d, m = torch.rand(n, 3, generator=g).half(), torch.randn(n, 3, generator=g).half()
    tiles = pack_tiles("q4_1", (q, d, m))
    w = tiles.w
    assert w.shape == (-(-n // 16), 3, 256)
    qt, st, mt = unpack_tiles(tiles)
    assert torch.equal(qt, q.short()) and torch.equal(st, d.float().repeat_interleave(2, 1)) and torch.equal(mt, m.float())
    q8 = torch.randint(-128, 128, (n, 96), generator=g, dtype=torch.int8)
    qt, st, mt = unpack_tiles(pack_tiles("q8_0", (q8, d)))
    assert torch.equal(qt, q8.short()) and torch.equal(st, d.float().repeat_interleave(2, 1)) and mt is None
    # one row's block: low nibbles of chunk 0 are its weights 0-3, the high ones 4-7 (csrc/quant_kernels.h)
    assert [int(w[0, 1, 4 * 2 + b]) & 15 for b in range(4)] == q[2, 32:36].tolist()
    assert [int(w[0, 1, 4 * 2 + b]) >> 4 for b in range(4)] == q[2, 36:40].tolist()


TIERS = quant_ops.impl.tiers()   # the compiled tiers this CPU runs (none on the pure-Python flavour: those skip)
AUTO = quant_ops.pick("auto")     # the best of them, or the one ROSEFAST_CPU_KERNELS forces (None: torch's ops)


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("n, k", [(40, 64), (576, 1536), (960, 576)])
@pytest.mark.parametrize("batch", [1, 6, 31])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_tier_of_the_block_kernels_equals_the_twin(n, k, batch, dtype, tier):
    """The twin is the reference; the scalar C tier computes the same integers in C, and every SIMD tier the CPU
    runs is checked against both."""
    g = torch.Generator().manual_seed(n * k + batch)
    x = (torch.randn(batch, k, generator=g) * torch.rand(batch, 1, generator=g) * 4).to(dtype)
    x[0, :32] = 0   # an all-zero block: scale 0
    bias = torch.randn(n, generator=g)
    q, d, m = quantize_q4_1(torch.randn(n, k, generator=g) * 0.05)
    q8, d8 = quantize_q8_0(torch.randn(n, k, generator=g) * 0.05)
    kernels = quant_ops.pick(tier)
    own = kernels.own_numbers_from(dtype)
    for tiles in (pack_tiles("q4_1", (q, d, m)), pack_tiles("q8_0", (q8, d8))):
        weights = quant_ops.impl.Weights([tiles], bias, k)
        got = kernels.linear(x, weights)
        want = _quant_ops_py.linear(x, _quant_ops_py.Weights([tiles], bias, k))
        assert got.dtype == dtype and got.shape == (batch, n)
        # the same integers and scales; the float sums in another order, and bf16's output rounding
        tol = 2e-5 if dtype == torch.float32 else 8e-3
        if own is not None and batch >= own:   # the tier's own numbers (AMX's tiles, AVX2's FMAs): near the exact sums
            exact = x.double() @ quant_ops.impl.rows(weights, torch.arange(n), torch.float32).double().T + bias.double()
            assert (got.double() - exact).abs().max() <= tol * exact.abs().max(), (tiles.fmt, dtype)
            if dtype == torch.float32:   # and closer to them than the two digits (which bf16's rounding hides)
                scalar = quant_ops.pick("scalar").linear(x, weights)
                rms = lambda y: (y.double() - exact).square().mean().sqrt()   # noqa: E731
                assert rms(got) < rms(scalar) / 2, (tiles.fmt, rms(got), rms(scalar))
            continue
        assert (got.float() - want.float()).abs().max() <= tol * want.float().abs().max(), (tiles.fmt, dtype)
        if tier != "scalar":
            scalar = quant_ops.pick("scalar").linear(x, quant_ops.impl.Weights([tiles], bias, k))
            assert (got.float() - scalar.float()).abs().max() <= tol * want.float().abs().max(), (tiles.fmt, dtype)


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("batch", [1, 5, 12, 33])
def test_one_digit_activations_on_every_tier_are_the_twins_one_digit(batch, tier):
    """ROSEFAST_ACTIVATIONS=one-digit: every tier computes the twin's one-digit numbers (x2 = 0), the AVX2 tier on
    its integer products at every row count (no FMAs); they differ from two digits' and sit farther from the exact
    sums (half a step of error against 1/508); a row's outputs do not depend on the rows beside it."""
    g = torch.Generator().manual_seed(batch)
    n, k = 96, 512
    x = torch.randn(batch, k, generator=g) * 2
    kernels, two = quant_ops.pick(tier, "one-digit"), quant_ops.pick(tier)
    assert kernels.digits == 1 and two.digits == 2 and kernels is quant_ops.pick(tier, "one-digit")
    if tier == "avx2":
        assert kernels.own_numbers_from(torch.float32) is None and two.own_numbers_from(torch.float32) == 8
    own = kernels.own_numbers_from(torch.float32)
    parts = [pack_tiles("q4_1", quantize_q4_1(torch.randn(n, k, generator=g) * 0.05)),
             pack_tiles("q8_0", quantize_q8_0(torch.randn(n, k, generator=g) * 0.05))]
    for tiles in parts:
        weights = quant_ops.impl.Weights([tiles], None, k)
        got = kernels.linear(x, weights)
        if own is not None and batch >= own:   # AMX's tiles: neither digit's numbers
            continue
        want = _quant_ops_py.linear(x, _quant_ops_py.Weights([tiles], None, k), digits=1)
        assert (got - want).abs().max() <= 2e-5 * want.abs().max(), tiles.fmt
        assert torch.equal(kernels.linear(x[-1:].contiguous(), weights)[0], got[-1]) or tier == "amx", tiles.fmt
        exact = x.double() @ quant_ops.impl.rows(weights, torch.arange(n), torch.float32).double().T
        rms = lambda y: (y.double() - exact).square().mean().sqrt()   # noqa: E731
        assert rms(got) > 20 * rms(two.linear(x, weights)), tiles.fmt   # one digit: ~127 times the error
    with pytest.raises(ValueError, match="activations must be one of two-digit, one-digit"):
        quant_ops.pick(tier, "three-digit")


@pytest.mark.skipif("amx" not in TIERS, reason="this CPU runs no AMX tier (Intel Sapphire Rapids and later)")
def test_the_row_count_that_picks_the_amx_tiers_path_can_be_the_steps_sequences():
    """20 rows on the AMX tier take the tiles; told the step has 4 sequences (path_rows), the same rows take its
    VNNI kernels, bit for bit the avx512vnni tier's."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(20, 576, generator=g)
    weights = quant_ops.impl.Weights([pack_tiles("q4_1", quantize_q4_1(torch.randn(96, 576, generator=g) * 0.05))],
                                     None, 576)
    amx, vnni = quant_ops.pick("amx"), quant_ops.pick("avx512vnni")
    assert torch.equal(amx.linear(x, weights, 4), vnni.linear(x, weights))
    assert not torch.equal(amx.linear(x, weights), vnni.linear(x, weights))


@pytest.mark.skipif("avx2" not in TIERS, reason="this CPU runs no AVX2 tier")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_row_count_that_picks_the_avx2_tiers_path_can_be_the_steps_sequences(dtype):
    """70 rows on the AVX2 tier take its float path; told the step has 3 sequences (path_rows), the same rows take
    its integer kernels (for 4 rows or more its tile of many rows, 64 at a time), each row bit for bit what a
    one-row call (a one-sequence decode step) computes."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(70, 576, generator=g).to(dtype)
    for tiles in (pack_tiles("q4_1", quantize_q4_1(torch.randn(96, 576, generator=g) * 0.05)),
                  pack_tiles("q8_0", quantize_q8_0(torch.randn(96, 576, generator=g) * 0.05))):
        weights = quant_ops.impl.Weights([tiles], None, 576)
        avx2 = quant_ops.pick("avx2")
        one_by_one = torch.cat([avx2.linear(x[i:i + 1].contiguous(), weights) for i in range(70)])
        assert avx2.own_numbers_from(dtype) == 8
        assert torch.equal(avx2.linear(x, weights, 3), one_by_one)
        assert torch.equal(avx2.linear(x[:7].contiguous(), weights), one_by_one[:7])
        assert not torch.equal(avx2.linear(x, weights), one_by_one)


def test_the_kernel_tiers_are_named_and_a_bad_choice_is_refused_by_name():
    assert quant_ops.available()[-1] == "torch" and quant_ops.available()[:-1] == TIERS
    assert quant_ops.pick("torch") is None and block_kernels("torch") is None
    if TIERS:
        forced = os.environ.get("ROSEFAST_CPU_KERNELS") or "auto"
        assert TIERS[-1] == "scalar" and AUTO is quant_ops.pick(TIERS[0] if forced == "auto" else forced)
        assert Int4Linear(*quantize_q4_1(torch.randn(32, 64)), kernels=TIERS[-1]).kernels.name == "scalar"
    else:   # the pure-Python flavour: torch's ops, and no tier to name
        assert AUTO is None
        with pytest.raises(ValueError, match="need the compiled build"):
            quant_ops.pick("scalar")
    with pytest.raises(ValueError, match="cpu_kernels must be one of auto, amx, avx512vnni, avxvnni, avx2, neon, scalar"):
        quant_ops.pick("sse2")
    with pytest.raises(ValueError, match="cpu_kernels must be one of"):
        EngineConfig(cpu_kernels="neon9")


@pytest.mark.parametrize("kernels", TIERS + ["torch"])
@pytest.mark.parametrize("n, k", [(64, 128), (96, 576), (576, 1536), (960, 576)])
@pytest.mark.parametrize("batch", [1, 7, 32])
def test_quantized_linears_equal_f_linear_on_their_dequantized_weights(n, k, batch, kernels):
    ours = kernels != "torch"
    g = torch.Generator().manual_seed(n + k + batch)
    weight = torch.randn(n, k, generator=g) * 0.05
    bias = torch.randn(n, generator=g) * 0.1
    x = torch.randn(batch, k, generator=g)
    q, d, m = quantize_q4_1(weight)
    assert (dequantize_q4_1(q, d, m) - weight).abs().max() <= d.float().max() / 2 + 1e-6   # half a step at most
    # ours: the file's numbers, activations int8 per 32 (~0.4 % of a group's largest each); torch's op: bf16
    # activations, its bf16 scale and zero
    xb = x if ours else x.to(torch.bfloat16).float()
    want = F.linear(xb, dequantize_q4_1(q, d, m) if ours else _served_int4(q, d, m), bias)
    layer = Int4Linear(q, d, m, bias, kernels=kernels)
    assert (layer.kernels is not None) is ours
    got = layer(x)
    assert got.dtype == x.dtype and got.shape == (batch, n)
    assert (got - want).abs().max() <= 1e-2 * want.abs().max() + 1e-2
    q8, s8 = quantize_q8_0(weight) if ours else quantize_int8(weight)
    served8 = dequantize_q8_0(q8, s8) if ours else q8.float() * s8.to(torch.bfloat16).float()[:, None]
    got8 = Int8Linear(q8, s8, bias, kernels=kernels)(x)
    want8 = F.linear(xb, served8, bias)
    assert (got8 - want8).abs().max() <= 1e-2 * want8.abs().max() + 1e-2
    # Q8_0 blocks given to torch's op: re-quantized per channel; per-channel scales given to ours: as blocks
    other = Int8Linear(*(quantize_int8(weight) if ours else quantize_q8_0(weight)), bias, kernels=kernels)
    assert (other(x) - F.linear(x, weight, bias)).abs().max() <= 2e-2 * want8.abs().max() + 2e-2


def _follow(model, dtype, mode, head, kernels="auto"):
    """(greedy ids of PROMPTS, TEXT's per-token loglikelihoods, (weight bytes, count)) of one engine."""
    engine = LLMEngine(model=model, dtype=dtype, device="cpu", kv_cache_tokens=4096, quantization=mode,
                       quantize_lm_head=head, cpu_kernels=kernels)
    ids = engine.tokenizer(TEXT).input_ids
    greedy = engine.generate(PROMPTS, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True), use_tqdm=False)
    scored = engine.generate([ids], SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0), use_tqdm=False)[0]
    return ([o["token_ids"] for o in greedy], [c for c, _ in scored["prompt_logprobs"][1:]],
            weight_bytes(engine.runner.model))


def _against(base, run):
    """(greedy agreement, mean loglikelihood gap per token, mean |gap| per token) of `run` against `base`."""
    (base_tokens, base_lp, _), (tokens, lp, _) = base, run
    first = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), len(x)) for x, y in zip(base_tokens, tokens)]
    gaps = [a - b for a, b in zip(base_lp, lp)]
    return sum(first) / sum(len(x) for x in base_tokens), sum(gaps) / len(gaps), sum(map(abs, gaps)) / len(gaps)


@pytest.mark.parametrize("kernels", ([AUTO.name] if AUTO is not None else []) + ["torch"])
def test_the_int4_engine_follows_the_unquantized_one(default_model, kernels):
    """On our kernels (the best tier here, or the one ROSEFAST_CPU_KERNELS forces) the file's numbers, finer than
    bf16: within 0.01 nats/token of the unquantized engine. torch's op computes in bf16 (activations, d and
    m + 8 d, its output): its bound is what serving the unquantized model in bf16 costs, measured here as how far
    bf16 moves each token's loglikelihood (mean |difference|: 0.047-0.049 on this project's machines, on AMX
    and on AVX2 code alike). The int4 engine on torch's op must move them less (0.028 here) and shift their mean
    by less (0.003). bf16's own mean shift is no bound: its errors cancel, 0.023 on AMX, 0.0005 on AVX2 code
    (against which the earlier test failed there)."""
    base = _follow(default_model, "float32", "none", "none")
    base_bytes = base[2][0]
    if kernels == "torch":
        bf16_agreement, _, bf16_moves = _against(base, _follow(default_model, "bfloat16", "none", "none"))
        bounds = {("int4", "none"): (bf16_moves, min(0.5, bf16_agreement))}
    else:
        bounds = {("int4", "none"): (0.01, 0.5), ("int4", "int8"): (0.02, 0.5), ("int8", "none"): (0.03, 0.5)}
    for (mode, head), (bound, least) in bounds.items():
        run = _follow(default_model, "float32", mode, head, kernels)
        agreement, gap, moves = _against(base, run)
        size, count = run[2]
        print(f"{mode}/{head} on {kernels}: greedy agreement {agreement:.2f}, loglik gap {gap:+.4f}/token "
              f"(bound {bound:.4f}), each token's moved {moves:.4f}, {size / count:.2f} bytes per weight")
        assert abs(gap) < bound           # mean per-token loglikelihood on TEXT, nats
        if kernels == "torch":
            assert moves < bound          # bf16's own cost, token by token
        assert agreement >= least         # near-ties may flip a token; then the texts part ways
        assert size < 0.45 * base_bytes   # the layers' weights at 4 or 8 bits (embedding, norms as they were)


def test_bad_modes_and_devices_are_refused_by_name():
    with pytest.raises(ValueError, match="quantization must be one of auto, none, int8, int4"):
        EngineConfig(quantization="int3")
    with pytest.raises(ValueError, match="runs on CPU only"):
        check_mode("int4", torch.device("cuda"))
    check_mode("none", torch.device("cuda"))


def test_a_directory_is_quantized_at_load_and_the_benchmark_runs(tiny_llama, capsys):
    from benches import quantized

    rows = quantized.main(["--model", str(tiny_llama.path), "--tokens", "2", "--concurrent", "1", "--dtype", "float32",
                           "--step-runs", "1"])
    assert [(mode, head) for mode, head, *_ in rows] == [("none", "none"), ("int8", "none"), ("int8", "int8"),
                                                          ("int4", "none"), ("int4", "int8"), ("int4", "int4")]
    assert all(rates[0] > 0 and step > 0 for *_, rates, step in rows) and rows[3][2] < rows[0][2]
    assert "| int4 | int4 |" in capsys.readouterr().out


@pytest.mark.skipif(AUTO is None, reason="torch's ops in force (ROSEFAST_CPU_KERNELS=torch or the pure-Python "
                    "flavour): the activations' digits are the block kernels'")
def test_the_activations_benchmark_finds_one_digit_farther_from_the_unquantized_forward(default_model, capsys):
    """benches/activations.py on the real model and a real text: two digits' distributions next to the unquantized
    forward's, one digit's measurably farther (and the settings named wrong are refused)."""
    from benches import activations

    rows = activations.main(["--tokens", "96", "--window", "48"])
    two, one = rows["two-digit", "fp32"], rows["one-digit", "fp32"]
    assert 0 <= two["kl_mean"] < 1e-5 < one["kl_mean"] and one["kl_max"] > 10 * two["kl_max"]
    assert two["top1"] >= one["top1"] and two["top1"] > 0.95
    assert rows["one-digit", "two-digit"]["kl_mean"] > 1e-5
    assert "| one-digit | fp32 |" in capsys.readouterr().out
    with pytest.raises(ValueError, match="activations must be one of two-digit, one-digit"):
        EngineConfig(activations="1")


def test_auto_is_int4_for_a_q4_1_file_and_none_for_a_directory(default_model, tiny_llama):
    from server.config import server_config_from_env

    # one default for the library, the CLI and the server
    assert server_config_from_env({}).quantization == "auto" and EngineConfig().quantization == "auto"
    for model, want in ((default_model, True), (tiny_llama, False)):
        engine = LLMEngine(model=model, dtype="float32", device="cpu", kv_cache_tokens=1024, quantization="auto")
        assert any(isinstance(m, Int4Linear) for m in engine.runner.model.modules()) is want
        # the head follows: int8 under quantized linears (auto), as loaded otherwise
        assert isinstance(engine.runner.model.lm_head, Int8Linear) is want


def test_auto_on_a_gpu_keeps_the_dtype_without_reading_the_file(tiny_llama, tmp_path):
    """auto serves a GGUF's blocks on CPU only: on another device the file is not read for them (the device
    check's first GPU run read a placeholder GGUF here and failed every engine built on it)."""
    assert quantizes("auto", torch.device("cpu")) and quantizes("int8", torch.device("cuda"))
    assert not quantizes("auto", torch.device("cuda")) and not quantizes("none", torch.device("cpu"))
    model, _ = load_model(tiny_llama, torch.float32, "cpu")
    model = model.to("meta")   # a device other than the CPU
    assert quantize_linears(model, "auto", {"linears": "blocks"}) == (0, None)
    assert not any(isinstance(m, (Int4Linear, Int8Linear)) for m in model.modules())


def test_the_lm_head_setting():
    assert [head_mode(setting, linears) for setting, linears in (
        ("auto", "int4"), ("auto", "int8"), ("auto", "none"), ("true", "int4"), ("none", "int4"), ("int4", "int8"))] \
        == ["int8", "int8", "none", "int4", "none", "int4"]
    assert EngineConfig(quantize_lm_head=True).quantize_lm_head == "true"
    assert EngineConfig(quantize_lm_head=False).quantize_lm_head == "none"
    assert EngineConfig(quantize_lm_head="Off").quantize_lm_head == "none"   # the env's boolean spellings
    with pytest.raises(ValueError, match="quantize_lm_head must be one of none, int8, int4, auto, true"):
        EngineConfig(quantize_lm_head="int3")


def same_tiles(a, b):
    """Two tiles_cache dicts hold the same tiles, part for part."""
    def parts(x, y):
        return [(t.fmt, t.n) for t in x] == [(t.fmt, t.n) for t in y] and all(
            (u is None) == (v is None) and (u is None or torch.equal(u, v))
            for s, t in zip(x, y) for u, v in zip((s.w, s.d, s.m, s.sc, s.mn), (t.w, t.d, t.m, t.sc, t.mn)))

    return a.keys() == b.keys() and a["linears"] == b["linears"] and a["types"] == b["types"] \
        and all(parts(a[i][n], b[i][n]) for i in a if isinstance(i, int) for n in a[i]) \
        and parts(a.get("head", []), b.get("head", []))


def test_the_q4_1_tiles_are_kept_beside_the_converted_model(default_model, monkeypatch):
    """After the first start the kernels' tiles come from their own file (the GGUF's reader takes ~4 s on the
    tokenizer's metadata, the re-laying out seconds more), bit for bit; a damaged file is rebuilt from the GGUF."""
    from rosefast.sources import tiles_cache
    from rosefast.models.args import load_model_args

    args, source, cache = load_model_args(default_model.path), gguf_source(default_model), default_model.path
    first = tiles_cache.cached_tiles(source, args, cache)
    kept = cache / tiles_cache.TILES_DIR
    assert (kept / "index.json").is_file() and (kept / "0.safetensors").is_file()

    def no_reading(*_):
        raise AssertionError("the GGUF was read again")

    read = tiles_cache.file_tiles
    monkeypatch.setattr(tiles_cache, "file_tiles", no_reading)
    again = tiles_cache.cached_tiles(source, args, cache)
    assert first["linears"] == "q4_1" and "head" in first
    assert same_tiles(first, again) and same_tiles(first, read(source, args))
    monkeypatch.undo()
    damaged = kept / "damaged"   # (renamed over a layer's file: `first` is served from the old one's pages)
    damaged.write_bytes(b"damaged")
    os.replace(damaged, kept / "1.safetensors")
    assert same_tiles(first, tiles_cache.cached_tiles(source, args, cache))
    assert same_tiles(first, tiles_cache._load(kept, args))   # rewritten whole


def _write_gguf(path, model, kind=gguf.GGMLQuantizationType.Q8_0):
    """A whole GGUF of `model` as llama.cpp's converter lays its family out (tests/gguf_writer.py), its linears as
    `kind` and its embedding (or untied head) as Q8_0: (its ModelArgs, the model's own weights)."""
    embedding = {"token_embd.weight", "output.weight"}
    args = write_gguf(path, model, lambda name: gguf.GGMLQuantizationType.Q8_0 if name in embedding else kind)
    return args, read_hf_state_dict(model.path)


FILE_LAYOUTS = {"llama": {}, "qwen2": {}, "qwen3": {}, "mistral": {}, "gemma3_text": {},
                "phi3": {"partial_rotary_factor": 0.75}, "llama-partial": {"partial_rotary_factor": 0.5}}


@pytest.mark.parametrize("layout", FILE_LAYOUTS)
def test_q8_0_linears_in_a_gguf_are_served_as_they_are_by_int8(layout, default_model, tmp_path):
    """The blocks come out in our model's row order for each family's file layout (Llama's and Mistral's q/k rows
    reordered by llama.cpp's converter, the Qwen and Gemma families' not, Phi-3's q|k|v and gate|up fused; a
    partial rotary's pairs placed as the model places them at load)."""
    model = tiny_random(layout.split("-")[0], **FILE_LAYOUTS[layout])
    path = tmp_path / "q8_0.gguf"
    args, hf = _write_gguf(path, model)
    blocks = gguf_blocks(path, args)
    assert blocks["linears"] == "q8_0" and "head" in blocks
    deq = {t.name: torch.from_numpy(quants.dequantize(t.data, t.tensor_type)).float()
           for t in gguf.GGUFReader(str(path)).tensors}
    ours = llama_state_dict(hf, args)
    for i in range(args.num_layers):
        assert torch.equal(dequantize_q8_0(*blocks[i]["o"][0][1]), deq[f"blk.{i}.attn_output.weight"])
        for name in ("qkv", "gate_up"):   # in our order, near the model's own weights
            got = torch.cat([dequantize_q8_0(*part) for _, part in blocks[i][name]])
            want = ours[f"layers.{i}.{name}.weight"].float()
            assert (got - want).abs().max() <= want.abs().max() / 127
    model, _ = load_model(model, torch.float32, "cpu")
    count, source = quantize_linears(model, "auto", file_tiles(path, args), head="auto")   # auto: the file's own int8
    assert source == "the GGUF's Q8_0 blocks" and count == 4 * args.num_layers + 1
    layer = model.layers[1].gate_up
    assert isinstance(layer, Int8Linear) and isinstance(model.lm_head, Int8Linear)
    if layer.kernels is not None:   # the tiles hold the file's blocks exactly
        q, s, _ = unpack_tiles(layer.weights.parts[0])
        assert torch.equal(q.to(torch.int8), blocks[1]["gate_up"][0][1][0])
        assert torch.equal(s[:, ::2], blocks[1]["gate_up"][0][1][1].float())


def test_q4_0_linears_in_a_gguf_are_q4_1_blocks_with_m_minus_8_d(tiny_llama, tmp_path):
    path = tmp_path / "q4_0.gguf"
    args, _ = _write_gguf(path, tiny_llama, gguf.GGMLQuantizationType.Q4_0)
    blocks = gguf_blocks(path, args)
    assert blocks["linears"] == "q4_1"
    deq = {t.name: torch.from_numpy(quants.dequantize(t.data, t.tensor_type)).float()
           for t in gguf.GGUFReader(str(path)).tensors}
    for i in range(args.num_layers):
        assert torch.equal(dequantize_q4_1(*blocks[i]["down"][0][1]), deq[f"blk.{i}.ffn_down.weight"])
    model, _ = load_model(tiny_llama, torch.float32, "cpu")
    assert quantize_linears(model, "auto", file_tiles(path, args))[1] == "the GGUF's Q4_1 blocks"
    assert isinstance(model.layers[0].o, Int4Linear)


def test_the_kernel_tiers_benchmark_runs_every_tier_here():
    from benches import kernel_tiers

    rows = kernel_tiers.main(["--batches", "1", "--repeat", "1", "--vocab", "64"])
    assert [tier for tier, *_ in rows] == quant_ops.available()
    assert all(step > 0 and all(u > 0 for u in per_op) for *_, per_op, _, step in rows)


DRIVER = Path(__file__).with_name("quant_tiers_check.c")
CSRC = Path(__file__).parent.parent / "csrc"


def _driver(compiler, out, *flags):
    subprocess.run([compiler, "-O2", *flags, f"-I{CSRC}", "-o", str(out), str(DRIVER), "-lm"], check=True,
                   capture_output=True)
    return out


def test_the_c_driver_finds_every_x86_tier_equal_to_the_scalar_one(tmp_path):
    """The kernels' header alone, outside Python: what the compiled build would run on this CPU."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    run = subprocess.run([_driver("cc", tmp_path / "check")], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout
    # two digits, then one; 77 rows too where a tier has two paths, and its 31 and 77 rows on both paths (AVX2's
    # FMAs: with two digits only); and 8 of a mixture of experts' one call
    cases = {t: {"amx": 680, "avx2": 584}.get(t, 392) for t in TIERS}
    assert all(f"{t}: {cases[t]} cases" in run.stdout for t in TIERS if t != "scalar"), run.stdout
    assert run.stdout.rstrip().endswith(" passed, 0 failed"), run.stdout


def test_the_neon_tier_equals_the_scalar_one_under_emulation(tmp_path):
    """No ARM machine here: the header cross-compiled for aarch64 and run by qemu-user, every case against the
    scalar tier, on a CPU with the int8 matrix multiply (qemu's "max": smmla for pairs of activation rows) and on
    a Neoverse N1 (the dot-product extension alone: sdot), and on one with neither (the tier is refused). ARM
    speed is unmeasured until an ARM machine runs benches/."""
    cross, qemu = shutil.which("aarch64-linux-gnu-gcc"), shutil.which("qemu-aarch64")
    if cross is None or qemu is None:
        pytest.skip("needs Debian's gcc-aarch64-linux-gnu and qemu-user (make test installs them where apt runs)")
    binary = _driver(cross, tmp_path / "check-arm", "-static")
    hashes = []
    for cpu, path in (("max", "smmla for row pairs"), ("neoverse-n1", "sdot")):
        run = subprocess.run([qemu, "-cpu", cpu, str(binary), "neon"], capture_output=True, text=True, timeout=300)
        assert run.returncode == 0 and f"neon: 392 cases against scalar ({path})" in run.stdout, run.stdout
        assert run.stdout.rstrip().endswith("392 passed, 0 failed")
        hashes.append(re.search(r"outputs' hash (\w+)", run.stdout).group(1))
    assert hashes[0] == hashes[1]   # smmla's outputs are sdot's, bit for bit
    old = subprocess.run([qemu, "-cpu", "cortex-a53", str(binary), "neon"], capture_output=True, text=True, timeout=60)
    assert old.returncode == 2 and "this CPU does not run it" in old.stdout   # ARMv8.0: no sdot, no NEON tier


# what an AVX2-only CPU gets, run under the emulator: its tiers, its decode attention, and both against the twins
ZEN3_PROBE = """
import json, torch
from rosefast.kernels import _layer_ops_c as _kernels_c, _layer_ops_py as _kernels_py, _quant_ops_py, quant_ops
from rosefast.quant.tiles import pack_tiles
from rosefast.quant.formats import quantize_q4_1
from tests.test_kernels import decode_case
from rosefast.models.layers import AttentionMetadata
qkv, kc, vc, meta = decode_case(9, 3, 64, torch.float32, [1, 5, 37])
fresh = lambda: AttentionMetadata(False, None, meta.block_tables, context_lens=meta.context_lens)
att = (_kernels_c.decode_attention(qkv, 9, 3, kc, vc, fresh(), 0.125)
       - _kernels_py.decode_attention(qkv, 9, 3, kc, vc, fresh(), 0.125)).abs().max().item()
g = torch.Generator().manual_seed(0)
x = torch.randn(5, 256, generator=g)   # the integer path (its tile of many rows): the twin's digits
tiles = pack_tiles("q4_1", quantize_q4_1(torch.randn(64, 256, generator=g) * 0.05))
want = _quant_ops_py.linear(x, _quant_ops_py.Weights([tiles], None, 256))
got = quant_ops.pick("auto").linear(x, quant_ops.impl.Weights([tiles], None, 256))
print(json.dumps({"tiers": quant_ops.available(), "attention": _kernels_c.attention_kernel(),
                  "torch": torch.backends.cpu.get_cpu_capability(), "attention_error": att,
                  "linear_error": ((got - want).abs().max() / want.abs().max()).item()}))
"""


@pytest.mark.skipif(platform.machine() != "x86_64", reason="emulates an x86-64 CPU on an x86-64 one")
def test_an_avx2_only_cpu_under_emulation_runs_the_avx2_tier_and_attention(tmp_path):
    """No AVX2-only machine here: QEMU's user-mode emulator as an AMD EPYC Milan (Zen 3: AVX2, FMA, F16C; no
    AVX-512, no VNNI) runs the kernels' C driver — the avx2 tier against the scalar one on both its paths, the
    AVX-512 tiers refused; one AVX-512 instruction in the AVX2 code would stop it — and Python: the tiers, decode
    attention and torch capability such a CPU gets, and the AVX2 attention and linear against their twins."""
    qemu = shutil.which("qemu-x86_64")
    if not TIERS:
        pytest.skip("the pure-Python flavour: no kernels to emulate")
    if qemu is None or shutil.which("cc") is None:
        pytest.skip("needs Debian's qemu-user (make test installs it where apt runs) and a C compiler")
    zen3 = [qemu, "-cpu", "EPYC-Milan"]
    run = subprocess.run(zen3 + [str(_driver("cc", tmp_path / "check")), "--quick"], capture_output=True, text=True,
                         timeout=600)
    if "avx2: not run by this CPU" in run.stdout:
        pytest.skip("this QEMU does not emulate AVX2 (it came in QEMU 7.2)")
    assert run.returncode == 0 and run.stdout.rstrip().endswith("296 passed, 0 failed"), run.stdout
    assert "avx2: 296 cases" in run.stdout
    assert all(f"{t}: not run by this CPU" in run.stdout for t in ("avxvnni", "avx512vnni", "amx"))
    root = Path(__file__).parent.parent
    env = {k: v for k, v in os.environ.items() if k not in ("ROSEFAST_CPU_KERNELS", "ATEN_CPU_CAPABILITY")}
    probe = subprocess.run(zen3 + [sys.executable, "-c", ZEN3_PROBE], cwd=root, env=env, capture_output=True,
                           text=True, timeout=600)
    assert probe.returncode == 0, probe.stderr[-3000:]
    got = json.loads(probe.stdout.strip().splitlines()[-1])
    assert got["tiers"] == ["avx2", "scalar", "torch"] and got["attention"] == "avx2" and got["torch"] == "AVX2"
    assert got["attention_error"] < 1e-5 and got["linear_error"] < 2e-5, got

