"""What the machine can hold: a model file larger than the memory left to this process is refused at start with
both sizes named, rather than loaded until the kernel's OOM killer ends the process part-way."""
from pathlib import Path

from rosefast.errors import ModelError


def _meminfo_available():
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _cgroup_left():
    """A cgroup v2 memory limit less what the group uses, or None (no limit, or not Linux)."""
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit == "max":
            return None
        return int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text())
    except (OSError, ValueError):
        return None


def available_bytes():
    """The memory this process may still take (the machine's available memory, or its cgroup's if smaller), or
    None where neither is known."""
    known = [x for x in (_meminfo_available(), _cgroup_left()) if x is not None]
    return min(known) if known else None


def check_fits(path):
    """ModelError naming both sizes when the model file at `path` (with its other parts, a split file's first) is
    larger than the memory available: its weights are served from a copy of its blocks, so the file must fit."""
    from rosefast.sources.gguf_file import split_parts

    check_size_fits(sum(p.stat().st_size for p in split_parts(path) if p.is_file()), repr(str(path)))


def check_size_fits(size, what):
    """check_fits for `size` bytes of model file called `what` (a file not yet downloaded: refused before it is)."""
    available = available_bytes()
    if available is not None and size > available:
        raise ModelError(f"{what} is {size / 1e9:.1f} GB, more than the {available / 1e9:.1f} GB of memory "
                         "available here: serve a smaller quantization of it (Q4_K_M, Q4_0) or a smaller model, "
                         "or free memory")
