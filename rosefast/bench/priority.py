"""The arrival loop's place in the OS scheduler.

When the engine keeps every core busy (torch's OpenMP threads spin between parallel regions), a submitting
thread woken at its target is runnable but waits for a core until the scheduler's next tick: about 4 ms on a
250 Hz kernel, the 5 ms schedule's lag tail (seen with `perf record -e sched:sched_wakeup -e
sched:sched_switch`: the wake at the target, the switch-in a tick later; docs/streaming.md). Running the
arrival loop's own thread as SCHED_FIFO while it submits lets the scheduler run it at once; everything else,
the engine included, keeps its normal policy, and SCHED_RESET_ON_FORK keeps any thread started from the loop
(a tokenizer's pool, say) off it."""
import contextlib
import os

MODES = ("auto", "realtime", "normal")
FIFO_PRIORITY = 1   # the lowest real-time priority: above every normal thread, below the kernel's own


def _fifo_available():
    return hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_FIFO")


def _set(policy, priority):
    flags = getattr(os, "SCHED_RESET_ON_FORK", 0) if policy == os.SCHED_FIFO else 0
    os.sched_setscheduler(0, policy | flags, os.sched_param(priority))   # 0: the calling thread only


def resolve(mode):
    """(what the arrival loop will run as: "realtime" or "normal", and why). `auto` takes realtime where the
    OS permits it; `realtime` raises SystemExit, naming the fix, where it does not."""
    if mode not in MODES:
        raise ValueError(f"submitter priority must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "normal":
        return "normal", "as asked (--submitter-priority normal)"
    if not _fifo_available():
        why = "this OS has no SCHED_FIFO"
    else:
        before = os.sched_getscheduler(0), os.sched_getparam(0).sched_priority
        try:
            _set(os.SCHED_FIFO, FIFO_PRIORITY)
        except OSError as e:
            why = f"the OS refused SCHED_FIFO ({e.strerror})"
        else:
            _set(*before)
            return "realtime", f"SCHED_FIFO {FIFO_PRIORITY} while it submits"
    if mode == "realtime":
        raise SystemExit(f"--submitter-priority realtime: {why}; run as root, grant CAP_SYS_NICE "
                         f"(setcap cap_sys_nice+ep on the interpreter) or raise RLIMIT_RTPRIO (ulimit -r 1), "
                         f"or pass --submitter-priority auto|normal")
    return "normal", f"{why}; woken submits may wait for a core"


@contextlib.contextmanager
def submitter_priority(effective):
    """The body runs with the calling thread at SCHED_FIFO when `effective` is "realtime" (from resolve()),
    and with its policy as before afterwards, however the body ends."""
    if effective != "realtime":
        yield
        return
    before = os.sched_getscheduler(0), os.sched_getparam(0).sched_priority
    _set(os.SCHED_FIFO, FIFO_PRIORITY)
    try:
        yield
    finally:
        _set(*before)
