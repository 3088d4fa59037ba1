"""A GGUF file's metadata and tensors, read in a walk over its header: what serving needs, fast.

    f = GGUFFile(path)
    f.value("qwen3.attention.key_length")      # a scalar, or a list of numbers; None when absent
    t = f.tensors["blk.0.attn_q.weight"]       # .tensor_type, .shape (innermost first), .data (a view of the file)

gguf's own reader builds a numpy array for every string of the vocabulary (~150k for Qwen3, seconds); this one
steps over them, and keeps string arrays only as their length. Tensors are views of one read-only map of the
file, shaped as gguf's reader shapes them (block types: uint8 rows of whole blocks).

A split file (`NAME-00001-of-00003.gguf`, as `llama-gguf-split` and the converter's `--split-max-*` write it: the
metadata in the first part, `split.*` keys in each, every tensor in one part) is opened from its first part: the
tensors of every part, each a view of its own part's map.
"""
import mmap
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32,
          7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
_STRING, _ARRAY = 8, 9


class GGUFError(ValueError):
    """Not a GGUF file this reader understands; the message says why."""


@dataclass(frozen=True)
class Tensor:
    name: str
    tensor_type: object   # gguf.GGMLQuantizationType
    shape: tuple          # innermost first, as the file lists it
    data: np.ndarray
    offset: int = 0       # where its bytes are in its file
    part: int = 0         # which part of a split file holds it


_PART = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def split_position(path):
    """(which part, of how many, the name before `-0000k-of-0000N.gguf`) of a split GGUF's part, by its name;
    None for a name not written as one."""
    named = _PART.match(Path(path).name)
    return None if named is None else (int(named["no"]), int(named["count"]), named["stem"])


def split_parts(path):
    """The paths of the parts of the split GGUF whose first part is `path` (its name says how many), or [path]
    for a file not named as a split's first part."""
    path = Path(path)
    position = split_position(path)
    if position is None or position[0] != 1:
        return [path]
    _, count, stem = position
    return [path.with_name(f"{stem}-{k:05d}-of-{count:05d}.gguf") for k in range(1, count + 1)]


def architecture_in(head):
    """`general.architecture` from the first bytes of a GGUF file (`head`: a prefix, as a ranged read gives it), or
    None when those bytes end before it (or are not a GGUF's)."""
    if head[:4] != b"GGUF" or len(head) < 24:
        return None
    walk = _Header(head)
    try:
        for key, value in walk.pairs(struct.unpack_from("<Q", head, 16)[0]):
            if walk.at > len(head):   # the pair runs past the bytes given
                return None
            if key == "general.architecture":
                return value if isinstance(value, str) else None
    except (struct.error, ValueError):   # (GGUFError is one) the bytes end inside a pair
        return None
    return None


class GGUFFile:
    """A GGUF file's metadata (`fields`, `value`) and its tensors: of every part, for a split file's first part."""

    def __init__(self, path):
        path = Path(path)
        first = _Part(path, 0)
        self.fields, self.tensors, self._parts = first.fields, dict(first.tensors), [first]
        count = int(first.fields.get("split.count") or 1)
        if count == 1:
            return
        if int(first.fields.get("split.no") or 0) != 0:
            raise GGUFError(f"{path} is part {int(first.fields['split.no']) + 1} of {count} of a split GGUF: load "
                            "the model from its first part (NAME-00001-of-0000N.gguf)")
        paths = split_parts(path)
        if len(paths) != count:
            raise GGUFError(f"{path} is the first of {count} parts of a split GGUF but is not named as one "
                            f"(NAME-00001-of-{count:05d}.gguf): the other parts cannot be found")
        for k, part_path in enumerate(paths[1:], 1):
            if not part_path.is_file():
                raise GGUFError(f"{path} is the first of {count} parts of a split GGUF, and part {k + 1}, "
                                f"{part_path.name}, is not beside it")
            part = _Part(part_path, k)
            if int(part.fields.get("split.no", -1)) != k or int(part.fields.get("split.count", -1)) != count:
                raise GGUFError(f"{part_path} is not part {k + 1} of {count} of {path.name}'s split (its split keys "
                                "say otherwise)")
            self._parts.append(part)
            self.tensors.update(part.tensors)
        expected = first.fields.get("split.tensors.count")
        if expected is not None and int(expected) != len(self.tensors):
            raise GGUFError(f"{path}'s {count} parts hold {len(self.tensors)} tensors, not the {int(expected)} "
                            "its split keys name")

    @property
    def paths(self):
        """The file's path, or its parts' (a split file)."""
        return [part.path for part in self._parts]

    def value(self, key, default=None):
        value = self.fields.get(key)
        return default if value is None else value

    def release(self, tensor):
        """Let go of the pages of `tensor`'s bytes (read once, done with): they leave this process's resident memory
        (the page cache keeps them; a later read faults them back in)."""
        self._parts[tensor.part].release(tensor)


class _Header:
    """A walk over a GGUF header in `buf` (a map of the whole file, or its first bytes), from its key-value pairs
    on; `at`: where the walk is."""

    def __init__(self, buf):
        self._buf, self.at = buf, 24

    def pairs(self, n_kv):
        """(key, value) of the header's `n_kv` pairs, in the file's order."""
        for _ in range(n_kv):
            key = self._string()
            (kind,) = self._unpack("<I")
            yield key, self._field(kind)

    def _unpack(self, fmt):
        values = struct.unpack_from(fmt, self._buf, self.at)
        self.at += struct.calcsize(fmt)
        return values

    def _string(self):
        (n,) = self._unpack("<Q")
        text = bytes(self._buf[self.at:self.at + n]).decode("utf-8", errors="replace")
        self.at += n
        return text

    def _skip_strings(self, count):
        for _ in range(count):
            (n,) = struct.unpack_from("<Q", self._buf, self.at)
            self.at += 8 + n

    def _field(self, kind):
        if kind == _STRING:
            return self._string()
        if kind in _SCALARS:
            return self._unpack(_SCALARS[kind])[0]
        if kind != _ARRAY:
            raise GGUFError(f"unknown GGUF value type {kind}")
        item, count = self._unpack("<IQ")
        if item == _STRING:   # a vocabulary, merges: stepped over, kept as their length
            self._skip_strings(count)
            return count
        if item not in _NUMPY:
            raise GGUFError(f"unsupported GGUF array of type {item}")
        values = np.frombuffer(self._buf, _NUMPY[item], count, self.at)
        self.at += values.nbytes
        return values.tolist()


class _Part(_Header):
    """One file: its header walked, its tensors views of its map."""

    def __init__(self, path, part):
        self.path, self._part = Path(path), part
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        super().__init__(self._map)
        if self._map[:4] != b"GGUF":
            raise GGUFError(f"{path} is not a GGUF file (no GGUF magic)")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", self._map, 4)
        if version < 2:
            raise GGUFError(f"{path} is GGUF version {version}; versions 2 and 3 are read")
        self.fields = dict(self.pairs(n_kv))
        infos = []
        for _ in range(n_tensors):
            name = self._string()
            (dims,) = self._unpack("<I")
            shape = self._unpack(f"<{dims}Q")
            kind, offset = self._unpack("<IQ")
            infos.append((name, shape, kind, offset))
        align = int(self.fields.get("general.alignment") or 32)
        start = -(-self.at // align) * align
        self.tensors = {name: self._tensor(name, shape, kind, start + offset) for name, shape, kind, offset in infos}

    def _tensor(self, name, shape, kind, offset):
        import gguf

        tensor_type = gguf.GGMLQuantizationType(kind)
        block, size = gguf.GGML_QUANT_SIZES[tensor_type]
        rows = int(np.prod(shape[1:], dtype=np.int64))
        row_bytes = shape[0] // block * size
        if tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            dtype = np.float32 if tensor_type == gguf.GGMLQuantizationType.F32 else np.float16
            data = np.frombuffer(self._buf, dtype, rows * shape[0], offset).reshape(tuple(reversed(shape)))
        else:
            data = np.frombuffer(self._buf, np.uint8, rows * row_bytes, offset).reshape(
                tuple(reversed(shape[1:])) + (row_bytes,))
        return Tensor(name, tensor_type, tuple(int(x) for x in shape), data, offset, self._part)

    def release(self, tensor):
        page = mmap.PAGESIZE
        start = tensor.offset // page * page
        end = tensor.offset + tensor.data.nbytes
        if hasattr(self._map, "madvise") and end > start:
            self._map.madvise(mmap.MADV_DONTNEED, start, end - start)
