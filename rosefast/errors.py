"""Exceptions the serving core raises; the server maps them to HTTP statuses."""


class ModelError(ValueError):
    """A model spec that cannot be resolved or loaded; the message says what to do."""


class OverloadedError(RuntimeError):
    """Refused at admission: `max_inflight_requests` requests are already in flight (HTTP 429)."""


class EngineError(RuntimeError):
    """The engine failed while running this request (HTTP 500 / an error event in the stream)."""


class EngineDeadError(EngineError):
    """The device failed in a way no later step recovers from (a sticky CUDA error: a device-side assert, an
    illegal address): every open request ends with it, new ones get HTTP 503, the worker restarts."""


class ShutdownError(RuntimeError):
    """The server is shutting down; the request was not completed (HTTP 503)."""


class NotReadyError(ShutdownError):
    """The model is still loading (or failed to load): HTTP 503."""
