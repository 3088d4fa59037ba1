"""Frontend collapse: an engine stand-in producing tokens for N streams as fast as it can, consumers
that read only every `lag` steps. Delivered tokens/s with the compiled collector vs the quadratic
reference: the reference degrades as the backlog grows; ours must not."""
import pytest

from benches.conftest import collector_and_chunk

STREAMS, STEPS = 32, 2048


@pytest.mark.parametrize("lag", [1, 16, 128, 1024], ids=lambda n: f"lag{n}")
@pytest.mark.parametrize("flavour", ["c", "quadratic"])
def test_collapse(benchmark, flavour, lag):
    factory, chunk_type = collector_and_chunk(flavour)
    steps = [chunk_type([s], " tok", s == STEPS - 1, "length" if s == STEPS - 1 else None) for s in range(STEPS)]

    def run():
        collectors = [factory() for _ in range(STREAMS)]
        delivered = 0
        for s, chunk in enumerate(steps):
            for c in collectors:
                c.put_nowait(chunk)
            if (s + 1) % lag == 0 or s == STEPS - 1:
                for c in collectors:
                    out = c.get_nowait()
                    delivered += len(out["token_ids"] if isinstance(out, dict) else out.token_ids)
        return delivered

    benchmark.group = f"collapse lag {lag}"
    benchmark.extra_info.update(tokens=STREAMS * STEPS, flavour=flavour, lag=lag)
    assert benchmark.pedantic(run, rounds=3, warmup_rounds=1) == STREAMS * STEPS
