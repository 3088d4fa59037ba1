"""Tiny random-weight models with the real SmolLM2 tokenizer, for fast tests."""
import hashlib
import json
import shutil

from rosefast.models.registry import FAMILIES
from rosefast.sources.resolve import ResolvedModel, atomic_cache_entry, check_architecture, resolve_model, write_marker

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")

_BASE = {
    "llama": dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=1024, rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
        attention_bias=False, initializer_range=0.1,
    ),
    "qwen2": dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=1024, rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
        initializer_range=0.1,
    ),
    "qwen3": dict(   # an explicit head_dim (32: q is 128 wide on a 64-wide model), q/k norms, tied embeddings
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, max_position_embeddings=1024, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, initializer_range=0.1,
    ),
    "mistral": dict(   # a sliding window shorter than the positions (tests cross smaller ones)
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, max_position_embeddings=1024, sliding_window=512, rope_theta=1000000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=False, initializer_range=0.1,
    ),
    "phi3": dict(   # q|k|v and gate|up stored fused
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=1024, original_max_position_embeddings=1024, rope_theta=10000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=False, initializer_range=0.1,
    ),
    "gemma3_text": dict(   # a local layer and a global one, each with its RoPE; attention scale from its own scalar
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, layer_types=["sliding_attention", "full_attention"], sliding_window=512,
        max_position_embeddings=1024, query_pre_attn_scalar=24, rms_norm_eps=1e-6, tie_word_embeddings=True,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}},
        initializer_range=0.1,
    ),
    "gpt2": dict(n_embd=64, n_layer=2, n_head=4, n_positions=1024, initializer_range=0.1),
}


RANDOM_NORMS = {"qwen3", "mistral", "phi3", "gemma3_text"}   # families whose tiny models get random norm weights (the older ones keep their ones)


def _config(arch, vocab_size, special, overrides):
    import transformers

    family = FAMILIES.get(arch)
    if family is not None and family.tiny:   # a family written as its own module names its tiny model there
        kwargs = dict(family.tiny, vocab_size=vocab_size, **special)
        kwargs.update(overrides)
        return getattr(transformers, family.hf_config)(**kwargs)
    cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config,
           "mistral": transformers.MistralConfig, "phi3": transformers.Phi3Config,
           "gemma3_text": transformers.Gemma3TextConfig, "gpt2": transformers.GPT2Config}[arch]
    kwargs = dict(_BASE[arch], vocab_size=vocab_size, **special)
    kwargs.update(overrides)
    return cls(**kwargs)


def tiny_random(arch="llama", seed=0, **overrides):
    """Build (once, cached) a tiny random-weight `arch` model, deterministic by `seed`.

    `overrides` are config fields (e.g. num_hidden_layers=3, attention_bias=True, tie_word_embeddings=False).
    """
    check_architecture(arch, "tiny_random(arch=...)")
    tokenizer_dir = resolve_model().path
    key = json.dumps({"arch": arch, "seed": seed, **overrides}, sort_keys=True)
    name = f"tiny-{arch}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"

    path, made = atomic_cache_entry(name, lambda tmp: build_tiny(tmp, arch, seed, overrides, tokenizer_dir))
    return ResolvedModel(f"tiny-{arch}", path, "tiny", arch, made)


def build_tiny(dest, arch, seed, overrides, tokenizer_dir):
    """Write a tiny random `arch` model (weights from `seed`) and the tokenizer of `tokenizer_dir` into dest."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    special = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                   pad_token_id=tokenizer.pad_token_id)
    config = _config(arch, len(tokenizer), special, overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        if arch in RANDOM_NORMS or FAMILIES[arch].tiny:   # norms initialized to ones would hide a weight applied wrongly
            with torch.no_grad():
                for name, p in model.named_parameters():
                    if name.endswith("norm.weight"):
                        p.uniform_(0.5, 1.5)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(dest / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(dest)
    for f in TOKENIZER_FILES:
        if (tokenizer_dir / f).exists():
            shutil.copy(tokenizer_dir / f, dest / f)
    write_marker(dest, tiny=arch, seed=seed, overrides=overrides)
