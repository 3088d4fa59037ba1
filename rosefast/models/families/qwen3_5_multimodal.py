"""Qwen3.5 / Qwen3.6 as published (Qwen3_5ForConditionalGeneration, `qwen3_5`): the text model (rosefast.models.families
.qwen3_5) in a multimodal checkpoint, served as text: its config the checkpoint's `text_config`, its weights those
under `model.language_model.` and the `lm_head`; the vision tower's are left out (a log line says so)."""
from dataclasses import replace

from rosefast.models.families import qwen3_5

VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64)   # the tiny model's

FAMILY = replace(
    qwen3_5.FAMILY, model_type="qwen3_5", label="Qwen3.5/3.6 (the published multimodal checkpoint, as text)",
    gguf_arch=None, gguf_read_as=None, gguf_fixes=None, gguf_tensors=None,   # (never a GGUF)
    text_of="qwen3_5_text", hf_config="Qwen3_5Config", tiny=dict(text_config=qwen3_5.FAMILY.tiny, vision_config=VISION),
)
