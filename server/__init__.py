"""The gevent-Flask SSE shim: `gunicorn -k gevent server:app` (config from ROSEFAST_* variables).

`app` is a WSGI callable that builds the Flask app on first use; gunicorn.conf.py builds it as soon
as the worker has started (after fork and after gevent's patching), so the model starts loading at
once and is never loaded in the master. Importing this package starts nothing.
"""
from server.factory import create_app


class LazyApp:
    """The WSGI entry point: creates the real app (and starts loading the model) once, in the worker."""

    def __init__(self):
        self._app = None

    def load(self):
        if self._app is None:
            self._app = create_app()
        return self._app

    def __call__(self, environ, start_response):
        # gunicorn's response object: a route that leaves a body unread (a 408) closes the connection with it
        environ["rosefast.force_close"] = getattr(getattr(start_response, "__self__", None), "force_close", None)
        return self.load()(environ, start_response)


app = LazyApp()

__all__ = ["app", "create_app"]
