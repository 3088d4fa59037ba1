"""The OpenAI request fields we take, how they map to SamplingParams, and the response shapes."""
import math

from rosefast.serving.values import MAX_LOGPROBS, SamplingParams
from server.errors import APIError, bad_request
from server.request_model import Generation, Options
from server.structured import FIELDS as STRUCTURED
from server.structured import requested_grammar
from server.tools import history_tool_calls, requested_tools

# what the batched sampler takes: OpenAI's names, and vLLM's extras (sent in the openai client's extra_body)
SAMPLING = {"temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
            "logit_bias", "min_tokens", "seed", "stop_token_ids"}
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


def _number(body, name, default, low=None, high=None, integer=False, names=None):
    """body[name] checked as a number (an integer) in [low, high]; `names` maps the field to the client's name
    for the 400 (an API that calls it otherwise)."""
    value = body.get(name, default)
    if value is None:
        return default
    label = names.get(name, name) if names else name
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        raise bad_request(f"'{label}' must be {'an integer' if integer else 'a number'}, got {json_type(value)}",
                          label)
    if not integer and not math.isfinite(value):
        raise bad_request(f"'{label}' must be finite", label)
    if low is not None and value < low or high is not None and value > high:
        raise bad_request(f"'{label}' must be between {low} and {high}, got {value}", label)
    return value


def json_type(value):
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null",
            int: "an integer", float: "a number"}.get(type(value), type(value).__name__)


def check_known(body, allowed, say=lambda names: f"unsupported field(s): {', '.join(names)}"):
    """A 400 unless the body is a JSON object of `allowed` fields (`say` words the unknown ones' message)."""
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {json_type(body)}")
    unknown = sorted(k for k in body if k not in allowed)
    if unknown:
        raise bad_request(say(unknown), unknown[0])


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
    n = _number(body, "n", 1, 1, MAX_N, integer=True)
    best_of = _number(body, "best_of", None, integer=True)
    if best_of is not None and best_of != n:
        raise bad_request(f"'best_of' is supported only equal to 'n' ({n}): choices are not ranked here, got "
                          f"{best_of}", "best_of")
    if chat:
        lp = body.get("logprobs")
        if lp is not None and not isinstance(lp, bool):
            raise bad_request("'logprobs' must be a boolean in a chat request (the count is 'top_logprobs')",
                              "logprobs")
        top = _number(body, "top_logprobs", None, 0, MAX_LOGPROBS, integer=True)
        if top is not None and not lp:
            raise bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        logprobs = (top or 0) if lp else None
    else:
        logprobs = _number(body, "logprobs", None, 0, MAX_LOGPROBS, integer=True)
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


def sampling_params(body, config, context_len, options, defaults=None, grammar=None, names=None):
    """SamplingParams from the request's fields under OpenAI's names, with the server's caps; the fields it
    leaves out (or sends as null) from `defaults` (the model's generation defaults), else SamplingParams';
    `grammar`: the compiled grammar the tokens must follow (server.structured). Raises APIError naming the
    field as the client calls it (`names`: OpenAI's name -> the client's, for another API)."""
    defaults, names = defaults or {}, names or {}
    cap = min(config.max_tokens_cap, context_len - 1)
    field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _number(body, field, min(config.default_max_tokens, cap), integer=True, names=names)
    name = names.get(field, field)
    if max_tokens == 0 and options.echo:   # scoring only: one token is run for the prompt's logprobs, not sent
        options.score_only, max_tokens = True, 1
    if max_tokens < 1:
        raise bad_request(f"'{name}' must be >= 1 (0 only with 'echo'), got {max_tokens}", name)
    if max_tokens > cap:
        raise bad_request(f"'{name}' is {max_tokens}; the most this server allows is {cap}", name)
    stop, stop_name = body.get("stop"), names.get("stop", "stop")
    if stop is None:
        stop = ()
    elif isinstance(stop, str):
        stop = (stop,)
    elif not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)) or len(stop) > 16:
        raise bad_request(f"'{stop_name}' must be a string or a list of at most 16 strings", stop_name)
    if any(not s or len(s) > 256 for s in stop):
        raise bad_request(f"each '{stop_name}' string must have 1 to 256 characters", stop_name)
    for flag in ("ignore_eos", "include_stop_str_in_output"):
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
            temperature=_number(body, "temperature", defaults.get("temperature", 1.0), 0.0, 2.0, names=names),
            top_p=_number(body, "top_p", defaults.get("top_p", 1.0), names=names),
            top_k=_number(body, "top_k", defaults.get("top_k", 0), -1, 1 << 20, integer=True, names=names),
            min_p=_number(body, "min_p", defaults.get("min_p", 0.0), names=names),
            presence_penalty=_number(body, "presence_penalty", 0.0, names=names),
            frequency_penalty=_number(body, "frequency_penalty", 0.0, names=names),
            repetition_penalty=_number(body, "repetition_penalty", defaults.get("repetition_penalty", 1.0), names=names),
            logit_bias=bias or None,
            min_tokens=_number(body, "min_tokens", 0, integer=True, names=names),
            seed=seed,
            stop=tuple(stop),
            stop_token_ids=tuple(stop_ids or ()),
            ignore_eos=bool(body.get("ignore_eos", False)),
            include_stop_str_in_output=bool(body.get("include_stop_str_in_output", False)),
            logprobs=options.logprobs,
            prompt_logprobs=options.logprobs if options.echo else None,
            grammar=grammar,
        )
    except ValueError as e:   # SamplingParams names the field first
        field, rest = str(e).split(" ", 1)
        raise bad_request(f"'{names.get(field, field)}' {rest}", names.get(param_of(e), param_of(e))) from None


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


def check_output_budget(prompts, options, params, context_len, limit, param="max_tokens"):
    """A 400 when what the request may make passes `limit` (ROSEFAST_MAX_OUTPUT_ENTRIES): per prompt and
    choice, the echoed prompt (token ids: their count; text: its UTF-8 bytes + 2, as no token is shorter than a
    byte) plus max_tokens, at most the context length; each token 1 entry, 2 + k with logprobs. Checked before
    any work, so the response a request asks for is bounded whatever it holds."""
    per_token = 1 if options.logprobs is None else 2 + options.logprobs
    tokens = 0
    for p in prompts:
        echoed = (len(p) if not isinstance(p, str) else len(p.encode("utf-8", "surrogatepass")) + 2) \
            if options.echo else 0
        tokens += min(echoed + params.max_tokens, context_len)
    entries = tokens * options.n * per_token
    if entries > limit:
        raise APIError(
            400, f"this request may make {entries:,} output entries ({len(prompts)} prompt(s) x {options.n} choice(s): "
            f"{tokens:,} tokens{' with the prompts echoed' if options.echo else ''}, x {per_token} per token"
            f"{' with logprobs' if options.logprobs is not None else ''}); this server's limit is {limit:,} "
            "(ROSEFAST_MAX_OUTPUT_ENTRIES): send fewer prompts, choices, tokens or logprobs",
            param=param, code="output_budget_exceeded")


def param_of(e):
    """The request field a sampling ValueError is about (its message starts with the field's name)."""
    name = str(e).split(" ", 1)[0]
    return name if name in SAMPLING or name in ("max_tokens", "logprobs", "top_logprobs") else None


def plain_text(text, where):
    """A str that UTF-8 can carry (JSON allows lone surrogates like "\\ud800"; no tokenizer takes them)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise bad_request(f"{where} is not valid Unicode text (a lone surrogate?)", where.split("[")[0]) from None
    return text


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
