"""One Llama layer's decode step: the reference twin of _decode_layer_c — the layer's own forward, one op at a
time through the kernels' flavour for x (rosefast.models.kernels)."""
from rosefast.models import kernels


def fits(layer):
    return False


class LayerPlan:
    def __init__(self, layer):
        self.layer = layer

    def __call__(self, x, residual, cos, sin, meta, k_cache, v_cache):
        return self.layer.forward(x, residual, cos, sin, meta, k_cache, v_cache, kernels.for_tensor(x))
