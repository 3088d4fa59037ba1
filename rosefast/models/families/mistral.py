"""Mistral (7B, Nemo, Small) as Llama with a sliding window where its config has one. llama.cpp's converter
writes it under the `llama` architecture, and it is served from such a file as Llama (no window, as llama.cpp
serves it)."""
from dataclasses import replace

from rosefast.models.families import llama

FAMILY = replace(
    llama.FAMILY, model_type="mistral",
    label="Mistral (7B, Nemo, Small; a sliding window where the config has one)", gguf_arch="llama",
    hf_config="MistralConfig", tiny_random_norms=True,
    # a sliding window shorter than the positions (tests cross smaller ones)
    tiny=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=1024, sliding_window=512,
              rope_theta=1000000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, initializer_range=0.1),
)
