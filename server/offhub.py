"""Tokenizer and chat-template work off the gevent hub: `OffHub.call(fn, ...)` runs fn on a thread of its own
small pool while the calling greenlet waits cooperatively, so a 1 MB prompt being rendered or encoded (for
/tokenize, /detokenize, count_tokens, a chat request's template) does not hold every other stream on the hub:
the Rust encoder releases the GIL, and Python work there yields it every switch interval.

Without gevent's patching (another WSGI server, Flask's test client) there is no hub to keep free: it runs in
place."""
import sys


class OffHub:
    def __init__(self, threads):
        self.threads = threads
        self._pool = None

    def call(self, fn, *args, **kwargs):
        """fn(*args, **kwargs)'s value (its exception re-raised here)."""
        monkey = sys.modules.get("gevent.monkey")
        if monkey is None or not monkey.is_module_patched("socket"):
            return fn(*args, **kwargs)
        if self._pool is None:
            from gevent.threadpool import ThreadPool

            self._pool = ThreadPool(self.threads)
        return self._pool.apply(fn, args, kwargs)
