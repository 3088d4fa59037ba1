"""The tokenizer over HTTP, with vLLM's names and fields (lm-evaluation-harness's remote tokenizer uses them):
POST /tokenize, POST /detokenize, GET /tokenizer_info. Behind the API key when one is set."""
from flask import Blueprint, current_app

from rosefast.errors import NotReadyError
from server import openai_api
from server.request_fields import json_type
from server.body import read_json_body
from server.errors import api_error, bad_request, json_response

bp = Blueprint("tokenizer", __name__)
PATHS = ("/tokenize", "/detokenize", "/tokenizer_info")


def _ready():
    state = current_app.extensions["rosefast"]
    manager = state.manager
    if manager is None or not manager.ready:
        raise api_error(NotReadyError(), state.config.retry_after_seconds)
    return state, manager


def _json_body():
    body = read_json_body()
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {json_type(body)}")
    return body


def _flag(body, name, default):
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise bad_request(f"'{name}' must be a boolean", name)
    return value


@bp.post("/tokenize")
def tokenize():
    """{prompt} or {messages} (rendered with the chat template) -> {tokens, count, max_model_len}."""
    state, manager = _ready()
    body = _json_body()
    unknown = sorted(set(body) - {"model", "prompt", "messages", "add_special_tokens", "add_generation_prompt",
                                  "return_token_strs"})
    if unknown:
        raise bad_request(f"unsupported field(s): {', '.join(unknown)}", unknown[0])
    if ("prompt" in body) == ("messages" in body):
        raise bad_request("give exactly one of 'prompt' or 'messages'", "prompt")
    tok = manager.tokenizer
    strs = _flag(body, "return_token_strs", False)
    if "messages" in body:
        messages = openai_api.chat_messages(body)
        generation_prompt = _flag(body, "add_generation_prompt", True)
        special = _flag(body, "add_special_tokens", False)
        text = None
    else:
        prompts = openai_api.completion_prompts({"prompt": body["prompt"]})
        if len(prompts) != 1 or not isinstance(prompts[0], str):
            raise bad_request("'prompt' must be one string", "prompt")
        text = prompts[0]
        special = _flag(body, "add_special_tokens", True)

    def work():   # on the off-hub pool: the template, the encoding and the token strings
        rendered = text
        if rendered is None:
            try:
                rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
            except Exception as e:  # noqa: BLE001 - the template refuses these messages: the client's error
                raise bad_request(f"the chat template cannot render these messages: {e}", "messages") from None
        ids = tok(rendered, add_special_tokens=special)["input_ids"]
        return ids, tok.convert_ids_to_tokens(ids) if strs else None

    ids, token_strs = state.off_hub.call(work)
    out = {"tokens": ids, "count": len(ids), "max_model_len": manager.max_model_len}
    if strs:
        out["token_strs"] = token_strs
    return json_response(out)


@bp.post("/detokenize")
def detokenize():
    """{tokens} -> {prompt}."""
    state, manager = _ready()
    body = _json_body()
    tokens = body.get("tokens")
    vocab = manager.vocab_size
    if not (isinstance(tokens, list) and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab
                                             for t in tokens)):
        raise bad_request(f"'tokens' must be a list of token ids in [0, {vocab})", "tokens")
    return json_response({"prompt": state.off_hub.call(manager.tokenizer.decode, tokens)})


@bp.get("/tokenizer_info")
def tokenizer_info():
    """The tokenizer's special tokens, chat template and limits."""
    state, manager = _ready()
    tok = manager.tokenizer
    return json_response({
        "tokenizer_class": type(tok).__name__, "eos_token": tok.eos_token, "bos_token": tok.bos_token,
        "pad_token": tok.pad_token, "unk_token": tok.unk_token, "eos_token_id": tok.eos_token_id,
        "bos_token_id": tok.bos_token_id, "pad_token_id": tok.pad_token_id, "chat_template": tok.chat_template,
        "add_bos_token": bool(getattr(tok, "add_bos_token", False)), "vocab_size": manager.vocab_size,
        "model_max_length": manager.max_model_len, "max_model_len": manager.max_model_len})
