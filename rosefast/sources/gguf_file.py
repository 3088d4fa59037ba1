"""A GGUF file's metadata and tensors, read in a walk over its header: what serving needs, fast.

    f = GGUFFile(path)
    f.value("qwen3.attention.key_length")      # a scalar, or a list of numbers; None when absent
    t = f.tensors["blk.0.attn_q.weight"]       # .tensor_type, .shape (innermost first), .data (a view of the file)

gguf's own reader builds a numpy array for every string of the vocabulary (~150k for Qwen3, seconds); this one
steps over them, and keeps string arrays only as their length. Tensors are views of one read-only map of the
file, shaped as gguf's reader shapes them (block types: uint8 rows of whole blocks).
"""
import mmap
import struct
from dataclasses import dataclass

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
    offset: int = 0       # where its bytes are in the file


class GGUFFile:
    def __init__(self, path):
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        buf = self._map
        if buf[:4] != b"GGUF":
            raise GGUFError(f"{path} is not a GGUF file (no GGUF magic)")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if version < 2:
            raise GGUFError(f"{path} is GGUF version {version}; versions 2 and 3 are read")
        self._buf, self._at = buf, 24
        self.fields = {}
        for _ in range(n_kv):
            key = self._string()
            (kind,) = self._unpack("<I")
            self.fields[key] = self._field(kind)
        infos = []
        for _ in range(n_tensors):
            name = self._string()
            (dims,) = self._unpack("<I")
            shape = self._unpack(f"<{dims}Q")
            kind, offset = self._unpack("<IQ")
            infos.append((name, shape, kind, offset))
        align = int(self.fields.get("general.alignment") or 32)
        start = -(-self._at // align) * align
        self.tensors = {name: self._tensor(name, shape, kind, start + offset) for name, shape, kind, offset in infos}

    def value(self, key, default=None):
        value = self.fields.get(key)
        return default if value is None else value

    def _unpack(self, fmt):
        values = struct.unpack_from(fmt, self._buf, self._at)
        self._at += struct.calcsize(fmt)
        return values

    def _string(self):
        (n,) = self._unpack("<Q")
        text = bytes(self._buf[self._at:self._at + n]).decode("utf-8", errors="replace")
        self._at += n
        return text

    def _skip_strings(self, count):
        for _ in range(count):
            (n,) = struct.unpack_from("<Q", self._buf, self._at)
            self._at += 8 + n

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
        values = np.frombuffer(self._buf, _NUMPY[item], count, self._at)
        self._at += values.nbytes
        return values.tolist()

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
        return Tensor(name, tensor_type, tuple(int(x) for x in shape), data, offset)

    def release(self, tensor):
        """Let go of the pages of `tensor`'s bytes (read once, done with): they leave this process's resident memory
        (the page cache keeps them; a later read faults them back in)."""
        page = mmap.PAGESIZE
        start = tensor.offset // page * page
        end = tensor.offset + tensor.data.nbytes
        if hasattr(self._map, "madvise") and end > start:
            self._map.madvise(mmap.MADV_DONTNEED, start, end - start)
