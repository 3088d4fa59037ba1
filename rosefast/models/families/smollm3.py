"""SmolLM3 as Llama with no positional encoding on every 4th layer (NoPE: its q and k are not rotated). Hugging
Face says which layers in `no_rope_layers` (1: RoPE, 0: none) or by `no_rope_layer_interval`; llama.cpp's converter
writes the `smollm3` architecture with Llama's tensors (q/k permuted) and no key for it: its loader takes every
4th layer. transformers' GGUF reader does not know the architecture, so the file is shown to it as Llama's and
these fields are put back. A NoPE layer runs on a RoPE of zero frequencies (cos 1, sin 0: q and k exactly as they
are), the model's second RoPE (ModelArgs.local_layers)."""
from dataclasses import replace

from rosefast.models.families import llama

LLAMA_CPP_NOPE_INTERVAL = 4   # llama.cpp's smollm3 loader: layer i has no RoPE where (i + 1) % 4 == 0
NO_ROPE = (10000.0, (("rope_type", "none"),))   # a RoPE of zero frequencies


def nope_layers(config):
    """The layers without RoPE, from a Hugging Face SmolLM3 config (dict)."""
    n = config["num_hidden_layers"]
    flags = config.get("no_rope_layers")
    if not flags:
        interval = config.get("no_rope_layer_interval") or LLAMA_CPP_NOPE_INTERVAL
        flags = [int((i + 1) % interval != 0) for i in range(n)]
    return tuple(i for i, use_rope in enumerate(flags) if not use_rope)


def _args_fields(config):
    return {"local_layers": nope_layers(config), "local_rope": NO_ROPE}


def _gguf_fixes(reader, config, head_dim):
    """The file read as Llama's becomes SmolLM3's again, with llama.cpp's NoPE layers."""
    n = config["num_hidden_layers"]
    return {"model_type": "smollm3", "architectures": ["SmolLM3ForCausalLM"],
            "no_rope_layers": [int((i + 1) % LLAMA_CPP_NOPE_INTERVAL != 0) for i in range(n)],
            "no_rope_layer_interval": LLAMA_CPP_NOPE_INTERVAL, "use_sliding_window": False, "sliding_window": None}


FAMILY = replace(
    llama.FAMILY, model_type="smollm3", label="SmolLM3 (NoPE on every 4th layer)", reasoning=("<think>", "</think>"),
    args_fields=_args_fields, gguf_arch="smollm3", gguf_read_as="llama", gguf_fixes=_gguf_fixes,
    hf_config="SmolLM3Config", tiny_random_norms=True,
    tiny=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=8, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=1024, rope_theta=10000.0, rms_norm_eps=1e-6,
              tie_word_embeddings=True, no_rope_layer_interval=4, initializer_range=0.1),
)
