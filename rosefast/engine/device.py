"""Device and dtype choice. CPU default dtype comes from the decode benchmark (benches/test_decode.py)."""
import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def cpu_has_fast_bf16():
    """AVX-512 BF16 / AMX: bf16 matmuls run natively (measured ~2.5x fp32 on this project's CPU)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def resolve_device(name):
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available on this machine")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"device {name!r} requested but this machine has {torch.cuda.device_count()} CUDA "
                         f"device(s) (cuda:0..cuda:{torch.cuda.device_count() - 1})")
    return device


def use_device(device):
    """Make `device` the calling thread's current CUDA device (torch's current device is per thread), so
    graph capture, the graph pool, streams and synchronize act on it and not on cuda:0."""
    if device.type == "cuda":
        torch.cuda.set_device(device)


def resolve_dtype(name, device):
    if name != "auto":
        return DTYPES[name]
    if device.type == "cuda":
        return torch.bfloat16
    return torch.bfloat16 if cpu_has_fast_bf16() else torch.float32
