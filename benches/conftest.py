import importlib

import pytest

from benches.quadratic import QuadraticCollector


def flavour_module(name, flavour):
    try:
        return importlib.import_module(f"rosefast.frontend._{name}_{flavour}")
    except ImportError as e:
        pytest.skip(f"compiled flavour not built: {e}")


def collector_and_chunk(flavour):
    """(collector factory, chunk type) for 'c', 'py' or 'quadratic'."""
    if flavour == "quadratic":
        return QuadraticCollector, flavour_module("collector", "py").StreamChunk
    mod = flavour_module("collector", flavour)
    return mod.StreamOutputCollector, mod.StreamChunk
