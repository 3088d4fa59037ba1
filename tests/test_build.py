"""The build flavour: compiled modules are live when promised; ROSEFAST_NO_EXTENSIONS=1 selects the twins."""
import json
import os
import subprocess
import sys

import pytest

import rosefast
from rosefast.frontend import ACCELERATED
from tests.conftest import REQUIRE_EXTENSIONS


@pytest.mark.skipif(not REQUIRE_EXTENSIONS, reason="ROSEFAST_REQUIRE_EXTENSIONS=1 not set (the test command sets it)")
def test_compiled_flavour_is_live_when_required():
    assert rosefast.EXTENSIONS, f"the build promised compiled modules but twins are live: {rosefast.flavours()}"
    from rosefast.models import decode_layer, kernels, quant_ops

    for module in ACCELERATED + (kernels,):
        assert module._impl.__name__.endswith("_c"), module.__name__
        assert module._impl.__file__.endswith(".so"), module._impl.__file__
    for module in (quant_ops, decode_layer):
        assert module.impl.__file__.endswith(".so"), module.impl.__file__


def _flavours_in_subprocess(no_extensions):
    env = dict(os.environ)
    env.pop("ROSEFAST_NO_EXTENSIONS", None)
    if no_extensions:
        env["ROSEFAST_NO_EXTENSIONS"] = "1"
    code = ("import json, rosefast; from rosefast.frontend import ACCELERATED; "
            "from rosefast.models import decode_layer, kernels, quant_ops; from rosefast.engine import sample_ops; "
            "print(json.dumps([rosefast.EXTENSIONS, [m._impl.__name__ for m in ACCELERATED + (kernels, sample_ops)] "
            "+ [quant_ops.impl.__name__, decode_layer.impl.__name__], rosefast.flavours()]))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_no_extensions_env_selects_pure_twins():
    live, names, flavours = _flavours_in_subprocess(no_extensions=True)
    assert live is False
    assert len(names) == len(rosefast.ACCELERATED) and all(n.endswith("_py") for n in names)
    assert flavours == dict.fromkeys(rosefast.ACCELERATED, "pure")


def test_default_import_selects_compiled_when_built():
    live, names, flavours = _flavours_in_subprocess(no_extensions=False)
    if not REQUIRE_EXTENSIONS and not live:
        pytest.skip("compiled flavour not built")
    assert live is True
    assert all(n.endswith("_c") for n in names)
    assert flavours == dict.fromkeys(rosefast.ACCELERATED, "compiled")   # every compiled module counted
