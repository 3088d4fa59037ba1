"""The engine benchmark scripts run end to end on a tiny model (a smoke test: they cannot rot unnoticed)."""
from benches import add_request, decode_step, throughput


def test_decode_step_prints_ours_floor_and_hf(tiny_llama, capsys):
    rows = decode_step.main(["--model", str(tiny_llama.path), "--dtypes", "float32,bfloat16", "--batches", "1,2",
                             "--contexts", "8", "--steps", "1"])
    assert len(rows) == 4 and all(r[3] > 0 and r[4] > 0 and r[5] > 0 for r in rows)
    assert "| bfloat16 | 2 | 8 |" in capsys.readouterr().out


def test_throughput_runs_every_level(tiny_llama, capsys):
    throughput.main(["--model", str(tiny_llama.path), "--new-tokens", "4", "--concurrency", "1,2",
                     "--hf-solo-requests", "1", "--repeats", "1"])
    out = capsys.readouterr().out
    assert "| 1 |" in out and "| 2 |" in out


def test_add_request_compares_worker_settings(tiny_llama):
    rows = add_request.main(["--model", str(tiny_llama.path), "--workers", "0,1", "--requests", "5",
                             "--intervals-ms", "0,1", "--prompt-repeats", "8"])
    settings = ["control, idle", 0, "0: control under load", 1, "1: control under load"]
    assert [(r[0], r[1]) for r in rows] == [(interval, s) for interval in (0, 1) for s in settings]
    assert all(0 < r[2] <= r[5] for r in rows)
