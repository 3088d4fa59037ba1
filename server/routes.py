"""The routes: POST /v1/completions and /v1/chat/completions (validate, admit with a 429 at once, stream or
collect), and GET /health, /v1/models and /metrics."""
import json
import logging
import time

from flask import Blueprint, Response, current_app, request

from rosefast.errors import EngineError, NotReadyError, OverloadedError, ShutdownError
from server import disconnect, openai_api, sse
from server.errors import APIError, bad_request, json_response

bp = Blueprint("openai", __name__)
access = logging.getLogger("rosefast.access")


def _state():
    return current_app.extensions["rosefast"]


def _reject_constant(name):
    raise ValueError(f"{name} is not valid JSON")


def _body():
    raw = request.get_data(cache=False)
    try:
        return json.loads(raw, parse_constant=_reject_constant)
    except RecursionError:
        raise bad_request("invalid JSON: nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise bad_request(f"invalid JSON: {e}") from None


@bp.get("/health")
def health():
    state = _state()
    m = state.manager
    if m is not None and m.load_error is not None:
        return json_response({"status": "error", "error": str(m.load_error)}, 500)
    if m is None or not m.ready:
        return json_response({"status": "loading"}, 503)
    if state.draining:
        return json_response({"status": "draining"}, 503)
    return json_response({"status": "ok"})


@bp.get("/v1/models")
def models():
    state = _state()
    m = state.manager
    card = {"id": state.model_name, "object": "model", "created": int(state.started), "owned_by": "rosefast"}
    if m is not None and m.ready:
        card["max_model_len"] = m.engine.max_model_len
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
    if state.draining:
        raise api_error(ShutdownError(), state, chat)
    if manager is None or not manager.ready:
        raise api_error(NotReadyError(), state, chat)
    body = _body()
    openai_api.check_fields(body, openai_api.CHAT if chat else openai_api.COMPLETION)
    model = body.get("model")
    if model is not None and model != state.model_name:
        raise APIError(404, f"the model '{str(model)[:200]}' does not exist; this server serves "
                            f"'{state.model_name}'", "not_found_error", "model", "model_not_found")
    if chat:
        messages = openai_api.chat_messages(body)
        prompt, prompt_ids = _chat_prompt(manager, messages), None
    else:
        prompt, prompt_ids = openai_api.completion_prompt(body)
    params = openai_api.sampling_params(body, state.config, manager.engine.max_model_len)
    stream = bool(body.get("stream", False))
    usage_flag = openai_api.include_usage(body)
    try:
        rid = manager.add_request(prompt, prompt_token_ids=prompt_ids, params=params)
    except MANAGER_ERRORS as e:
        raise api_error(e, state, chat) from None
    shapes = openai_api.Shapes(chat, state.model_name)
    stop_watch = disconnect.watch(request.environ, lambda: manager.abort(rid))
    run = _Run(state, manager, rid, shapes, chat, t0, stop_watch)
    if state.config.log_text:   # an operator's explicit choice; off by default
        access.info("%s prompt=%r", shapes.id, prompt if prompt is not None else prompt_ids)
    if stream:
        return Response(run.events(usage_flag), mimetype="text/event-stream", headers=sse.HEADERS)
    return run.collect()


MANAGER_ERRORS = (OverloadedError, ShutdownError, EngineError, ValueError)
LOADING_RETRY_AFTER_S = 5


def api_error(e, state, chat):
    """What the manager raised (at add_request or while the request runs) as the client's APIError."""
    if isinstance(e, OverloadedError):
        return APIError(429, str(e), "rate_limit_error", code="rate_limit_exceeded",
                        headers={"Retry-After": str(state.config.retry_after_seconds)})
    if isinstance(e, NotReadyError):
        return APIError(503, "the model is still loading; retry shortly", "server_error",
                        headers={"Retry-After": str(LOADING_RETRY_AFTER_S)})
    if isinstance(e, ShutdownError):
        return APIError(503, "the server is shutting down", "server_error")
    if isinstance(e, EngineError):
        return APIError(500, str(e), "server_error")
    return bad_request(str(e), openai_api.param_of(e) or ("messages" if chat else "prompt"))


def _chat_prompt(manager, messages):
    try:
        return manager.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    except Exception as e:  # noqa: BLE001 - a template that refuses these messages is the client's error
        raise bad_request(f"the chat template cannot render these messages: {e}", "messages") from None


def _endpoint(chat):
    return "chat" if chat else "completions"


ENDPOINTS = {"/v1/completions": "completions", "/v1/chat/completions": "chat", "/v1/models": "models"}


def count_request(state, environ, endpoint, status):
    """One increment of rosefast_requests_total per request, whichever path answered it (the mark is kept
    in the WSGI environ: a streaming body finishes outside Flask's request context)."""
    if not environ.get("rosefast.counted"):
        environ["rosefast.counted"] = True
        state.metrics.requests.labels(endpoint, status).inc()


class _Run:
    """One admitted request on its way out: events or one JSON body, then the books."""

    def __init__(self, state, manager, rid, shapes, chat, t0, stop_watch):
        self.state, self.manager, self.rid, self.shapes, self.chat = state, manager, rid, shapes, chat
        self.t0, self.stop_watch = t0, stop_watch
        self.environ = request.environ
        self.completion_tokens = 0
        self.prompt_tokens = 0
        self.text = [] if state.config.log_text else None
        self.t_first = self.t_last = None
        self.status = "200"

    def _observe(self, chunk):
        now = time.perf_counter()
        if chunk.finished:
            self.prompt_tokens = chunk.prompt_tokens or 0   # the final chunk carries it
        m = self.state.metrics
        if chunk.token_ids:
            if self.t_first is None:
                self.t_first = now
                m.ttft.observe(now - self.t0)
            else:
                m.itl.observe(now - self.t_last)
            self.t_last = now
        self.completion_tokens += len(chunk.token_ids)
        if self.text is not None:
            self.text.append(chunk.text)

    def events(self, include_usage):
        shapes, first = self.shapes, self.chat
        stream = self.manager.stream(self.rid)
        try:
            for chunk in stream:
                self._observe(chunk)
                reason = openai_api.openai_finish_reason(chunk.finish_reason) if chunk.finished else None
                if chunk.text or reason or first:
                    yield sse.event(shapes.chunk(chunk.text, reason, first=first))
                    first = False
            if include_usage:
                yield sse.event(shapes.usage_chunk(self._usage()))
        except MANAGER_ERRORS as e:   # after the 200: an error event, then [DONE]
            error = self._failed(e)
            yield sse.event(error.body())
        except GeneratorExit:
            self.status = "499"   # the client went away
            raise
        finally:
            stream.close()
            self._finish()
        yield sse.DONE

    def collect(self):
        text, reason = [], None
        stream = self.manager.stream(self.rid)
        try:
            for chunk in stream:
                self._observe(chunk)
                text.append(chunk.text)
                reason = chunk.finish_reason
        except MANAGER_ERRORS as e:
            raise self._failed(e) from None
        finally:
            stream.close()
            self._finish()
        body = self.shapes.full("".join(text), openai_api.openai_finish_reason(reason), self._usage())
        return json_response(body)

    def _failed(self, e):
        error = api_error(e, self.state, self.chat)
        self.status = str(error.status)
        return error

    def _usage(self):
        return openai_api.usage(self.prompt_tokens, self.completion_tokens)

    def _finish(self):
        self.stop_watch()
        m = self.state.metrics
        prompt_tokens = self.prompt_tokens
        now = time.perf_counter()
        count_request(self.state, self.environ, _endpoint(self.chat), self.status)
        m.prompt_tokens.inc(prompt_tokens)
        m.completion_tokens.inc(self.completion_tokens)
        if self.t_last is not None:
            m.e2e.observe(self.t_last - self.t0)
        access.info("%s %s status=%s prompt_tokens=%d completion_tokens=%d ttft_ms=%s e2e_ms=%.1f",
                    self.shapes.id, _endpoint(self.chat), self.status, prompt_tokens, self.completion_tokens,
                    "-" if self.t_first is None else f"{(self.t_first - self.t0) * 1e3:.1f}", (now - self.t0) * 1e3)
        if self.text is not None:
            access.info("%s completion=%r", self.shapes.id, "".join(self.text))
