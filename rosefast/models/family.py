"""A model family: what its Hugging Face config, its checkpoints and its GGUF files mean for our model code. Each
family is a module of its own in rosefast.models.families, written as its differences from the one it resembles
(its Family made with dataclasses.replace from that one's); the registry (rosefast.models.registry) names them."""
from dataclasses import dataclass


@dataclass(frozen=True, eq=False)
class Family:
    model_type: str          # Hugging Face's config.model_type
    module: str              # our model code: "llama" (rosefast.models.llama) or "gpt2"
    label: str               # for messages and the README
    # the layer's differences, as flags of ModelArgs the model code keys on (never the family's name)
    qkv_bias: object = None  # True/False: fixed for the family; None: the config's attention_bias
    o_bias: bool = None      # None: the config's attention_bias
    qk_norm: bool = False    # a per-head RMSNorm of q and k (over head_dim) before RoPE
    qk_norm_full: bool = False   # an RMSNorm of all of q and all of k (OLMoE) before RoPE
    fused_weights: bool = False   # its checkpoints store q|k|v and gate|up fused (qkv_proj, gate_up_proj)
    gemma: bool = False      # Gemma's layer: RMSNorm as x * (1 + w), four norms a layer (around attention and
                             # the MLP), embeddings x sqrt(hidden), tanh-GELU, attention scale from
                             # query_pre_attn_scalar, local (sliding) layers with their own RoPE base
    reasoning: tuple = ()    # (opening, closing) tag of the reasoning block its chat models write first
    text_of: str = None      # a multimodal checkpoint served as text: the model_type of its text model, whose config
                             # is its `text_config` and whose weights are under `model.language_model.` (the vision
                             # tower's are left out, with a log line)
    # its config
    args_fields: object = None   # config dict -> {ModelArgs field: value} beyond the common reading ("rope": the
                                 # (theta, scaling) pair, where the common reading of RoPE does not fit)
    read_args: object = None     # config dict -> every ModelArgs field, where the common reading does not fit at all
    # its GGUF files, as llama.cpp's converter writes them
    gguf_arch: str = None            # llama.cpp's architecture name (None: the model_type)
    gguf_qk_permuted: bool = False   # the converter reorders q/k rows for interleaved RoPE (Llama's converter and
                                     # those made from it; the Qwen families keep Hugging Face's rotate-half order)
    gguf_read_as: str = None     # the architecture transformers' GGUF reader is shown (one it knows, with the
                                 # same tensors), where it does not know this one
    gguf_fixes: object = None    # (GGUF metadata reader, config dict) -> the config fields the file's reading lacks
    gguf_tensors: object = None  # where transformers' reader has no names for the file's tensors: an object naming
                                 # them (beside gguf's map of the file's own architecture) and undoing what the
                                 # converter did to them (rosefast.models.families.linear_gguf.LinearTensors)
    # its tiny random model (tests)
    hf_config: str = None        # transformers' config class
    tiny: dict = None            # the tiny model's config
    tiny_random_norms: bool = True   # norms drawn at random (ones would hide a weight applied wrongly)

    @property
    def gguf_architecture(self):
        return self.gguf_arch or self.model_type
