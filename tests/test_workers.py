"""A worker per GPU: `gunicorn -w N` numbers its workers 0..N-1 (gunicorn.conf.py), `{worker}` in
ROSEFAST_DEVICE becomes that number, and a dead worker's replacement takes its number (its GPU)."""
import os
import re
import signal
import sys
import time

import pytest
import requests
import torch

from rosefast import device
from rosefast.device import resolve_device
from server.config import ConfigError, server_config_from_env
from tests.serving import Server, tiny_env


def test_worker_placeholder_in_the_device():
    c = server_config_from_env({"ROSEFAST_DEVICE": "cuda:{worker}", "ROSEFAST_WORKER_INDEX": "3"})
    assert (c.device, c.engine_config().device, c.worker_index) == ("cuda:3", "cuda:3", 3)
    assert server_config_from_env({"ROSEFAST_DEVICE": "cuda:{worker}"}).device == "cuda:0"
    with pytest.raises(ConfigError, match="ROSEFAST_WORKER_INDEX: worker_index must be an integer >= 0, got -1"):
        server_config_from_env({"ROSEFAST_WORKER_INDEX": "-1"})
    with pytest.raises(ConfigError, match="ROSEFAST_DEVICE"):
        server_config_from_env({"ROSEFAST_DEVICE": "cuda:{gpu}"})


@pytest.mark.skipif(torch.cuda.device_count() > 1, reason="checks the error of a GPU index this machine lacks")
def test_a_gpu_index_past_the_machine_is_refused_by_name():
    with pytest.raises(ValueError, match="'cuda:1' requested but"):
        resolve_device("cuda:1")


def test_a_gpu_without_an_index_is_the_current_one(monkeypatch):
    """Setting the engine thread's GPU takes an index: "cuda" and "auto" on a GPU machine name one (the
    device check's first GPU run failed every CUDA test on `torch.cuda.set_device(torch.device("cuda"))`)."""
    monkeypatch.setattr(device, "cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda") == resolve_device("auto") == torch.device("cuda", 0)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert resolve_device("cpu") == torch.device("cpu")


def _workers(server, count, timeout=120):
    """{worker index: pid} from the start-up lines of the `count` workers started so far (the latest wins)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = re.findall(r"worker (\d+) \(pid (\d+)\): device cpu", server.log_path.read_text(errors="replace"))
        if len(lines) >= count:
            return {int(i): int(pid) for i, pid in lines}
        time.sleep(0.2)
    raise AssertionError(f"{count} worker start-up lines did not appear:\n{server.log()}")


def test_workers_are_numbered_and_a_replacement_takes_the_dead_ones_number(tiny_llama):
    # the index given to gunicorn is the first worker's (deploy/replicas.py gives replica i the index i)
    command = [sys.executable, "-m", "gunicorn", "-k", "gevent", "-w", "2", "server:app", "--bind", "127.0.0.1:{port}"]
    server = Server(tiny_env(tiny_llama, device="cpu", worker_index=1), command=command)
    try:
        first = _workers(server, 2)
        assert sorted(first) == [1, 2]
        os.kill(first[1], signal.SIGKILL)
        after = _workers(server, 3)
        assert sorted(after) == [1, 2] and after[2] == first[2] and after[1] != first[1]
        deadline = time.monotonic() + 60
        seen = set()
        while seen != {1, 2} and time.monotonic() < deadline:   # both answer, each with its own number
            with requests.Session() as s:   # a new connection each time: the kernel picks the worker
                r = s.get(server.url + "/health", timeout=5)
            if r.status_code == 200:
                seen.add(r.json()["worker"])
        assert seen == {1, 2}
    finally:
        server.stop()
