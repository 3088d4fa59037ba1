"""The hybrid-attention families from their GGUFs (`qwen35`, `qwen35moe`, `qwen3next`), written as llama.cpp's
converter writes them (tests/gguf_writer.py: tensor for tensor what conversion/qwen.py makes of these tiny models —
Qwen3.5's v heads tiled, A as -exp(A_log), norms as 1 + w, Qwen3-Next's q|k|v|z apart): Hugging Face's logits from
the F32 file, the Q8_0 and mixed files served from their blocks, a file's draft (MTP) layers left out (greedy over
HTTP from a Qwen3.6-MoE file: tests/test_gguf_families.py)."""
import itertools

import pytest
import torch
from gguf import GGMLQuantizationType as T

from rosefast.build import read_hf_state_dict
from rosefast.models.args import load_model_args
from rosefast.sources import load_tokenizer, tiny_random
from rosefast.sources.resolve import left_in_gguf, resolve_model
from tests.gguf_writer import dequantized_copy, write_gguf
from tests.paged import max_abs_diff, run_hf, run_ours
from tests.test_model_runner import load_hf_model, runner_for
from tests.test_quant import TEXT

HYBRIDS = ["qwen3_5_text", "qwen3_5_moe_text", "qwen3_next"]
PROMPTS = [[(i * 7919) % 40000 + 17 for i in range(40)], [5, 900, 17, 33, 2000]]


@pytest.fixture(scope="module", params=HYBRIDS)
def f32_file(request, tmp_path_factory):
    """(the tiny directory model, the model its F32 GGUF converts to, the file)"""
    model = tiny_random(request.param)
    path = tmp_path_factory.mktemp("gguf") / f"{request.param}.f32.gguf"
    write_gguf(path, model, lambda name: T.F32)
    return model, resolve_model(str(path)), path


def _logits_against_hf(model, served, quantization="none"):
    """The largest logit difference from Hugging Face's on the directory, over a packed prefill of two prompts and
    six decode steps"""
    ref = [run_hf(load_hf_model(model), p, 6) for p in PROMPTS]
    ours = run_ours(runner_for(served, quantization=quantization), PROMPTS, 6, next_tokens=[fed for _, fed in ref])
    return max_abs_diff([r for r, _ in ref], ours)


def test_the_file_gives_hugging_faces_logits_over_prefill_and_decode(f32_file):
    """Its config read back from the `ssm.*` keys (the v heads tiled where the converter tiles them), its weights
    undone, Hugging Face's logits to 1e-4 (Qwen3.5's tiled v heads read their own k heads; the norms lose their
    offset; A_log is back)."""
    model, converted, _ = f32_file
    ours, theirs = load_model_args(converted.path), load_model_args(model.path)
    assert ours.linear_v_tiled == model.model_type.startswith("qwen3_5")   # (2 k heads, 4 v heads)
    for field in ("linear_layers", "linear_k_heads", "linear_v_heads", "linear_k_dim", "linear_v_dim", "linear_conv",
                  "rotary_dim", "num_experts", "experts_per_token", "expert_size", "shared_expert_size", "attn_gate",
                  "norm_offset", "num_layers", "tie_word_embeddings"):
        assert getattr(ours, field) == getattr(theirs, field), field
    assert _logits_against_hf(model, converted) < 1e-4


def test_the_files_draft_layers_are_left_out(tmp_path):
    """A file with a multi-token-prediction layer after the model's own (`nextn_predict_layers`, as published
    Qwen3.5/3.6 files carry): the model is its own layers, with Hugging Face's logits."""
    model = tiny_random("qwen3_5_moe_text")
    path = tmp_path / "mtp.gguf"
    write_gguf(path, model, lambda name: T.F32, mtp=1)
    converted = resolve_model(str(path))
    assert load_model_args(converted.path).num_layers == load_model_args(model.path).num_layers
    assert not any(".4." in k for k in read_hf_state_dict(converted.path))
    assert _logits_against_hf(model, converted) < 1e-4


def _scored(engine, ids):
    from rosefast.engine.sampling_params import SamplingParams

    scored = engine.generate([ids], SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)[0]
    return torch.tensor([lp for lp, _ in scored["prompt_logprobs"][1:]])


@pytest.mark.parametrize("family", HYBRIDS)
def test_a_block_file_is_served_from_its_blocks_as_its_dequantized_weights_compute(family, tmp_path):
    """Every linear in a block format (Q8_0, Q4_0, Q5_1, Q4_1, Q5_0 in turn; the embedding and head Q8_0): the
    conversion writes none of the linears (the DeltaNet's q|k|v, z and out; the gated attention's q|gate, k, v, o;
    the MLP's or the experts'), they are served from the file's blocks — the DeltaNet's z beside its q|k|v, the
    attention's gate rows apart from its q rows — and the prompt's loglikelihoods are those of the file's numbers
    dequantized into an F32 file (read by the conversion, not the blocks) to the kernels' rounding."""
    from rosefast.engine.llm_engine import LLMEngine
    from rosefast.models.quantized import Int8Linear, _TiledLinear

    kinds = itertools.cycle([T.Q8_0, T.Q4_0, T.Q5_1, T.Q4_1, T.Q5_0])

    def kind(name):
        if name in ("token_embd.weight", "output.weight"):
            return T.Q8_0
        return next(kinds) if name.startswith("blk.") and "norm" not in name else T.F32

    model = tiny_random(family)
    path = tmp_path / f"{family}.mixed.gguf"
    write_gguf(path, model, kind)
    converted = resolve_model(str(path))
    gguf, left = left_in_gguf(converted.path)
    assert gguf == path
    written = read_hf_state_dict(converted.path)
    assert not [k for k in written if k.endswith(("_proj.weight", "in_proj_qkv.weight", "in_proj_z.weight"))
                and "shared_expert_gate" not in k and k.startswith("model.layers.")]
    assert "model.layers.0.linear_attn.in_proj_qkv.weight" in left and "model.layers.3.self_attn.q_proj.weight" in left
    ids = load_tokenizer(model)(TEXT).input_ids
    blocks = LLMEngine(model=converted, dtype="float32", kv_cache_tokens=1024, quantization="auto")
    served = blocks.runner.model
    deltanet, attention = served.layers[0], served.layers[3]
    tiled = (deltanet.linear_attn.qkvz, deltanet.linear_attn.out, attention.qkv, attention.o, attention.attn_gate)
    assert all(isinstance(x, _TiledLinear) for x in tiled)
    if served.args.num_experts:
        assert all(isinstance(x, _TiledLinear) for e in attention.moe.experts for x in (e.gate_up, e.down))
    assert isinstance(served.lm_head, Int8Linear)
    ours = _scored(blocks, ids)
    twin = tmp_path / f"{family}.dequantized.gguf"   # the same numbers in F32: read by the conversion, not the blocks
    dequantized_copy(path, twin)
    dense = _scored(LLMEngine(model=resolve_model(str(twin)), dtype="float32", kv_cache_tokens=1024,
                              quantization="none"), ids)
    if deltanet.linear_attn.qkvz.kernels is not None:   # our block kernels: the file's numbers as they lie
        assert (ours - dense).abs().max() < 0.02
    else:   # ROSEFAST_CPU_KERNELS=torch: torch's weight-only ops, the blocks dequantized and quantized again to Q4_1
        assert (ours - dense).abs().mean() < 0.2   # (these tiny hybrids drift 0.03-0.11 nats by it: as by int4 at load)


@pytest.mark.parametrize("family", HYBRIDS)
def test_a_q8_0_file_is_served_near_hugging_faces_numbers(family, tmp_path):
    """Every linear, the embedding and the head Q8_0: the prompt's loglikelihoods within 0.03 nats/token of Hugging
    Face's on the directory (the int8 bound of tests/test_quant.py; 4-bit blocks move these tiny hybrids' numbers
    by 0.1-0.2 nats whether the file's or quantized at load: their gated norms amplify rounding)."""
    from rosefast.engine.llm_engine import LLMEngine

    model = tiny_random(family)
    path = tmp_path / f"{family}.q8_0.gguf"
    write_gguf(path, model, lambda name: T.Q8_0)
    ids = load_tokenizer(model)(TEXT).input_ids
    ours = _scored(LLMEngine(model=resolve_model(str(path)), dtype="float32", kv_cache_tokens=1024,
                             quantization="auto"), ids)
    with torch.no_grad():
        logits = load_hf_model(model)(torch.tensor([ids])).logits[0]
    want = torch.log_softmax(logits[:-1], -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    assert abs((ours - want).mean()) < 0.03

