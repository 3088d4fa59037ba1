"""The packages' layering, read from the source: each package imports only those below it, so there is no circle
and no import running back up (the kernels never see a model, a model never sees a file, the engine sees the
model only through rosefast.build), and server/ goes through the serving layer."""
import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: a package -> the rosefast packages it may import (the shared modules at the top level are open to all)
ALLOWED = {
    "quant": set(),
    "kernels": {"quant"},
    "models": {"quant", "kernels"},
    "sources": {"quant", "models"},
    "build": {"quant", "kernels", "models", "sources"},
    "engine": {"build", "models"},
    "serving": {"engine", "build", "frontend"},
    "frontend": set(),
}
SHARED = {"config", "errors", "device", "_select", "_native"}   # value, error and setting modules any layer uses


def _imports(path):
    """The rosefast modules a file imports, at any depth (a function's late import counts too); a Cython file's
    Python imports read line by line (its cimports name C headers)."""
    if path.suffix == ".pyx":
        for line, text in enumerate(path.read_text().splitlines(), 1):
            m = re.match(r"\s*from (rosefast[\w.]*) import \(?([\w, ]+)", text)
            if m:
                yield line, m.group(1), [n.strip().split(" ")[0] for n in m.group(2).split(",") if n.strip()]
        return
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ("rosefast", "server"):
            yield node.lineno, node.module, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in ("rosefast", "server"):
                    yield node.lineno, alias.name, []


def _package(module):
    """The rosefast package (or shared module) a module is in; None for the top-level package's own names."""
    parts = module.split(".")
    if len(parts) < 2 or not ((ROOT / "rosefast" / parts[1]).is_dir() or (ROOT / "rosefast" / f"{parts[1]}.py").is_file()):
        return None
    return parts[1]


def _violations(files, allowed_of):
    bad = []
    for path in files:
        for line, module, names in _imports(path):
            targets = [module] if module != "rosefast" else [f"rosefast.{n}" for n in names]
            for target in targets:
                why = allowed_of(target)
                if why:
                    bad.append(f"{path.relative_to(ROOT)}:{line} imports {target}: {why}")
    return bad


def _refused_in(package):
    """A check of one import target from `package`: None when the layering allows it, else why not."""
    def refused(target):
        if not target.startswith("rosefast."):
            return "server/ is above every package"
        other = _package(target)
        if other in (package, None) or other in SHARED or other in ALLOWED[package]:
            return None
        return f"{package} may import {', '.join(sorted(ALLOWED[package] | SHARED))}"
    return refused


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_a_package_imports_only_the_layers_below_it(package):
    here = ROOT / "rosefast" / package
    files = sorted(here.rglob("*.py")) + sorted(here.rglob("*.pyx")) if here.is_dir() else [ROOT / "rosefast/build.py"]
    assert _violations(files, _refused_in(package)) == []


def test_the_server_goes_through_the_serving_layer():
    def refused(target):
        if target.startswith("server") or _package(target) in ("serving", "frontend", "bench", None, *SHARED):
            return None
        return "server/ imports rosefast.serving and the shared modules only"
    assert _violations(sorted((ROOT / "server").glob("*.py")), refused) == []


def test_the_layering_test_sees_an_import_running_back_up(tmp_path):
    """The check itself: a kernel that imports a model (late, inside a function) and a Cython kernel that imports a
    source are both named; a kernel importing the block formats is not."""
    late = tmp_path / "late.py"
    late.write_text("from rosefast.quant.tiles import Tiles\n\ndef f():\n    from rosefast.models.llama import LlamaModel\n")
    compiled = tmp_path / "_x_c.pyx"
    compiled.write_text("from libc.stdint cimport int64_t\nfrom rosefast.sources import gguf_blocks\n")
    found = [(line, module) for path in (late, compiled) for line, module, _ in _imports(path)]
    assert found == [(1, "rosefast.quant.tiles"), (4, "rosefast.models.llama"), (2, "rosefast.sources")]
    refused = _refused_in("kernels")
    assert [refused(m) is None for _, m in found] == [True, False, False]
