"""Wakers: one wakeup per engine step, from a native thread, for threads and for greenlets."""
import threading

import pytest

from rosefast._native import start_native_thread
from rosefast.frontend.waker import GeventWaker, ThreadWaker
from tests.conftest import load_flavour

STEPS = 40


def produce(fan, waker, streams, steps, done, gate=None):
    """An engine stand-in: one publish and at most one wake per step."""
    signals = [s for s, _ in streams]
    collectors = [c for _, c in streams]
    n = len(streams)
    for s in range(steps):
        last = s == steps - 1
        ready = fan.publish(signals, collectors, [[s] for _ in range(n)], [f"<{s}>"] * n, [last] * n,
                            ["length" if last else None] * n)
        waker.wake(ready)
        if gate is not None:
            gate(s)
    done.set()


def consume(waker, stream):
    signal, collector = stream
    ids, text = [], []
    while True:
        chunk = collector.get_nowait()
        if chunk is None:
            waker.wait(signal, timeout=5)
            continue
        ids += chunk.token_ids
        text.append(chunk.text)
        if chunk.finished:
            return ids, "".join(text)


EXPECTED = (list(range(STEPS)), "".join(f"<{s}>" for s in range(STEPS)))


def setup_streams(flavour, waker, n):
    """(the fan-out module, [(signal, collector)] for n requests)."""
    collector_type = load_flavour("collector", flavour).StreamOutputCollector
    return load_flavour("fanout", flavour), [(waker.signal(), collector_type()) for _ in range(n)]


def test_thread_waker_delivers_everything(flavour):
    waker = ThreadWaker()
    fan, streams = setup_streams(flavour, waker, 8)
    results = {}
    consumers = [threading.Thread(target=lambda i=i: results.__setitem__(i, consume(waker, streams[i])))
                 for i in range(len(streams))]
    for t in consumers:
        t.start()
    done = threading.Event()
    produce(fan, waker, streams, STEPS, done)
    for t in consumers:
        t.join(10)
    assert results == {i: EXPECTED for i in range(len(streams))}
    assert waker.wakes <= STEPS  # at most one wakeup per step, however many requests


def test_thread_waker_wake_before_wait_is_not_lost():
    waker = ThreadWaker()
    signal = waker.signal()
    waker.wake([signal])
    waker.wake([signal])  # a second signal before the wait does not raise
    assert waker.wait(signal, timeout=0.01) is True
    assert waker.wait(signal, timeout=0.01) is False


def test_gevent_waker_one_send_per_step_from_a_native_thread(flavour):
    gevent = pytest.importorskip("gevent")
    waker = GeventWaker()
    fan, streams = setup_streams(flavour, waker, 16)
    done = threading.Event()
    greenlets = [gevent.spawn(consume, waker, s) for s in streams]
    gevent.sleep(0)  # let the consumers reach their wait
    start_native_thread(produce, fan, waker, streams, STEPS, done)
    gevent.joinall(greenlets, timeout=20)
    try:
        assert [g.value for g in greenlets] == [EXPECTED] * len(streams)
        # the consumers can finish between the producer's last wake and its return: wait for that
        assert done.wait(10)
        # one send per step with something ready: never one per request or per token
        assert 1 <= waker.wakes <= STEPS
        assert waker.callbacks <= waker.wakes
    finally:
        waker.close()


def test_gevent_waker_counts_sends_per_step():
    pytest.importorskip("gevent")
    waker = GeventWaker()
    try:
        signals = [waker.signal() for _ in range(3)]
        waker.wake(signals)
        waker.wake([])
        assert waker.wakes == 1
        assert all(waker.wait(s, timeout=1) for s in signals)
        assert waker.callbacks == 1
    finally:
        waker.close()


def test_gevent_waker_wake_before_wait_is_not_lost():
    gevent = pytest.importorskip("gevent")
    waker = GeventWaker()
    try:
        signal = waker.signal()
        waker.wake([signal])
        waker.wake([signal])
        gevent.sleep(0.01)   # the hub runs the callback while nobody waits on the signal
        assert waker.callbacks >= 1
        assert waker.wait(signal, timeout=0.01) is True
        assert waker.wait(signal, timeout=0.01) is False   # one wakeup, however many wakes before it
    finally:
        waker.close()
