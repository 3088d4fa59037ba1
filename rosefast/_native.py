"""Native OS threads and locks, even where gevent has monkey-patched `threading` and `_thread`."""
import sys

_cache = {}


def _original(module, name):
    """The unpatched function (looked up once: it is native whether or not gevent patches later)."""
    fn = _cache.get((module, name))
    if fn is None:
        monkey = sys.modules.get("gevent.monkey")
        fn = monkey.get_original(module, name) if monkey is not None else getattr(__import__(module), name)
        _cache[module, name] = fn
    return fn


def native_lock():
    """A real OS lock (not a gevent one): safe to share between greenlets and native threads."""
    return _original("_thread", "allocate_lock")()


def native_rlock():
    """A real OS re-entrant lock: for state a native thread and the hub's greenlets both take (a log handler's)."""
    return _original("_thread", "RLock")()


def start_native_thread(target, *args):
    """Start `target(*args)` in a real OS thread; gevent's patched Thread would give a greenlet."""
    return _original("_thread", "start_new_thread")(target, args)

