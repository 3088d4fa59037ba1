"""The one request path every API takes: its translation module turns a body into a Generation; `admit`
checks it against the server (model, grammar, sampling caps, output budget), admits it (a 429 at once when
the server is full, before any byte of an answer) and returns the Run whose deltas the API's writer shapes.

    run = admit(state, openai_api.chat_generation)    # or responses_api.generation, messages_api.generation
    writer = OpenAIWriter(run, ...)                    # or ResponsesWriter, MessagesWriter
    return Response(writer.events(), ...) if run.options.stream else writer.body()

A new API is one module of translation and writing, not a fork of this path."""
import functools
import logging
import time

from flask import request

from rosefast.errors import NotReadyError, ShutdownError
from rosefast.serving.values import reasoning_tags
from server import disconnect, structured
from server.body import read_json_body
from server.errors import MANAGER_ERRORS, APIError, api_error, bad_request
from server.metrics import priority_class
from server.request_fields import check_output_budget, param_of, sampling_params
from server.run import Run
from server.shapes import new_id
from server.tools import render_messages, template_takes_tools

access = logging.getLogger("rosefast.access")


def ready_manager(state):
    """The serving core, or the 503 that says why not (draining, loading)."""
    retry = state.config.retry_after_seconds
    if state.draining:
        raise api_error(ShutdownError(), retry)
    manager = state.manager
    if manager is None or not manager.ready:
        raise api_error(NotReadyError(), retry)
    return manager


def admit(state, translate):
    """Read the body, translate it (`translate(body)` -> Generation), check and admit it: the Run, or an
    APIError (400 naming the client's field, 404 for another model, 429 when full, 503)."""
    t0 = time.perf_counter()
    manager, body, gen = _translated(state, translate)
    context_len = manager.max_model_len
    prompts = gen.prompts if gen.messages is None else [state.off_hub.call(
        chat_prompt, manager, gen.messages, gen.tools, gen.template_kwargs, gen.names.get("messages", "messages"))]
    wanted, calls = gen.grammar, gen.tools
    if calls is not None and calls.forced:   # "required" or a named function: held to one call by a grammar
        if wanted is not None:
            raise bad_request(f"give one grammar: '{wanted[2]}' and a forced tool call ('tool_choice')", wanted[2])
        wanted = (*calls.grammar(), "tool_choice")
    grammar = structured.compile_grammar(state, *wanted) if wanted is not None else None
    params = sampling_params(gen.sampling, state.config, context_len, gen.options, state.generation_defaults,
                             grammar, gen.names)
    check_output_budget(prompts, gen.options, params, context_len, state.config.max_output_entries,
                        gen.names.get("max_tokens", "max_tokens"))
    retry = state.config.retry_after_seconds
    try:
        if len(prompts) == 1:
            one = prompts[0]
            rid = manager.add_request(one if isinstance(one, str) else None, params=params, n=gen.options.n,
                                      prompt_token_ids=None if isinstance(one, str) else one)
        else:
            rid = manager.add_requests(prompts, params=params, n=gen.options.n)
    except MANAGER_ERRORS as e:
        name = param_of(e)
        raise api_error(e, retry, gen.names.get(name, name) if name else
                        gen.names.get("messages", "messages") if gen.messages is not None else "prompt") from None
    echoes = state.off_hub.call(lambda: [p if isinstance(p, str) else manager.tokenizer.decode(p) for p in prompts]) \
        if gen.options.echo else None
    stop_watch = disconnect.watch(request.environ, lambda: manager.abort(rid))
    reasoning = reasoning_tags(manager.model.model_type) if gen.messages is not None else ()
    run = Run(state, manager, rid, new_id(gen.id_prefix), gen.endpoint, gen.options, echoes, t0, stop_watch,
              calls if calls is not None and calls.active else None, reasoning, body)
    run.carry, run.priority = gen.carry, priority_class(params.priority)
    state.metrics.priority_requests.labels(run.priority).inc()
    if state.config.log_text:   # an operator's explicit choice; off by default
        access.info("%s prompt=%r", run.id, prompts)
    return run


def count_prompt_tokens(state, translate):
    """The prompt's length in tokens as `admit` would run it (the same translation and template), without
    running it."""
    manager, _, gen = _translated(state, translate)

    def count():
        field = gen.names.get("messages", "messages")
        return len(manager.tokenizer(chat_prompt(manager, gen.messages, gen.tools, gen.template_kwargs, field))
                   ["input_ids"])
    return state.off_hub.call(count)


def _translated(state, translate):
    """(the serving core, the body, its Generation) once the server is ready and the body names no other model."""
    manager = ready_manager(state)
    body = read_json_body()
    gen = translate(body)
    check_model(state, gen.model)
    return manager, body, gen


def check_model(state, model):
    """A 404 for a `model` that names another model than this server's (None: this server's)."""
    if model is not None and model != state.model_name:
        raise APIError(404, f"the model '{str(model)[:200]}' does not exist; this server serves "
                            f"'{state.model_name}'", "not_found_error", "model", "model_not_found")


def chat_prompt(manager, messages, calls=None, template_kwargs=None, field="messages"):
    """The chat messages (and the tools, where the request has them) rendered by the model's chat template
    into the prompt's text; a 400 when the template refuses them."""
    native = template_takes_tools(manager.tokenizer)
    listed = [{"type": "function", "function": {"name": n, **f}} for n, f in calls.functions.items()] \
        if calls is not None and calls.active and native else None
    tok = manager.tokenizer
    try:
        text = tok.apply_chat_template(render_messages(messages, calls, native), tools=listed,
                                       add_generation_prompt=True, tokenize=False, **(template_kwargs or {}))
    except Exception as e:  # noqa: BLE001 - a template that refuses these messages is the client's error
        raise bad_request(f"the chat template cannot render these messages: {e}", field) from None
    # the prompt is encoded with the tokenizer's special tokens (as a completion's is): where it adds a BOS
    # itself (Llama 3, Gemma), the template's own BOS text goes, or the model would see two
    if tok.bos_token and text.startswith(tok.bos_token) and _adds_bos(tok):
        text = text[len(tok.bos_token):]
    return text


@functools.lru_cache(maxsize=8)
def _adds_bos(tokenizer):
    """Whether encoding with special tokens puts the BOS token first."""
    return tokenizer.bos_token_id is not None and tokenizer("x")["input_ids"][:1] == [tokenizer.bos_token_id]
