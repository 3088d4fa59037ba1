"""A Llama layer's decode step as one call on CPU when its linears run on the block kernels: the compiled
flavour (_decode_layer_c: the same C kernels as the per-op path, one call instead of nine) or its twin (the
layer's own forward).

    if impl.fits(layer): plan = impl.LayerPlan(layer)          # then, each decode step:
    step = impl.StepInputs(cos, sin, meta)                    # once for all layers
    x, mlp_out = plan(x, residual, step, k_cache, v_cache)    # as layer.forward
"""
from rosefast._select import select

impl = select("decode_layer", package="rosefast.kernels")

# What the plan implements of a LlamaLayer: its two norms, its per-head q/k norms (Qwen3, Gemma 3), Gemma's norms
# of the attention's and the MLP's outputs, and its four linears (any flavour of them)
PLANNED_PARAMETERS = {"input_norm", "post_norm", "q_norm", "k_norm", "post_attn_norm", "post_mlp_norm"}
PLANNED_MODULES = {"qkv", "o", "gate_up", "down"}


def unplanned(layer):
    """The names of the layer's parts the one-call plan does not implement (a family's own norms): such a
    layer is refused by name, never run without them."""
    return sorted({n for n, _ in layer.named_parameters(recurse=False)} - PLANNED_PARAMETERS
                  | {n for n, _ in layer.named_children()} - PLANNED_MODULES)
