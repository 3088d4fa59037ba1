"""Offline text generation for the CLI (Hugging Face's generate until our engine serves it)."""


def generate_text(prompt, model="smollm2-135m", max_tokens=64, chat=True):
    """Greedy completion of `prompt`; with `chat`, the prompt goes through the model's chat template."""
    if not isinstance(prompt, str) or not prompt:
        raise ValueError("prompt must be a non-empty string")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    import torch

    from rosefast.models import load_hf_model, load_tokenizer, resolve_model

    resolved = resolve_model(model)
    tokenizer = load_tokenizer(resolved)
    hf = load_hf_model(resolved)
    if chat and tokenizer.chat_template:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                               tokenize=False)
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.inference_mode():
        out = hf.generate(ids, max_new_tokens=max_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
