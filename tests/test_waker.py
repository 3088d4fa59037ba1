"""Wakers: one wakeup per engine step, from a native thread, for threads and for greenlets."""
import threading

import pytest

from rosefast._native import start_native_thread
from rosefast.frontend.waker import GeventWaker, ThreadWaker
from tests.conftest import load_flavour

STEPS = 40


def produce(fan, waker, ids, steps, done, gate=None):
    """An engine stand-in: one publish and at most one wake per step."""
    for s in range(steps):
        last = s == steps - 1
        ready = fan.publish(list(ids), [[s] for _ in ids], [f"<{s}>" for _ in ids], [last] * len(ids),
                            ["length" if last else None] * len(ids))
        waker.wake(ready)
        if gate is not None:
            gate(s)
    done.set()


def consume(fan, waker, rid):
    ids, text = [], []
    collector = fan.get(rid)
    while True:
        chunk = collector.get_nowait()
        if chunk is None:
            waker.wait(rid, timeout=5)
            continue
        ids += chunk.token_ids
        text.append(chunk.text)
        if chunk.finished:
            return ids, "".join(text)


EXPECTED = (list(range(STEPS)), "".join(f"<{s}>" for s in range(STEPS)))


def setup_streams(flavour, waker, n):
    fan = load_flavour("fanout", flavour).FanOut()
    rids = [f"r{i}" for i in range(n)]
    for rid in rids:
        fan.register(rid)
        waker.register(rid)
    return fan, rids


def test_thread_waker_delivers_everything(flavour):
    waker = ThreadWaker()
    fan, rids = setup_streams(flavour, waker, 8)
    results = {}
    consumers = [threading.Thread(target=lambda r=r: results.__setitem__(r, consume(fan, waker, r))) for r in rids]
    for t in consumers:
        t.start()
    done = threading.Event()
    produce(fan, waker, rids, STEPS, done)
    for t in consumers:
        t.join(10)
    assert results == {r: EXPECTED for r in rids}
    assert waker.wakes <= STEPS  # at most one wakeup per step, however many requests


def test_thread_waker_wake_before_wait_is_not_lost():
    waker = ThreadWaker()
    waker.register("a")
    waker.wake(["a"])
    waker.wake(["a"])  # a second signal before the wait does not raise
    assert waker.wait("a", timeout=0.01) is True
    assert waker.wait("a", timeout=0.01) is False
    assert waker.wait("unknown", timeout=0.01) is True


def test_gevent_waker_one_send_per_step_from_a_native_thread(flavour):
    gevent = pytest.importorskip("gevent")
    waker = GeventWaker()
    fan, rids = setup_streams(flavour, waker, 16)
    done = threading.Event()
    greenlets = [gevent.spawn(consume, fan, waker, r) for r in rids]
    gevent.sleep(0)  # let the consumers reach their wait
    start_native_thread(produce, fan, waker, rids, STEPS, done)
    gevent.joinall(greenlets, timeout=20)
    try:
        assert [g.value for g in greenlets] == [EXPECTED] * len(rids)
        assert done.is_set()
        # one send per step with something ready: never one per request or per token
        assert 1 <= waker.wakes <= STEPS
        assert waker.callbacks <= waker.wakes
    finally:
        waker.close()


def test_gevent_waker_counts_sends_per_step():
    pytest.importorskip("gevent")
    waker = GeventWaker()
    try:
        for rid in ("a", "b", "c"):
            waker.register(rid)
        waker.wake(["a", "b", "c"])
        waker.wake([])
        assert waker.wakes == 1
        assert waker.wait("a", timeout=1) and waker.wait("b", timeout=1) and waker.wait("c", timeout=1)
        assert waker.callbacks == 1
    finally:
        waker.close()
