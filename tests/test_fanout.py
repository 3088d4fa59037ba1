"""publish: one call per step puts each request's delta into its collector and reports who became ready."""
import pytest

from tests.conftest import load_flavour


@pytest.fixture
def fan(flavour):
    return load_flavour("fanout", flavour)


@pytest.fixture
def new_collector(flavour):
    return load_flavour("collector", flavour).StreamOutputCollector


def test_publish_returns_exactly_the_keys_that_became_ready(fan, new_collector):
    a, b, c = new_collector(), new_collector(), new_collector()
    assert fan.publish(["a", "b", "c"], [a, b, c], [[1], [2], [3]], ["x", "y", "z"]) == ["a", "b", "c"]
    a.get_nowait()
    # a was drained: ready again; b and c still hold their chunk: merged, not ready again
    assert fan.publish(["a", "b", "c"], [a, b, c], [[4], [5], [6]], ["X", "Y", "Z"], [False, False, True],
                       [None, None, "stop"]) == ["a"]
    assert a.get_nowait().token_ids == [4]
    chunk = c.get_nowait()
    assert (chunk.token_ids, chunk.text, chunk.finished, chunk.finish_reason) == ([3, 6], "zZ", True, "stop")
    assert b.get_nowait().text == "yY"
    assert fan.publish([], [], [], []) == []


def test_keys_are_returned_as_given(fan, new_collector):
    keys = [object(), object()]
    collectors = [new_collector(), new_collector()]
    ready = fan.publish(keys, collectors, [[1], [2]], ["a", "b"])
    assert len(ready) == 2 and ready[0] is keys[0] and ready[1] is keys[1]


def test_mismatched_step_lists_are_refused(fan, new_collector):
    a = new_collector()
    with pytest.raises(ValueError, match="texts has 0 entries for 1 keys"):
        fan.publish(["a"], [a], [[1]], [])
    with pytest.raises(ValueError, match="collectors has 2 entries for 1 keys"):
        fan.publish(["a"], [a, a], [[1]], ["x"])
    with pytest.raises(ValueError, match="finished has 2 entries"):
        fan.publish(["a"], [a], [[1]], ["x"], [True, False])
    assert a.get_nowait() is None


def test_something_that_is_not_a_collector_is_refused(fan, new_collector, flavour):
    a = new_collector()
    with pytest.raises((TypeError, AttributeError)):
        fan.publish(["a", "b"], [a, "not a collector"], [[1], [2]], ["x", "y"])
    assert a.get_nowait().text == "x"   # the entries before it got theirs


def test_bad_delta_in_a_step_raises_after_earlier_requests_got_theirs(fan, new_collector):
    a, b = new_collector(), new_collector()
    with pytest.raises(TypeError, match="text must be str"):
        fan.publish(["a", "b"], [a, b], [[1], [2]], ["ok", None])
    assert a.get_nowait().text == "ok" and b.get_nowait() is None


def test_fail_fails_the_streams(fan, new_collector):
    a, b = new_collector(), new_collector()
    fan.publish(["a"], [a], [[1]], ["x"])
    assert fan.fail(["a", "b"], [a, b], RuntimeError("boom")) == ["b"]
    assert a.get_nowait().text == "x"
    for c in (a, b):
        with pytest.raises(RuntimeError, match="boom"):
            c.get_nowait()
    with pytest.raises(ValueError, match="collectors has 1 entries for 2 keys"):
        fan.fail(["a", "b"], [a], RuntimeError("boom"))


def test_producer_step_lists_are_not_mutated(fan, new_collector):
    a = new_collector()
    ids = [[1, 2]]
    fan.publish(["a"], [a], ids, ["x"])
    fan.publish(["a"], [a], [[3]], ["y"])
    assert ids == [[1, 2]]


class _Finished:
    """A `finished` entry whose truth test runs Python code in the middle of a publish."""

    def __init__(self, action):
        self.action = action

    def __bool__(self):
        self.action()
        return False


def test_step_lists_emptied_during_publish_stop_it_safely(fan, new_collector):
    """Python code run by a publish (here a `finished` entry's __bool__) may empty the step's lists: the
    delta already read is delivered and the loop stops where the keys end, without reading past them
    (the compiled loop once read entries by their original count)."""
    a, b = new_collector(), new_collector()
    keys, collectors, ids, texts = ["a", "b"], [a, b], [[1], [2]], ["x", "y"]

    def empty_all():
        for lst in (keys, collectors, ids, texts, finished):
            del lst[:]

    finished = [_Finished(empty_all), False]
    assert fan.publish(keys, collectors, ids, texts, finished) == ["a"]
    assert a.get_nowait().token_ids == [1] and b.get_nowait() is None


def test_delta_lists_emptied_during_publish_raise_index_error(fan, new_collector):
    a, b = new_collector(), new_collector()
    ids, texts = [[1], [2]], ["x", "y"]

    def empty_deltas():
        del ids[:]
        del texts[:]

    with pytest.raises(IndexError):
        fan.publish(["a", "b"], [a, b], ids, texts, [_Finished(empty_deltas), False])
    assert a.get_nowait().text == "x" and b.get_nowait() is None


def test_collector_dropped_during_its_own_put_is_not_used_after_free(fan, new_collector):
    """The publish holds the collector it is putting into while Python code runs: dropping the step list's
    reference (the only other one) mid-put must not free it under the put, which would then write into
    whatever reuses its memory (here fresh collectors, allocated right after)."""
    collectors = [new_collector()]
    fresh = []

    def drop_and_reuse():
        del collectors[:]
        fresh.extend(new_collector() for _ in range(8))

    assert fan.publish(["a"], collectors, [[1]], ["x"], [_Finished(drop_and_reuse)]) == ["a"]
    assert not any(c.ready for c in fresh)


def test_a_step_publishes_each_requests_logprobs_with_its_tokens(fan, new_collector):
    """Requests that asked for logprobs get their entries in the same chunk as their tokens (merged across steps
    like them); the others get none, in the same step."""
    a, b = new_collector(), new_collector()
    assert fan.publish(["a", "b"], [a, b], [[1, 2], [3]], ["x", "y"], [False, False], [None, None],
                       [[-0.1, -0.2], None]) == ["a", "b"]
    fan.publish(["a", "b"], [a, b], [[4], [5]], ["z", "w"], [True, True], ["stop", "stop"], [[-0.4], None])
    got_a, got_b = a.get_nowait(), b.get_nowait()
    assert (got_a.token_ids, got_a.logprobs) == ([1, 2, 4], [-0.1, -0.2, -0.4])
    assert (got_b.token_ids, got_b.logprobs) == ([3, 5], None)
    with pytest.raises(ValueError):
        fan.publish(["a"], [a], [[1]], ["x"], [False], [None], [])      # one entry per key
    with pytest.raises(ValueError):
        fan.publish(["a"], [a], [[1, 2]], ["x"], [False], [None], [[-1.0]])   # one entry per token
