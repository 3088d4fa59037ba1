"""What every API's request shares, whatever it calls its fields: the checks of a body's fields and numbers, the
sampling settings as SamplingParams, the output budget. openai_api, responses_api and messages_api translate their
bodies with these; generation.py admits the one internal request with them."""
import math

from rosefast.serving.values import SamplingParams
from server.errors import APIError, bad_request

# what the batched sampler takes: OpenAI's names, and vLLM's extras (sent in the openai client's extra_body)
SAMPLING = {"temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
            "logit_bias", "min_tokens", "seed", "stop_token_ids", "priority"}   # (priority: how it is scheduled)


def number(body, name, default, low=None, high=None, integer=False, names=None):
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


def sampling_params(body, config, context_len, options, defaults=None, grammar=None, names=None):
    """SamplingParams from the request's fields under OpenAI's names, with the server's caps; the fields it
    leaves out (or sends as null) from `defaults` (the model's generation defaults), else SamplingParams';
    `grammar`: the compiled grammar the tokens must follow (server.structured). Raises APIError naming the
    field as the client calls it (`names`: OpenAI's name -> the client's, for another API)."""
    defaults, names = defaults or {}, names or {}
    cap = min(config.max_tokens_cap, context_len - 1)
    field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = number(body, field, min(config.default_max_tokens, cap), integer=True, names=names)
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
    seed = number(body, "seed", None, integer=True)
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
            temperature=number(body, "temperature", defaults.get("temperature", 1.0), 0.0, 2.0, names=names),
            top_p=number(body, "top_p", defaults.get("top_p", 1.0), names=names),
            top_k=number(body, "top_k", defaults.get("top_k", 0), -1, 1 << 20, integer=True, names=names),
            min_p=number(body, "min_p", defaults.get("min_p", 0.0), names=names),
            presence_penalty=number(body, "presence_penalty", 0.0, names=names),
            frequency_penalty=number(body, "frequency_penalty", 0.0, names=names),
            repetition_penalty=number(body, "repetition_penalty", defaults.get("repetition_penalty", 1.0), names=names),
            logit_bias=bias or None,
            min_tokens=number(body, "min_tokens", 0, integer=True, names=names),
            seed=seed,
            stop=tuple(stop),
            stop_token_ids=tuple(stop_ids or ()),
            ignore_eos=bool(body.get("ignore_eos", False)),
            include_stop_str_in_output=bool(body.get("include_stop_str_in_output", False)),
            logprobs=options.logprobs,
            prompt_logprobs=options.logprobs if options.echo else None,
            grammar=grammar,
            priority=number(body, "priority", 0, integer=True, names=names),
        )
    except ValueError as e:   # SamplingParams names the field first
        field, rest = str(e).split(" ", 1)
        raise bad_request(f"'{names.get(field, field)}' {rest}", names.get(param_of(e), param_of(e))) from None


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
