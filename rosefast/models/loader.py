"""Build our torch model for a resolved model: config -> ModelArgs -> module, weights from safetensors (and, for
a GGUF served from its blocks, the layer linears and the head from the file's blocks: models.gguf_convert)."""
import torch
from torch import nn

from rosefast.models.args import load_model_args
from rosefast.models.gpt2 import GPT2Model, gpt2_state_dict
from rosefast.models.llama import LlamaModel, llama_state_dict
from rosefast.models.quant_tiles import dequantize_parts
from rosefast.models.sources import ModelError, left_in_gguf, resolve_model
from rosefast.models.tiles_cache import cached_tiles

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
        if name.startswith("layers."):   # layers.{i}.{qkv, o, gate_up, down}
            _, i, part = name.split(".")
            weight = dequantize_parts(tiles[int(i)][part])
        else:   # "lm_head", or "embed": its own blocks (untied) or the head's (tied)
            weight = dequantize_parts(tiles["embed" if name == "embed" and "embed" in tiles else "head"])
        sub.weight = nn.Parameter(weight.to(device=like.device, dtype=like.dtype), requires_grad=False)
