"""The request record: its admission slot goes back exactly once, whoever races to release it."""
import sys
import threading

from rosefast.engine.sampling_params import SamplingParams
from rosefast.frontend.admission import AdmissionCounter
from rosefast.frontend.waker import ThreadWaker
from rosefast.serving.request import RequestTable


def test_release_gives_the_slot_back_once_per_record_under_racing_threads():
    """Round after round, four threads call release() on the same fresh record at once (switching threads as
    often as the interpreter allows): exactly one of them gives the slot back each time."""
    counter = AdmissionCounter(None)
    table, waker = RequestTable(), ThreadWaker()
    rounds, racers = 1500, 4
    records = []
    for _ in range(rounds):
        assert counter.try_acquire()
        records.append(table.add(None, counter, waker.signal()))
    barrier = threading.Barrier(racers)
    wins = [0] * racers

    errors = []

    def racer(k):
        try:
            for record in records:
                barrier.wait(timeout=60)
                wins[k] += record.release()
        except Exception as e:  # noqa: BLE001 - a double release below zero raises: reported below
            errors.append(e)
            barrier.abort()

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=racer, args=(k,)) for k in range(racers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert not [e for e in errors if not isinstance(e, threading.BrokenBarrierError)], errors
    assert sum(wins) == rounds and counter.inflight == 0
    assert not any(r.holds_slot for r in records)
    assert not records[0].release()


def test_finish_ends_the_record_and_the_table_forgets_it_on_remove():
    counter = AdmissionCounter(2)
    table = RequestTable()
    assert counter.try_acquire()
    record = table.add(SamplingParams(), counter, ThreadWaker.signal())
    assert table.get(record.id) is record and table.open() == [record]
    assert table.counts() == {"requests": 1, "open": 1, "in_engine": 0, "holding_slot": 1}
    record.detok = object()
    record.finish()
    assert record.finished and record.detok is None and counter.inflight == 0 and table.open() == []
    assert table.remove(record.id) is record and table.get(record.id) is None and len(table) == 0
    assert table.add(SamplingParams(), counter, ThreadWaker.signal()).id == record.id + 1   # ids are never reused
