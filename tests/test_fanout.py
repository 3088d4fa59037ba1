"""FanOut: one publish per step puts each request's delta into its collector and reports who became ready."""
import pytest

from tests.conftest import load_flavour


@pytest.fixture
def fan(flavour):
    return load_flavour("fanout", flavour).FanOut()


def test_collectors_are_of_the_same_flavour(fan, flavour):
    c = fan.register("a")
    assert type(c).__module__.endswith(f"_collector_{flavour}")


def test_publish_returns_exactly_the_requests_that_became_ready(fan):
    a, b, c = fan.register("a"), fan.register("b"), fan.register("c")
    assert fan.publish(["a", "b", "c"], [[1], [2], [3]], ["x", "y", "z"]) == ["a", "b", "c"]
    a.get_nowait()
    # a was drained: ready again; b and c still hold their chunk: merged, not ready again
    assert fan.publish(["a", "b", "c"], [[4], [5], [6]], ["X", "Y", "Z"], [False, False, True],
                       [None, None, "stop"]) == ["a"]
    assert a.get_nowait().token_ids == [4]
    chunk = c.get_nowait()
    assert (chunk.token_ids, chunk.text, chunk.finished, chunk.finish_reason) == ([3, 6], "zZ", True, "stop")
    assert b.get_nowait().text == "yY"
    assert fan.publish([], [], []) == []


def test_unknown_ids_are_dropped_and_counted(fan):
    fan.register("live")
    assert fan.publish(["gone", "live"], [[1], [2]], ["a", "b"]) == ["live"]
    assert fan.dropped == 1


def test_register_unregister_lookup(fan):
    c = fan.register(7)
    assert 7 in fan and len(fan) == 1 and fan.get(7) is c
    with pytest.raises(KeyError, match="already registered"):
        fan.register(7)
    assert fan.unregister(7) is c
    assert fan.unregister(7) is None
    assert 7 not in fan and len(fan) == 0 and fan.get(7) is None


def test_mismatched_step_lists_are_refused(fan):
    fan.register("a")
    with pytest.raises(ValueError, match="texts has 0 entries for 1 request_ids"):
        fan.publish(["a"], [[1]], [])
    with pytest.raises(ValueError, match="finished has 2 entries"):
        fan.publish(["a"], [[1]], ["x"], [True, False])
    assert fan.get("a").get_nowait() is None


def test_bad_delta_in_a_step_raises_after_earlier_requests_got_theirs(fan):
    a, b = fan.register("a"), fan.register("b")
    with pytest.raises(TypeError, match="text must be str"):
        fan.publish(["a", "b"], [[1], [2]], ["ok", None])
    assert a.get_nowait().text == "ok" and b.get_nowait() is None


def test_publish_error_fails_the_streams(fan):
    a, b = fan.register("a"), fan.register("b")
    fan.publish(["a"], [[1]], ["x"])
    assert fan.publish_error(["a", "b", "zz"], RuntimeError("boom")) == ["b"]
    assert a.get_nowait().text == "x"
    for c in (a, b):
        with pytest.raises(RuntimeError, match="boom"):
            c.get_nowait()


def test_producer_step_lists_are_not_mutated(fan):
    fan.register("a")
    ids = [[1, 2]]
    fan.publish(["a"], ids, ["x"])
    fan.publish(["a"], [[3]], ["y"])
    assert ids == [[1, 2]]


class _Finished:
    """A `finished` entry whose truth test runs Python code in the middle of a publish."""

    def __init__(self, action):
        self.action = action

    def __bool__(self):
        self.action()
        return False


def test_step_lists_emptied_during_publish_stop_it_safely(fan):
    """Python code run by a publish (here a `finished` entry's __bool__) may empty the step's lists: the
    delta already read is delivered and the loop stops where the request ids end, without reading past them
    (the compiled loop once read entries by their original count)."""
    a, b = fan.register("a"), fan.register("b")
    rids, ids, texts = ["a", "b"], [[1], [2]], ["x", "y"]

    def empty_all():
        for lst in (rids, ids, texts, finished):
            del lst[:]

    finished = [_Finished(empty_all), False]
    assert fan.publish(rids, ids, texts, finished) == ["a"]
    assert a.get_nowait().token_ids == [1] and b.get_nowait() is None


def test_delta_lists_emptied_during_publish_raise_index_error(fan):
    a, b = fan.register("a"), fan.register("b")
    ids, texts = [[1], [2]], ["x", "y"]

    def empty_deltas():
        del ids[:]
        del texts[:]

    with pytest.raises(IndexError):
        fan.publish(["a", "b"], ids, texts, [_Finished(empty_deltas), False])
    assert a.get_nowait().text == "x" and b.get_nowait() is None


def test_collector_unregistered_during_its_own_put_is_not_used_after_free(fan, flavour):
    """The publish holds the collector it found while Python code runs: unregistering (the only other
    reference) mid-put must not free it under the put, which would then write into whatever reuses
    its memory (here a fresh collector, allocated right after)."""
    fan.register("a")
    fresh = []

    def drop_and_reuse():
        fan.unregister("a")
        fresh.extend(fan.collector_type() for _ in range(8))

    assert fan.publish(["a"], [[1]], ["x"], [_Finished(drop_and_reuse)]) == ["a"]
    assert "a" not in fan
    assert not any(c.ready for c in fresh)
