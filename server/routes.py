"""The routes: POST /v1/completions and /v1/chat/completions (validate, admit with a 429 at once, stream or
collect), and GET /health, /v1/models and /metrics."""
import contextlib
import functools
import logging
import sys
import time

from flask import Blueprint, Response, current_app, request
from werkzeug.exceptions import RequestEntityTooLarge

from rosefast.errors import NotReadyError, ShutdownError
from rosefast.models.families import FAMILIES
from server import disconnect, openai_api, sse, structured, tools
from server.auth import authorized
from server.errors import MANAGER_ERRORS, APIError, api_error, bad_request, json_response, parse_json
from server.responses import Run
from server.shapes import Shapes

bp = Blueprint("openai", __name__)
access = logging.getLogger("rosefast.access")


def _state():
    return current_app.extensions["rosefast"]


def _body():
    """The request's JSON body, read within ROSEFAST_BODY_TIMEOUT_S (a 408 that closes the connection when it
    is slower: a client trickling its body does not hold the connection for ever). Under gunicorn, the socket
    then gets ROSEFAST_SEND_TIMEOUT_S for each write of the answer: a client that stops reading has its stream
    ended (the write raises, the stream closes, its request is aborted) instead of piling output up."""
    environ = request.environ
    config = _state().config
    length = environ.get("CONTENT_LENGTH", "")
    if length.isdigit() and int(length) > current_app.config["MAX_CONTENT_LENGTH"]:
        raise RequestEntityTooLarge()
    sock = environ.get("gunicorn.socket")
    try:
        with _deadline(config.body_timeout_s if sock is not None else None):
            if length.isdigit() and "HTTP_TRANSFER_ENCODING" not in environ:   # the common case, without
                raw = environ["wsgi.input"].read(int(length))                # werkzeug's stream wrappers
            else:                                                            # (~5% of a request)
                raw = request.get_data(cache=False)
    except BodyTimeout:
        close = environ.get("rosefast.force_close")
        if close is not None:
            close()
        raise APIError(408, f"the request body did not arrive within {config.body_timeout_s:g} s "
                            "(ROSEFAST_BODY_TIMEOUT_S)", code="request_timeout") from None
    if sock is not None:
        sock.settimeout(config.send_timeout_s)
    return parse_json(raw)


class BodyTimeout(Exception):
    pass


def _deadline(seconds):
    """A gevent timeout raising BodyTimeout in this greenlet (nothing without gevent or a limit)."""
    if seconds is None or "gevent" not in sys.modules:
        return contextlib.nullcontext()
    import gevent

    return gevent.Timeout(seconds, BodyTimeout)


@bp.get("/health")
def health():
    """Open to every caller (load balancers probe it without a key); the reason behind an error or a dead
    engine is shown only to a caller with the API key, where one is set."""
    state = _state()
    m = state.manager
    failure = ("error", m.load_error) if m is not None and m.load_error is not None else \
        ("dead", m.dead) if m is not None and m.dead is not None else None
    if failure is not None:
        body = {"status": failure[0]}
        if authorized(state.config):
            body["error"] = str(failure[1])
        return json_response(body, 503)
    if m is None or not m.ready:
        return json_response({"status": "loading"}, 503)
    if state.draining:
        return json_response({"status": "draining"}, 503)
    return json_response({"status": "ok", "worker": state.config.worker_index})


@bp.get("/v1/models")
def models():
    state = _state()
    m = state.manager
    card = {"id": state.model_name, "object": "model", "created": int(state.started), "owned_by": "rosefast"}
    if m is not None and m.ready:
        card["max_model_len"] = m.engine.max_model_len
        card["generation_defaults"] = state.generation_defaults
    return json_response({"object": "list", "data": [card]})


@bp.get("/metrics")
def metrics():
    return Response(_state().metrics.render(), mimetype="text/plain; version=0.0.4")


@bp.post("/v1/completions")
def completions():
    return _serve(chat=False)


@bp.post("/v1/chat/completions")
def chat_completions():
    return _serve(chat=True)


def _serve(chat):
    state = _state()
    manager = state.manager
    t0 = time.perf_counter()
    retry = state.config.retry_after_seconds
    if state.draining:
        raise api_error(ShutdownError(), retry)
    if manager is None or not manager.ready:
        raise api_error(NotReadyError(), retry)
    body = _body()
    openai_api.check_fields(body, openai_api.CHAT if chat else openai_api.COMPLETION)
    _check_model(state, body)
    options = openai_api.request_options(body, chat)
    calls = tools.requested_tools(body) if chat else None
    if chat:   # (echo is a completions field: a chat request that sends it is refused by check_fields)
        prompts = [_chat_prompt(manager, openai_api.chat_messages(body), calls, openai_api.chat_template_kwargs(body))]
    else:
        prompts = openai_api.completion_prompts(body)
    wanted = structured.requested_grammar(body)
    if calls is not None and calls.forced:   # "required" or a named function: held to one call by a grammar
        if wanted is not None:
            raise bad_request(f"give one grammar: '{wanted[2]}' and a forced tool call ('tool_choice')",
                              wanted[2])
        wanted = (*calls.grammar(), "tool_choice")
    grammar = structured.compile_grammar(state, *wanted) if wanted is not None else None
    params = openai_api.sampling_params(body, state.config, manager.engine.max_model_len, options,
                                        state.generation_defaults, grammar)
    openai_api.check_output_budget(prompts, options, params, manager.engine.max_model_len,
                                   state.config.max_output_entries)
    try:
        if len(prompts) == 1:
            one = prompts[0]
            rid = manager.add_request(one if isinstance(one, str) else None, params=params, n=options.n,
                                      prompt_token_ids=None if isinstance(one, str) else one)
        else:
            rid = manager.add_requests(prompts, params=params, n=options.n)
    except MANAGER_ERRORS as e:
        raise api_error(e, retry, openai_api.param_of(e) or ("messages" if chat else "prompt")) from None
    echoes = [p if isinstance(p, str) else manager.tokenizer.decode(p) for p in prompts] if options.echo else None
    shapes = Shapes(chat, state.model_name)
    stop_watch = disconnect.watch(request.environ, lambda: manager.abort(rid))
    run = Run(state, manager, rid, shapes, options, echoes, state.token_strings, t0, stop_watch,
              calls if calls is not None and calls.active else None,
              FAMILIES[manager.model.model_type].reasoning if chat else ())
    if state.config.log_text:   # an operator's explicit choice; off by default
        access.info("%s prompt=%r", shapes.id, prompts)
    if options.stream:
        return Response(run.events(), mimetype="text/event-stream", headers=sse.HEADERS)
    return run.collect()


def _check_model(state, body):
    model = body.get("model")
    if model is not None and model != state.model_name:
        raise APIError(404, f"the model '{str(model)[:200]}' does not exist; this server serves "
                            f"'{state.model_name}'", "not_found_error", "model", "model_not_found")


def _chat_prompt(manager, messages, calls=None, template_kwargs=None):
    native = tools.template_takes_tools(manager.tokenizer)
    listed = [{"type": "function", "function": {"name": n, **f}} for n, f in calls.functions.items()] \
        if calls is not None and calls.active and native else None
    tok = manager.tokenizer
    try:
        text = tok.apply_chat_template(tools.render_messages(messages, calls, native), tools=listed,
                                       add_generation_prompt=True, tokenize=False, **(template_kwargs or {}))
    except Exception as e:  # noqa: BLE001 - a template that refuses these messages is the client's error
        raise bad_request(f"the chat template cannot render these messages: {e}", "messages") from None
    # the prompt is encoded with the tokenizer's special tokens (as a completion's is): where it adds a BOS
    # itself (Llama 3, Gemma), the template's own BOS text goes, or the model would see two
    if tok.bos_token and text.startswith(tok.bos_token) and _adds_bos(tok):
        text = text[len(tok.bos_token):]
    return text


@functools.lru_cache(maxsize=8)
def _adds_bos(tokenizer):
    """Whether encoding with special tokens puts the BOS token first."""
    return tokenizer.bos_token_id is not None and tokenizer("x")["input_ids"][:1] == [tokenizer.bos_token_id]
