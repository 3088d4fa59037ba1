"""One Llama layer's decode step: the reference twin of _decode_layer_c — the layer's own forward, one op at a
time through the kernels' flavour for x (rosefast.kernels.layer_ops)."""
from rosefast.kernels import layer_ops


def fits(layer):
    return False


class LayerPlan:
    def __init__(self, layer):
        self.layer = layer

    def __call__(self, x, residual, step, k_cache, v_cache):
        return self.layer.forward(x, residual, step.cos, step.sin, step.meta, k_cache, v_cache, layer_ops.for_tensor(x))


class StepInputs:
    """One decode step's inputs that every layer shares."""

    def __init__(self, cos, sin, meta):
        self.cos, self.sin, self.meta = cos, sin, meta
