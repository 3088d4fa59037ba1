"""GGUF as people download it: Q5_0/Q5_1 and the K-quants (Q4_K, Q5_K, Q6_K) read as they lie, mixed tensor by
tensor as a Q4_K_M file mixes them, served from their own blocks on every kernel tier this CPU runs."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGML_QUANT_SIZES, quants
from gguf import GGMLQuantizationType as T

from tests.gguf_writer import quantize, write_gguf
from rosefast.engine.llm_engine import LLMEngine
from rosefast.engine.sampling_params import SamplingParams
from rosefast.kernels import _quant_ops_py, quant_ops
from rosefast.sources import gguf_blocks
from rosefast.models.quantized import BlockEmbedding, BlockLinear, Int4Linear, Int8Linear
from rosefast.quant.tiles import dequantize_tiles, pack_tiles
from tests.serving import Server, tiny_env

UNPACK = {T.Q5_0: ("q5_0", gguf_blocks.unpack_q5_0), T.Q5_1: ("q5_1", gguf_blocks.unpack_q5_1),
          T.Q4_K: ("q4_k", gguf_blocks.unpack_q4_k), T.Q5_K: ("q5_k", gguf_blocks.unpack_q5_k),
          T.Q6_K: ("q6_k", gguf_blocks.unpack_q6_k)}
_SCALE_AT = {T.Q5_0: (0,), T.Q5_1: (0, 2), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,)}   # their fp16 fields
TIERS = quant_ops.impl.tiers()


def random_blocks(kind, n, k, seed=0):
    """Blocks of random bytes (every scale code, the 6-bit edges included) with finite fp16 scales."""
    rng = np.random.default_rng(seed)
    per, size = GGML_QUANT_SIZES[kind]
    raw = rng.integers(0, 256, (n, k // per * size), dtype=np.uint8)
    blocks = raw.reshape(n, k // per, size)
    for at in _SCALE_AT[kind]:
        half = (rng.random((n, k // per)) * 0.02 + 1e-3).astype(np.float16)
        blocks[..., at:at + 2] = half.view(np.uint8).reshape(n, k // per, 2)
    return raw


@pytest.mark.parametrize("kind", list(UNPACK), ids=lambda k: k.name)
def test_each_format_unpacks_to_what_gguf_dequantizes_bit_for_bit(kind):
    """Random blocks and, where gguf quantizes the type, a real weight's: our unpacking, laid out in the kernels'
    tiles and read back, is gguf's own dequantization exactly."""
    fmt, unpack = UNPACK[kind]
    n, k = 40, 512
    for raw in (random_blocks(kind, n, k), quantize(np.random.default_rng(1).standard_normal((n, k)) * 0.05, kind)):
        parts = unpack(raw, n, k)
        want = torch.from_numpy(quants.dequantize(raw, kind)).float().reshape(n, k)
        assert torch.equal(dequantize_tiles(pack_tiles(fmt, parts)), want)
    if fmt in ("q4_k", "q5_k"):   # the random bytes reached every 6-bit scale and min
        sc, mn = unpack(random_blocks(kind, n, k), n, k)[3:]
        assert sc.min() == mn.min() == 0 and sc.max() == mn.max() == 63


@pytest.mark.parametrize("kind", [T.Q4_K, T.Q5_K, T.Q6_K], ids=lambda k: k.name)
def test_the_reference_k_quantizer_writes_blocks_gguf_reads_near_the_weights(kind):
    w = np.random.default_rng(2).standard_normal((16, 512)).astype(np.float32) * 0.05
    back = quants.dequantize(quantize(w, kind), kind).reshape(w.shape)
    levels = {T.Q4_K: 15, T.Q5_K: 31, T.Q6_K: 63}[kind]
    assert np.abs(back - w).max() <= 2 * (w.max() - w.min()) / levels / 2 + 1e-3   # about half a step


def _tiles(kind, n, k, seed):
    fmt, unpack = UNPACK.get(kind, (None, None))
    if kind == T.Q4_1:
        return pack_tiles("q4_1", gguf_blocks.unpack_q4_1(quantize(np.random.default_rng(seed).standard_normal((n, k)) * 0.05, kind), n, k))
    return pack_tiles(fmt, unpack(random_blocks(kind, n, k, seed), n, k))


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("kinds", [[T.Q5_0], [T.Q5_1], [T.Q4_K], [T.Q5_K], [T.Q6_K], [T.Q4_K, T.Q6_K, T.Q5_0],
                                   [T.Q5_K, T.Q4_1]], ids=lambda ks: "|".join(k.name for k in ks))
@pytest.mark.parametrize("batch", [1, 6, 31])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_tier_equals_the_twin_on_every_format_and_mix(tier, kinds, batch, dtype):
    """Parts of 40 rows (a partial tile) and 24, each in its own format, against the twin and the scalar tier."""
    k = 512
    tiles = [_tiles(kind, 40 if i % 2 == 0 else 24, k, i) for i, kind in enumerate(kinds)]
    n = sum(t.n for t in tiles)
    g = torch.Generator().manual_seed(batch)
    x = (torch.randn(batch, k, generator=g) * torch.rand(batch, 1, generator=g) * 4).to(dtype)
    x[0, :32] = 0
    bias = torch.randn(n, generator=g)
    want = _quant_ops_py.linear(x, _quant_ops_py.Weights(tiles, bias, k))
    weights = quant_ops.impl.Weights(tiles, bias, k)
    kernels = quant_ops.pick(tier)
    got = kernels.linear(x, weights)
    scalar = quant_ops.pick("scalar").linear(x, weights)
    rel = 2e-5 if dtype == torch.float32 else 8e-3
    tol = rel * want.float().abs().max()
    assert got.shape == (batch, n) and got.dtype == dtype
    dense = torch.cat([dequantize_tiles(t) for t in tiles])
    own = kernels.own_numbers_from(dtype)
    if own is not None and batch >= own:   # the tier's own numbers (AMX's tiles, AVX2's FMAs): near the exact sums
        exact = x.double() @ dense.double().T + bias.double()
        assert (got.double() - exact).abs().max() <= rel * exact.abs().max()
    else:
        assert (got.float() - want.float()).abs().max() <= tol and (got.float() - scalar.float()).abs().max() <= tol
    # and the twin is the weights' own product, up to the activations' two digits (and bf16's output rounding)
    exact = F.linear(x.float(), dense, bias)
    assert (want.float() - exact).abs().max() <= (2e-3 if dtype == torch.float32 else 1e-2) * exact.abs().max()


@pytest.mark.parametrize("impl", [quant_ops.impl, _quant_ops_py], ids=lambda m: m.__name__.rsplit("_", 1)[-1])
@pytest.mark.parametrize("kind", [T.Q4_1, T.Q5_0, T.Q5_1, T.Q4_K, T.Q5_K, T.Q6_K], ids=lambda k: k.name)
def test_rows_looked_up_in_the_blocks_are_the_dequantized_rows(impl, kind):
    """A tied embedding looked up in its head's tiles: each row exactly what dequantizing the file gives (fp32),
    rounded as torch rounds it (bf16); an id past the rows is refused."""
    tiles = _tiles(kind, 40, 512, 3)
    weights = impl.Weights([tiles], None, 512)
    ids = torch.tensor([[0, 39, 17], [16, 15, 31]])
    full = dequantize_tiles(tiles)
    assert torch.equal(impl.rows(weights, ids, torch.float32), full[ids])
    assert torch.equal(impl.rows(weights, ids, torch.bfloat16), full[ids].bfloat16())
    with pytest.raises(IndexError, match="out of 0..39"):
        impl.rows(weights, torch.tensor([40]), torch.float32)


def test_a_k_format_needs_whole_super_blocks():
    with pytest.raises(ValueError, match="do not fit"):
        bad = _tiles(T.Q4_K, 16, 512, 0)
        _quant_ops_py.Weights([bad], None, 256)


def _mixed_kind(name):
    """Q4_K_M's way on a 256-wide model: Q4_K mostly, Q6_K for half of attn_v and ffn_down and for the embedding,
    and the fallbacks (Q5_0, Q5_1) and Q5_K besides, so every format is in one file."""
    if name == "token_embd.weight":
        return T.Q6_K
    layer, part = int(name.split(".")[1]), name.split(".")[2]
    return {"attn_q": T.Q4_K, "attn_k": T.Q4_K, "attn_v": T.Q6_K if layer == 0 else T.Q4_K, "attn_output": T.Q5_0,
            "ffn_gate": T.Q5_K, "ffn_up": T.Q4_K, "ffn_down": T.Q6_K if layer == 0 else T.Q5_1}[part]


@pytest.fixture(scope="module")
def mixed(default_model, tmp_path_factory):
    """A whole GGUF of a 256-wide tiny Llama in that mix, resolved (converted once) as a downloaded file is."""
    from rosefast.sources import tiny_random
    from rosefast.sources.resolve import resolve_model

    path = tmp_path_factory.mktemp("kquants") / "tiny-q4_k_m.gguf"
    write_gguf(path, tiny_random("llama", hidden_size=256, intermediate_size=512), _mixed_kind)
    return resolve_model(str(path))


TEXT = "The quick brown fox jumps over the lazy dog. Paris is the capital of France, and Berlin of Germany."
PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):"]


def _run(model, quantization, kernels="auto"):
    engine = LLMEngine(model=model, dtype="float32", device="cpu", kv_cache_tokens=2048, quantization=quantization,
                       cpu_kernels=kernels)
    greedy = engine.generate(PROMPTS, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True), use_tqdm=False)
    ids = engine.tokenizer(TEXT).input_ids
    scored = engine.generate([ids], SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0), use_tqdm=False)[0]
    return engine, [o["token_ids"] for o in greedy], np.array([c for c, _ in scored["prompt_logprobs"][1:]])


@pytest.mark.parametrize("tier", TIERS)
def test_a_mixed_k_quant_file_is_served_from_its_own_blocks(mixed, tier, caplog):
    """Each tensor in its own type (a fused q|k|v of Q4_K and Q6_K parts), the head from its Q6_K blocks, the
    decode step one call per layer; the output follows the unquantized engine on the file's dequantized numbers
    (the only difference: the activations' two int8 digits)."""
    base_engine, base_ids, base_ll = _run(mixed, "none")
    with caplog.at_level("INFO", logger="rosefast.engine"):
        engine, ids, ll = _run(mixed, "auto", kernels=tier)
    model = engine.runner.model
    assert [x.formats() for x in (model.layers[0].qkv, model.layers[1].qkv, model.layers[0].o, model.layers[0].gate_up,
                                  model.layers[0].down, model.layers[1].down, model.lm_head)] == [
        ["q4_k", "q6_k"], ["q4_k"], ["q5_0"], ["q5_k", "q4_k"], ["q6_k"], ["q5_1"], ["q6_k"]]
    assert all(isinstance(x, BlockLinear) for x in (model.layers[0].qkv, model.lm_head))
    assert isinstance(model.embed, BlockEmbedding) and model.embed.weights is model.lm_head.weights   # one copy
    assert model.plan_decode_layers() is None   # every layer planned: one call a layer on the blocks
    logged = caplog.text
    assert "the GGUF's blocks (Q4_K 7, Q5_0 2, Q5_1 1, Q5_K 2, Q6_K 2 tensors)" in logged, logged
    assert f"lm_head int8 (the GGUF's Q6_K blocks, the embedding looked up in them), on our {tier} block kernels" \
        in logged
    assert ids == base_ids
    assert abs((ll - base_ll).mean()) < 1e-3 and np.abs(ll - base_ll).max() < 1e-2
    served = sum(x.nbytes() for layer in model.layers for x in (layer.qkv, layer.o, layer.gate_up, layer.down))
    fp32 = sum(p.numel() * 4 for layer in base_engine.runner.model.layers
               for x in (layer.qkv, layer.o, layer.gate_up, layer.down) for p in x.parameters())
    assert served < 0.21 * fp32   # 4.6-6.6 bits a weight, as the file holds them, against 32


def test_an_int8_head_asked_for_by_name_is_q8_0_whatever_the_file_holds(mixed):
    """auto takes the file's own head blocks (Q6_K here); quantize_lm_head=int8 is Q8_0, quantized at load."""
    if quant_ops.pick("auto") is None:
        pytest.skip("no compiled kernel tier here: the head is torch's int8 either way")
    engine = LLMEngine(model=mixed, dtype="float32", device="cpu", kv_cache_tokens=1024, quantization="auto",
                       quantize_lm_head="int8")
    head = engine.runner.model.lm_head
    assert isinstance(head, Int8Linear) and head.formats() == ["q8_0"]
    assert not isinstance(engine.runner.model.embed, BlockEmbedding)   # its own table: the head is not the file's


def test_the_tiles_of_a_mixed_file_are_kept_and_read_back_as_they_were(mixed, monkeypatch):
    from rosefast.sources import tiles_cache
    from rosefast.models.args import load_model_args
    from rosefast.sources.resolve import gguf_source
    from tests.test_quant import same_tiles

    args, source = load_model_args(mixed.path), gguf_source(mixed)
    first = tiles_cache.cached_tiles(source, args, mixed.path)
    assert (mixed.path / tiles_cache.TILES_DIR / "index.json").is_file() and first["linears"] == "blocks"
    monkeypatch.setattr(tiles_cache, "file_tiles", lambda *_: pytest.fail("the GGUF was read again"))
    again = tiles_cache.cached_tiles(source, args, mixed.path)
    assert [t.fmt for t in again[0]["qkv"]] == ["q4_k", "q6_k"] and same_tiles(first, again)


def test_on_torch_ops_a_mixed_file_is_dequantized_once_and_quantized_again(mixed, caplog):
    with caplog.at_level("INFO", logger="rosefast.engine"):
        engine, ids, ll = _run(mixed, "auto", kernels="torch")
    layers = engine.runner.model.layers
    assert isinstance(layers[0].qkv, Int8Linear) and isinstance(layers[1].qkv, Int4Linear)   # Q4_K|Q6_K, Q4_K
    assert "blocks dequantized once and quantized again" in caplog.text
    _, _, base_ll = _run(mixed, "none")
    assert abs((ll - base_ll).mean()) < 0.05   # bf16 numbers and Q4_1 / int8 again: near, not equal


def _untied_kind(name):
    """An untied model as Q4_K_M files have it: the embedding in Q4_K, the head (output.weight) in Q6_K."""
    return {"token_embd.weight": T.Q4_K, "output.weight": T.Q6_K}.get(name) or _mixed_kind(name)


@pytest.fixture(scope="module")
def untied(default_model, tmp_path_factory):
    from rosefast.sources import tiny_random
    from rosefast.sources.resolve import resolve_model

    path = tmp_path_factory.mktemp("kquants") / "tiny-untied-q4_k_m.gguf"
    write_gguf(path, tiny_random("llama", hidden_size=256, intermediate_size=512, tie_word_embeddings=False),
               _untied_kind)
    return resolve_model(str(path))


@pytest.mark.parametrize("kernels", [*TIERS, "torch"])
def test_an_untied_embedding_is_looked_up_in_its_own_blocks_no_table_beside_them(untied, kernels, caplog):
    """The conversion leaves an untied embedding in the file too; on the kernels it is looked up in its own Q4_K
    tiles (no table: the weights served are the tiles), on torch's ops it is the table the blocks dequantize to.
    Either way each row is the file's numbers."""
    from rosefast.models.quantized import weight_bytes
    from rosefast.sources.resolve import left_in_gguf

    assert "model.embed_tokens.weight" in left_in_gguf(untied.path)[1]   # not written into the conversion
    _, base_ids, base_ll = _run(untied, "none")
    with caplog.at_level("INFO", logger="rosefast.engine"):
        engine, ids, ll = _run(untied, "auto", kernels=kernels)
    model = engine.runner.model
    vocab, hidden = model.args.vocab_size, model.args.hidden_size
    if kernels == "torch":
        assert isinstance(model.embed, torch.nn.Embedding) and not model.embed.weight.is_meta
    else:
        assert isinstance(model.embed, BlockEmbedding) and not model.embed.shared
        assert model.embed.weights.parts[0].fmt == "q4_k" and model.lm_head.formats() == ["q6_k"]
        assert "the embedding looked up in its own Q4_K blocks" in caplog.text, caplog.text
        assert not [p for p in model.parameters() if p.numel() >= vocab * hidden]   # no table of the vocabulary
        total, params = weight_bytes(model)
        assert model.embed.nbytes() == pytest.approx(vocab * hidden * 4.5 / 8, rel=0.05)   # Q4_K: 4.5 bits
        assert model.embed.nbytes() < total < 0.25 * params * 4
    if kernels == "torch":   # bf16 numbers and the blocks quantized again: near, not equal
        assert abs((ll - base_ll).mean()) < 0.05
        return
    assert ids == base_ids   # the kernels: only the activations' two int8 digits differ
    assert abs((ll - base_ll).mean()) < 1e-3 and np.abs(ll - base_ll).max() < 1e-2


def test_a_mixed_file_serves_over_http_as_the_engine_generates(mixed):
    engine = LLMEngine(model=mixed, dtype="float32", device="cpu", kv_cache_tokens=2048, quantization="auto")
    want = engine.generate(["Once upon a time"], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True),
                           use_tqdm=False)[0]["text"]
    server = Server(dict(tiny_env(mixed, kv_cache_tokens=2048, quantization="auto"), ROSEFAST_MODEL=mixed.name))
    try:
        import requests

        r = requests.post(server.url + "/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 12,
                                                               "temperature": 0, "ignore_eos": True}, timeout=60)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == want
        assert "the GGUF's blocks (Q4_K 7" in server.log_path.read_text(errors="replace")
    finally:
        server.stop()


def test_the_block_formats_benchmark_runs_every_format_on_every_tier_here():
    from benches import block_formats

    rows = block_formats.main(["--batches", "1", "--copies", "1", "--formats", "q4_k,q6_k"])
    assert [(fmt, tier) for fmt, tier, *_ in rows] == [(f, t) for f in ("q4_k", "q6_k") for t in TIERS]
    assert all(4.5 < bits < 6.7 and times[0] > 0 for _, _, bits, times in rows)


def test_the_shaped_gguf_writer_writes_an_f16_file_rosefast_reads(tmp_path):
    """benches/shaped_gguf.py (random weights in a real model's shapes, for llama-quantize): an F16 file whose
    linears are not blocks (served as converted), the model's tensors all there."""
    import gguf

    from benches import shaped_gguf
    from rosefast.sources import tiny_random
    from rosefast.models.args import load_model_args

    path = shaped_gguf.main(["--shape", "tiny-256", "--out", str(tmp_path / "tiny-f16.gguf")])
    tensors = gguf.GGUFReader(path).tensors
    assert {t.tensor_type.name for t in tensors} == {"F16", "F32"} and len(tensors) == 2 + 9 * 2
    args = load_model_args(tiny_random("llama", hidden_size=256, intermediate_size=512).path)
    assert gguf_blocks.gguf_blocks(path, args) is None
    cut = shaped_gguf.main(["--shape", "tiny-256", "--layers", "1", "--out", str(tmp_path / "cut-f16.gguf")])
    assert len(gguf.GGUFReader(cut).tensors) == 2 + 9   # a model cut to one layer: its layer's shapes, one of them
    with pytest.raises(SystemExit, match="--layers: 1 to 2"):
        shaped_gguf.main(["--shape", "tiny-256", "--layers", "3", "--out", str(tmp_path / "no.gguf")])
