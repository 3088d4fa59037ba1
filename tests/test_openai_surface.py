"""What evaluation and SDK clients send, through the official openai client and a real gunicorn: n, logprobs,
echo, several prompts, the tokenizer endpoints, tolerated fields; admission of several prompts; n's fork."""
import math
import threading

import openai
import pytest
import requests

from rosefast.engine.llm_engine import LLMEngine
from rosefast.engine.sampling_params import SamplingParams
from tests.serving import Server, client, offline, server, tiny_env  # noqa: F401 - the shared fixtures


def streamed_choices(events, chat=False):
    """{index: text} from a stream of chunks."""
    out = {}
    for ev in events:
        for c in ev.choices:
            piece = (c.delta.content or "") if chat else c.text
            out[c.index] = out.get(c.index, "") + (piece or "")
    return out


def test_n_choices_are_reproducible_with_a_seed_and_differ(client):
    kw = dict(model="tiny", prompt="Three ways to say it", max_tokens=10, temperature=1.0, n=3, seed=42,
              extra_body={"ignore_eos": True})
    a, b = client.completions.create(**kw), client.completions.create(**kw)
    assert [c.index for c in a.choices] == [0, 1, 2]
    texts = [c.text for c in a.choices]
    assert texts == [c.text for c in b.choices] and len(set(texts)) == 3
    single = client.completions.create(model="tiny", prompt="Three ways to say it", max_tokens=1, temperature=0)
    assert a.usage.completion_tokens == 30 and a.usage.prompt_tokens == single.usage.prompt_tokens   # once
    assert streamed_choices(client.completions.create(**kw, stream=True)) == dict(enumerate(texts))
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], n=2,
                                          max_tokens=6, temperature=1.0, seed=1, extra_body={"ignore_eos": True})
    assert [c.index for c in chat.choices] == [0, 1] and chat.usage.completion_tokens == 12
    streamed = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], n=2,
                                              max_tokens=6, temperature=1.0, seed=1, stream=True,
                                              extra_body={"ignore_eos": True})
    assert streamed_choices(streamed, chat=True) == {c.index: c.message.content for c in chat.choices}


def test_completion_logprobs_streamed_and_not(client, offline):
    prompt = "Logprobs of every token"
    want = offline.generate([prompt], SamplingParams(max_tokens=6, temperature=0, logprobs=2, ignore_eos=True),
                            use_tqdm=False)[0]
    full = client.completions.create(model="tiny", prompt=prompt, max_tokens=6, temperature=0, logprobs=2,
                                     extra_body={"ignore_eos": True})
    lp = full.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    for got, (chosen, top) in zip(lp.token_logprobs, want["logprobs"]):
        assert math.isclose(got, chosen, abs_tol=1e-5)
    assert all(len(t) in (2, 3) and max(t.values()) >= c for t, c in zip(lp.top_logprobs, lp.token_logprobs))
    assert "".join(lp.tokens) == full.choices[0].text and lp.text_offset[0] == 0
    assert all(b - a == len(t) for a, b, t in zip(lp.text_offset, lp.text_offset[1:], lp.tokens))
    streamed = list(client.completions.create(model="tiny", prompt=prompt, max_tokens=6, temperature=0,
                                              logprobs=2, stream=True, extra_body={"ignore_eos": True}))
    tokens = [t for ev in streamed for c in ev.choices if c.logprobs for t in c.logprobs.tokens]
    values = [v for ev in streamed for c in ev.choices if c.logprobs for v in c.logprobs.token_logprobs]
    assert tokens == lp.tokens and values == lp.token_logprobs   # a merged chunk carries all its tokens' entries


def test_chat_logprobs_with_bytes_streamed_and_not(client):
    kw = dict(model="tiny", messages=[{"role": "user", "content": "Tell me"}], max_tokens=5, temperature=0,
              logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True})
    full = client.chat.completions.create(**kw)
    content = full.choices[0].logprobs.content
    assert len(content) == 5 and all(len(c.top_logprobs) == 3 for c in content)
    assert all(c.top_logprobs[0].logprob >= c.logprob - 1e-6 for c in content)   # greedy: its token is the top one
    assert bytes(b for c in content for b in c.bytes).decode("utf-8", "replace") == full.choices[0].message.content
    streamed = [c for ev in client.chat.completions.create(**kw, stream=True) for ch in ev.choices
                if ch.logprobs for c in ch.logprobs.content]
    assert [(c.token, c.logprob) for c in streamed] == [(c.token, c.logprob) for c in content]


def test_echo_with_logprobs_and_max_tokens_zero(client, offline, tiny_llama):
    ids = offline.tokenizer("An echoed prompt is scored").input_ids
    want = offline.generate([ids], SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=1), use_tqdm=False)[0]
    scored = client.completions.create(model="tiny", prompt=ids, max_tokens=0, echo=True, logprobs=1, temperature=0)
    lp = scored.choices[0].logprobs
    assert scored.choices[0].text == offline.tokenizer.decode(ids) and scored.usage.completion_tokens == 0
    assert lp.token_logprobs[0] is None and len(lp.token_logprobs) == len(ids)
    for got, (chosen, _) in zip(lp.token_logprobs[1:], want["prompt_logprobs"][1:]):
        assert math.isclose(got, chosen, abs_tol=1e-5)
    one = client.completions.create(model="tiny", prompt=ids, max_tokens=1, echo=True, logprobs=1, temperature=0)
    # lm-eval's request: prompt, then 1 (equal up to the ~1e-6 a prefill batched beside another request moves)
    assert close(one.choices[0].logprobs.token_logprobs[:-1], lp.token_logprobs)
    assert one.choices[0].text.startswith(scored.choices[0].text) and one.usage.completion_tokens == 1
    text = client.completions.create(model="tiny", prompt="Say it back", max_tokens=3, echo=True, temperature=0)
    assert text.choices[0].text.startswith("Say it back")
    streamed = list(client.completions.create(model="tiny", prompt=ids, max_tokens=1, echo=True, logprobs=1,
                                              temperature=0, stream=True))
    assert "".join(c.text for ev in streamed for c in ev.choices) == one.choices[0].text
    assert close([v for ev in streamed for c in ev.choices if c.logprobs for v in c.logprobs.token_logprobs],
                 one.choices[0].logprobs.token_logprobs)


def close(got, want):
    """Logprob lists equal in length, in where they are None, and in value within 1e-5."""
    return len(got) == len(want) and all(
        (g is None) == (w is None) and (g is None or math.isclose(g, w, abs_tol=1e-5)) for g, w in zip(got, want))


def test_several_prompts_are_answered_in_prompt_order(client, offline):
    prompts = ["first prompt", "the second one", "and a third"]
    want = offline.generate(prompts, SamplingParams(max_tokens=5, temperature=0, ignore_eos=True), use_tqdm=False)
    out = client.completions.create(model="tiny", prompt=prompts, max_tokens=5, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert [c.text for c in out.choices] == [w["text"] for w in want] and out.usage.completion_tokens == 15
    ids = [offline.tokenizer(p).input_ids for p in prompts]
    by_ids = client.completions.create(model="tiny", prompt=ids, max_tokens=5, temperature=0, n=2,
                                       extra_body={"ignore_eos": True})
    assert [c.index for c in by_ids.choices] == list(range(6))
    assert [c.text for c in by_ids.choices] == [w["text"] for w in want for _ in range(2)]   # greedy: equal pairs
    assert by_ids.usage.prompt_tokens == sum(len(i) for i in ids)   # each prompt counted once
    streamed = streamed_choices(client.completions.create(model="tiny", prompt=prompts, max_tokens=5, temperature=0,
                                                          stream=True, extra_body={"ignore_eos": True}))
    assert streamed == {i: w["text"] for i, w in enumerate(want)}


def test_tokenizer_endpoints_and_tolerated_fields(server, client, offline):
    tok = offline.tokenizer
    r = requests.post(server.url + "/tokenize", json={"prompt": "Hello there"}).json()
    assert r == {"tokens": tok("Hello there").input_ids, "count": len(tok("Hello there").input_ids),
                 "max_model_len": offline.max_model_len}
    chat = requests.post(server.url + "/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    rendered = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert chat["tokens"] == tok(rendered, add_special_tokens=False).input_ids
    assert requests.post(server.url + "/detokenize", json={"tokens": r["tokens"]}).json() == {"prompt": "Hello there"}
    info = requests.get(server.url + "/tokenizer_info").json()
    assert info["eos_token"] == tok.eos_token and info["chat_template"] == tok.chat_template
    for path, body in (("/tokenize", {"prompt": 5}), ("/detokenize", {"tokens": [-1]}), ("/tokenize", {})):
        bad = requests.post(server.url + path, json=body)
        assert bad.status_code == 400 and "error" in bad.json()
    ok = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=2,
                                        user="someone", metadata={"k": "v"}, store=False, service_tier="auto",
                                        parallel_tool_calls=True)
    assert ok.choices[0].message.content is not None


def test_usage_in_every_chunk_with_continuous_usage_stats(server):
    r = requests.post(server.url + "/v1/completions", stream=True, json={
        "prompt": "count me", "max_tokens": 4, "stream": True, "ignore_eos": True, "temperature": 0,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    import json
    events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith(b"data: {")]
    usages = [e["usage"]["completion_tokens"] for e in events]
    assert usages == sorted(usages) and usages[-1] == 4 and all("usage" in e for e in events)


def test_a_list_of_prompts_takes_a_slot_each_all_or_none(tiny_llama):
    s = Server(tiny_env(tiny_llama, max_inflight_requests=3))
    try:
        held = requests.post(s.url + "/v1/completions", stream=True, json={
            "prompt": "hold", "max_tokens": 1000, "stream": True, "ignore_eos": True})
        lines = held.iter_lines()
        assert next(lines).startswith(b"data: ")
        tokenized = s.metric("rosefast_tokenized_prompts_total")
        refused = requests.post(s.url + "/v1/completions", json={"prompt": ["a", "b", "c"], "max_tokens": 2})
        assert refused.status_code == 429 and refused.headers["Retry-After"] == "1"
        assert s.metric("rosefast_inflight_requests") == 1                       # none of the three was kept
        assert s.metric("rosefast_tokenized_prompts_total") == tokenized       # nor tokenized
        fits = requests.post(s.url + "/v1/completions", json={"prompt": ["a", "b"], "max_tokens": 2, "n": 4})
        assert fits.status_code == 200 and len(fits.json()["choices"]) == 8    # n shares its prompt's slot
        held.close()
    finally:
        s.stop()


def test_n_forks_from_one_prefill_shares_blocks_and_frees_them(tiny_llama):
    from rosefast.serving.manager import SchedulerManager

    with SchedulerManager(model=tiny_llama, dtype="float32", kv_cache_tokens=4096, block_size=4) as m:
        prompt = m.tokenizer("a prompt long enough to fill a few blocks of four").input_ids
        engine = m.engine
        before = engine.stats()
        rid = m.add_request(prompt_token_ids=prompt, n=4, max_tokens=6, temperature=1.0, seed=9, ignore_eos=True)
        seen, peak = {}, 0
        for chunk in m.stream(rid):
            seen[chunk.index] = seen.get(chunk.index, []) + chunk.token_ids
            peak = max(peak, engine.stats()["kv_blocks_used"])
        after = engine.stats()
        assert sorted(seen) == [0, 1, 2, 3] and all(len(v) == 6 for v in seen.values())
        assert after["forks"] - before["forks"] == 3
        # one prefill: the choices were not prefilled again from the prefix cache
        assert after["prefix_cache_hits"] == before["prefix_cache_hits"]
        full_blocks, blocks_each = len(prompt) // 4, -(-(len(prompt) + 6) // 4)
        assert full_blocks >= 2 and peak <= full_blocks + 4 * (blocks_each - full_blocks)   # shared, held once
        assert after["kv_blocks_used"] == 0 and m.bookkeeping() == dict.fromkeys(m.bookkeeping(), 0)
        engine.block_manager.check()


@pytest.mark.slow
def test_echo_logprobs_on_the_real_model_equal_hugging_face(default_model, model_cache):
    import torch

    from rosefast.sources import load_hf_model, load_tokenizer

    tok = load_tokenizer(default_model)
    ids = tok("The capital of France is Paris, and the capital of Italy is Rome.").input_ids
    s = Server({"ROSEFAST_DTYPE": "float32", "ROSEFAST_KV_CACHE_TOKENS": 4096, "ROSEFAST_SERVED_MODEL_NAME": "real",
                "ROSEFAST_QUANTIZATION": "none"})   # Hugging Face's forward runs the dequantized fp32 weights
    try:
        out = requests.post(s.url + "/v1/completions", json={"model": "real", "prompt": ids, "max_tokens": 1,
                                                             "echo": True, "logprobs": 5, "temperature": 0}).json()
    finally:
        s.stop()
    lp = out["choices"][0]["logprobs"]
    hf = load_hf_model(default_model)
    with torch.inference_mode():
        ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)
    assert lp["token_logprobs"][0] is None and len(lp["token_logprobs"]) == len(ids) + 1
    for pos in range(1, len(ids)):
        assert abs(lp["token_logprobs"][pos] - float(ref[pos - 1, ids[pos]])) < 1e-4
        top = ref[pos - 1].topk(5)
        want = {tok.decode([t]): float(v) for v, t in zip(top.values, top.indices)}
        got = lp["top_logprobs"][pos]
        assert all(abs(got[k] - v) < 1e-4 for k, v in want.items())
    generated = ids + [int(ref[-1].argmax())]
    assert abs(lp["token_logprobs"][-1] - float(ref[-1, generated[-1]])) < 1e-4


def test_generation_defaults_come_from_the_model(tiny_llama, tmp_path, default_model):
    import json
    import shutil

    from rosefast.sources.generation import generation_defaults

    assert generation_defaults(default_model) == {"temperature": 0.2, "top_p": 0.9}   # the model card's
    assert generation_defaults(tiny_llama) == {}
    model = tmp_path / "tiny-with-defaults"
    shutil.copytree(tiny_llama.path, model)
    (model / "generation_config.json").write_text(json.dumps({"temperature": 0.0, "top_k": 7, "do_sample": True}))
    offline = LLMEngine(model=str(model), dtype="float32", kv_cache_tokens=4096)
    greedy = offline.generate(["defaults"], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True),
                              use_tqdm=False)[0]["text"]
    for setting, expect_greedy in (("model", True), ("none", False)):
        s = Server({**tiny_env(tiny_llama), "ROSEFAST_MODEL": str(model), "ROSEFAST_GENERATION_CONFIG": setting})
        try:
            card = requests.get(s.url + "/v1/models").json()["data"][0]
            assert card["generation_defaults"] == ({"temperature": 0.0, "top_k": 7} if setting == "model" else {})
            texts = {requests.post(s.url + "/v1/completions", json={"prompt": "defaults", "max_tokens": 8,
                                                                     "ignore_eos": True}).json()["choices"][0]["text"]
                     for _ in range(3)}
            assert (texts == {greedy}) is expect_greedy
            explicit = requests.post(s.url + "/v1/completions", json={"prompt": "defaults", "max_tokens": 8,
                                                                       "temperature": 0, "ignore_eos": True}).json()
            assert explicit["choices"][0]["text"] == greedy   # a request's own value wins
        finally:
            s.stop()


def _dict_completion_logprobs(strings, entries, offset):
    """The reference: the legacy shape built as dicts (as it was built before it was written as text)."""
    tokens, lps, tops, offsets = [], [], [], []
    for token, entry in entries:
        text = strings.text(token)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        if entry is None:
            lps.append(None)
            tops.append(None)
            continue
        chosen, top = entry
        lps.append(chosen)
        ranked = {strings.text(t): lp for t, lp in top}
        ranked.setdefault(text, chosen)
        tops.append(ranked)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}, offset


def _dict_chat_logprobs(strings, entries):
    return {"content": [{"token": strings.text(t), "logprob": c, "bytes": strings.bytes(t),
                         "top_logprobs": [{"token": strings.text(a), "logprob": lp, "bytes": strings.bytes(a)}
                                          for a, lp in top]} for t, (c, top) in entries]}


@pytest.fixture(scope="module")
def token_strings(default_model):
    from rosefast.sources import load_tokenizer
    from server.logprobs import TokenStrings

    return TokenStrings(load_tokenizer(default_model))


def test_logprobs_written_as_text_parse_to_the_dicts_they_replace(token_strings):
    """Both shapes, written straight to JSON text, parse to what the dict-built shapes serialized to: unicode and
    byte-fragment tokens, tokens whose texts collide in top_logprobs, a prompt's first token without a logprob,
    -inf and tiny logprobs; through both encoders (the SSE one and the JSON body one)."""
    import json
    import random

    from server.json_text import dumps
    from server.logprobs import chat_logprobs, completion_logprobs

    rng = random.Random(7)
    tokens = [rng.randrange(49152) for _ in range(300)] + [3, 4, 5, 252, 253, 216, 230]   # + byte tokens
    values = [-0.0, -1e-300, -3.25, float("-inf"), -123.456789012345]

    def entry():
        top = [(rng.choice(tokens), rng.choice(values)) for _ in range(rng.randrange(0, 6))]
        return rng.choice(values), top

    entries = [(tokens[0], None)] + [(t, entry()) for t in tokens]
    text, end = completion_logprobs(token_strings, entries, 17)
    reference, ref_end = _dict_completion_logprobs(token_strings, entries, 17)
    assert end == ref_end
    chat = chat_logprobs(token_strings, entries[1:])
    chat_reference = _dict_chat_logprobs(token_strings, entries[1:])
    for kwargs in ({}, {"ensure_ascii": False, "separators": (",", ":")}):
        body = json.loads(dumps({"choices": [{"logprobs": text}, {"logprobs": chat}]}, **kwargs))
        assert body["choices"][0]["logprobs"] == json.loads(json.dumps(reference))
        assert body["choices"][1]["logprobs"] == json.loads(json.dumps(chat_reference))
