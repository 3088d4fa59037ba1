"""Linear layers with their weights reordered once for oneDNN (CPU, bf16): the step's matmuls, faster.

    packed = pack_linears(model, batch_hint=64)     # how many layers now run packed (0: unavailable)

torch's bf16 `F.linear` on CPU hands oneDNN a plain [out, in] weight and oneDNN reorders it into its
blocked layout on every call; a PackedLinear reorders it once at load and keeps only that copy. The
results are the same numbers (checked on a probe when packing); fp32 stays on `F.linear` (MKL's sum
order, which the tests against Hugging Face's forward rely on), and so does every other device.
"""
import logging

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger("rosefast.engine")


def _reorder(weight, batch_hint):
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), batch_hint)


def _run(x, packed, bias):
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class PackedLinear(nn.Module):
    """y = x W^T + b with W held in oneDNN's layout (the original weight is not kept)."""

    def __init__(self, weight, bias=None, batch_hint=64):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.packed = _reorder(weight, batch_hint)
        self.bias = None if bias is None else bias.detach()

    def forward(self, x):
        return _run(x, self.packed, self.bias)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def packing_available(dtype, device):
    """True when oneDNN's packed linear runs here and gives F.linear's numbers (probed once per call)."""
    if device.type != "cpu" or dtype != torch.bfloat16 or not torch.backends.mkldnn.is_available():
        return False
    try:
        gen = torch.Generator().manual_seed(0)
        w = torch.randn(48, 32, generator=gen).to(dtype)
        x = torch.randn(3, 32, generator=gen).to(dtype)
        return torch.equal(_run(x, _reorder(w, 4), None), F.linear(x, w))
    except (RuntimeError, AttributeError, NotImplementedError) as e:   # an op missing from this torch build
        log.info("packed linear weights unavailable: %s", e)
        return False


def pack_linears(model, batch_hint=64):
    """Replace every nn.Linear of `model` (and a tied lm_head) by a PackedLinear when packing is available
    for its weights' dtype and device. Returns how many were packed."""
    first = next(model.parameters())
    if not packing_available(first.dtype, first.device):
        return 0
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and not getattr(parent, "stacked_linears", False):
                setattr(parent, name, PackedLinear(child.weight, child.bias, batch_hint))
                count += 1
    if getattr(model, "lm_head", "absent") is None:          # tied: the head reads the embedding
        model.lm_head = PackedLinear(model.embed.weight, None, batch_hint)
        count += 1
    log.info("packed %d linear layers for oneDNN (%s)", count, first.dtype)
    return count
