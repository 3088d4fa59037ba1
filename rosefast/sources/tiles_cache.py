"""A GGUF's blocks as the kernels read them (quant_tiles.Tiles), kept beside the converted model: the first start
reads the file (gguf_blocks) and re-lays its blocks out one layer at a time; a later start reads the tiles back,
nothing re-packed — the served bytes, no more.

    tiles = cached_tiles(gguf_path, args, cache_dir)
    # {"linears": "q4_1" | "q8_0" | "blocks", "types": {"Q4_K": 7, ...}, i: {"qkv": [Tiles, ...], ...}, "head": [Tiles],
    #  "embed": [Tiles]}   ("head" and "embed" where gguf_blocks has them)
"""
import json
import logging
import os
from pathlib import Path

from rosefast.sources.gguf_blocks import gguf_blocks
from rosefast.quant.tiles import Tiles, pack_tiles

log = logging.getLogger("rosefast.engine")

TILES_FILE = "gguf_tiles.v6.safetensors"
_FORMAT = "6"     # another format is rebuilt from the GGUF
_FIELDS = ("w", "d", "m", "sc", "mn")
WHOLE = ("head", "embed")   # tensors kept whole (not a layer's linears)
_SUPERSEDED = ("q4_1_blocks.safetensors", "gguf_blocks.v2.safetensors", "gguf_blocks.v3.safetensors",
               "gguf_blocks.v4.safetensors",   # earlier releases' caches: the blocks before re-laying out
               "gguf_tiles.v5.safetensors")    # the tiles without an untied embedding


def file_tiles(gguf_path, args):
    """gguf_blocks with each part re-laid out as Tiles, or None (a linear in a type the kernels do not take)."""
    return gguf_blocks(gguf_path, args, pack=pack_tiles)


def cached_tiles(gguf_path, args, cache_dir):
    """file_tiles, kept in `cache_dir` (the converted model's directory) after the first start. A file whose
    linears are in another type is remembered as such. A damaged or older cache is rebuilt from the GGUF."""
    if cache_dir is None:
        return file_tiles(gguf_path, args)
    path = Path(cache_dir) / TILES_FILE
    if path.is_file():
        try:
            return _load(path, args)
        except Exception as e:  # noqa: BLE001 - a damaged cache is rebuilt from the file
            log.warning("quantization: ignoring the unreadable %s (%s); reading the GGUF again", path, e)
    layers = file_tiles(gguf_path, args)
    try:
        _save(path, layers)
    except OSError as e:
        log.warning("quantization: could not keep the GGUF's tiles in %s (%s)", path, e)
    return layers


def _entries(layers):
    for i, parts in layers.items():
        if i in WHOLE:
            yield i, parts
        elif isinstance(i, int):
            for name, linear in parts.items():
                yield f"{i}.{name}", linear


def _save(path, layers):
    from safetensors.torch import save_file

    tensors, parts_of = {}, {}
    for key, parts in _entries(layers or {}):
        parts_of[key] = [[t.fmt, t.n] for t in parts]
        for p, t in enumerate(parts):
            for field in _FIELDS:
                if getattr(t, field) is not None:
                    tensors[f"{key}.{p}.{field}"] = getattr(t, field).contiguous()
    meta = {"format": _FORMAT, "linears": layers["linears"] if layers else "none"}
    if layers:
        meta.update(parts=json.dumps(parts_of), types=json.dumps(layers["types"]))
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    save_file(tensors, str(tmp), metadata=meta)
    os.replace(tmp, path)
    for old in _SUPERSEDED:
        (path.parent / old).unlink(missing_ok=True)


def _load(path, args):
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
        if meta.get("format") != _FORMAT:
            raise ValueError(f"format {meta.get('format')!r}, not {_FORMAT}")
        if meta.get("linears") == "none":
            return None
        names = set(f.keys())
        layers = {"linears": meta["linears"], "types": json.loads(meta["types"])}
        for key, parts_of in json.loads(meta["parts"]).items():
            parts = []
            for p, (fmt, n) in enumerate(parts_of):
                # copies: nothing may keep the file's mapping (a later start may replace the file)
                fields = {field: f.get_tensor(f"{key}.{p}.{field}").clone() for field in _FIELDS
                          if f"{key}.{p}.{field}" in names}
                parts.append(Tiles(fmt, n, **fields))
            if key in WHOLE:
                layers[key] = parts
            else:
                i, name = key.split(".", 1)
                layers.setdefault(int(i), {})[name] = parts
        if any(i not in layers for i in range(args.num_layers)):
            raise ValueError(f"{args.num_layers} layers expected")
    return layers

