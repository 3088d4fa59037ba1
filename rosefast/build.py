"""One call builds a ready model: `build_model(spec, device, dtype, quantization)` resolves the spec (a source:
rosefast.sources), builds our torch module for its family (rosefast.models), takes a GGUF's blocks as they lie
or quantizes at load (rosefast.models.quantized, on rosefast.kernels), and packs the rest for the CPU. The engine
sees only what comes back: the module (forward, logits, its decode plan) and its ModelArgs.

    built = build_model("smollm2-135m", torch.device("cpu"), torch.bfloat16, "auto")
    built.module, built.args, built.quantized      # the model, its shape, what its linears run on

Lower down: load_model (config -> ModelArgs -> module, weights from safetensors; a GGUF served from its blocks
keeps its linears in the file) and fill_linears (those weights dequantized where no blocks were put in).
"""
import logging
from dataclasses import dataclass

import torch
from torch import nn

from rosefast.errors import ModelError
from rosefast.kernels import layer_ops
from rosefast.kernels.quant_ops import decoding  # noqa: F401 (the engine's: a step's row count to the kernels)
from rosefast.models.args import load_model_args
from rosefast.models.gpt2 import GPT2Model, gpt2_state_dict
from rosefast.models.llama import LlamaModel, llama_state_dict
from rosefast.models.packed import pack_linears
from rosefast.models.registry import FAMILIES
from rosefast.models.quantized import check_mode, quantize_linears, quantizes, weight_bytes
from rosefast.quant.tiles import dequantize_parts
from rosefast.sources.resolve import STAND_IN, gguf_source, left_in_gguf, resolve_model  # noqa: F401 (the engine's)
from rosefast.sources.progress import DOWNLOAD  # noqa: F401 (the serving layer's: a hub name's download)
from rosefast.sources.tiles_cache import cached_tiles
from rosefast.sources import load_tokenizer  # noqa: F401 (the engine's)

log = logging.getLogger("rosefast.engine")

ARCHES = {"llama": (LlamaModel, llama_state_dict), "gpt2": (GPT2Model, gpt2_state_dict)}


def read_hf_state_dict(path):
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors"))
    if files:
        state = {}
        for f in files:
            state.update(load_file(str(f)))
        return state
    if (path / "pytorch_model.bin").is_file():
        return torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise ModelError(f"{path} has no weights (*.safetensors or pytorch_model.bin)")


def text_model_weights(hf):
    """A multimodal checkpoint's text model's weights under the text model's names (`model.language_model.` ->
    `model.`; the lm_head as it is), the vision tower's left out (logged)."""
    text, left = {}, 0
    for name, tensor in hf.items():
        if name.startswith("model.language_model."):
            text["model." + name[len("model.language_model."):]] = tensor
        elif name.startswith("lm_head."):
            text[name] = tensor
        else:
            left += 1
    if left:
        log.info("a multimodal checkpoint served as text: %d tensors of its vision tower left out", left)
    return text


def _unfilled(module):
    """The weights still on the meta device (left in the GGUF): [(submodule, its name in `module`)] — layer linears,
    and the embedding or lm_head where their blocks were left too."""
    return [(sub, name) for name, sub in module.named_modules()
            if isinstance(sub, (nn.Linear, nn.Embedding)) and sub.weight is not None and sub.weight.is_meta]


def load_model(model, dtype=torch.float32, device="cpu", lean=False):
    """(our model in eval mode on `device` with `dtype`, its ModelArgs) for a spec or ResolvedModel. A GGUF served
    from its blocks keeps its layer linears (and its head's and its embedding's blocks) in the file
    (sources.left_in_gguf): `lean` leaves them on the meta device, for quantize_linears to put the blocks there
    (fill_linears does what it did not); else they are dequantized from the blocks here, bit for bit what gguf's
    dequantization makes."""
    resolved = resolve_model(model)
    args = load_model_args(resolved.path)
    cls, convert = ARCHES[args.arch]
    _, left = left_in_gguf(resolved.path)
    hf = read_hf_state_dict(resolved.path)
    if getattr(FAMILIES.get(resolved.model_type), "text_of", None) is not None:
        hf = text_model_weights(hf)
    hf.update({name: torch.empty(shape, device="meta") for name, shape in left.items()})
    with torch.device("meta"):
        module = cls(args)
    module.load_state_dict(convert(hf, args), strict=True, assign=True)
    holes = _unfilled(module)
    shapes = [sub.weight.shape for sub, _ in holes]
    for sub, _ in holes:   # out of the way of .to(), which cannot move a meta tensor
        sub.weight = None
    module = module.to(device=device, dtype=dtype).eval()
    for (sub, _), shape in zip(holes, shapes):
        sub.weight = nn.Parameter(torch.empty(shape, dtype=dtype, device="meta"), requires_grad=False)
    if not lean:
        fill_linears(module, resolved)
    return module, args


def fill_linears(module, model):
    """Dequantize into `module` (on its device and dtype) each weight load_model(lean=True) left on the meta device,
    from the GGUF's blocks (as the kernels' tiles: tiles_cache) — a layer linear and an untied embedding from their
    own, the lm_head and a tied embedding from the head's; a no-op when there is none."""
    holes = _unfilled(module)
    if not holes:
        return
    resolved = resolve_model(model)
    gguf, _ = left_in_gguf(resolved.path)
    tiles = cached_tiles(gguf, module.args, resolved.path)
    like = module.norm
    for sub, name in holes:
        if name.startswith("layers."):   # layers.{i}.{qkv, o, gate_up, down, moe.experts.{e}.gate_up ...}
            _, i, part = name.split(".", 2)
            weight = dequantize_parts(tiles[int(i)][part])
        else:   # "lm_head", or "embed": its own blocks (untied) or the head's (tied)
            weight = dequantize_parts(tiles["embed" if name == "embed" and "embed" in tiles else "head"])
        sub.weight = nn.Parameter(weight.to(device=like.device, dtype=like.dtype), requires_grad=False)


def reasoning_tags(model_type):
    """(opening, closing) tag of the reasoning block a family's chat models write first, or ()."""
    return FAMILIES[model_type].reasoning


def load_generation_defaults(model):
    """The generation settings a model ships with (rosefast.sources.generation), for requests that leave them out."""
    from rosefast.sources.generation import generation_defaults

    return generation_defaults(model)


def load_pooling(model):
    """How a model's prompts become embeddings (rosefast.sources.pooling), for the embeddings route."""
    from rosefast.sources.pooling import pooling_of

    return pooling_of(model.path)


@dataclass
class BuiltModel:
    module: nn.Module        # forward(input_ids, positions, meta, kv_caches), logits(hidden), head(h)
    args: object             # its ModelArgs (rosefast.models.args)
    resolved: object         # the ResolvedModel it came from (rosefast.sources)
    quantized: int = 0       # how many linears run quantized (0: none)
    source: str = None       # where their numbers came from ("the GGUF's blocks", "quantized at load"), or None


def build_model(spec, device, dtype, quantization="none", *, quantize_lm_head="auto", cpu_kernels="auto",
                activations="two-digit", batch_hint=1):
    """A ready model for `spec` (a name, a path, a ResolvedModel) on `device` with `dtype`, its linears in
    `quantization` (none, auto, int8, int4; rosefast.config): weights loaded, a GGUF's blocks put in as they lie
    (or quantized at load), the rest packed for the CPU's matmuls, the one-call decode plan made where it fits.
    ValueError for a quantization the device does not run; ModelError for a spec that cannot be built."""
    check_mode(quantization, device)
    resolved = resolve_model(spec)
    with torch.inference_mode():
        # a GGUF served from its blocks: its layer linears stay in the file unless a dense one is asked for
        module, args = load_model(resolved, dtype, device, lean=quantization != "none")
        source = gguf_source(resolved)
        tiles = cached_tiles(source, args, resolved.path) if source is not None and \
            quantizes(quantization, device) else None
        count, described = quantize_linears(module, quantization, tiles, head=quantize_lm_head, kernels=cpu_kernels,
                                            activations=activations)
        # what the blocks were not put in for: auto on a GPU, a tied embedding not looked up in the head's blocks
        fill_linears(module, resolved)
        pack_linears(module, batch_hint=batch_hint)
        if getattr(module.args, "num_experts", 0):
            log.info("routed experts, layers by how they run: %s (one call: the block kernels' Tier.experts; "
                     "grouped: torch's grouped matmul; loop: one expert at a time)", module.plan_experts())
        if hasattr(module, "plan_decode_layers"):
            refused = module.plan_decode_layers()
            log.info("decode steps: %s; decode attention: %s", "one call per layer (the linears on the block "
                     "kernels)" if refused is None else f"per op ({refused})",
                     layer_ops.for_device(device, dtype).attention_kernel())
        size, params = weight_bytes(module)
        log.info("weights: %.1f MB, %.2f bytes per weight (%s, quantization %s)", size / 1e6, size / params,
                 dtype, quantization)
    return BuiltModel(module, args, resolved, count, described)
