"""FakeTensorMode on a "cuda" device, on any torch build: the CPU-side checks of the CUDA path.

Under torch._subclasses.fake_tensor.FakeTensorMode every op runs on shapes and devices alone: a CPU tensor
mixed with CUDA ones raises (FakeTensorDeviceMismatchError) and so does anything that needs a value on the
host (`.item()`, `.tolist()`, `bool(t)`: DataDependentOutputException) — the host syncs of a step. A CPU-only
build of torch has no CUDA device guard, which the Python bindings of a few ops (Tensor.copy_, indexing,
scaled_dot_product_attention's backend choice) take before dispatching; a no-op guard for "cuda", built
once here with torch's C++ extension tools, lets those reach the fake kernels. It is registered only when
this torch has no CUDA of its own.
"""
import hashlib
import os
import pathlib
import shutil
import sys

import torch

_GUARD_SOURCE = r"""
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/extension.h>
namespace { C10_REGISTER_GUARD_IMPL(CUDA, c10::impl::NoOpDeviceGuardImpl<c10::DeviceType::CUDA>); }
int fake_cuda_guard() { return 1; }
"""
_loaded = []


def enable():
    """Make FakeTensorMode with "cuda" tensors work on this build (idempotent)."""
    if torch.backends.cuda.is_built() or _loaded:
        return
    from torch.utils.cpp_extension import load_inline

    if shutil.which("ninja") is None:   # torch builds with ninja: the test extras' one sits beside this python
        os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    tag = hashlib.sha1((_GUARD_SOURCE + torch.__version__).encode()).hexdigest()[:12]
    root = pathlib.Path(os.environ.get("ROSEFAST_CACHE") or "/tmp") / f"fake-cuda-guard-{tag}"
    root.mkdir(parents=True, exist_ok=True)
    _loaded.append(load_inline("rosefast_fake_cuda_guard", cpp_sources=_GUARD_SOURCE,
                               functions=["fake_cuda_guard"], build_directory=str(root)))


def to_fake_cuda(module, mode):
    """The module's parameters and buffers as fake CUDA tensors of `mode` (values are not needed)."""
    with mode:
        for sub in module.modules():
            for name, p in list(sub._parameters.items()):
                if p is not None:
                    sub._parameters[name] = torch.nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device="cuda"),
                                                               requires_grad=False)
            for name, b in list(sub._buffers.items()):
                if b is not None:
                    sub._buffers[name] = torch.empty(b.shape, dtype=b.dtype, device="cuda")
    return module
