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
    from rosefast.models import resolve_model

    return resolve_model()


@pytest.fixture(scope="session")
def tiny_llama(default_model):
    from rosefast.models import tiny_random

    return tiny_random("llama")


@pytest.fixture(scope="session")
def tiny_gpt2(default_model):
    from rosefast.models import tiny_random

    return tiny_random("gpt2")
