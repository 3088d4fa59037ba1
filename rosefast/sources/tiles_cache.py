"""A GGUF's blocks as the kernels read them (quant_tiles.Tiles), kept beside the converted model: the first start
reads the file (gguf_blocks) and re-lays its blocks out one layer at a time; a later start reads the tiles back,
nothing re-packed — the served bytes, no more, read from the cache files' pages.

    tiles = cached_tiles(gguf_path, args, cache_dir)
    # {"linears": "q4_1" | "q8_0" | "blocks", "types": {"Q4_K": 7, ...}, i: {"qkv": [Tiles, ...], ...}, "head": [Tiles],
    #  "embed": [Tiles]}   ("head" and "embed" where gguf_blocks has them)
"""
import json
import logging
import os
import shutil
import struct
from pathlib import Path

import torch

from rosefast.sources.gguf_blocks import gguf_blocks
from rosefast.quant.tiles import Tiles, pack_tiles

log = logging.getLogger("rosefast.engine")

TILES_DIR = "gguf_tiles.v7"   # a safetensors file a layer ({i}.safetensors, head, embed) and index.json
_FORMAT = "7"     # another format is rebuilt from the GGUF
_FIELDS = ("w", "d", "m", "sc", "mn")
WHOLE = ("head", "embed")   # tensors kept whole (not a layer's linears)
_SUPERSEDED = ("q4_1_blocks.safetensors", "gguf_blocks.v2.safetensors", "gguf_blocks.v3.safetensors",
               "gguf_blocks.v4.safetensors",   # earlier releases' caches: the blocks before re-laying out
               "gguf_tiles.v5.safetensors",    # the tiles without an untied embedding
               "gguf_tiles.v6.safetensors")    # one file, written from every layer's tiles held at once


def file_tiles(gguf_path, args, sink=None):
    """gguf_blocks with each part re-laid out as Tiles, or None (a linear in a type the kernels do not take);
    `sink(key, parts)` takes each layer's as it is made (gguf_blocks)."""
    return gguf_blocks(gguf_path, args, pack=pack_tiles, sink=sink)


def cached_tiles(gguf_path, args, cache_dir):
    """file_tiles, kept in `cache_dir` (the converted model's directory) after the first start, a file a layer
    written as each is made (never every layer's tiles in memory at once: a 17 GB file starts within its size and
    2 GB), then served from those files' pages (mapped, not copied). A file whose linears are in another type is
    remembered as such. A damaged or older cache is rebuilt from the GGUF."""
    if cache_dir is None:
        return file_tiles(gguf_path, args)
    path = Path(cache_dir) / TILES_DIR
    if (path / "index.json").is_file():
        try:
            return _load(path, args)
        except Exception as e:  # noqa: BLE001 - a damaged cache is rebuilt from the file
            log.warning("quantization: ignoring the unreadable %s (%s); reading the GGUF again", path, e)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        keys = []

        def sink(key, parts):
            _save(tmp / f"{key}.safetensors", parts)
            keys.append(key)
        layers = file_tiles(gguf_path, args, sink=sink)
        index = {"format": _FORMAT, "linears": layers["linears"] if layers else "none"}
        if layers:
            index.update(types=layers["types"], keys=keys)
        (tmp / "index.json").write_text(json.dumps(index))
        shutil.rmtree(path, ignore_errors=True)
        os.replace(tmp, path)
        for old in _SUPERSEDED:
            (path.parent / old).unlink(missing_ok=True)
    except OSError as e:   # a read-only cache: the tiles kept in memory instead
        log.warning("quantization: could not keep the GGUF's tiles in %s (%s); holding them in memory", path, e)
        shutil.rmtree(tmp, ignore_errors=True)
        return file_tiles(gguf_path, args)
    return _load(path, args)


def _write_safetensors(path, tensors, metadata):
    """A safetensors file of `tensors` written one tensor at a time from its own memory, each 64-byte aligned in
    the file (a filler tensor before it where needed), for the kernels to read mapped."""
    names = {torch.uint8: "U8", torch.int8: "I8", torch.float16: "F16", torch.float32: "F32", torch.int32: "I32",
             torch.int64: "I64", torch.bfloat16: "BF16"}
    header, offset, laid = {"__metadata__": metadata}, 0, []
    for name, t in tensors.items():
        if offset % 64:
            gap = 64 - offset % 64
            header[f"_pad.{len(laid)}"] = {"dtype": "U8", "shape": [gap], "data_offsets": [offset, offset + gap]}
            laid.append(bytes(gap))
            offset += gap
        size = t.numel() * t.element_size()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        laid.append(t)
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % 64)   # the data from a 64-byte boundary of the (page-aligned) mapping
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for t in laid:
            f.write(t if isinstance(t, bytes) else memoryview(t.contiguous().view(torch.uint8).reshape(-1).numpy()))


def _save(path, parts):
    """One layer's linears ({name: [Tiles, ...]}) or a whole tensor's parts ([Tiles, ...]) into `path`."""
    linears = parts if isinstance(parts, dict) else {"": parts}
    tensors, parts_of = {}, {}
    for name, linear in linears.items():
        parts_of[name] = [[t.fmt, t.n] for t in linear]
        for p, t in enumerate(linear):
            for field in _FIELDS:
                if getattr(t, field) is not None:
                    tensors[f"{name}.{p}.{field}"] = getattr(t, field)
    _write_safetensors(path, tensors, {"parts": json.dumps(parts_of)})


def _load_file(path):
    """{name: [Tiles, ...]} of one file: views of its private mapping, not copies (the tiles are served from its
    pages; a rebuilt cache is another directory renamed over this one, which the mapping never sees)."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        names = set(f.keys())
        out = {}
        for name, parts_of in json.loads(f.metadata()["parts"]).items():
            out[name] = [Tiles(fmt, n, **{field: f.get_tensor(f"{name}.{p}.{field}") for field in _FIELDS
                                          if f"{name}.{p}.{field}" in names})
                         for p, (fmt, n) in enumerate(parts_of)]
    return out


def _load(path, args):
    index = json.loads((path / "index.json").read_text())
    if index.get("format") != _FORMAT:
        raise ValueError(f"format {index.get('format')!r}, not {_FORMAT}")
    if index["linears"] == "none":
        return None
    layers = {"linears": index["linears"], "types": index["types"]}
    for key in index["keys"]:
        parts = _load_file(path / f"{key}.safetensors")
        layers[key if key in WHOLE else int(key)] = parts[""] if key in WHOLE else parts
    if any(i not in layers for i in range(args.num_layers)):
        raise ValueError(f"{args.num_layers} layers expected")
    return layers
