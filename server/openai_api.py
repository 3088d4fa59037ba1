"""The OpenAI request fields we take, how they map to SamplingParams, and the response shapes."""
import math
import time
import uuid

from rosefast.engine.sampling import SamplingParams
from server.errors import bad_request

# what the batched sampler takes: OpenAI's names, and vLLM's extras (sent in the openai client's extra_body)
SAMPLING = {"temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
            "logit_bias", "min_tokens", "seed", "stop_token_ids"}
COMMON = {"model", "max_tokens", "stop", "stream", "stream_options", "ignore_eos", "n", "user",
          "include_stop_str_in_output", "max_completion_tokens"} | SAMPLING
COMPLETION = COMMON | {"prompt", "echo", "logprobs", "best_of", "suffix"}
CHAT = COMMON | {"messages", "logprobs", "top_logprobs"}
FALSE_OK = {"echo", "logprobs"}


def _number(body, name, default, low=None, high=None, integer=False):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        raise bad_request(f"'{name}' must be {'an integer' if integer else 'a number'}, got {json_type(value)}",
                          name)
    if not integer and not math.isfinite(value):
        raise bad_request(f"'{name}' must be finite", name)
    if low is not None and value < low or high is not None and value > high:
        raise bad_request(f"'{name}' must be between {low} and {high}, got {value}", name)
    return value


def json_type(value):
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null",
            int: "an integer", float: "a number"}.get(type(value), type(value).__name__)


def check_fields(body, allowed):
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {json_type(body)}")
    unknown = sorted(k for k in body if k not in allowed)
    if unknown:
        raise bad_request(f"unsupported field(s): {', '.join(unknown)}", unknown[0])
    for name in FALSE_OK:
        if body.get(name) not in (None, False, 0):
            raise bad_request(f"'{name}' is not supported", name)
    if body.get("best_of") not in (None, 1):
        raise bad_request("'best_of' > 1 is not supported", "best_of")
    if body.get("suffix") is not None:
        raise bad_request("'suffix' is not supported", "suffix")
    n = _number(body, "n", 1, integer=True)
    if n != 1:
        raise bad_request(f"'n' must be 1 (one completion per request), got {n}", "n")


def sampling_params(body, config, context_len):
    """SamplingParams from the request, with the server's caps; raises APIError naming the field."""
    cap = min(config.max_tokens_cap, context_len - 1)
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _number(body, name, min(config.default_max_tokens, cap), integer=True)
    if max_tokens < 1:
        raise bad_request(f"'{name}' must be >= 1, got {max_tokens}", name)
    if max_tokens > cap:
        raise bad_request(f"'{name}' is {max_tokens}; the most this server allows is {cap}", name)
    stop = body.get("stop")
    if stop is None:
        stop = ()
    elif isinstance(stop, str):
        stop = (stop,)
    elif not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)) or len(stop) > 16:
        raise bad_request("'stop' must be a string or a list of at most 16 strings", "stop")
    if any(not s or len(s) > 256 for s in stop):
        raise bad_request("each 'stop' string must have 1 to 256 characters", "stop")
    for flag in ("ignore_eos", "include_stop_str_in_output", "stream"):
        if body.get(flag) is not None and not isinstance(body.get(flag), bool):
            raise bad_request(f"'{flag}' must be a boolean", flag)
    seed = _number(body, "seed", None, integer=True)
    if seed is not None and not 0 <= seed < 2**63:
        raise bad_request("'seed' must be between 0 and 2**63-1", "seed")
    bias = body.get("logit_bias")
    if bias is not None and not isinstance(bias, dict):
        raise bad_request(f"'logit_bias' must be an object of token ids to numbers, got {json_type(bias)}",
                          "logit_bias")
    stop_ids = body.get("stop_token_ids")
    if stop_ids is not None and not (isinstance(stop_ids, list) and len(stop_ids) <= 64):
        raise bad_request("'stop_token_ids' must be a list of at most 64 token ids", "stop_token_ids")
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
            top_p=_number(body, "top_p", 1.0),
            top_k=_number(body, "top_k", 0, -1, 1 << 20, integer=True),
            min_p=_number(body, "min_p", 0.0),
            presence_penalty=_number(body, "presence_penalty", 0.0),
            frequency_penalty=_number(body, "frequency_penalty", 0.0),
            repetition_penalty=_number(body, "repetition_penalty", 1.0),
            logit_bias=bias or None,
            min_tokens=_number(body, "min_tokens", 0, integer=True),
            seed=seed,
            stop=tuple(stop),
            stop_token_ids=tuple(stop_ids or ()),
            ignore_eos=bool(body.get("ignore_eos", False)),
            include_stop_str_in_output=bool(body.get("include_stop_str_in_output", False)),
        )
    except ValueError as e:   # SamplingParams names the field first
        raise bad_request(f"'{str(e).split(' ', 1)[0]}' {str(e).split(' ', 1)[1]}", param_of(e)) from None


def param_of(e):
    """The request field a sampling ValueError is about (its message starts with the field's name)."""
    name = str(e).split(" ", 1)[0]
    return name if name in SAMPLING or name in ("max_tokens", "logprobs", "top_logprobs") else None


def include_usage(body):
    opts = body.get("stream_options")
    if opts is None:
        return False
    if not isinstance(opts, dict) or set(opts) - {"include_usage", "continuous_usage_stats"}:
        raise bad_request("'stream_options' must be an object with 'include_usage'", "stream_options")
    if not body.get("stream"):
        raise bad_request("'stream_options' is only allowed with 'stream': true", "stream_options")
    return bool(opts.get("include_usage", False))


def completion_prompt(body):
    """(text, token_ids): exactly one is set. Accepts a string, a one-string list, token ids, [[ids]]."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise bad_request("'prompt' must not be empty", "prompt")
        return prompt, None
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return None, prompt
    if prompt is None:
        raise bad_request("'prompt' is required", "prompt")
    if isinstance(prompt, list) and not prompt:
        raise bad_request("'prompt' must not be empty", "prompt")
    raise bad_request("'prompt' must be a string, a list with one string, or a list of token ids "
                      "(one prompt per request)", "prompt")


ROLES = {"system", "user", "assistant", "tool", "developer"}


def chat_messages(body):
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty array", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise bad_request(f"messages[{i}] must be an object with a 'role' in {sorted(ROLES)}", "messages")
        content = m.get("content")
        if isinstance(content, list):   # [{"type": "text", "text": ...}, ...]
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise bad_request(f"messages[{i}].content parts must be text parts", "messages")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise bad_request(f"messages[{i}].content must be a string", "messages")
        out.append({"role": m["role"], "content": content})
    return out


def new_id(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


class Shapes:
    """Response bodies for one request: the same id and created in every chunk."""

    def __init__(self, chat, model):
        self.chat = chat
        self.id = new_id("chatcmpl" if chat else "cmpl")
        self.created = int(time.time())
        self.model = model

    def _base(self, obj):
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def chunk(self, text, finish_reason, first=False):
        if self.chat:
            delta = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return {**self._base("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return {**self._base("text_completion"), "choices": [choice]}

    def usage_chunk(self, usage):
        return {**self._base("chat.completion.chunk" if self.chat else "text_completion"), "choices": [],
                "usage": usage}

    def full(self, text, finish_reason, usage):
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": finish_reason}
            return {**self._base("chat.completion"), "choices": [choice], "usage": usage}
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return {**self._base("text_completion"), "choices": [choice], "usage": usage}


def usage(prompt_tokens, completion_tokens):
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def openai_finish_reason(reason):
    """Our finish reasons in OpenAI's words ("abort" never reaches a client that is still there)."""
    return {"stop": "stop", "length": "length"}.get(reason, reason)
