"""A request's JSON body, read within ROSEFAST_BODY_TIMEOUT_S; the socket's send timeout set for the answer."""
import contextlib
import sys

from flask import current_app, request
from werkzeug.exceptions import RequestEntityTooLarge

from server.errors import APIError, parse_json


class BodyTimeout(Exception):
    pass


def read_json_body():
    """The request's JSON body, read within ROSEFAST_BODY_TIMEOUT_S (a 408 that closes the connection when it
    is slower: a client trickling its body does not hold the connection for ever). Under gunicorn, the socket
    then gets ROSEFAST_SEND_TIMEOUT_S for each write of the answer: a client that stops reading has its stream
    ended (the write raises, the stream closes, its request is aborted) instead of piling output up."""
    environ = request.environ
    config = current_app.extensions["rosefast"].config
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


def _deadline(seconds):
    """A gevent timeout raising BodyTimeout in this greenlet (nothing without gevent or a limit)."""
    if seconds is None or "gevent" not in sys.modules:
        return contextlib.nullcontext()
    import gevent

    return gevent.Timeout(seconds, BodyTimeout)
