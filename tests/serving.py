"""A real gunicorn for a test (server/process.py), the tiny model's environment for it, and the module
fixtures of the suites that drive one through the official client (imported by name where used: one
server per module)."""
import openai
import pytest

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
def offline(tiny_llama):
    return LLMEngine(model=tiny_llama, dtype="float32", kv_cache_tokens=16384)
