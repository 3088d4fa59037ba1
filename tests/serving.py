"""A real gunicorn for a test (server/process.py), the tiny model's environment for it, and the module
fixtures of the suites that drive one through the official client (imported by name where used: one
server per module)."""
import json
import threading
import time

import openai
import pytest
import requests

from rosefast.engine.llm_engine import LLMEngine
from server.process import ROOT, Server, free_port  # noqa: F401 - the tests' names for them


def tiny_env(model, **extra):
    env = {"ROSEFAST_MODEL": str(model.path), "ROSEFAST_DTYPE": "float32", "ROSEFAST_KV_CACHE_TOKENS": 16384,
           "ROSEFAST_BLOCK_SIZE": 16, "ROSEFAST_SERVED_MODEL_NAME": "tiny"}
    env.update({f"ROSEFAST_{k.upper()}": v for k, v in extra.items()})
    return env


@pytest.fixture(scope="module")
def server(tiny_llama):
    s = Server(tiny_env(tiny_llama, max_inflight_requests=0))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def one_slot(default_model):
    """The stand-in engine at 20 ms a step with one admission slot: a 1,000-token stream holds it for 20 s."""
    s = Server({"ROSEFAST_MODEL": "stand-in", "ROSEFAST_STAND_IN_STEP_MS": 20, "ROSEFAST_MAX_INFLIGHT_REQUESTS": 1,
                "ROSEFAST_SERVED_MODEL_NAME": "tiny"})
    yield s
    s.stop()


@pytest.fixture(scope="module")
def offline(tiny_llama):
    return LLMEngine(model=tiny_llama, dtype="float32", kv_cache_tokens=16384)


class Bystander:
    """A greedy stream of `tokens` tokens run in a thread: its events and the gaps between its text events."""

    def __init__(self, server, tokens=64):
        self.events, self.gaps = [], []
        self._thread = threading.Thread(target=self._run, args=(server, tokens))

    def _run(self, server, tokens):
        r = requests.post(server.url + "/v1/completions", json={"prompt": "bystander", "max_tokens": tokens,
                                                                "stream": True, "ignore_eos": True, "temperature": 0,
                                                                "stream_options": {"include_usage": True}},
                          stream=True, timeout=120)
        last = None
        for line in r.iter_lines():
            if line:
                now = time.perf_counter()
                if last is not None:
                    self.gaps.append(now - last)
                last = now
                self.events.append(line)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._thread.join(120)

    def whole(self, tokens):
        """Every token came (the usage chunk says so), then [DONE], and no error event."""
        if self.events[-1:] != [b"data: [DONE]"] or any(b'"error"' in e for e in self.events):
            return False
        return json.loads(self.events[-2][6:])["usage"]["completion_tokens"] == tokens

    def itl_p50(self):
        return sorted(self.gaps)[len(self.gaps) // 2]



def never_stalled(bystander, stall):
    """Whether a bystander's stream was never held for anything like `stall`, what a hub blocked by the thing under
    test would hold it for (a send or body timeout, a compile's delay): its longest gap under half of it. A bound
    from the mechanism, not a multiple of a median measured idle, so a loaded 2-core machine cannot fail it: a
    step beside 16 busy sequences, or beside two other test processes, takes milliseconds, not 0.5 s."""
    return max(bystander.gaps) < stall / 2
