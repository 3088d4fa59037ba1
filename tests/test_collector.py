"""StreamOutputCollector: merged delivery == unmerged delivery, no aliasing, nothing lost on bad input."""
import itertools
import sys
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import load_flavour

PIECES = ["a", " ", "é", "東京", "🚀", "\n", "", "naïve", "\u200d", "x" * 40]


@pytest.fixture
def mod(flavour):
    return load_flavour("collector", flavour)


def make_stream(n):
    """n decode-step-sized deltas; the last one finishes the stream."""
    deltas = []
    for i in range(n):
        last = i == n - 1
        deltas.append(([i, i + 1] if i % 5 == 0 else [i], PIECES[i % len(PIECES)], last, "stop" if last else None))
    return deltas


def unmerged(deltas):
    ids = [t for d in deltas for t in d[0]]
    return ids, "".join(d[1] for d in deltas), deltas[-1][2], deltas[-1][3]


def drain(mod, collector, deltas, cadence):
    """Put every delta; take whenever `cadence(i)` says the consumer reads; then take the rest."""
    got = []
    for i, d in enumerate(deltas):
        collector.put_nowait(mod.StreamChunk(*d))
        if cadence(i):
            c = collector.get_nowait()
            if c is not None:
                got.append(c)
    while (c := collector.get_nowait()) is not None:
        got.append(c)
    return got


def concat(chunks):
    return ([t for c in chunks for t in c.token_ids], "".join(c.text for c in chunks),
            any(c.finished for c in chunks), chunks[-1].finish_reason)


@pytest.mark.parametrize("depth", [1, 2, 17, 500])
def test_merged_equals_unmerged_at_backlog_depth(mod, depth):
    deltas = make_stream(depth * 3)
    collector = mod.StreamOutputCollector()
    got = drain(mod, collector, deltas, lambda i: (i + 1) % depth == 0)
    assert concat(got) == unmerged(deltas)
    assert len(got) == 3
    assert collector.merges == 3 * (depth - 1)
    assert [c.merged for c in got] == [depth - 1] * 3   # each taken chunk says how many deltas joined it
    assert [c.finished for c in got] == [False, False, True]


# One piece of each storage width (ASCII, Latin-1, BMP, astral), short and long: merged text takes the width of
# its widest piece, so every narrower piece before or after it must be widened code point by code point.
WIDTHS = ["ok", "é", "東", "🚀", "x" * 40, "é" * 40, "東" * 20, "🚀" * 9]


@pytest.mark.parametrize("first", WIDTHS, ids=range(len(WIDTHS)))
def test_text_of_every_width_merges_code_point_for_code_point(mod, first):
    for second in WIDTHS:
        for third in WIDTHS:
            collector = mod.StreamOutputCollector()
            for piece in (first, second, third):
                collector.put_nowait(mod.StreamChunk([1], piece))
            assert collector.get_nowait().text == first + second + third


@pytest.mark.parametrize("name", ["c", "py"])
@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 49151), max_size=3), st.text(max_size=6)), min_size=1,
                max_size=60),
       st.lists(st.booleans(), min_size=1, max_size=60))
def test_random_cadence_and_multibyte_text(name, items, reads):
    mod = load_flavour("collector", name)
    deltas = [(ids, text, i == len(items) - 1, "length" if i == len(items) - 1 else None)
              for i, (ids, text) in enumerate(items)]
    collector = mod.StreamOutputCollector()
    got = drain(mod, collector, deltas, lambda i: reads[i % len(reads)])
    ids, text, finished, reason = concat(got)
    assert (ids, text.encode(), finished, reason) == (
        unmerged(deltas)[0], unmerged(deltas)[1].encode(), True, "length")


def test_producer_lists_are_never_mutated_nor_aliased(mod):
    collector = mod.StreamOutputCollector()
    first, second, third = [1, 2], [3], [4, 5]
    collector.put_nowait(mod.StreamChunk(first, "a", False, None))
    collector.put_nowait(mod.StreamChunk(second, "b", False, None))  # merged into the waiting chunk
    collector.put_nowait(mod.StreamChunk(third, "c", False, None))
    assert (first, second, third) == ([1, 2], [3], [4, 5])
    chunk = collector.get_nowait()
    assert chunk.token_ids == [1, 2, 3, 4, 5]
    assert chunk.token_ids is not first
    # the consumer's chunk is its own: later producer activity does not reach it
    first.append(99)
    collector.put_nowait(mod.StreamChunk(first, "d", False, None))
    collector.put_nowait(mod.StreamChunk([7], "e", False, None))
    assert chunk.token_ids == [1, 2, 3, 4, 5] and chunk.text == "abc"
    assert first == [1, 2, 99]
    assert collector.get_nowait().token_ids == [1, 2, 99, 7]


def test_single_chunk_is_copied_too(mod):
    collector = mod.StreamOutputCollector()
    ids = [5]
    collector.put_nowait(mod.StreamChunk(ids, "x", False, None))
    ids.append(6)
    assert collector.get_nowait().token_ids == [5]


def test_tuple_ids_are_accepted(mod):
    collector = mod.StreamOutputCollector()
    collector.put_nowait(mod.StreamChunk((1, 2), "a", False, None))
    collector.put_nowait(mod.StreamChunk((3,), "b", False, None))
    assert collector.get_nowait().token_ids == [1, 2, 3]


def test_non_str_text_raises_and_keeps_what_was_accumulated(mod):
    collector = mod.StreamOutputCollector()
    collector.put_nowait(mod.StreamChunk([1], "Hel", False, None))
    collector.put_nowait(mod.StreamChunk([2], "lo", False, None))
    with pytest.raises(TypeError, match="text must be str"):
        collector.put_nowait(mod.StreamChunk([3], b"bytes", True, "stop"))
    with pytest.raises(TypeError, match="token_ids must be a list or tuple"):
        collector.put_nowait(mod.StreamChunk(3, "x", True, "stop"))
    with pytest.raises(TypeError, match="finish_reason must be str or None"):
        collector.put_nowait(mod.StreamChunk([3], "x", True, 5))
    chunk = collector.get_nowait()
    assert (chunk.token_ids, chunk.text, chunk.finished, chunk.finish_reason) == ([1, 2], "Hello", False, None)
    assert collector.merges == 1


def test_a_delta_converted_by_python_code_is_held_while_it_runs(mod):
    """Subclassed fields go through Python code (the checks, list(), str()), which may drop the chunk's own
    references: the collector must hold the fields itself until it is done with them."""
    freed = []

    class Text(str):
        def __del__(self):
            freed.append(str(self))

    class Ids(list):
        def __iter__(self):
            chunk.text = "replaced"       # the chunk's reference to the original text is gone
            assert not freed, "the text was freed while the collector still read it"
            return super().__iter__()

    collector = mod.StreamOutputCollector()
    chunk = mod.StreamChunk(Ids([1, 2]), Text("original"))
    collector.put_nowait(chunk)
    got = collector.get_nowait()
    assert (got.token_ids, got.text, type(got.text), type(got.token_ids)) == ([1, 2], "original", str, list)


def test_a_finished_flag_that_runs_python_code_cannot_free_the_fields(mod):
    freed = []

    class Ids(list):
        def __del__(self):
            freed.append(list(self))

    class Truthy:
        def __bool__(self):
            chunk.token_ids, chunk.text = [99], "replaced"   # drops the chunk's references to its fields
            assert not freed, "the ids were freed while the collector still read them"
            return True

    collector = mod.StreamOutputCollector()
    chunk = mod.StreamChunk(Ids([1, 2]), "".join(["orig", "inal"]), Truthy())
    assert collector.put_nowait(chunk)
    got = collector.get_nowait()
    assert (got.token_ids, got.text, got.finished) == ([1, 2], "original", True)


def test_str_subclasses_are_delivered_as_plain_str(mod):
    class Reason(str):
        pass

    class Sticky(str):
        def __str__(self):         # str() of it gives itself back, not a plain str
            return self

    collector = mod.StreamOutputCollector()
    collector.put_nowait(mod.StreamChunk([1], Sticky("a"), False, Reason("length")))
    first = collector.get_nowait()
    collector.put_nowait(mod.StreamChunk([2], "b", False, None))
    collector.put_nowait(mod.StreamChunk([3], Sticky("c"), True, Reason("stop")))
    merged = collector.get_nowait()
    assert [(c.token_ids, c.text, c.finish_reason) for c in (first, merged)] == [([1], "a", "length"),
                                                                               ([2, 3], "bc", "stop")]
    assert {type(c.text) for c in (first, merged)} | {type(c.finish_reason) for c in (first, merged)} == {str}


def test_concurrent_put_and_take_lose_nothing(mod):
    """The engine thread puts while a consumer thread takes; thread switches forced as often as possible."""
    n = 20_000
    collector = mod.StreamOutputCollector()
    done = threading.Event()

    def produce():
        for i in range(n):
            collector.put([i], PIECES[i % len(PIECES)], i == n - 1, "stop" if i == n - 1 else None)
        done.set()

    got = []
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        producer = threading.Thread(target=produce)
        producer.start()
        while True:
            finished = done.is_set()
            chunk = collector.get_nowait()
            if chunk is not None:
                got.append(chunk)
            elif finished:
                break
        producer.join()
    finally:
        sys.setswitchinterval(switch)
    assert concat(got) == ([*range(n)], "".join(PIECES[i % len(PIECES)] for i in range(n)), True, "stop")


class _Tracked:
    """A garbage-collected object from no free list: each one counts toward the next collection."""


def _takes_while_collections_put(collector, put_one):
    """20 takes, each made to run the garbage collector by its allocations, a put landing from the collection as
    a finalizer or another thread would: (the numbers put, in order; the chunks taken). The caller checks them."""
    import gc

    sent, numbers, got, keep = [], itertools.count(), [], []
    armed = False

    def put():
        i = next(numbers)
        put_one(i)
        sent.append(i)

    def put_while_collecting(phase, info):
        if phase == "start" and armed:
            put()

    threshold = gc.get_threshold()
    ours = gc.get_freeze_count() == 0   # (a serving manager's freeze, if one is held, is left to it)
    if ours:   # the process's objects out of the way: each gc.collect() below walks this test's alone (~0.5 s less)
        gc.freeze()
    gc.callbacks.append(put_while_collecting)
    gc.set_threshold(1)
    try:
        for _ in range(20):
            put()
            gc.collect()                 # the count of new objects is 0 ...
            keep.append(_Tracked())      # ... now 1: the take's next allocation collects
            armed = True
            got.append(collector.get_nowait())
            armed = False
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(put_while_collecting)
        if ours:
            gc.unfreeze()
    while (chunk := collector.get_nowait()) is not None:
        got.append(chunk)
    # 20 takes, 20 puts from the collections they ran (a thread left by another test may collect one first)
    assert len(sent) >= 30, "the takes did not collect: this test no longer tests anything"
    return sent, [c for c in got if c is not None]


def test_compiled_take_is_atomic_even_when_it_runs_the_gc():
    """A take allocates the chunk it returns, which may run the garbage collector, and so finalizers and other
    threads. A put that lands then must be delivered whole: its ids and its text in the same chunk, nothing
    left behind. A gc callback stands in for the other thread: it puts while the take's allocation collects.
    (The pure twin serializes with a lock instead; a put from inside its own take would wait on it.)"""

    mod = load_flavour("collector", "c")
    collector = mod.StreamOutputCollector()
    sent, got = _takes_while_collections_put(collector, lambda i: collector.put_nowait(mod.StreamChunk([i], f"<{i}>")))
    assert [(c.token_ids, c.text) for c in got] == [(c.token_ids, "".join(f"<{i}>" for i in c.token_ids))
                                                    for c in got]
    assert [i for c in got for i in c.token_ids] == sent


def test_bad_first_chunk_leaves_collector_empty(mod):
    collector = mod.StreamOutputCollector()
    with pytest.raises(TypeError):
        collector.put_nowait(mod.StreamChunk([1], None, False, None))
    assert collector.get_nowait() is None and not collector.ready


def test_chunk_missing_a_field_is_a_clear_error(mod):
    class Partial:
        token_ids = [1]
        text = "x"

    collector = mod.StreamOutputCollector()
    with pytest.raises(TypeError, match="missing field.*finished, finish_reason"):
        collector.put_nowait(Partial())
    assert collector.get_nowait() is None


def test_any_object_with_the_fields_is_a_chunk(mod):
    class Delta:
        def __init__(self, ids, text):
            self.token_ids, self.text, self.finished, self.finish_reason = ids, text, False, None

    collector = mod.StreamOutputCollector()
    assert collector.put_nowait(Delta([1], "a")) is True
    assert collector.put_nowait(Delta([2], "b")) is False
    assert collector.get_nowait() == mod.StreamChunk([1, 2], "ab", False, None)


def test_finished_is_ored_and_last_nonempty_reason_wins(mod):
    collector = mod.StreamOutputCollector()
    collector.put_nowait(mod.StreamChunk([1], "a", False, None))
    collector.put_nowait(mod.StreamChunk([2], "b", True, "stop"))
    collector.put_nowait(mod.StreamChunk([], "", False, ""))
    collector.put_nowait(mod.StreamChunk([], "", False, None))
    chunk = collector.get_nowait()
    assert chunk.finished is True and chunk.finish_reason == "stop"


def test_put_reports_empty_to_ready_transitions(mod):
    collector = mod.StreamOutputCollector()
    assert collector.put_nowait(mod.StreamChunk([1], "a", False, None)) is True
    assert collector.put_nowait(mod.StreamChunk([2], "b", False, None)) is False
    collector.get_nowait()
    assert collector.put_nowait(mod.StreamChunk([3], "c", False, None)) is True


def test_error_arrives_after_the_chunks_before_it(mod):
    collector = mod.StreamOutputCollector()
    collector.put_nowait(mod.StreamChunk([1], "a", False, None))
    assert collector.put_error(RuntimeError("engine step failed")) is False  # already ready
    assert collector.get_nowait().text == "a"
    with pytest.raises(RuntimeError, match="engine step failed"):
        collector.get_nowait()
    with pytest.raises(RuntimeError):  # a failed stream stays failed
        collector.get_nowait()
    empty = mod.StreamOutputCollector()
    assert empty.put_error(ValueError("x")) is True and empty.ready
    with pytest.raises(TypeError, match="needs an exception"):
        empty.put_error("not an exception")


def test_one_argument_methods_are_positional_only_in_both_flavours(mod):
    """The compiled methods use list.append's calling convention (METH_O / METH_NOARGS); the twin matches."""
    c = mod.StreamOutputCollector()
    with pytest.raises(TypeError):
        c.put_nowait(chunk=mod.StreamChunk([1], "a", False, None))
    assert c.get_nowait() is None and c.merges == 0



@pytest.mark.parametrize("depth", [1, 3, 40])
def test_logprobs_ride_with_their_tokens_merged_or_not(mod, depth):
    """Each token's logprob entry is merged with it: a take at any backlog depth has exactly its tokens' entries,
    in order (what a lagging consumer reads equals what an unlagging one reads); the producer's lists are not
    touched; a chunk of a request that asked for none has None."""
    deltas = make_stream(depth * 4)
    entries = [[(-0.1 * t, [(t, -0.1 * t)]) for t in d[0]] for d in deltas]
    sent = [list(e) for e in entries]
    collector = mod.StreamOutputCollector()
    got = []
    for i, (d, e) in enumerate(zip(deltas, entries)):
        collector.put(*d, e)
        if (i + 1) % depth == 0:
            got.append(collector.get_nowait())
    while (c := collector.get_nowait()) is not None:
        got.append(c)
    assert [t for c in got for t in c.token_ids] == unmerged(deltas)[0]
    assert [e for c in got for e in c.logprobs] == [e for es in sent for e in es]
    assert all(len(c.logprobs) == len(c.token_ids) for c in got)
    assert entries == sent                                   # the producer's lists as they were
    plain = mod.StreamOutputCollector()
    plain.put([1, 2], "ab", False, None)
    plain.put_nowait(mod.StreamChunk([3], "c", True, "stop"))
    assert plain.get_nowait().logprobs is None


def test_a_chunk_with_logprobs_merges_them_through_put_nowait(mod):
    collector = mod.StreamOutputCollector()
    first = mod.StreamChunk([1, 2], "ab", False, None)
    first.logprobs = [-1.0, -2.0]
    second = mod.StreamChunk([3], "c", True, "stop")
    second.logprobs = (-3.0,)
    collector.put_nowait(first)
    collector.put_nowait(second)
    chunk = collector.get_nowait()
    assert chunk.logprobs == [-1.0, -2.0, -3.0] and type(chunk.logprobs) is list and chunk.merged == 1


@pytest.mark.parametrize("logprobs, error", [([-1.0], ValueError), ([-1.0, -2.0, -3.0], ValueError),
                                             ({0: -1.0, 1: -2.0}, TypeError), ("ab", TypeError)])
def test_logprobs_that_do_not_line_up_with_the_tokens_are_refused_and_keep_what_waits(mod, logprobs, error):
    collector = mod.StreamOutputCollector()
    collector.put([7], "x", False, None, [-0.5])
    with pytest.raises(error):
        collector.put([8, 9], "yz", False, None, logprobs)
    chunk = collector.get_nowait()
    assert (chunk.token_ids, chunk.text, chunk.logprobs) == ([7], "x", [-0.5])


def test_compiled_take_with_logprobs_is_atomic_even_when_it_runs_the_gc():
    """As the plain take above: a put that lands while the take's allocations collect is delivered whole, its
    logprob entries in the same chunk as its tokens."""

    mod = load_flavour("collector", "c")
    collector = mod.StreamOutputCollector()
    sent, got = _takes_while_collections_put(collector, lambda i: collector.put([i], f"<{i}>", False, None,
                                                                               [-float(i)]))
    assert all(c.logprobs == [-float(i) for i in c.token_ids] for c in got)
    assert [i for c in got for i in c.token_ids] == sent
