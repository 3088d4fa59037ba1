"""ns per merge at backlog depths: compiled vs pure vs the quadratic reference, and the floor.

One round = `depth` decode-step-sized chunks (one token id, a short text piece) put into one
collector whose consumer is not reading (the first is stored, the rest are merged), then taken.
ns per merge = round time / depth (extra_info["merges"]).
"""
import pytest

from benches.conftest import collector_and_chunk

DEPTHS = [1, 2, 17, 100, 500, 2000]
# Calibration picks the iterations per timed round from one call, which may be cold (the collector's first
# growth, a GC pass): a 5 us first call fixes 1 iteration, and each sub-microsecond round then carries the
# timer's own ~100 ns (d17: +6 ns a merge, in some runs and not others). With warmup it takes the fastest
# of many calls.
pytestmark = pytest.mark.benchmark(warmup=True, warmup_iterations=2000)
PIECES = [" the", " KV", " cache", ",", " é", "東", "🚀", " token"]


def decode_chunks(chunk_type, depth):
    return [chunk_type([1000 + i], PIECES[i % len(PIECES)], False, None) for i in range(depth)]


@pytest.mark.parametrize("depth", DEPTHS, ids=lambda d: f"d{d}")
@pytest.mark.parametrize("flavour", ["c", "py", "quadratic"])
def test_merge(benchmark, flavour, depth):
    factory, chunk_type = collector_and_chunk(flavour)
    chunks = decode_chunks(chunk_type, depth)
    collector = factory()
    put, take = collector.put_nowait, collector.get_nowait

    def round_():
        for chunk in chunks:
            put(chunk)
        return take()

    benchmark.group = f"merge depth {depth}"
    benchmark.extra_info.update(merges=depth, flavour=flavour, depth=depth)
    out = benchmark(round_)
    ids = out["token_ids"] if isinstance(out, dict) else out.token_ids
    assert ids == [1000 + i for i in range(depth)]


@pytest.mark.parametrize("depth", DEPTHS, ids=lambda d: f"d{d}")
def test_merge_floor(benchmark, depth):
    """The floor: a Python loop calling one C method (list.append) per decode-step-sized item."""
    _, chunk_type = collector_and_chunk("py")
    chunks = decode_chunks(chunk_type, depth)

    def round_():
        out = []
        append = out.append
        for chunk in chunks:
            append(chunk)
        return out

    benchmark.group = f"merge depth {depth}"
    benchmark.extra_info.update(merges=depth, flavour="floor", depth=depth)
    assert len(benchmark(round_)) == depth
