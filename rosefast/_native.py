"""Native OS threads and locks, even where gevent has monkey-patched `threading` and `_thread`; and on those
threads the standard library's `subprocess`, not gevent's."""
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


def native_sleep(seconds):
    """The OS's sleep: on a native thread, gevent's patched time.sleep would run a hub of that thread's own."""
    _original("time", "sleep")(seconds)


def start_native_thread(target, *args):
    """Start `target(*args)` in a real OS thread; gevent's patched Thread would give a greenlet. Under gevent,
    `subprocess` works on it (install_native_subprocess)."""
    install_native_subprocess()
    return _original("_thread", "start_new_thread")(target, args)


# -- subprocesses from native threads ---------------------------------------------------------------

_SUBPROCESS_API = ("Popen", "run", "call", "check_call", "check_output", "getoutput", "getstatusoutput")
_SHARED = ("SubprocessError", "CalledProcessError", "TimeoutExpired", "CompletedProcess")
_OS_PATCHED = ("close", "waitpid", "fork", "forkpty", "posix_spawn", "posix_spawnp")


def _overlay(module, originals):
    """A copy of `module`'s namespace with `originals` ({name: object}) in place of gevent's."""
    import types

    copy = types.ModuleType(module.__name__)
    copy.__dict__.update(vars(module))
    copy.__dict__.update(originals)
    return copy


def _native_subprocess_module(monkey):
    """The standard library's `subprocess`, loaded afresh with the OS's os.close/os.waitpid, poll, sleep and
    locks: gevent's need a loop in the calling thread (its os.close defers closing the exec-status pipe to one, so
    a Popen waits for ever) and its Popen needs the main thread's (`child watchers are only available on the
    default loop`)."""
    import importlib.util
    import os
    import select
    import selectors
    import threading
    import time

    spec = importlib.util.find_spec("subprocess")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name in _SHARED:    # raised and returned as the classes callers catch and check
        setattr(module, name, getattr(sys.modules["subprocess"], name))
    originals = {name: monkey.get_original("os", name) for name in _OS_PATCHED if hasattr(os, name)}
    module.os = _overlay(os, originals)
    module.time = _overlay(time, {"sleep": monkey.get_original("time", "sleep")})
    module.threading = _overlay(threading, {"Lock": monkey.get_original("threading", "Lock")})
    poll = monkey.get_original("select", "poll")
    module.select = _overlay(select, {"poll": poll, "select": monkey.get_original("select", "select")})
    module._PopenSelector = type("NativePollSelector", (selectors.PollSelector,), {"_selector_cls": staticmethod(poll)})
    return module


def install_native_subprocess():
    """Once gevent has patched `subprocess`: its functions run the standard library's on every thread but the one
    whose hub owns the default loop (where gevent's is the one to use). Code on a native thread that starts a
    process -- an import that runs `ldconfig -p` through ctypes.util, Triton finding libcuda and compiling with
    ptxas, torch's extension builder -- then works under `gunicorn -k gevent`. Idempotent; a no-op without
    gevent's patch."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is None or not monkey.is_module_patched("subprocess") or "native_subprocess" in _cache:
        return
    import subprocess

    from gevent._hub_local import get_hub_if_exists

    native = _cache["native_subprocess"] = _native_subprocess_module(monkey)

    def dispatch(name):
        green, real = getattr(subprocess, name), getattr(native, name)

        def call(*args, **kwargs):
            hub = get_hub_if_exists()
            return (green if hub is not None and hub.loop.default else real)(*args, **kwargs)
        call.__name__ = call.__qualname__ = name
        call.__doc__ = green.__doc__
        return call

    green_popen, real_popen = subprocess.Popen, native.Popen

    class Popen(green_popen):
        """gevent's Popen on the default loop's thread; the standard library's anywhere else."""

        def __new__(cls, *args, **kwargs):
            hub = get_hub_if_exists()
            if cls is Popen and not (hub is not None and hub.loop.default):
                return real_popen(*args, **kwargs)
            return super().__new__(cls)

    for name in _SUBPROCESS_API:
        if name != "Popen":
            setattr(subprocess, name, dispatch(name))
    subprocess.Popen = Popen
