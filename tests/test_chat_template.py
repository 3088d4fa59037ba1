"""A chat prompt is encoded as Hugging Face's apply_chat_template(tokenize=True) encodes it, whether or not the
tokenizer adds a BOS itself (Llama 3 and Gemma do, SmolLM2 does not): one BOS, never two."""
import json
import shutil

import pytest
import requests

from rosefast.sources import load_tokenizer, tiny_random
from tests.serving import Server, tiny_env

MESSAGES = [{"role": "user", "content": "Say hello"}]


def _with_bos(path):
    """The tiny model's tokenizer made to add its BOS (<|im_start|>, id 1) first, and a template that writes it."""
    tokenizer = json.loads((path / "tokenizer.json").read_text())
    tokenizer["post_processor"] = {
        "type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
                                                 {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]}}}
    (path / "tokenizer.json").write_text(json.dumps(tokenizer))
    (path / "chat_template.jinja").write_text(
        "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}")


@pytest.mark.parametrize("bos", [False, True], ids=["smollm2-no-bos", "adds-bos"])
def test_a_chat_prompt_has_the_tokens_hugging_face_gives_it(tmp_path, default_model, bos):
    path = tmp_path / "model"
    shutil.copytree(tiny_random("llama").path, path)
    if bos:
        _with_bos(path)
    tok = load_tokenizer(str(path))
    want = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    if bos:
        assert want[:2] != [1, 1] and want[0] == 1   # Hugging Face's own: one BOS
    s = Server(tiny_env(type("M", (), {"path": path})()))
    try:
        chat = requests.post(s.url + "/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES,
                                                                   "max_tokens": 1}, timeout=60).json()
        counted = requests.post(s.url + "/tokenize", json={"model": "tiny", "messages": MESSAGES}, timeout=60).json()
    finally:
        s.stop()
    assert chat["usage"]["prompt_tokens"] == len(want) == counted["count"]
