"""Build our torch model for a resolved model: config -> ModelArgs -> module, weights from safetensors."""
import torch

from rosefast.models.args import load_model_args
from rosefast.models.gpt2 import GPT2Model, gpt2_state_dict
from rosefast.models.llama import LlamaModel, llama_state_dict
from rosefast.models.sources import ModelError, resolve_model

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


def load_model(model, dtype=torch.float32, device="cpu"):
    """(our model in eval mode on `device` with `dtype`, its ModelArgs) for a spec or ResolvedModel."""
    resolved = resolve_model(model)
    args = load_model_args(resolved.path)
    cls, convert = ARCHES[args.arch]
    with torch.device("meta"):
        module = cls(args)
    state = convert(read_hf_state_dict(resolved.path), args)
    module.load_state_dict(state, strict=True, assign=True)
    return module.to(device=device, dtype=dtype).eval(), args
