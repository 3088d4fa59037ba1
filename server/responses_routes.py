"""The Responses API's routes: POST /v1/responses (the one request path, server.routes.serve, its answer kept in
the caller's store unless `store` is false; `background`: answered at once as `queued`, run to the store), and
the stored responses by id: GET (retrieve), DELETE, GET .../input_items, POST .../cancel."""
import functools
import logging
import threading

from flask import Blueprint, current_app, request

from server import responses_api
from server.auth import caller
from server.errors import APIError, bad_request, json_response
from server.response_store import Stored
from server.responses_api import not_found
from server.responses_writer import ResponsesWriter
from server.routes import serve

bp = Blueprint("responses", __name__)
log = logging.getLogger("rosefast.server")


def _state():
    return current_app.extensions["rosefast"]


@bp.post("/v1/responses")
def create():
    state = _state()
    owner = caller(state.config)
    return serve(functools.partial(responses_api.generation, store=state.responses, owner=owner),
                 lambda run, state: _writer(run, state, owner))


def _writer(run, state, owner):
    turn = run.carry
    if not turn.keep:
        return ResponsesWriter(run, state.model_name)
    stored = Stored(owner, {"id": run.id, "output": []}, turn.input_items, turn.context)
    writer = ResponsesWriter(run, state.model_name, keep=lambda response: _keep(state, stored, response))
    return Background(state, stored, writer) if turn.background else writer


def _keep(state, stored, response):
    if stored.cancelled:   # cancelled while it ran: what it had made, so marked
        response["status"] = "cancelled"
    stored.response = response
    if not stored.deleted and not state.responses.put(stored):
        log.warning("%s is larger than ROSEFAST_RESPONSES_STORE_BYTES: not stored", stored.id)


class Background:
    """A `background` response: answered at once (`queued`, stored), run in its own greenlet to the store."""

    def __init__(self, state, stored, writer):
        self.state, self.stored, self.writer = state, stored, writer

    def body(self):
        run = self.writer.run
        run.detach()   # the client's connection ends with this answer; the run goes on
        self.stored.response, self.stored.run = self.writer.response("queued"), run
        self.state.responses.put(self.stored)
        answer = json_response(self.stored.response)   # made before the run can move it on
        threading.Thread(target=self._run, name=f"background {run.id}", daemon=True).start()
        return answer

    def _run(self):
        stored = self.stored
        stored.response["status"] = "in_progress"
        try:
            self.writer.result()
        except APIError as e:
            self.writer.failed(e)
        except Exception as e:  # noqa: BLE001 - no client to answer: the stored response says it failed
            log.exception("background response %s failed", stored.id)
            self.writer.failed(APIError(500, f"internal error: {type(e).__name__}", "server_error"))
        finally:
            stored.run = None


def _stored(id_):
    """The caller's stored response, or OpenAI's 404."""
    state = _state()
    stored = state.responses.get(caller(state.config), id_)
    if stored is None:
        raise not_found(id_)
    return stored


@bp.get("/v1/responses/<id_>")
def retrieve(id_):
    if request.args.get("stream", "false").lower() == "true":
        raise bad_request("streaming a stored response is not served: retrieve it without 'stream'", "stream")
    return json_response(_stored(id_).response)


@bp.delete("/v1/responses/<id_>")
def delete(id_):
    stored = _stored(id_)
    _stop(stored)
    stored.deleted = True
    _state().responses.delete(stored.owner, id_)
    return json_response({"id": id_, "object": "response", "deleted": True})


@bp.post("/v1/responses/<id_>/cancel")
def cancel(id_):
    """Cancel a background response: its run stopped, its status `cancelled` (one already ended: as it is)."""
    stored = _stored(id_)
    if not stored.response.get("background"):
        raise bad_request("only a response created with 'background': true can be cancelled", "response_id")
    _stop(stored)
    return json_response(stored.response)


def _stop(stored):
    run = stored.run
    if run is not None:
        stored.cancelled = True
        stored.response["status"] = "cancelled"
        run.manager.abort(run.rid)


@bp.get("/v1/responses/<id_>/input_items")
def input_items(id_):
    """The items the response answered (the earlier turns' too, as OpenAI lists them), a page at a time:
    `limit` (1-100, 20), `order` (desc, as OpenAI, or asc), `after` (an item id)."""
    stored = _stored(id_)
    items = list(stored.context) + list(stored.input_items)
    args = request.args
    order = args.get("order", "desc")
    if order not in ("asc", "desc"):
        raise bad_request("'order' must be asc or desc", "order")
    try:
        limit = int(args.get("limit", 20))
    except ValueError:
        limit = 0
    if not 1 <= limit <= 100:
        raise bad_request("'limit' must be an integer from 1 to 100", "limit")
    if order == "desc":
        items.reverse()
    after = args.get("after")
    if after is not None:
        at = next((i for i, item in enumerate(items) if item.get("id") == after), None)
        if at is None:
            raise bad_request(f"no item with id '{after[:100]}' in this response's input", "after")
        items = items[at + 1:]
    page = items[:limit]
    return json_response({"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                          "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit})
