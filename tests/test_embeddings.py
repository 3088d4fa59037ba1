"""POST /v1/embeddings against a real gunicorn through the official openai client: each vector equal to Hugging
Face's pooled final hidden state (last token by default, L2-normalized; a sentence-transformers model's own mean
pooling) on a tiny random model and on the real default model, the same whatever else is in the batch, base64 the
same floats, `dimensions`, usage, and a 400 with the reason for what cannot be embedded."""
import base64
import json
import shutil
import types

import numpy as np
import openai
import pytest
import requests
import torch

from rosefast.sources import load_hf_model, load_tokenizer
from rosefast.sources.pooling import Pooling, pooling_of
from tests.serving import Server, client, server, tiny_env  # noqa: F401 - the shared fixtures

TEXTS = ["The lighthouse keeper lit the lamp.", "A storm rolled in from the sea tonight", "Paris", "x " * 40]


def hf_vectors(model, texts, mode="last", normalize=True):
    """Hugging Face's final hidden states (after the final norm, as its last hidden state is), pooled."""
    hf, tok = load_hf_model(model, torch.float32), load_tokenizer(model)
    out = []
    with torch.inference_mode():
        for text in texts:
            ids = tok(text, return_tensors="pt").input_ids
            states = hf(ids, output_hidden_states=True).hidden_states[-1][0].float()
            v = states[-1] if mode == "last" else states.mean(0) if mode == "mean" else states[0]
            out.append((v / v.norm() if normalize else v).numpy())
    return np.stack(out)


def cosines(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def test_vectors_are_hugging_faces_last_token_states_normalized(client, tiny_llama):
    got = client.embeddings.create(model="tiny", input=TEXTS, encoding_format="float")
    vectors = np.array([d.embedding for d in got.data])
    assert [d.index for d in got.data] == list(range(len(TEXTS)))
    assert cosines(vectors, hf_vectors(tiny_llama, TEXTS)).min() >= 0.999
    assert np.allclose(np.linalg.norm(vectors, axis=-1), 1.0, atol=1e-5)
    tok = load_tokenizer(tiny_llama)
    assert got.usage.prompt_tokens == got.usage.total_tokens == sum(len(tok(t).input_ids) for t in TEXTS)


def test_a_vector_is_the_same_whatever_else_is_in_the_batch(client):
    alone = [client.embeddings.create(model="tiny", input=t, encoding_format="float").data[0].embedding
             for t in TEXTS]
    batched = [d.embedding for d in client.embeddings.create(model="tiny", input=TEXTS[::-1] + TEXTS,
                                                             encoding_format="float").data]
    assert cosines(alone, batched[len(TEXTS):]).min() >= 0.99999
    assert cosines(alone[::-1], batched[:len(TEXTS)]).min() >= 0.99999


def test_base64_token_ids_and_dimensions(server, client, tiny_llama):
    floats = client.embeddings.create(model="tiny", input=TEXTS[0], encoding_format="float").data[0].embedding
    raw = requests.post(server.url + "/v1/embeddings", json={"input": TEXTS[0], "encoding_format": "base64"},
                        timeout=30).json()
    decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    assert np.array_equal(decoded, np.asarray(floats, dtype=np.float32))
    sdk = client.embeddings.create(model="tiny", input=TEXTS[0])   # the SDK asks for base64 and decodes it
    assert np.allclose(sdk.data[0].embedding, floats, atol=1e-7)
    ids = load_tokenizer(tiny_llama)(TEXTS[0]).input_ids
    by_ids = client.embeddings.create(model="tiny", input=[ids], encoding_format="float").data[0].embedding
    assert cosines([by_ids], [floats])[0] >= 0.99999
    cut = client.embeddings.create(model="tiny", input=TEXTS[0], dimensions=8, encoding_format="float")
    short = np.asarray(cut.data[0].embedding)
    assert short.shape == (8,) and abs(np.linalg.norm(short) - 1) < 1e-5
    assert cosines([short], [floats[:8]])[0] >= 0.99999


@pytest.mark.parametrize("body, param, message", [
    ({"input": ""}, "input", "empty"),
    ({"input": []}, "input", "non-empty"),
    ({"input": [[1, -2]]}, "input", "token ids"),
    ({"input": [1] * 3000}, "input", "context"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format", "float or base64"),
    ({"input": "x", "dimensions": 0}, "dimensions", "from 1 to"),
    ({"input": "x", "bogus": 1}, "bogus", "unsupported"),
])
def test_what_cannot_be_embedded_is_a_400_with_the_reason(server, body, param, message):
    r = requests.post(server.url + "/v1/embeddings", json=body, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and message in error["message"], error


def test_the_stand_in_engine_cannot_embed(default_model):
    s = Server({"ROSEFAST_MODEL": "stand-in", "ROSEFAST_SERVED_MODEL_NAME": "tiny"})
    try:
        r = requests.post(s.url + "/v1/embeddings", json={"input": "x"}, timeout=30)
        assert r.status_code == 400 and "cannot embed" in r.json()["error"]["message"], r.text
    finally:
        s.stop()


@pytest.fixture(scope="module")
def sentence_model(tiny_llama, tmp_path_factory):
    """The tiny model as a sentence-transformers checkpoint: mean pooling, normalized."""
    path = tmp_path_factory.mktemp("st") / "model"
    shutil.copytree(tiny_llama.path, path)
    (path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    (path / "1_Pooling").mkdir()
    (path / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 64,
                                                                "pooling_mode_mean_tokens": True}))
    (path / "2_Normalize").mkdir()
    return path


def test_a_sentence_transformers_model_is_pooled_as_its_files_say(sentence_model):
    assert pooling_of(sentence_model) == Pooling("mean", True, "sentence-transformers")
    s = Server(tiny_env(types.SimpleNamespace(path=sentence_model), max_num_batched_tokens=16))   # in chunks
    try:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
        got = np.array([d.embedding for d in c.embeddings.create(model="tiny", input=TEXTS,
                                                                   encoding_format="float").data])
        assert cosines(got, hf_vectors(str(sentence_model), TEXTS, "mean")).min() >= 0.999
        # the longest again (blocks of it cached by now): a mean needs every position, none from the prefix cache
        again = c.embeddings.create(model="tiny", input=TEXTS[3], encoding_format="float").data[0].embedding
        assert cosines([again], [got[3]])[0] >= 0.99999
    finally:
        s.stop()


def test_a_pooling_not_served_is_refused_by_name(sentence_model, tmp_path):
    path = tmp_path / "m"
    shutil.copytree(sentence_model, path)
    (path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_max_tokens": True}))
    with pytest.raises(ValueError, match="pooling_mode_max_tokens"):
        pooling_of(path)


def test_the_real_model_embeds_as_hugging_face(default_model):
    s = Server({"ROSEFAST_MODEL": str(default_model.path), "ROSEFAST_DTYPE": "float32",
                "ROSEFAST_QUANTIZATION": "none", "ROSEFAST_SERVED_MODEL_NAME": "real"}, startup_timeout=300)
    try:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
        got = np.array([d.embedding for d in c.embeddings.create(model="real", input=TEXTS,
                                                                   encoding_format="float").data])
    finally:
        s.stop()
    assert cosines(got, hf_vectors(default_model, TEXTS)).min() >= 0.999


def test_embeddings_and_generation_share_the_engine_unchanged(tiny_llama):
    """Embedding and generating requests admitted together: prefill steps never mix the two (one pools, the
    other samples); every generation equals its run alone, every vector its pooling alone."""
    from rosefast.engine.llm_engine import LLMEngine
    from rosefast.engine.sampling_params import SamplingParams

    engine = LLMEngine(model=tiny_llama, dtype="float32", kv_cache_tokens=4096, speculative="off",
                       max_num_batched_tokens=32)   # a 40-token prompt pools in two chunks
    prompts = [[5 + i] * (8 + 16 * i) for i in range(3)]
    gen = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)

    def run(requests_):
        ids = [engine.add_request(p, params) for p, params in requests_]
        outs, pooled = {}, {}
        while engine.has_unfinished():
            for out in engine.step().outputs:
                outs.setdefault(out.request_id, []).extend(out.new_token_ids)
                if out.embedding is not None:
                    pooled[out.request_id] = out.embedding
        return [pooled.get(i, outs.get(i)) for i in ids]

    alone = [run([(p, gen)])[0] for p in prompts] + [run([(p, SamplingParams(pooling=m))])[0]
                                                     for p in prompts for m in ("last", "mean")]
    mixed = run([(p, gen) for p in prompts] + [(p, SamplingParams(pooling=m)) for p in prompts
                                               for m in ("last", "mean")])
    assert mixed[:3] == alone[:3]
    assert cosines(mixed[3:], alone[3:]).min() >= 0.99999
    assert engine.block_manager.num_used_blocks == 0


@pytest.mark.parametrize("family", ["gpt2", "gemma3_text", "qwen3_moe", "qwen3_next"])
def test_every_kind_of_family_embeds_as_hugging_face(family, default_model):
    """The final norm of each model kind (GPT-2's LayerNorm, Gemma's, a mixture of experts', a hybrid's whose
    linear-attention state runs through a chunked prefill) pooled as Hugging Face's last hidden state."""
    from rosefast.engine.llm_engine import LLMEngine
    from rosefast.engine.sampling_params import SamplingParams
    from rosefast.sources import tiny_random

    model = tiny_random(family)
    engine = LLMEngine(model=model, dtype="float32", kv_cache_tokens=4096, speculative="off",
                       max_num_batched_tokens=16)
    tok = load_tokenizer(model)
    ids = [engine.add_request(tok(t).input_ids, SamplingParams(pooling="last")) for t in TEXTS]
    pooled = {}
    while engine.has_unfinished():
        for out in engine.step().outputs:
            if out.embedding is not None:
                pooled[out.request_id] = out.embedding
    assert cosines([pooled[i] for i in ids], hf_vectors(model, TEXTS)).min() >= 0.999


def test_a_preempted_embedding_pools_its_prompt_once(tiny_llama):
    """Preempted halfway through its chunked prefill (a decoding sequence needs its blocks), a mean pooling starts
    again from nothing: its vector is the one it has alone."""
    from rosefast.engine.llm_engine import LLMEngine
    from rosefast.engine.sampling_params import SamplingParams

    engine = LLMEngine(model=tiny_llama, dtype="float32", kv_cache_tokens=96, speculative="off",
                       max_num_batched_tokens=32, enable_prefix_cache=False)   # 6 blocks of 16
    prompt = list(range(100, 160))   # 4 blocks, pooled in two chunks

    def pooled(rid):
        found = None
        while engine.has_unfinished():
            for out in engine.step().outputs:
                if out.request_id == rid and out.embedding is not None:
                    found = out.embedding
        return found
    alone = pooled(engine.add_request(prompt, SamplingParams(pooling="mean")))
    engine.add_request(list(range(31)), SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))   # 2 blocks
    engine.step()   # its prefill; it decodes into its third block two steps on, when the embedding holds 4
    got = pooled(engine.add_request(prompt, SamplingParams(pooling="mean", priority=5)))
    assert engine.scheduler.preemptions == 1 and cosines([got], [alone])[0] >= 0.99999


def test_another_model_is_a_404(server):
    r = requests.post(server.url + "/v1/embeddings", json={"input": "x", "model": "text-embedding-3-small"},
                      timeout=30)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
