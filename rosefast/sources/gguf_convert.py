"""A GGUF file converted once into a Hugging Face-format directory (the cache entry sources.resolve_model keeps):
config.json with what transformers' GGUF reader leaves out (models.gguf_config), the tokenizer, and the weights
as fp32 safetensors — all of them, or, when every layer linear is in a block format our kernels take (the file is
served from its blocks: models.gguf_blocks), all but those and the head's (the tied embedding's) blocks. A 7B
Q4_K_M file then converts to its norms and at most an untied embedding table rather than 28 GB of fp32 that the
engine would read only to throw away; the cache marker lists the left-out weights, which the loader takes from
the file (blocks, or dequantized where dense ones are asked for).

    convert_gguf(Path("model.Q4_K_M.gguf"), dest)
    hf_model_from_gguf(gguf_path)       # transformers' own model of the file (the reference in tests)
"""
import copy
import functools
import itertools
import sys
from contextlib import contextmanager

from rosefast.models.registry import FAMILIES, GGUF_READ_AS
from rosefast.sources.gguf_file import split_parts
from rosefast.sources.resolve import ModelError, check_architecture, write_marker


class _ArraysNotMemmaps:
    """numpy, as gguf's reader sees it during a conversion: the file mapped once as a plain array, so that the
    ~400k small slices a 50k-token vocabulary is read as are ndarray views (a memmap slice costs ~2x more)."""

    def __getattr__(self, name):
        import numpy

        return getattr(numpy, name)

    @staticmethod
    def memmap(*args, **kwargs):
        import numpy

        return numpy.memmap(*args, **kwargs).view(numpy.ndarray)


def _shown_as_known(reader):
    """A gguf reader of a file whose architecture transformers' GGUF reader does not know, shown as one it knows
    with the same tensors (registry.GGUF_READ_AS: SmolLM3's as Llama's): the architecture field and its keys
    renamed. The family's gguf_fixes put back what the file is (rosefast.sources.gguf_config)."""
    import numpy as np

    field = reader.fields.get("general.architecture")
    arch = field.contents() if field is not None else None
    shown = GGUF_READ_AS.get(arch)
    if shown is None:
        return reader
    parts = list(field.parts)
    parts[field.data[0]] = np.frombuffer(shown.encode(), dtype=np.uint8)
    fields = {}
    for key, value in reader.fields.items():
        if key == "general.architecture":
            value = value._replace(parts=parts)
        elif key.startswith(arch + "."):
            key = shown + key[len(arch):]
            value = value._replace(name=key)
        fields[key] = value
    reader.fields = fields
    return reader


@contextmanager
def _gguf_parsed_once():
    """While transformers converts a GGUF, gguf's reader parses the file once and its tensor-name map is built
    once per architecture: transformers makes a reader for the config, the tokenizer and the weights alike
    (4 parses of the embedded model's 49k-token vocabulary, ~6 s each) and a name map per submodule (~400); the
    metadata it reads for the config is read again for the tokenizer. The one parse reads plain arrays."""
    import gguf
    import gguf.gguf_reader
    import transformers.modeling_gguf_pytorch_utils as hf_gguf

    saved = gguf.GGUFReader, gguf.get_tensor_name_map, gguf.gguf_reader.np, hf_gguf.load_gguf_checkpoint
    gguf.GGUFReader = functools.lru_cache(maxsize=1)(lambda *a, **k: _shown_as_known(saved[0](*a, **k)))
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(saved[1])
    gguf.gguf_reader.np = _ArraysNotMemmaps()
    metadata = functools.lru_cache(maxsize=1)(saved[3])

    def load_gguf_checkpoint(path, return_tensors=False, **kwargs):
        if return_tensors or kwargs:
            return saved[3](path, return_tensors=return_tensors, **kwargs)
        return copy.deepcopy(metadata(path))

    hf_gguf.load_gguf_checkpoint = load_gguf_checkpoint
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map, gguf.gguf_reader.np, hf_gguf.load_gguf_checkpoint = saved


def _config(gguf):
    """transformers' config of a GGUF with what its reader leaves out read from the file (models.gguf_config). Call
    inside _gguf_parsed_once."""
    from transformers import AutoConfig

    from rosefast.sources.gguf_config import gguf_config_fixes
    from rosefast.sources.gguf_file import GGUFFile

    try:
        config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except Exception as e:  # noqa: BLE001 - any parse failure means the same thing to the user
        raise ModelError(f"{str(gguf)!r} is not a readable GGUF model: {e}") from e
    as_dict = config.to_dict()
    fixes = gguf_config_fixes(GGUFFile(gguf), as_dict)
    if fixes.get("model_type", config.model_type) != config.model_type:   # read as another (GGUF_READ_AS)
        from transformers import AutoConfig

        merged = {k: v for k, v in {**as_dict, **fixes}.items() if k != "model_type"}
        return AutoConfig.for_model(fixes["model_type"], **merged)
    return type(config).from_dict({**as_dict, **fixes}) if fixes else config


def _state_without(gguf, config, skip):
    """{Hugging Face name: fp32 tensor} for every tensor of the file but those named in `skip` (llama.cpp's
    names), as transformers' GGUF loading makes them (its name map and per-architecture fixes: Llama's q/k row
    order, Gemma's norm offset), and {Hugging Face name: shape} of the ones skipped. Call inside
    _gguf_parsed_once (transformers' reader, parsed once)."""
    import gguf as gguf_package
    import numpy as np
    import torch
    import transformers.modeling_gguf_pytorch_utils as hf_gguf
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    parsed = hf_gguf.load_gguf_checkpoint(str(gguf))
    reader = gguf_package.GGUFReader(str(gguf))
    architecture = hf_gguf.read_field(reader, "general.architecture")[0]
    processor = hf_gguf.TENSOR_PROCESSORS.get(architecture, hf_gguf.TensorProcessor)(config=parsed["config"])
    family = FAMILIES[config.model_type]
    own = family.gguf_tensors   # a file transformers' reader does not know: named by gguf's map of its own arch
    if own is None:
        names = hf_gguf.get_gguf_hf_weights_map(skeleton, processor)
    else:
        as_dict = config.to_dict()
        names = {**hf_gguf.get_gguf_hf_weights_map(skeleton, processor, model_type=family.gguf_architecture),
                 **own.names(as_dict)}
    state, left = {}, {}
    parsed["tensors"] = state
    others = [gguf_package.gguf_reader.GGUFReader(str(part)) for part in split_parts(gguf)[1:]]   # a split's
    for tensor in itertools.chain(reader.tensors, *(other.tensors for other in others)):          # other parts
        if tensor.name in skip and tensor.name.endswith("_exps.weight"):   # experts [E, N, K], as transformers 5
            _left_expert(left, tensor)                                        # holds them (models.moe)
            continue
        if tensor.name in skip:
            if tensor.name not in names:
                raise ModelError(f"{gguf}: transformers has no name for the tensor {tensor.name!r}")
            left[names[tensor.name]] = [int(x) for x in reversed(tensor.shape)]
            continue
        weights = gguf_package.dequantize(tensor.data, tensor.tensor_type)
        undone = [(tensor.name, weights)] if own is None else own.undo(tensor.name, weights, as_dict)
        for name, weights in undone:
            result = processor.process(weights=weights, name=name, tensor_key_mapping=names, parsed_parameters=parsed)
            if result.name in names:
                state[names[result.name]] = torch.from_numpy(np.array(result.weights, dtype=np.float32))
    return state, left


def _left_expert(left, tensor):
    """A layer's experts left in the file, under transformers' names and shapes: gate and up as one
    `experts.gate_up_proj` [E, 2I, H], down as `experts.down_proj` [E, H, I]."""
    layer, part = tensor.name.split(".")[1], tensor.name.split(".")[2]
    shape = [int(x) for x in reversed(tensor.shape)]
    prefix = f"model.layers.{layer}.mlp.experts."
    if part == "ffn_down_exps":
        left[prefix + "down_proj"] = shape
    else:   # gate or up: each half of gate_up_proj
        left[prefix + "gate_up_proj"] = [shape[0], 2 * shape[1], shape[2]]


def convert_gguf(gguf, dest):
    """Convert a GGUF into dest: config.json, the tokenizer and model.safetensors (fp32), without the layer
    linears when the file is served from their blocks (the marker's `left_in_gguf`)."""
    import torch
    from safetensors.torch import save_file
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rosefast.sources.gguf_blocks import block_linears
    from rosefast.sources.gguf_file import GGUFFile

    kwargs = {"gguf_file": gguf.name}
    with tqdm(total=4, desc=f"rosefast: converting {gguf.name} (once)", unit="step", file=sys.stderr) as bar, \
            _gguf_parsed_once():
        config = _config(gguf)
        check_architecture(config.model_type, str(gguf))
        bar.update()
        AutoTokenizer.from_pretrained(gguf.parent, **kwargs).save_pretrained(dest)
        bar.update()
        skip = block_linears(GGUFFile(gguf).tensors, FAMILIES[config.model_type], config.num_hidden_layers,
                             getattr(config, "tie_word_embeddings", False))
        left = {}
        # (transformers reads neither a file of the latter nor a split file's other parts)
        if skip or FAMILIES[config.model_type].gguf_tensors is not None or len(split_parts(gguf)) > 1:
            state, left = _state_without(gguf, config, set(skip or ()))
        else:
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, config=config, dtype=torch.float32, **kwargs)
            state = model.state_dict()
        state = {k: v.contiguous() for k, v in state.items()}
        if getattr(config, "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)  # tied: the embedding is the one copy
        save_file(state, str(dest / "model.safetensors"), metadata={"format": "pt"})
        bar.update()
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.save_pretrained(dest)
        write_marker(dest, gguf=str(gguf), size=sum(p.stat().st_size for p in split_parts(gguf)), left_in_gguf=left)
        bar.update()


def hf_model_from_gguf(gguf, dtype=None):
    """transformers' own model of a GGUF file (every tensor dequantized by gguf), with the config fixes ours
    has: the reference a converted model is checked against, whatever the conversion left in the file."""
    import torch
    from transformers import AutoModelForCausalLM

    with _gguf_parsed_once():
        config = _config(gguf)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, config=config,
                                                     dtype=dtype or torch.float32)
    return model.eval()
