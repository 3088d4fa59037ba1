"""A GGUF of each family, written as llama.cpp's converter writes it, converts to the model it was written from:
the same shapes and RoPE (what transformers' GGUF reader drops is read from the file: models.gguf_config), the
same weights, the same logits in Hugging Face's forward and in ours, and its Q8_0 blocks served as they lie."""
import dataclasses
import itertools
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T

from rosefast.sources import load_hf_model, load_tokenizer, tiny_random
from rosefast.models.args import load_model_args
from rosefast.build import read_hf_state_dict
from rosefast.sources.resolve import resolve_model
from tests.test_quant import TEXT
from tests.gguf_writer import _longrope_attn_factor, write_gguf

#: each family's tiny model, with what its file has to carry: an explicit head_dim (Qwen3: 32 on a 64-wide
#: model), a partial rotary and long-RoPE switching at 64 positions (Phi-3), a local layer beside a global one
#: with their own RoPE, the global one scaled (Gemma 3: its attention scale is 1/sqrt(head_dim) in a GGUF)
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}   # Llama 3.1's own
FAMILY_FILES = {
    "llama": {}, "qwen2": {}, "qwen3": {}, "mistral": {},
    # Llama 3.x's RoPE scaling, written by llama.cpp as per-frequency divisors: Llama 3's own parameters read
    # back; other parameters (a 512-position original) kept as the divisors themselves
    "llama-rope-llama3": {"rope_parameters": LLAMA3_ROPE},
    "llama-rope-divisors": {"rope_parameters": {**LLAMA3_ROPE, "original_max_position_embeddings": 512}},
    "phi3": {"partial_rotary_factor": 0.75, "original_max_position_embeddings": 64,
             "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
                                 "short_factor": [1.0, 1.5, 2.0, 3.0, 5.0, 8.0], "long_factor": [4.0] * 6}},
    "gemma3_text": {"query_pre_attn_scalar": 32},
    # mixtures of experts (8, top-2), every layer sparse as llama.cpp has them; Qwen2-MoE's shared expert
    "qwen3_moe": {"mlp_only_layers": []}, "qwen2_moe": {},
    # OLMoE's file (`olmoe`): shown to transformers' reader as Qwen3-MoE's, its q/k norms over their whole width
    "olmoe": {},
    # Gemma 3's own pattern (five local layers, then a global one), which llama.cpp's converter does not write
    "gemma3_text-pattern": {"query_pre_attn_scalar": 32, "num_hidden_layers": 6, "sliding_window_pattern": 6,
                            "layer_types": None},
}


def _as_served(args):
    """What a GGUF of `args`' model says, as llama.cpp reads it: Mistral is written under the `llama`
    architecture and served as Llama (no window, as llama.cpp serves it)."""
    args = dataclasses.replace(args, norm_eps=float(np.float32(args.norm_eps)))   # stored as float32
    rope = dict(args.rope_scaling)
    if rope.get("rope_type") == "longrope":   # its attention factor written out, as the converter does
        rope["attention_factor"] = float(np.float32(_longrope_attn_factor(args, rope)))
        args = dataclasses.replace(args, rope_scaling=tuple(sorted(rope.items())))
    if args.family == "mistral":
        return dataclasses.replace(args, family="llama", sliding_window=0)
    return args


FAMILIES = [name for name in FAMILY_FILES if "-" not in name]   # a variant's layers are its family's


@pytest.fixture(scope="module", params=list(FAMILY_FILES))
def family_file(request, tmp_path_factory):
    """(the tiny directory model, the model its F32 GGUF converts to)"""
    model = tiny_random(request.param.split("-")[0], **FAMILY_FILES[request.param])
    path = tmp_path_factory.mktemp("gguf") / f"{request.param}.f32.gguf"
    write_gguf(path, model, lambda name: T.F32)
    return model, resolve_model(str(path))


def test_the_file_converts_to_the_same_shapes_rope_and_weights(family_file):
    model, converted = family_file
    assert converted.source == "gguf"
    ours, theirs = load_model_args(converted.path), _as_served(load_model_args(model.path))
    if dict(theirs.rope_scaling).get("original_max_position_embeddings") == 512:   # the divisors kept as such
        rope = dict(ours.rope_scaling)
        assert rope["rope_type"] == "longrope" and rope["short_factor"] == rope["long_factor"]
        assert rope["original_max_position_embeddings"] == ours.max_position_embeddings   # never switches
        ours = dataclasses.replace(ours, rope_scaling=theirs.rope_scaling)
    assert ours == theirs
    ours, theirs = read_hf_state_dict(converted.path), read_hf_state_dict(model.path)
    assert sorted(ours) == sorted(theirs)
    for name, weight in theirs.items():   # Gemma's norms went through 1 + w and back
        torch.testing.assert_close(ours[name], weight, atol=1e-6, rtol=0, msg=name)


def _hf_logits(path, ids):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def test_the_converted_model_gives_hugging_faces_logits_past_the_long_rope_switch(family_file):
    """Hugging Face's own forward over the directory and over the conversion of its GGUF: 80 positions cross
    Phi-3's long-RoPE switch (64) and reach past nothing else."""
    model, converted = family_file
    ids = [(i * 7919) % 40000 + 17 for i in range(80)]
    torch.testing.assert_close(_hf_logits(converted.path, ids), _hf_logits(model.path, ids), atol=1e-4, rtol=0)


def test_the_gguf_is_served_as_hugging_face_generates_from_the_directory(family_file):
    from rosefast.engine.llm_engine import LLMEngine
    from rosefast.engine.sampling_params import SamplingParams

    model, converted = family_file
    tok = load_tokenizer(model)
    prompt = tok("The tiny model says").input_ids
    with torch.inference_mode():
        want = load_hf_model(model).generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                                             pad_token_id=tok.pad_token_id, eos_token_id=None)[0, len(prompt):]
    engine = LLMEngine(model=converted, dtype="float32", kv_cache_tokens=1024, quantization="none")
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    assert engine.generate([prompt], params, use_tqdm=False)[0]["token_ids"] == want.tolist()


@pytest.mark.parametrize("family", FAMILIES)
def test_each_familys_q8_0_file_is_served_from_its_blocks_near_hugging_faces_numbers(family, tmp_path):
    """The same model as Q8_0 blocks (its head and embedding too), served with `auto` (the file's own blocks, the
    int8 kernels where the CPU has them): its prompt loglikelihoods within 0.03 nats/token of Hugging Face's on
    the directory (the int8 bound of tests/test_quant.py)."""
    from rosefast.engine.llm_engine import LLMEngine
    from rosefast.engine.sampling_params import SamplingParams
    from rosefast.models.quantized import Int8Linear

    model = tiny_random(family, **FAMILY_FILES[family])
    path = tmp_path / "q8_0.gguf"
    write_gguf(path, model, lambda name: T.Q8_0)
    engine = LLMEngine(model=resolve_model(str(path)), dtype="float32", kv_cache_tokens=1024, quantization="auto")
    served = engine.runner.model
    assert isinstance(served.layers[0].o, Int8Linear) and isinstance(served.lm_head, Int8Linear)
    if served.args.num_experts:   # every expert's linears from the file's 3-D tensors
        assert all(isinstance(x, Int8Linear) for e in served.layers[-1].moe.experts for x in (e.gate_up, e.down))
    ids = load_tokenizer(model)(TEXT).input_ids
    scored = engine.generate([ids], SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)[0]
    ours = torch.tensor([lp for lp, _ in scored["prompt_logprobs"][1:]])
    want = torch.log_softmax(_hf_logits(model.path, ids)[:-1], -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    assert abs((ours - want).mean()) < 0.03 and (ours - want).abs().max() < 0.3


@pytest.mark.parametrize("family", ["llama", "qwen3", "phi3", "gemma3_text", "qwen2_moe", "olmoe"])
def test_a_file_served_from_its_blocks_converts_without_its_linears_and_loads_as_transformers_reads_it(
        family, tmp_path):
    """A file whose layer linears are all in block formats (a mix here) converts to everything but them — they are
    read from the file at load — and the model loaded from it is transformers' own reading of the whole file, bit
    for bit: the blocks dequantized in our order (Llama's q/k rows, Phi-3's fused q|k|v with its partial rotary),
    the rest through transformers (Gemma's norm offset)."""
    from rosefast.sources.gguf_convert import hf_model_from_gguf
    from rosefast.models.llama import llama_state_dict
    from rosefast.build import load_model
    from rosefast.sources.resolve import gguf_source, left_in_gguf

    linear_kinds = itertools.cycle([T.Q8_0, T.Q4_0, T.Q5_1, T.Q4_1, T.Q5_0])

    def kind(name):
        if name in ("token_embd.weight", "output.weight"):
            return T.Q8_0
        return next(linear_kinds) if name.startswith("blk.") and "norm" not in name else T.F32

    path = tmp_path / f"{family}.mixed.gguf"
    write_gguf(path, tiny_random(family, **FAMILY_FILES[family]), kind)
    converted = resolve_model(str(path))
    args = load_model_args(converted.path)
    gguf, left = left_in_gguf(converted.path)
    assert gguf == path and gguf_source(converted) == path
    linears = [k for k in read_hf_state_dict(converted.path) if k.startswith("model.layers.") and
               k.endswith("_proj.weight")]
    assert not linears, f"dense linears were written into {converted.path}: {linears[:3]}"
    # its Q8_0 blocks too: the head's (a tied embedding's) and an untied embedding's own
    whole = ["model.embed_tokens.weight"] + ([] if args.tie_word_embeddings else ["lm_head.weight"])
    assert all(k in left for k in whole) and not any(k in read_hf_state_dict(converted.path) for k in whole)
    # q, k, v, o; gate, up, down, or the experts' gate|up and down (and a shared expert's gate, up, down)
    per_layer = 4 if family == "phi3" else 6 + 3 * bool(args.shared_expert_size) if args.num_experts else 7
    assert len(left) == per_layer * args.num_layers + len(whole)
    assert all(k.endswith(("_proj.weight", "experts.gate_up_proj", "experts.down_proj")) for k in left
               if k not in whole)
    ours = load_model(converted)[0].state_dict()
    theirs = llama_state_dict(hf_model_from_gguf(path).state_dict(), args)
    assert sorted(ours) == sorted(theirs)
    for name, weight in theirs.items():
        assert torch.equal(ours[name], weight), name
    lean = load_model(converted, lean=True)[0]
    assert lean.layers[0].qkv.weight.is_meta and not lean.layers[0].input_norm.is_meta   # left for the blocks
    assert lean.embed.weight.is_meta and (args.tie_word_embeddings or lean.lm_head.weight.is_meta)


@pytest.mark.parametrize("family", ["qwen3", "qwen3_moe", "qwen3_5_moe_text"])
def test_a_qwen3_gguf_is_served_over_http_as_hugging_face_generates(tmp_path, family):
    """The most downloaded families from a file (dense, a mixture of experts, Qwen3.6's hybrid attention MoE:
    tests/test_hybrid_gguf.py), through a real gunicorn (the file converted here first, the server finding it in
    the cache by the file): its greedy completion is Hugging Face's own greedy generation on the directory it was
    written from."""
    import requests

    from tests.serving import Server, tiny_env

    model = tiny_random(family, **FAMILY_FILES.get(family, {}))
    path = tmp_path / f"{family}.f32.gguf"
    write_gguf(path, model, lambda name: T.F32)
    assert resolve_model(str(path)).converted
    tok = load_tokenizer(model)
    prompt = tok("The tiny model says").input_ids
    with torch.inference_mode():
        want = load_hf_model(model).generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                                             pad_token_id=tok.pad_token_id, eos_token_id=None)[0, len(prompt):]
    s = Server({**tiny_env(model, quantization="none"), "ROSEFAST_MODEL": str(path)})
    try:
        r = requests.post(s.url + "/v1/completions", json={"prompt": "The tiny model says", "max_tokens": 12,
                                                           "temperature": 0, "ignore_eos": True}, timeout=120)
        assert r.status_code == 200, r.text
        assert requests.get(s.url + "/v1/models", timeout=10).json()["data"][0]["id"] == "tiny"
    finally:
        s.stop()
    assert r.json()["choices"][0]["text"] == tok.decode(want.tolist())


def test_our_gguf_reader_reads_the_tensors_and_values_ggufs_own_reader_reads(tmp_path):
    """rosefast.sources.gguf_file steps over the vocabulary (kept as its length) and maps the tensors: every
    tensor's type, shape and bytes and every other value as gguf's reader gives them, on the embedded file and
    on a file of mixed block types."""
    import gguf
    import numpy as np

    from rosefast.sources.gguf_file import GGUFError, GGUFFile
    from rosefast.sources.resolve import default_gguf_path

    mixed = tmp_path / "mixed.gguf"
    kinds = itertools.cycle([T.Q8_0, T.Q4_0, T.Q5_1, T.F16])
    write_gguf(mixed, tiny_random("gemma3_text", **FAMILY_FILES["gemma3_text"]), lambda name: next(kinds))
    for path in (default_gguf_path(), mixed):
        ours, theirs = GGUFFile(path), gguf.GGUFReader(str(path))
        assert list(ours.tensors) == [t.name for t in theirs.tensors]
        for t in theirs.tensors:
            o = ours.tensors[t.name]
            assert (o.tensor_type, o.shape, o.data.dtype) == (t.tensor_type, tuple(int(x) for x in t.shape),
                                                             t.data.dtype)
            assert np.array_equal(o.data, t.data), t.name
        for key, field in theirs.fields.items():
            if key.startswith("GGUF."):
                continue
            value = field.contents()
            strings = isinstance(value, list) and value and isinstance(value[0], str)
            assert ours.value(key) == (len(value) if strings else value), key
    assert len({t.tensor_type for t in GGUFFile(mixed).tensors.values()}) == 5   # F32 norms beside the four
    (tmp_path / "not.gguf").write_bytes(b"GGML" + bytes(60))
    with pytest.raises(GGUFError, match="not a GGUF file"):
        GGUFFile(tmp_path / "not.gguf")
