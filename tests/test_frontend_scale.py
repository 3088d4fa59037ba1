"""The frontend at scale against the stand-in engine (no model), through a real gunicorn: thousands of
concurrent streams all complete with the exact text and usage; the streams the hub could not keep up with
got merged chunks (fewer events than tokens) and the same bytes as the ones delivered token by token."""
import asyncio
import json
import sys

import pytest
import requests

from rosefast.bench.sse_client import stream_events
from rosefast.engine.stand_in import stand_in_text
from rosefast.sources import load_tokenizer
from tests.serving import Server, free_port

STREAMS, TOKENS = 2000, 64
PROMPT = "Tell me about streaming."


def stand_in_env(streams, **extra):
    env = {"ROSEFAST_MODEL": "stand-in", "ROSEFAST_MAX_BATCH_SIZE": streams, "ROSEFAST_MAX_INFLIGHT_REQUESTS": streams,
           "ROSEFAST_PREFILL_MAX_BATCH_SIZE": 256, "ROSEFAST_KV_CACHE_TOKENS": streams * 128}
    env.update({f"ROSEFAST_{k.upper()}": v for k, v in extra.items()})
    return env


def gunicorn(port, streams):
    return [sys.executable, "-m", "gunicorn", "-k", "gevent", "server:app", "--bind", f"127.0.0.1:{port}",
            "--worker-connections", str(streams + 64), "--backlog", str(max(streams, 2048))]


@pytest.fixture(scope="module")
def tokenizer(default_model):
    return load_tokenizer(default_model)


async def run_streams(port, streams, chat=False):
    """Every stream's (text, usage, events with text)."""
    async def one(i):
        texts, usage, events = [], {}, [0]

        def on_event(event):
            if event.get("usage"):
                usage.update(event["usage"])
            for choice in event["choices"]:
                text = choice["delta"].get("content") if chat else choice["text"]
                if text:
                    texts.append(text)
                    events[0] += 1

        body = {"max_tokens": TOKENS, "stream": True, "stream_options": {"include_usage": True}}
        body.update({"messages": [{"role": "user", "content": PROMPT}]} if chat else {"prompt": PROMPT})
        await stream_events("127.0.0.1", port, "/v1/chat/completions" if chat else "/v1/completions", body,
                            lambda status: None, on_event)
        return "".join(texts), usage, events[0]

    # a hang guard, not a speed check: a lost wakeup leaves a stream waiting forever
    return await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(streams))), 300)


def test_two_thousand_streams_complete_with_the_exact_text_and_usage(default_model, tokenizer):
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2 * STREAMS + 256:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 2 * STREAMS + 1024), hard))
    port = free_port()
    # 2,000 streams at a token a millisecond each: 2 M events a second, more than any hub delivers, so streams lag
    # and take merged chunks on any machine (a count-driven overload, not a speed bet)
    server = Server(stand_in_env(STREAMS, stand_in_step_ms=1), port=port, command=gunicorn(port, STREAMS))
    try:
        results = asyncio.run(run_streams(port, STREAMS))
        expected = stand_in_text(tokenizer, TOKENS)
        prompt_tokens = len(tokenizer(PROMPT)["input_ids"])
        assert len(results) == STREAMS
        wrong = [i for i, (text, _, _) in enumerate(results) if text != expected]
        assert not wrong, f"{len(wrong)} streams got other text, e.g. {results[wrong[0]][0]!r}"
        assert all({k: v for k, v in u.items() if k != "prompt_tokens_details"} ==
                   {"prompt_tokens": prompt_tokens, "completion_tokens": TOKENS, "total_tokens": prompt_tokens + TOKENS}
                   and 0 <= u["prompt_tokens_details"]["cached_tokens"] < prompt_tokens for _, u, _ in results)
        events = [e for _, _, e in results]
        assert min(events) < TOKENS   # some streams lagged and got merged chunks: the same bytes, fewer events
        # every token was taken once, alone or merged: the depths add up to all of them
        assert server.metric("rosefast_backlog_depth_sum") == STREAMS * TOKENS
        merged = server.metric("rosefast_merged_chunks_total")
        assert merged > 0 and merged + server.metric("rosefast_backlog_depth_count") == STREAMS * TOKENS
        assert server.metric("rosefast_inflight_requests") == 0
    finally:
        server.stop()


def test_the_stand_in_serves_chat_and_non_streamed_requests(default_model, tokenizer):
    """The stand-in is the whole server but the forward pass: the chat template, stop strings and
    non-streamed bodies work as with a model."""
    port = free_port()
    server = Server(stand_in_env(64), port=port, command=gunicorn(port, 64))
    try:
        expected = stand_in_text(tokenizer, TOKENS)
        r = requests.post(server.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": TOKENS}, timeout=30)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == expected
        assert r.json()["model"] == "stand-in"
        stop = requests.post(server.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": TOKENS,
                                                                   "stop": ["fox"]}, timeout=30).json()
        assert stop["choices"][0]["text"] == expected.split("fox")[0]
        assert stop["choices"][0]["finish_reason"] == "stop"
        results = asyncio.run(run_streams(port, 32, chat=True))
        assert {text for text, _, _ in results} == {expected}
        template = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                                 tokenize=False)
        assert {u["prompt_tokens"] for _, u, _ in results} == {len(tokenizer(template)["input_ids"])}
        assert json.loads(requests.get(server.url + "/v1/models", timeout=5).text)["data"][0]["id"] == "stand-in"
    finally:
        server.stop()


def test_the_frontend_benchmark_runs_both_servers(default_model, capsys):
    from benches import frontend_scale

    results = frontend_scale.main(["--streams", "8,24", "--tokens", "6", "--step-ms", "2"])
    assert [(kind, r["streams"], r["completed"], r["errors"]) for kind, r in results] == \
        [("rosefast", 8, 8, 0), ("rosefast", 24, 24, 0), ("bare", 8, 8, 0), ("bare", 24, 24, 0)]
    assert all(r["delivered"] == 6 * r["streams"] and r["cpu_us_per_token"] >= 0 for _, r in results)
    assert "| bare gevent WSGI, same bytes | 24 |" in capsys.readouterr().out


def test_a_client_gone_while_nothing_is_written_is_noticed(default_model):
    """A non-streamed request writes nothing until it is done: only the socket watch can see its client leave
    (at the stand-in's 50 ms step its 2,000 tokens would take 100 s)."""
    import socket
    import time

    port = free_port()
    server = Server(stand_in_env(8, stand_in_step_ms=50, max_tokens_cap=4096), port=port, command=gunicorn(port, 8))
    try:
        body = json.dumps({"prompt": PROMPT, "max_tokens": 2000, "ignore_eos": True}).encode()
        client = socket.create_connection(("127.0.0.1", port))
        client.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       b"Content-Length: %d\r\n\r\n" % len(body) + body)
        deadline = time.monotonic() + 30
        while server.metric("rosefast_inflight_requests") != 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.metric("rosefast_inflight_requests") == 1
        client.close()   # gone mid-request
        deadline = time.monotonic() + 20   # a hang guard: the watch notices at once; without it, 100 s
        while (server.metric("rosefast_inflight_requests"), server.metric("rosefast_kv_blocks_used")) != (0, 0) \
                and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.metric("rosefast_inflight_requests") == 0
        assert server.metric("rosefast_kv_blocks_used") == 0
    finally:
        server.stop()
