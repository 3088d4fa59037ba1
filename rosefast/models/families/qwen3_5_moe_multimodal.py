"""Qwen3.5 / Qwen3.6 mixtures of experts as published (Qwen3_5MoeForConditionalGeneration, `qwen3_5_moe`): the text
model (rosefast.models.families.qwen3_5_moe) in a multimodal checkpoint, served as text (rosefast.models.families
.qwen3_5_multimodal)."""
from dataclasses import replace

from rosefast.models.families import qwen3_5_moe
from rosefast.models.families.qwen3_5_multimodal import VISION

FAMILY = replace(
    qwen3_5_moe.FAMILY, model_type="qwen3_5_moe", label="Qwen3.5/3.6-MoE (the published multimodal checkpoint, as text)",
    gguf_arch=None, gguf_read_as=None, gguf_fixes=None, gguf_tensors=None,   # (never a GGUF)
    text_of="qwen3_5_moe_text", hf_config="Qwen3_5MoeConfig",
    tiny=dict(text_config=qwen3_5_moe.FAMILY.tiny, vision_config=VISION),
)
