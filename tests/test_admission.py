import threading

import pytest

from tests.conftest import load_flavour


@pytest.fixture
def Counter(flavour):
    return load_flavour("admission", flavour).AdmissionCounter


def test_limit_one_refuses_the_second_until_release(Counter):
    c = Counter(limit=1)
    assert c.try_acquire() is True
    assert c.try_acquire() is False
    assert (c.inflight, c.accepted_total, c.rejected_total) == (1, 1, 1)
    c.release()
    assert c.inflight == 0
    assert c.try_acquire() is True
    assert (c.inflight, c.accepted_total, c.rejected_total) == (1, 2, 1)


def test_unlimited_by_default(Counter):
    c = Counter()
    assert c.limit is None
    assert all(c.try_acquire() for _ in range(10_000))
    assert c.inflight == 10_000 and c.rejected_total == 0


def test_release_without_acquire_raises_and_never_goes_negative(Counter):
    c = Counter(limit=2)
    with pytest.raises(RuntimeError, match="without a matching try_acquire"):
        c.release()
    assert c.inflight == 0
    c.try_acquire()
    c.release()
    with pytest.raises(RuntimeError):
        c.release()
    assert c.inflight == 0


def test_limit_changes_at_run_time(Counter):
    c = Counter(limit=3)
    for _ in range(3):
        assert c.try_acquire()
    c.limit = 1  # below inflight: refuse until enough release
    assert not c.try_acquire()
    c.release()
    c.release()
    assert not c.try_acquire()
    c.release()
    assert c.try_acquire()
    c.limit = None
    assert c.try_acquire() and c.limit is None
    c.limit = 0
    assert not c.try_acquire()


@pytest.mark.parametrize("bad, exc", [(-1, ValueError), (1.5, TypeError), ("4", TypeError), (True, TypeError)])
def test_bad_limit_is_refused(Counter, bad, exc):
    with pytest.raises(exc, match="limit"):
        Counter(limit=bad)
    c = Counter(limit=1)
    with pytest.raises(exc, match="limit"):
        c.limit = bad
    assert c.limit == 1


def test_exact_counters_with_8_threads_hammering(Counter):
    limit, threads, rounds = 5, 8, 20_000
    c = Counter(limit=limit)
    accepted = [0] * threads
    rejected = [0] * threads
    over_limit = []
    start = threading.Barrier(threads)

    def hammer(i):
        start.wait()
        for _ in range(rounds):
            if c.try_acquire():
                accepted[i] += 1
                if c.inflight > limit:
                    over_limit.append(c.inflight)
                c.release()
            else:
                rejected[i] += 1

    ts = [threading.Thread(target=hammer, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not over_limit
    assert c.inflight == 0
    assert c.accepted_total == sum(accepted)
    assert c.rejected_total == sum(rejected)
    assert c.accepted_total + c.rejected_total == threads * rounds
