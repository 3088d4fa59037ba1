"""Native OS threads and locks, even where gevent has monkey-patched `threading` and `_thread`."""
import sys


def _original(module, name):
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None:
        return monkey.get_original(module, name)
    return getattr(__import__(module), name)


def native_lock():
    """A real OS lock (not a gevent one): safe to share between greenlets and native threads."""
    return _original("_thread", "allocate_lock")()


def start_native_thread(target, *args):
    """Start `target(*args)` in a real OS thread; gevent's patched Thread would give a greenlet."""
    return _original("_thread", "start_new_thread")(target, args)


def native_get_ident():
    return _original("_thread", "get_ident")()
