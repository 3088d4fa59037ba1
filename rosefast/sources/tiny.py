"""Tiny random-weight models with the real SmolLM2 tokenizer, for fast tests."""
import hashlib
import json
import shutil

from rosefast.models.registry import FAMILIES
from rosefast.sources.resolve import ResolvedModel, atomic_cache_entry, check_architecture, resolve_model, write_marker

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")

def _config(arch, vocab_size, special, overrides):
    """The tiny model's transformers config: its family's (Family.tiny, rosefast.models.families), changed by
    `overrides`."""
    import transformers

    family = FAMILIES[arch]
    if family.text_of is not None:   # a multimodal checkpoint's: the vocabulary and the overrides are its text model's
        text = dict(family.tiny["text_config"], vocab_size=vocab_size, **special)
        text.update(overrides)
        return getattr(transformers, family.hf_config)(**dict(family.tiny, text_config=text))
    kwargs = dict(family.tiny, vocab_size=vocab_size, **special)
    kwargs.update(overrides)
    return getattr(transformers, family.hf_config)(**kwargs)


def tiny_random(arch="llama", seed=0, **overrides):
    """Build (once, cached) a tiny random-weight `arch` model, deterministic by `seed`.

    `overrides` are config fields (e.g. num_hidden_layers=3, attention_bias=True, tie_word_embeddings=False).
    """
    check_architecture(arch, "tiny_random(arch=...)")
    tokenizer_dir = resolve_model().path
    # the family's tiny config is part of the name: a changed one is built afresh
    key = json.dumps({"arch": arch, "seed": seed, **overrides, "tiny": FAMILIES[arch].tiny}, sort_keys=True)
    name = f"tiny-{arch}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"

    path, made = atomic_cache_entry(name, lambda tmp: build_tiny(tmp, arch, seed, overrides, tokenizer_dir))
    return ResolvedModel(f"tiny-{arch}", path, "tiny", arch, made)


def build_tiny(dest, arch, seed, overrides, tokenizer_dir):
    """Write a tiny random `arch` model (weights from `seed`) and the tokenizer of `tokenizer_dir` into dest."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    special = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                   pad_token_id=tokenizer.pad_token_id)
    config = _config(arch, len(tokenizer), special, overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        # (a multimodal checkpoint's family: its whole model, vision tower and all, as it is published)
        auto = AutoModelForImageTextToText if FAMILIES[arch].text_of is not None else AutoModelForCausalLM
        model = auto.from_config(config, dtype=torch.float32)
        if FAMILIES[arch].tiny_random_norms:   # norms initialized to ones would hide a weight applied wrongly
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
