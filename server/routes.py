"""The routes: POST /v1/completions, /v1/chat/completions and /v1/messages (each translated
into the one request path, server.generation: admitted with a 429 at once, streamed or collected, the
answer written in its API's shape), POST /v1/messages/count_tokens, and GET /health, /v1/models and
/metrics. The Responses API's routes, with its stored responses, are server.responses_routes."""
from flask import Blueprint, Response, current_app

from server import messages_api, openai_api, sse
from server.auth import authorized
from server.errors import json_response
from server.generation import admit, count_prompt_tokens
from server.messages_api import MessagesWriter
from server.openai_writer import OpenAIWriter

bp = Blueprint("openai", __name__)


def _state():
    return current_app.extensions["rosefast"]


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
        download = m.download if m is not None else None   # a model named by its hub name, being fetched
        return json_response({"status": "loading", **({"download": download} if download else {})}, 503)
    if state.draining:
        return json_response({"status": "draining"}, 503)
    return json_response({"status": "ok", "worker": state.config.worker_index})


@bp.get("/v1/models")
def models():
    state = _state()
    m = state.manager
    card = {"id": state.model_name, "object": "model", "created": int(state.started), "owned_by": "rosefast"}
    if m is not None and m.ready:
        card["max_model_len"] = m.max_model_len
        card["generation_defaults"] = state.generation_defaults
    return json_response({"object": "list", "data": [card]})


@bp.get("/metrics")
def metrics():
    return Response(_state().metrics.render(), mimetype="text/plain; version=0.0.4")


@bp.post("/v1/completions")
def completions():
    return serve(openai_api.completion_generation,
                  lambda run, state: OpenAIWriter(run, False, state.model_name, state.token_strings))


@bp.post("/v1/chat/completions")
def chat_completions():
    return serve(openai_api.chat_generation,
                  lambda run, state: OpenAIWriter(run, True, state.model_name, state.token_strings))


@bp.post("/v1/messages")
def messages():
    return serve(messages_api.generation, lambda run, state: MessagesWriter(run, state.model_name))


def serve(translate, writer):
    """The one request path (server.generation.admit), answered by the API's writer: its event stream or its
    one body."""
    state = _state()
    run = admit(state, translate)
    try:
        out = writer(run, state)
        if run.options.stream:
            return Response(out.events(), mimetype="text/event-stream", headers=sse.HEADERS)
        return out.body()
    except BaseException:   # an answer that failed before its stream was read leaves nothing behind
        run.discard()
        raise


@bp.post("/v1/messages/count_tokens")
def count_tokens():
    return json_response({"input_tokens": count_prompt_tokens(_state(), messages_api.count_generation)})
