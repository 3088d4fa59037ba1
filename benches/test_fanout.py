"""Fan-out cost per token at batch 1, 32, 256 (compiled vs pure), and admission acquire+release."""
import pytest

from benches.conftest import flavour_module

STEPS = 16  # steps per round; the collectors are drained (untimed) between rounds


@pytest.mark.parametrize("batch", [1, 32, 256], ids=lambda b: f"b{b}")
@pytest.mark.parametrize("flavour", ["c", "py"])
def test_fanout(benchmark, flavour, batch):
    publish = flavour_module("fanout", flavour).publish
    keys = [f"req-{i}" for i in range(batch)]
    collectors = [flavour_module("collector", flavour).StreamOutputCollector() for _ in keys]
    steps = [([[s * 7 + i] for i in range(batch)], [" tok"] * batch) for s in range(STEPS)]

    def drain():
        for c in collectors:
            c.get_nowait()

    def round_():
        for ids, texts in steps:
            publish(keys, collectors, ids, texts)

    benchmark.group = f"fanout batch {batch}"
    benchmark.extra_info.update(tokens=STEPS * batch, flavour=flavour, batch=batch)
    benchmark.pedantic(round_, setup=drain, rounds=2000 if batch < 256 else 400, warmup_rounds=20)
    assert collectors[0].get_nowait().token_ids == [s * 7 for s in range(STEPS)]


@pytest.mark.parametrize("flavour", ["c", "py"])
def test_admission(benchmark, flavour):
    counter = flavour_module("admission", flavour).AdmissionCounter(limit=1000)
    acquire, release = counter.try_acquire, counter.release
    n = 1000

    def round_():
        for _ in range(n):
            acquire()
            release()

    benchmark.group = "admission acquire+release"
    benchmark.extra_info.update(ops=n, flavour=flavour)
    benchmark(round_)
    assert counter.inflight == 0 and counter.accepted_total >= n
