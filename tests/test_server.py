"""The HTTP server: a real gunicorn -k gevent process, driven by the official openai client and raw HTTP."""
import asyncio
import json
import threading
import time

import httpx
import openai
import pytest
import requests

from rosefast.engine.sampling_params import SamplingParams
from tests.serving import Server, client, offline, server, tiny_env  # noqa: F401 - the shared fixtures


def test_completion_streamed_and_not(client, offline):
    want = offline.generate(["The history of Rome"], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True),
                            use_tqdm=False)[0]
    full = client.completions.create(model="tiny", prompt="The history of Rome", max_tokens=12, temperature=0,
                                     extra_body={"ignore_eos": True})
    assert full.choices[0].text == want["text"] and full.choices[0].finish_reason == "length"
    assert full.usage.completion_tokens == 12 and full.usage.prompt_tokens > 0
    chunks = list(client.completions.create(model="tiny", prompt="The history of Rome", max_tokens=12,
                                            temperature=0, stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}))
    assert len({c.id for c in chunks}) == 1 and len({c.created for c in chunks}) == 1
    text_chunks, usage_chunk = chunks[:-1], chunks[-1]
    assert "".join(c.choices[0].text for c in text_chunks) == want["text"]
    assert [c.choices[0].finish_reason for c in text_chunks][-1] == "length"
    assert all(c.choices[0].finish_reason is None for c in text_chunks[:-1])
    assert usage_chunk.choices == [] and usage_chunk.usage.completion_tokens == 12
    assert usage_chunk.usage.total_tokens == usage_chunk.usage.prompt_tokens + 12


def test_chat_streamed_and_not(client, offline):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    prompt = offline.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    want = offline.generate([prompt], SamplingParams(max_tokens=9, temperature=0, ignore_eos=True),
                            use_tqdm=False)[0]
    full = client.chat.completions.create(model="tiny", messages=messages, max_tokens=9, temperature=0,
                                          extra_body={"ignore_eos": True})
    assert full.choices[0].message.role == "assistant"
    assert full.choices[0].message.content == want["text"] and full.usage.completion_tokens == 9
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=9, temperature=0,
                                                 stream=True, stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want["text"]
    assert chunks[-2].choices[0].finish_reason == "length" and chunks[-1].usage.completion_tokens == 9


def test_sse_wire_format(server):
    r = requests.post(server.url + "/v1/completions", json={"prompt": "wire", "max_tokens": 3, "stream": True,
                                                            "ignore_eos": True}, stream=True)
    assert r.headers["Content-Type"].startswith("text/event-stream")
    assert r.headers["Cache-Control"] == "no-cache" and r.headers["X-Accel-Buffering"] == "no"
    raw = r.content.decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    assert all(e.startswith("data: {") for e in events[:-2])
    assert all(json.loads(e[6:])["object"] == "text_completion" for e in events[:-2])


def test_models_health_metrics(server, client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert requests.get(server.url + "/health").json() == {"status": "ok", "worker": 0}
    client.completions.create(model="tiny", prompt="count me", max_tokens=2)
    text = requests.get(server.url + "/metrics").text
    for name in ("rosefast_requests_total", "rosefast_inflight_requests", "rosefast_rejected_total",
                 "rosefast_prompt_tokens_total", "rosefast_completion_tokens_total", "rosefast_ttft_seconds_bucket",
                 "rosefast_itl_seconds_bucket", "rosefast_e2e_seconds_bucket", "rosefast_kv_blocks_used",
                 "rosefast_prefix_cache_hits_total"):
        assert name in text, name
    assert server.metric("rosefast_completion_tokens_total") >= 2
    bad = 'rosefast_requests_total{endpoint="completions",status="400"}'
    before = server.metric(bad) or 0
    requests.post(server.url + "/v1/completions", json={"prompt": ""})
    assert server.metric(bad) == before + 1   # errors are counted too, once


BAD = [
    ("/v1/completions", b"{not json", 400, "invalid JSON"),
    ("/v1/completions", b"[1, 2]", 400, "must be a JSON object"),
    ("/v1/completions", {"max_tokens": 3}, 400, "'prompt' is required"),
    ("/v1/completions", {"prompt": ""}, 400, "'prompt' must not be empty"),
    ("/v1/completions", {"prompt": 5}, 400, "'prompt' must be a string"),
    ("/v1/completions", {"prompt": ["a", 5]}, 400, "'prompt' must be a string, a list of token ids"),
    ("/v1/completions", {"prompt": ["x"] * 65}, 400, "at most 64 prompts per request"),
    ("/v1/completions", b'{"prompt": "\\ud800"}', 400, "not valid Unicode text"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "a\\udfffb"}]}', 400, "not valid Unicode"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "'max_tokens' must be >= 1"),
    ("/v1/completions", {"prompt": "x", "max_tokens": -5}, 400, "'max_tokens' must be >= 1"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 5000}, 400, "the most this server allows is 1023"),
    ("/v1/completions", {"prompt": "x", "max_tokens": "ten"}, 400, "'max_tokens' must be an integer"),
    ("/v1/completions", {"prompt": list(range(1, 1500))}, 400, "context length is 1024"),
    ("/v1/completions", {"prompt": "x", "temperature": "hot"}, 400, "'temperature' must be a number"),
    ("/v1/completions", b'{"prompt": "x", "temperature": NaN}', 400, "invalid JSON"),
    ("/v1/completions", {"prompt": "x", "top_p": 0}, 400, "'top_p' must be in (0, 1]"),
    ("/v1/completions", {"prompt": "x", "n": 17}, 400, "'n' must be between 1 and 16"),
    ("/v1/completions", {"prompt": "x", "n": 0}, 400, "'n' must be between 1 and 16"),
    ("/v1/completions", {"prompt": "x", "n": 2, "best_of": 3}, 400, "'best_of' is supported only equal to 'n'"),
    ("/v1/completions", {"prompt": "x", "logprobs": 21}, 400, "'logprobs' must be between 0 and 20"),
    ("/v1/completions", {"prompt": "x", "logprobs": True}, 400, "'logprobs' must be an integer"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "(0 only with 'echo')"),
    ("/v1/completions", {"prompt": "x", "echo": "yes"}, 400, "'echo' must be a boolean"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "echo": True}, 400,
     "unsupported field(s): echo"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": 3}, 400,
     "'logprobs' must be a boolean in a chat request"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, 400,
     "'top_logprobs' needs 'logprobs': true"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": True,
                              "top_logprobs": 21}, 400, "'top_logprobs' must be between 0 and 20"),
    ("/v1/completions", {"prompt": "x", "stream": True, "stream_options": {"include_usage": 1}}, 400,
     "'stream_options' must be an object with the booleans"),
    ("/v1/completions", {"prompt": "x", "frobnicate": 1}, 400, "unsupported field(s): frobnicate"),
    ("/v1/completions", {"prompt": "x", "stream": "yes"}, 400, "'stream' must be a boolean"),
    ("/v1/completions", {"prompt": "x", "stop": [1]}, 400, "'stop' must be a string or a list"),
    ("/v1/completions", {"prompt": "x", "model": "/etc/passwd"}, 404, "does not exist"),
    ("/v1/chat/completions", {"messages": []}, 400, "'messages' must be a non-empty array"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "must be an object with"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 7}]}, 400, "content must be a string"),
    ("/v1/nowhere", {}, 404, "not found"),
]


BAD_SAMPLING = [("top_p", 1.5), ("min_p", 2), ("presence_penalty", 3), ("frequency_penalty", -2.5),
                ("repetition_penalty", 0), ("logit_bias", {"5": 500}), ("logit_bias", {"999999": 1}),
                ("logit_bias", {"x": 1}), ("logit_bias", [1]), ("min_tokens", 99), ("stop_token_ids", [10**7]),
                ("stop_token_ids", "7"), ("temperature", -1), ("logit_bias", {str(t): 1 for t in range(1025)})]


@pytest.mark.parametrize("field, value", BAD_SAMPLING, ids=[f"{f}={str(v)[:20]}" for f, v in BAD_SAMPLING])
def test_bad_sampling_fields_are_a_400_naming_the_field(server, field, value):
    for path, body in (("/v1/completions", {"prompt": "x"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})):
        r = requests.post(server.url + path, json={**body, "max_tokens": 4, field: value})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == field and field in err["message"], err


def test_sampling_fields_through_the_openai_client(client, offline):
    prompt = "The sampling fields"
    base = dict(model="tiny", prompt=prompt, max_tokens=12)
    want = offline.generate([prompt], SamplingParams(max_tokens=12, temperature=0), use_tqdm=False)[0]
    greedy = client.completions.create(**base, temperature=0)
    assert greedy.choices[0].text == want["text"]
    banned = client.completions.create(**base, temperature=0, logit_bias={str(want["token_ids"][0]): -100})
    assert banned.choices[0].text != greedy.choices[0].text
    penalized = client.completions.create(**base, temperature=0, frequency_penalty=2.0, presence_penalty=2.0,
                                          extra_body={"repetition_penalty": 1.5, "min_tokens": 3})
    assert penalized.usage.completion_tokens >= 3
    seeded = [client.completions.create(**base, temperature=1.0, top_p=0.9, seed=11, extra_body={"min_p": 0.01})
              for _ in range(2)]
    assert seeded[0].choices[0].text == seeded[1].choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        **base, temperature=1.0, top_p=0.9, seed=11, extra_body={"min_p": 0.01}, stream=True) if c.choices)
    assert streamed == seeded[0].choices[0].text


@pytest.mark.parametrize("path, body, status, message", BAD, ids=[f"{i}-{b[3][:20]}" for i, b in enumerate(BAD)])
def test_bad_input_gets_an_openai_error(server, path, body, status, message):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = requests.post(server.url + path, data=data, headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert message.lower() in err["message"].lower()


def test_oversized_body_is_413(server):
    r = requests.post(server.url + "/v1/completions", data=b'{"prompt": "' + b"a" * (2 << 20) + b'"}')
    assert r.status_code == 413 and "too large" in r.json()["error"]["message"]
    assert requests.get(server.url + "/health").status_code == 200   # the worker survived


def test_client_disconnect_frees_everything(server):
    r = requests.post(server.url + "/v1/completions", json={"prompt": "go on", "max_tokens": 900, "stream": True,
                                                            "ignore_eos": True}, stream=True)
    lines = r.iter_lines()
    assert next(lines).startswith(b"data: ")
    assert server.metric("rosefast_inflight_requests") == 1
    r.raw._fp.fp.raw._sock.shutdown(2)   # the client goes away mid-stream
    r.close()
    deadline = time.monotonic() + 60   # a hang guard, not a speed check: the watch notices at once
    while time.monotonic() < deadline:
        if server.metric("rosefast_inflight_requests") == 0 and server.metric("rosefast_kv_blocks_used") == 0:
            break
        time.sleep(0.02)
    assert server.metric("rosefast_inflight_requests") == 0
    assert server.metric("rosefast_kv_blocks_used") == 0


def test_500_concurrent_streams_complete_correctly(server, offline):
    prompts = [f"stream number {i % 50} says" for i in range(500)]
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    distinct = sorted(set(prompts))
    want = dict(zip(distinct, (r["text"] for r in offline.generate(distinct, params, use_tqdm=False))))

    async def one(client, prompt):
        text = []
        async with client.stream("POST", "/v1/completions", json={"prompt": prompt, "max_tokens": 8, "stream": True,
                                                                  "temperature": 0, "ignore_eos": True}) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    text.append(json.loads(line[6:])["choices"][0]["text"])
        return "".join(text)

    async def main():
        limits = httpx.Limits(max_connections=600, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=server.url, limits=limits, timeout=120) as c:
            return await asyncio.gather(*(one(c, p) for p in prompts))

    got = asyncio.run(main())
    assert got == [want[p] for p in prompts]
    assert server.metric("rosefast_inflight_requests") == 0


@pytest.fixture(scope="module")
def small_server(tiny_llama):
    s = Server(tiny_env(tiny_llama, max_inflight_requests=2))
    yield s
    s.stop()


def test_burst_overflow_gets_429_at_once(small_server):
    s = small_server
    tokenized_before = s.metric("rosefast_tokenized_prompts_total")
    held = []
    for _ in range(2):   # two long streams hold both slots
        r = requests.post(s.url + "/v1/completions", json={"prompt": "hold", "max_tokens": 1000, "stream": True,
                                                           "ignore_eos": True}, stream=True)
        assert r.status_code == 200
        held.append((r, r.iter_lines()))
        assert next(held[-1][1]).startswith(b"data: ")
    results = [None] * 8

    def burst(i):
        results[i] = requests.post(s.url + "/v1/completions", json={"prompt": f"burst {i}", "max_tokens": 5,
                                                                    "stream": i % 2 == 0})

    threads = [threading.Thread(target=burst, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert s.metric("rosefast_inflight_requests") == 2   # the held streams were still running throughout
    for r in results:
        assert r.status_code == 429
        assert r.headers["Retry-After"] == "1"
        assert not r.headers["Content-Type"].startswith("text/event-stream")
        err = r.json()["error"]
        assert err["type"] == "rate_limit_error" and err["code"] == "rate_limit_exceeded"
    assert s.metric("rosefast_rejected_total") >= 8
    assert s.metric("rosefast_tokenized_prompts_total") == tokenized_before + 2   # none of the 8 was tokenized
    for r, _ in held:
        r.close()
    ok = requests.post(s.url + "/v1/completions", json={"prompt": "after", "max_tokens": 3})
    for _ in range(50):
        if ok.status_code == 200:
            break
        time.sleep(0.05)
        ok = requests.post(s.url + "/v1/completions", json={"prompt": "after", "max_tokens": 3})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1


@pytest.mark.slow
def test_make_serve_answers_a_streamed_request_on_the_default_model(default_model, model_cache):
    from tests.serving import ROOT, free_port

    port = free_port()
    s = Server({"GUNICORN_CMD_ARGS": f"--bind 127.0.0.1:{port}", "ROSEFAST_KV_CACHE_TOKENS": 8192},
               port=port, command=["make", "-s", "-C", str(ROOT), "serve"], startup_timeout=300)
    try:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
        chunks = list(c.chat.completions.create(model="smollm2-135m", stream=True, max_tokens=16, temperature=0,
                                                messages=[{"role": "user", "content": "What is 2+2?"}]))
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert "4" in text and chunks[-1].choices[0].finish_reason in ("stop", "length")
    finally:
        s.stop()
