"""Two tiny-model replicas behind nginx (deploy/nginx.conf.in): a full replica's overflow spills to the
other, the client sees a 429 only when both are full, and a dead replica is passed over — never a 5xx."""
import asyncio
import json
import os
import signal

import httpx
import pytest

from deploy.replicas import Nginx, find_nginx
from tests.serving import Server, free_port, tiny_env

TOKENS = 200


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
    servers, nginx = [], None
    try:
        servers = [Server(tiny_env(tiny_llama, max_inflight_requests=2)) for _ in range(2)]
        nginx = Nginx(free_port(), [s.port for s in servers])
        yield servers, nginx
    finally:
        if nginx is not None:
            nginx.stop()
        for s in servers:
            s.stop()


async def stream(url, delay=0.0):
    """One streamed completion (after `delay` s): (status, Retry-After, the body: SSE text or error JSON)."""
    await asyncio.sleep(delay)
    body = {"prompt": "Once upon a time", "max_tokens": TOKENS, "stream": True, "ignore_eos": True}
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        async with client.stream("POST", "/v1/completions", json=body) as r:
            data = (await r.aread()).decode()
            return r.status_code, r.headers.get("retry-after"), data


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
    _, nginx = replicas
    results = asyncio.run(burst(nginx.url, 6))
    statuses = sorted(status for status, _, _ in results)
    assert statuses == [200] * 4 + [429] * 2
    for status, retry_after, data in results:
        if status == 429:   # the last replica's own answer, passed through: its error body and Retry-After
            error = json.loads(data)["error"]
            assert retry_after == "1" and error["type"] == "rate_limit_error" and error["code"] == "rate_limit_exceeded"
        else:
            assert completed(data)


def test_a_killed_replica_is_passed_over(tiny_llama):
    servers = [Server(tiny_env(tiny_llama, max_inflight_requests=2)) for _ in range(2)]
    nginx = None
    try:
        nginx = Nginx(free_port(), [s.port for s in servers])
        os.killpg(servers[0].proc.pid, signal.SIGKILL)
        servers[0].proc.wait(10)
        results = asyncio.run(burst(nginx.url, 2))   # both on the survivor (its limit is 2)
        assert [status for status, _, _ in results] == [200, 200]
        assert all(completed(data) for _, _, data in results)
    finally:
        if nginx is not None:
            nginx.stop()
        for s in servers:
            s.stop()
