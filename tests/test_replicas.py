"""Two tiny-model replicas behind nginx (deploy/nginx.conf.in): a full replica's overflow spills to the
other, the client sees a 429 only when both are full, and a dead replica is passed over — never a 5xx."""
import asyncio
import contextlib
import json
import os
import signal

import httpx
import pytest

from deploy.replicas import Nginx, find_nginx
from tests.serving import Server, free_port, tiny_env

TOKENS = 200
LONGEST = 1000   # the tiny model's context is 1024


@pytest.fixture(scope="module", autouse=True)
def nginx_binary():
    """nginx from the system's packages, installed when missing (as root with apt-get); where that cannot
    be done the tests say what to do instead of failing on a missing binary."""
    try:
        return find_nginx()
    except RuntimeError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def replicas(tiny_llama):
    with behind_nginx([tiny_env(tiny_llama, max_inflight_requests=2)] * 2) as pair:
        yield pair


async def stream(url, delay=0.0, tokens=TOKENS, progress=None):
    """One streamed completion (after `delay` s): (status, Retry-After, the body: SSE text or error JSON);
    `progress`, when given, is the list its body's pieces go into as they come."""
    await asyncio.sleep(delay)
    body = {"prompt": "Once upon a time", "max_tokens": tokens, "stream": True, "ignore_eos": True}
    progress = [] if progress is None else progress
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        async with client.stream("POST", "/v1/completions", json=body) as r:
            async for piece in r.aiter_text():
                progress.append(piece)
            return r.status_code, r.headers.get("retry-after"), "".join(progress)


async def burst(url, n):
    return await asyncio.gather(*(stream(url) for _ in range(n)))


def completed(data):
    return data.rstrip().endswith("data: [DONE]") and '"finish_reason":"length"' in data


def test_overflow_spills_to_the_other_replica(replicas):
    (first, _), nginx = replicas
    # the first replica is filled directly; least_conn (nginx counts only its own connections) still sends
    # one of the next two there: its 429 must go on to the other replica, unseen by the client
    async def run():
        return await asyncio.gather(stream(first.url), stream(first.url), stream(nginx.url, 0.3),
                                    stream(nginx.url, 0.3))

    results = asyncio.run(run())
    assert [status for status, _, _ in results] == [200] * 4
    assert all(completed(data) for _, _, data in results)


def test_a_burst_is_shared_between_the_replicas(replicas):
    _, nginx = replicas
    results = asyncio.run(burst(nginx.url, 4))
    assert [status for status, _, _ in results] == [200] * 4
    assert all(completed(data) for _, _, data in results)


def test_the_client_gets_a_429_only_when_every_replica_is_full(replicas):
    """Four streams as long as the context allows fill both replicas (two each, one passed on by nginx where three
    meet one replica); two more, sent once all four stream, are refused; then the four are closed and their slots
    come free. Ordered by the streams' progress, not by time: a burst of six 200-token streams at once flaked
    under CI's load when a stream ended before the sixth request was answered."""
    servers, nginx = replicas

    async def run():
        progress = [[] for _ in range(4)]
        admitted = [asyncio.create_task(stream(nginx.url, tokens=LONGEST, progress=p)) for p in progress]
        await until(lambda: all(progress), "four streams to start")
        refused = await asyncio.gather(stream(nginx.url), stream(nginx.url))
        streaming = sum(not task.done() for task in admitted)
        for task in admitted:
            task.cancel()
        await asyncio.gather(*admitted, return_exceptions=True)
        return refused, streaming, ["".join(p) for p in progress]

    refused, streaming, seen = asyncio.run(run())
    assert streaming == 4   # every admitted stream still ran when the two were answered
    assert all('"finish_reason":null' in text for text in seen)   # each had streamed tokens
    for status, retry_after, data in refused:   # the last replica's own answer, passed through
        assert (status, retry_after) == (429, "1"), data[:200]
        error = json.loads(data)["error"]
        assert error["type"] == "rate_limit_error" and error["code"] == "rate_limit_exceeded"
    asyncio.run(until(lambda: all(s.metric("rosefast_inflight_requests") == 0 for s in servers),
                      "the closed streams' slots to come free"))


def start_servers(envs):
    """Servers started side by side (each waits for its model); all or none."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(envs)) as pool:
        futures = [pool.submit(Server, env) for env in envs]
    servers = [f.result() for f in futures if f.exception() is None]
    if len(servers) < len(envs):
        for s in servers:
            s.stop()
        raise next(f.exception() for f in futures if f.exception() is not None)
    return servers


def stand_in_replicas(n, step_ms, inflight=4):
    return behind_nginx([{"ROSEFAST_MODEL": "stand-in", "ROSEFAST_STAND_IN_STEP_MS": step_ms,
                          "ROSEFAST_MAX_INFLIGHT_REQUESTS": inflight}] * n)


@contextlib.contextmanager
def behind_nginx(envs):
    """(a replica per environment, nginx in front of them), all stopped afterwards."""
    servers = start_servers(envs)
    nginx = None
    try:
        nginx = Nginx(free_port(), [s.port for s in servers])
        yield servers, nginx
    finally:
        if nginx is not None:
            nginx.stop()
        for s in servers:
            s.stop()


async def timed_stream(url, tokens, delay=0.0, times=None):
    """(status, arrival time of each SSE event with text, ended with [DONE], error if the stream broke); `times`,
    when given, is the list the arrival times go into as they come (a caller watches the stream's progress)."""
    import time

    await asyncio.sleep(delay)
    body = {"prompt": "Once upon a time", "max_tokens": tokens, "stream": True, "ignore_eos": True}
    times = [] if times is None else times
    done, error = False, None
    try:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            async with client.stream("POST", "/v1/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if line == "data: [DONE]":
                        done = True
                    elif line.startswith("data: {") and json.loads(line[6:])["choices"]:
                        times.append(time.monotonic())
                return r.status_code, times, done, None
    except httpx.HTTPError as e:
        error = e
    return None, times, done, error


async def until(condition, what, timeout=30):
    """Wait for an event the test orders itself by (a stream's progress, a replica's state), not for a time."""
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def _health(server):
    try:
        return httpx.get(server.url + "/health", timeout=5).status_code
    except httpx.HTTPError:
        return None


def test_a_draining_replica_finishes_its_streams_while_new_requests_go_to_the_other(default_model):
    with stand_in_replicas(2, step_ms=20) as (servers, nginx):
        async def run():
            progress = []
            own = asyncio.create_task(timed_stream(servers[0].url, 250, times=progress))   # ~5 s on replica 1
            await until(lambda: len(progress) >= 5, "the first replica's stream to start")
            os.kill(servers[0].proc.pid, signal.SIGTERM)   # gunicorn's master: the worker drains
            await until(lambda: _health(servers[0]) == 503, "the first replica to say it drains")
            new = await asyncio.gather(*(timed_stream(nginx.url, 20) for _ in range(4)))
            during = len(progress)
            return await own, during, new

        own, during, new = asyncio.run(run())
        assert len(own[1]) > during                           # the new requests ran while it still streamed
        assert own[0] == 200 and own[2] and len(own[1]) >= 160   # its stream ran to [DONE] (some tokens add no text)
        assert [(status, done) for status, _, done, _ in new] == [(200, True)] * 4


def test_a_stream_on_a_killed_replica_is_cut_not_hung(default_model):
    with stand_in_replicas(2, step_ms=20) as (servers, nginx):
        async def run():
            progress = [[], []]
            streams = [asyncio.create_task(timed_stream(nginx.url, 120, times=p)) for p in progress]  # one on each
            await until(lambda: all(progress), "both streams to start")
            os.killpg(servers[0].proc.pid, signal.SIGKILL)
            return await asyncio.wait_for(asyncio.gather(*streams), 30)   # a hang guard

        results = asyncio.run(run())
        cut = [r for r in results if not r[2]]
        whole = [r for r in results if r[2]]
        # the client of the killed replica sees its stream end early: no [DONE], a broken chunked body
        assert len(cut) == 1 and len(whole) == 1
        assert cut[0][3] is not None and 0 < len(cut[0][1]) < 120
        after = asyncio.run(timed_stream(nginx.url, 10))
        assert after[0] == 200 and after[2]                  # new requests go to the survivor


def test_streams_through_nginx_are_not_buffered(default_model):
    """Events arrive one engine step apart, not in bursts: over a 50-step stream (80 ms steps) they reach
    the client spread over its whole length."""
    with stand_in_replicas(1, step_ms=80) as (_, nginx):
        status, times, done, _ = asyncio.run(timed_stream(nginx.url, 50))
        assert status == 200 and done and len(times) >= 35   # (multibyte characters: some tokens add no text)
        gaps = sorted(b - a for a, b in zip(times, times[1:]))
        # buffered, the events would come in a few bursts: most gaps ~0 and the stream's length in a few
        assert gaps[len(gaps) // 2] > 0.05


def test_the_overhead_benchmark_runs(default_model, capsys):
    from benches import replicas_overhead

    # streams that outlive the burst (30 steps of 20 ms: 0.6 s against the ms its 9 requests take to send), so a replica is still full when the overflow arrives
    rows = replicas_overhead.main(["--streams", "3", "--tokens", "30", "--step-ms", "20"])
    assert [(n, f["completed"], f["rejected"], f["errors"]) for _, n, f in rows] == \
        [(3, 3, 0, 0), (3, 3, 0, 0), (9, 3, 6, 0), (9, 6, 3, 0)]
    assert "| 3x overload, through nginx (2 replicas) | 9 | 6 | 3 | 0 |" in capsys.readouterr().out
