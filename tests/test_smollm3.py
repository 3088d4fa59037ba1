"""SmolLM3 (rosefast.models.families.smollm3: Llama with no RoPE on every 4th layer), the family that proves the seam:
its own module, one line in the registry and this test. Its tiny model has 8 layers, two of them NoPE (3 and 7),
and its logits and greedy text are Hugging Face's, from a directory and from a GGUF written as llama.cpp's
converter writes it (the `smollm3` architecture, Llama's tensors with q/k permuted, no NoPE key)."""
import dataclasses

import pytest
import torch
from gguf import GGMLQuantizationType as T

from rosefast.models.args import load_model_args
from rosefast.models.families.smollm3 import nope_layers
from rosefast.sources import load_hf_model, load_tokenizer, resolve_model, tiny_random
from tests.gguf_writer import write_gguf
from tests.test_model_runner import check_against_hf, runner_for
from tests.paged import max_abs_diff, run_hf, run_ours


@pytest.fixture(scope="module")
def smollm3():
    return tiny_random("smollm3")


def test_the_nope_layers_are_every_fourth_and_their_rope_is_the_identity(smollm3):
    args = load_model_args(smollm3.path)
    assert args.local_layers == (3, 7) == nope_layers({"num_hidden_layers": 8, "no_rope_layer_interval": 4})
    assert nope_layers({"num_hidden_layers": 4, "no_rope_layers": [1, 0, 1, 1]}) == (1,)
    runner = runner_for(smollm3)
    assert torch.equal(runner.model.local_cos, torch.ones_like(runner.model.local_cos))
    assert torch.equal(runner.model.local_sin, torch.zeros_like(runner.model.local_sin))


def test_smollm3_logits_are_hugging_faces(smollm3):
    check_against_hf(smollm3)


def test_smollm3_with_rope_on_every_layer_is_not_hugging_faces(smollm3):
    """The check above sees the NoPE layers: our model with RoPE on them too is far from Hugging Face's."""
    tok = load_tokenizer(smollm3)
    prompt = tok("A B C D E F G H I J K L M N O P Q R S T U V W X Y Z").input_ids
    ref = run_hf(load_hf_model(smollm3), prompt, 4)
    runner = runner_for(smollm3)
    with torch.inference_mode():
        runner.model.local_cos.copy_(runner.model.rope_cos)
        runner.model.local_sin.copy_(runner.model.rope_sin)
    assert max_abs_diff([ref[0]], run_ours(runner, [prompt], 4, next_tokens=[ref[1]])) > 1e-2


def _greedy_over_http(model, prompt, n):
    import requests

    from tests.serving import Server, tiny_env

    s = Server(tiny_env(model))
    try:
        r = requests.post(s.url + "/v1/completions", json={"prompt": prompt, "max_tokens": n, "temperature": 0,
                                                           "ignore_eos": True}, timeout=60)
        assert r.status_code == 200, r.text
    finally:
        s.stop()
    return r.json()["choices"][0]["text"]


@pytest.mark.parametrize("kind", ["directory", "gguf-f32", "gguf-q8_0"])
def test_smollm3_is_served_over_http_as_hugging_face_generates(smollm3, kind, tmp_path):
    """Greedy over HTTP through a real gunicorn, token for token Hugging Face's own generation: from the directory,
    and from its GGUF (F32; Q8_0, served from its blocks, against Hugging Face's model of the same file)."""
    tok = load_tokenizer(smollm3)
    prompt = tok("The tiny model says that every fourth layer").input_ids
    model, reference = smollm3, smollm3
    if kind != "directory":
        path = tmp_path / f"smollm3.{kind}.gguf"
        written = write_gguf(path, smollm3, lambda name: T.F32 if kind == "gguf-f32" else T.Q8_0)
        model = resolve_model(str(path))
        assert model.model_type == "smollm3"
        served = load_model_args(model.path)
        assert served == dataclasses.replace(written, norm_eps=served.norm_eps)   # (stored as float32)
        reference = model if kind == "gguf-q8_0" else smollm3   # Hugging Face's model of the file itself
    with torch.inference_mode():
        want = load_hf_model(reference).generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                                                 pad_token_id=tok.pad_token_id, eos_token_id=None)[0, len(prompt):]
    assert _greedy_over_http(model, prompt, 12) == tok.decode(want.tolist())
