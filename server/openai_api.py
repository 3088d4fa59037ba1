"""The OpenAI request fields we take and how they make the one internal request (server.request_model)."""
from rosefast.serving.values import MAX_LOGPROBS
from server.errors import bad_request
from server.request_fields import SAMPLING, check_known, number, plain_text
from server.request_model import Generation, Options
from server.structured import FIELDS as STRUCTURED
from server.structured import requested_grammar
from server.tools import history_tool_calls, requested_tools

# sent routinely by the official clients and changing nothing here: accepted, ignored
IGNORED = {"user", "metadata", "store", "service_tier"}
COMMON = {"model", "max_tokens", "stop", "stream", "stream_options", "ignore_eos", "n", "include_stop_str_in_output",
          "max_completion_tokens", "logprobs"} | SAMPLING | IGNORED
COMPLETION = COMMON | STRUCTURED | {"prompt", "echo", "best_of", "suffix"}
CHAT = COMMON | STRUCTURED | {"messages", "top_logprobs", "parallel_tool_calls", "tools", "tool_choice",
                              "chat_template_kwargs"}
RESERVED_TEMPLATE_ARGS = {"conversation", "messages", "tools", "documents", "add_generation_prompt", "tokenize",
                          "continue_final_message", "return_dict", "chat_template", "tokenizer_kwargs"}
MAX_N = 16
MAX_PROMPTS = 64


def check_fields(body, allowed):
    check_known(body, allowed)
    if body.get("suffix") is not None:
        raise bad_request("'suffix' is not supported", "suffix")
    if body.get("parallel_tool_calls") is not None and not isinstance(body.get("parallel_tool_calls"), bool):
        raise bad_request("'parallel_tool_calls' must be a boolean", "parallel_tool_calls")


def request_options(body, chat):
    """The request's Options, each field checked (a 400 naming it)."""
    for flag in ("stream", "echo"):
        if body.get(flag) is not None and not isinstance(body.get(flag), bool):
            raise bad_request(f"'{flag}' must be a boolean", flag)
    n = number(body, "n", 1, 1, MAX_N, integer=True)
    best_of = number(body, "best_of", None, integer=True)
    if best_of is not None and best_of != n:
        raise bad_request(f"'best_of' is supported only equal to 'n' ({n}): choices are not ranked here, got "
                          f"{best_of}", "best_of")
    if chat:
        lp = body.get("logprobs")
        if lp is not None and not isinstance(lp, bool):
            raise bad_request("'logprobs' must be a boolean in a chat request (the count is 'top_logprobs')",
                              "logprobs")
        top = number(body, "top_logprobs", None, 0, MAX_LOGPROBS, integer=True)
        if top is not None and not lp:
            raise bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        logprobs = (top or 0) if lp else None
    else:
        logprobs = number(body, "logprobs", None, 0, MAX_LOGPROBS, integer=True)
    stream = bool(body.get("stream", False))
    opts = body.get("stream_options")
    if opts is not None:
        if not isinstance(opts, dict) or set(opts) - {"include_usage", "continuous_usage_stats"} \
                or not all(isinstance(v, bool) for v in opts.values()):
            raise bad_request("'stream_options' must be an object with the booleans 'include_usage' and "
                              "'continuous_usage_stats'", "stream_options")
        if not stream:
            raise bad_request("'stream_options' is only allowed with 'stream': true", "stream_options")
    opts = opts or {}
    echo = bool(body.get("echo", False))
    return Options(n=n, echo=echo, logprobs=logprobs, stream=stream, include_usage=opts.get("include_usage", False),
                   continuous_usage=opts.get("continuous_usage_stats", False))


def chat_generation(body):
    """POST /v1/chat/completions as the one internal request."""
    check_fields(body, CHAT)
    return Generation("chat", request_options(body, True), body, messages=chat_messages(body),
                      template_kwargs=chat_template_kwargs(body), tools=requested_tools(body),
                      grammar=requested_grammar(body), model=body.get("model"))


def completion_generation(body):
    """POST /v1/completions as the one internal request."""
    check_fields(body, COMPLETION)
    return Generation("completions", request_options(body, False), body, prompts=completion_prompts(body),
                      grammar=requested_grammar(body), model=body.get("model"), id_prefix="cmpl-")


def _token_ids(value):
    return isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def completion_prompts(body):
    """The prompts, each a string or a list of token ids: a string, token ids, or a list of either
    (at most MAX_PROMPTS)."""
    prompt = body.get("prompt")
    if prompt is None:
        raise bad_request("'prompt' is required", "prompt")
    if isinstance(prompt, str) or _token_ids(prompt):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) or _token_ids(p) for p in prompt):
        prompts = prompt
    elif isinstance(prompt, list) and not prompt:
        raise bad_request("'prompt' must not be empty", "prompt")
    else:
        raise bad_request("'prompt' must be a string, a list of token ids, or a list of strings or of token-id "
                          "lists", "prompt")
    if len(prompts) > MAX_PROMPTS:
        raise bad_request(f"at most {MAX_PROMPTS} prompts per request, got {len(prompts)}", "prompt")
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            if not p:
                raise bad_request("'prompt' must not be empty", "prompt")
            plain_text(p, f"prompt[{i}]")
    return prompts


ROLES = {"system", "user", "assistant", "tool", "developer"}


def chat_messages(body):
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty array", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or m["role"] not in ROLES:
            raise bad_request(f"messages[{i}] must be an object with a 'role' in {sorted(ROLES)}", "messages")
        content = m.get("content")
        calls = None
        if m["role"] == "assistant" and m.get("tool_calls") is not None:   # a call it made, in the history
            calls = history_tool_calls(i, m["tool_calls"])
            content = "" if content is None else content
        if isinstance(content, list):   # [{"type": "text", "text": ...}, ...]
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise bad_request(f"messages[{i}].content parts must be text parts", "messages")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise bad_request(f"messages[{i}].content must be a string", "messages")
        message = {"role": m["role"], "content": plain_text(content, f"messages[{i}].content")}
        if calls:
            message["tool_calls"] = calls
        out.append(message)
    return out


def chat_template_kwargs(body):
    """The request's extra chat-template variables (vLLM's `chat_template_kwargs`, e.g. Qwen3's
    `{"enable_thinking": false}`): an object of names the template reads; the ones the call itself sets are
    refused."""
    value = body.get("chat_template_kwargs")
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and k.isidentifier() for k in value):
        raise bad_request("'chat_template_kwargs' must be an object of template variable names", "chat_template_kwargs")
    taken = sorted(set(value) & RESERVED_TEMPLATE_ARGS)
    if taken:
        raise bad_request(f"'chat_template_kwargs' cannot set {', '.join(taken)}", "chat_template_kwargs")
    return value
