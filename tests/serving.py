"""A real gunicorn for a test (server/process.py) and the tiny model's environment for it."""
from server.process import ROOT, Server, free_port  # noqa: F401 - the tests' names for them


def tiny_env(model, **extra):
    env = {"ROSEFAST_MODEL": str(model.path), "ROSEFAST_DTYPE": "float32", "ROSEFAST_KV_CACHE_TOKENS": 16384,
           "ROSEFAST_BLOCK_SIZE": 16, "ROSEFAST_SERVED_MODEL_NAME": "tiny"}
    env.update({f"ROSEFAST_{k.upper()}": v for k, v in extra.items()})
    return env
