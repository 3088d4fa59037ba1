import importlib
import os

import pytest

REQUIRE_EXTENSIONS = os.environ.get("ROSEFAST_REQUIRE_EXTENSIONS") == "1"


def load_flavour(name, flavour):
    """Import rosefast.frontend._<name>_<flavour>; a missing compiled module skips (or fails when required)."""
    try:
        return importlib.import_module(f"rosefast.frontend._{name}_{flavour}")
    except ImportError as e:
        if flavour == "c" and not REQUIRE_EXTENSIONS:
            pytest.skip(f"compiled flavour not built: {e}")
        raise


@pytest.fixture(autouse=True)
def alone_when_timed(request, tmp_path_factory):
    """With the suite spread over processes (pytest-xdist: make test), a test marked `timing` — one that compares
    durations it measures, such as a stream's gaps beside an attack against the same stream's alone — runs while
    no other test does: it waits for the tests under way to end and holds back the next ones (file locks shared
    by the run's workers: a turnstile, then the CPU shared by the others, taken whole by it). ROSEFAST_TEST_LOCKS
    names a directory for those locks shared by several pytest runs at once (make test's two legs)."""
    shared = os.environ.get("ROSEFAST_TEST_LOCKS")
    if "PYTEST_XDIST_WORKER" not in os.environ and not shared:
        yield
        return
    import fcntl
    from pathlib import Path

    base = Path(shared) if shared else tmp_path_factory.getbasetemp().parent   # else the run's, above each worker's
    timed = request.node.get_closest_marker("timing") is not None
    with open(base / "rosefast-turnstile.lock", "a") as turn, open(base / "rosefast-cpu.lock", "a") as cpu:
        fcntl.flock(turn, fcntl.LOCK_EX)   # a timed test waiting below holds this: the next tests wait here
        if not timed:
            fcntl.flock(turn, fcntl.LOCK_UN)
        fcntl.flock(cpu, fcntl.LOCK_EX if timed else fcntl.LOCK_SH)
        if timed:
            fcntl.flock(turn, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(cpu, fcntl.LOCK_UN)


@pytest.fixture(params=["c", "py"])
def flavour(request):
    return request.param


@pytest.fixture(scope="session", autouse=True)
def model_cache(tmp_path_factory):
    """A fresh model cache per test session (ROSEFAST_TEST_CACHE reuses one between runs while developing)."""
    path = os.environ.get("ROSEFAST_TEST_CACHE") or str(tmp_path_factory.mktemp("rosefast-cache"))
    old = os.environ.get("ROSEFAST_CACHE")
    os.environ["ROSEFAST_CACHE"] = path
    yield path
    if old is None:
        os.environ.pop("ROSEFAST_CACHE", None)
    else:
        os.environ["ROSEFAST_CACHE"] = old


@pytest.fixture(scope="session")
def default_model(model_cache):
    from rosefast.sources import resolve_model

    return resolve_model()


@pytest.fixture(scope="session")
def tiny_llama(default_model):
    from rosefast.sources import tiny_random

    return tiny_random("llama")


@pytest.fixture(scope="session")
def tiny_gpt2(default_model):
    from rosefast.sources import tiny_random

    return tiny_random("gpt2")
