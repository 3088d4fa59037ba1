"""The build flavour: compiled modules are live when promised; ROSEFAST_NO_EXTENSIONS=1 selects the twins."""
import json
import os
import subprocess
import sys

import pytest

import rosefast
from tests.conftest import REQUIRE_EXTENSIONS


@pytest.mark.skipif(not REQUIRE_EXTENSIONS, reason="ROSEFAST_REQUIRE_EXTENSIONS=1 not set (the test command sets it)")
def test_compiled_flavour_is_live_when_required():
    assert rosefast.EXTENSIONS, f"the build promised compiled modules but twins are live: {rosefast.flavours()}"
    import importlib

    for name in rosefast.ACCELERATED:   # one convention: every selector module's flavour is its `impl`
        module = importlib.import_module(name)
        assert module.impl.__name__.endswith("_c"), name
        assert module.impl.__file__.endswith(".so"), module.impl.__file__


def _flavours_in_subprocess(no_extensions):
    env = dict(os.environ)
    env.pop("ROSEFAST_NO_EXTENSIONS", None)
    if no_extensions:
        env["ROSEFAST_NO_EXTENSIONS"] = "1"
    code = ("import importlib, json, rosefast; "
            "print(json.dumps([rosefast.EXTENSIONS, [importlib.import_module(m).impl.__name__ "
            "for m in rosefast.ACCELERATED], rosefast.flavours()]))")
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


def _copy_of_the_checkout(dest):
    """What a fresh clone holds (the tracked files of the build, the package and the server), nothing built."""
    import shutil

    from server.process import ROOT

    listed = subprocess.run(["git", "ls-files", "-z", "setup.py", "pyproject.toml", "MANIFEST.in", "README.md",
                             "gunicorn.conf.py", "rosefast", "server", "csrc"],
                            cwd=ROOT, capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / name, dest / name)
    return dest


def _flavour_report(cwd):
    code = "import json, rosefast; print(json.dumps([rosefast.flavours(), rosefast.flavour_warning()]))"
    env = {k: v for k, v in os.environ.items() if k not in ("ROSEFAST_NO_EXTENSIONS", "PYTHONPATH")}
    out = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


@pytest.mark.skipif(not REQUIRE_EXTENSIONS, reason="ROSEFAST_REQUIRE_EXTENSIONS=1 not set (needs the compiler)")
def test_the_specified_commands_serve_the_compiled_flavour_from_the_checkout(tmp_path, default_model):
    """`pip install .` then `gunicorn -k gevent server:app` in the repository root: Python imports rosefast/ from
    the checkout, so the build leaves its compiled modules there too; a checkout without them says so loudly at
    start-up, with the command that fixes it. (One module is built, to keep the test short: the copy into the
    checkout is the same for each.)"""
    from server.process import Server

    src = _copy_of_the_checkout(tmp_path / "clone")
    flavours, warning = _flavour_report(src)
    assert set(flavours.values()) == {"pure"}
    assert "pure-Python twins of 7 of 7" in warning and "`pip install -e .`" in warning and str(src) in warning

    s = Server({"ROSEFAST_MODEL": "stand-in", "ROSEFAST_STAND_IN_STEP_MS": 1}, cwd=src)
    try:
        assert "pure-Python twins of 7 of 7" in s.log()   # gunicorn from the unbuilt checkout: said at start-up
    finally:
        s.stop()

    env = {**os.environ, "ROSEFAST_BUILD_MODULES": "frontend/admission"}
    env.pop("ROSEFAST_NO_EXTENSIONS", None)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "--no-index",
                    "--target", str(tmp_path / "site"), "."], cwd=src, env=env, check=True, capture_output=True)
    assert list((tmp_path / "site" / "rosefast" / "frontend").glob("_admission_c.*.so"))   # installed, and
    flavours, warning = _flavour_report(src)                                             # beside its source
    assert flavours["rosefast.frontend.admission"] == "compiled"
    assert "twins of 6 of 7" in warning and "admission" not in warning.split(":")[0]


def test_only_an_absent_compiled_module_selects_the_twin(tmp_path, monkeypatch):
    """A compiled module that is not there runs its twin (and says why); one that is there but fails inside its
    own imports (an import cycle, a missing name) raises: a bug must not pass as the slow flavour."""
    from rosefast import _select

    package = tmp_path / "flavoured"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "_absent_py.py").write_text("FLAVOUR = 'pure'\n")
    (package / "_broken_py.py").write_text("FLAVOUR = 'pure'\n")
    (package / "_broken_c.py").write_text("from os import no_such_name\n")   # stands in for the .so
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(_select, "NO_EXTENSIONS", False)
    monkeypatch.setattr(_select, "_SELECTED", {})   # (this package's entries stay out of the real ones)
    monkeypatch.setattr(_select, "_MISSING", {})
    assert _select.select("absent", package="flavoured").FLAVOUR == "pure"
    assert "flavoured._absent_c" in _select._MISSING["flavoured.absent"]
    with pytest.raises(ImportError, match="no_such_name"):
        _select.select("broken", package="flavoured")
