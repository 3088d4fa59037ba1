"""Device and dtype choice. CPU default dtype comes from the decode benchmark (benches/test_decode.py)."""
import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def cpu_has_fast_bf16():
    """AVX-512 BF16 / AMX: bf16 matmuls run natively (measured ~2.5x fp32 on this project's CPU)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


# what a CUDA error that poisons the context says (torch raises torch.AcceleratorError for them since 2.8)
_STICKY = ("illegal memory access", "device-side assert", "illegal instruction", "misaligned address",
           "unspecified launch failure", "an illegal address", "uncorrectable ecc", "cuda error: unknown error")


def is_fatal_device_error(exc):
    """True for a device error after which every later CUDA call fails too (not an out-of-memory, which a
    smaller step can survive)."""
    if isinstance(exc, torch.OutOfMemoryError):
        return False
    accelerator_error = getattr(torch, "AcceleratorError", ())
    message = str(exc).lower()
    return (isinstance(exc, accelerator_error) and "out of memory" not in message) or \
        ("cuda error" in message and any(s in message for s in _STICKY))


def cuda_available():
    """Whether this process has a GPU (one name for it, which the fake-CUDA checks answer as a GPU machine)."""
    return torch.cuda.is_available()


def resolve_device(name):
    """The engine's device, a GPU always with its index: "cuda" (and "auto" on a GPU machine) is the
    process's current GPU, since setting a thread's current device takes an index."""
    if name == "auto":
        name = "cuda" if cuda_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda" and not cuda_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available on this machine")
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    if device.type == "cuda" and device.index >= torch.cuda.device_count():
        raise ValueError(f"device {name!r} requested but this machine has {torch.cuda.device_count()} CUDA "
                         f"device(s) (cuda:0..cuda:{torch.cuda.device_count() - 1})")
    return device


def use_device(device):
    """Make `device` the calling thread's current CUDA device (torch's current device is per thread), so
    graph capture, the graph pool, streams and synchronize act on it and not on cuda:0."""
    if device.type == "cuda":
        torch.cuda.set_device(device)


def host_values(values, dtype, device):
    """A CPU tensor of `values` to copy onto `device`: pinned when that is a GPU, so the copy does not wait
    for the work already queued there (a pageable copy is staged synchronously)."""
    host = values.to(dtype) if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    real = device.type == "cuda" and cuda_available() and torch._guards.detect_fake_mode() is None
    return host.pin_memory() if real else host   # a fake tensor (tracing, the FakeTensorMode checks) has no memory


def copy_in(dst, src):
    """dst <- src (host to device without waiting): the aten op, not Tensor.copy_, whose Python binding takes
    a device guard of its own that a CPU-only build cannot make for "cuda" (the FakeTensorMode checks of
    tests/test_cuda_path.py); the CUDA copy kernel takes it anyway."""
    return torch.ops.aten.copy_.default(dst, src, True)


def upload(values, dtype, device):
    """Host values (a list, or a CPU tensor) as a new tensor on `device`."""
    if device.type != "cuda":
        return torch.as_tensor(values, dtype=dtype, device=device)
    host = host_values(values, dtype, device)
    return copy_in(torch.empty(host.shape, dtype=dtype, device=device), host)


def resolve_dtype(name, device):
    if name != "auto":
        return DTYPES[name]
    if device.type == "cuda":
        return torch.bfloat16
    return torch.bfloat16 if cpu_has_fast_bf16() else torch.float32
