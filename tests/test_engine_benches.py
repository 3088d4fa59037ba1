"""The engine benchmark scripts run end to end on a tiny model (a smoke test: they cannot rot unnoticed)."""
import os
import shutil

import pytest

from benches import add_request, decode_step, delta_rule, llama_cpp, throughput, window_kv


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


def test_the_llama_cpp_comparison_runs_where_a_llama_server_is_built(capsys):
    """benches/llama_cpp.py against a real llama-server (README: "Beside llama.cpp" builds one); where none is
    built (ROSEFAST_LLAMA_SERVER names it) there is nothing to compare with."""
    binary = os.environ.get("ROSEFAST_LLAMA_SERVER") or shutil.which("llama-server")
    if not binary:
        pytest.skip("no llama-server built here (set ROSEFAST_LLAMA_SERVER to its path)")
    rows = llama_cpp.main(["--llama-server", binary, "--tokens", "4", "--rounds", "1", "--concurrent", "1", "--distinct",
                           "--prompt-repeats", "2"])
    assert [(name, c) for name, c, _, _ in rows] == [("llama.cpp", 1), ("rosefast", 1)]
    assert all(f["completed"] == 1 for *_, f in rows)
    assert "c=1: rosefast / llama.cpp ITL p50" in capsys.readouterr().out


def test_the_startup_benchmark_converts_once_then_reads_the_cache(tiny_llama, tmp_path):
    from benches import startup
    from tests.gguf_writer import write_gguf
    from gguf import GGMLQuantizationType as T

    path = tmp_path / "q8_0.gguf"
    write_gguf(path, tiny_llama, lambda name: T.Q8_0)
    first, later = startup.main(["--model", str(path), "--starts", "2"])
    assert first["converted"] and not later["converted"]
    assert first["tokens"] == later["tokens"] and len(first["tokens"]) == 8
    assert later["cache_mb"] == first["cache_mb"] and later["peak_rss_gb"] >= later["rss_gb"] > 0


def test_the_window_pool_benchmark_plans_and_measures(default_model, capsys):
    rows, (main_peak, window_peak, window_blocks) = window_kv.main(["--context", "1024", "--sequences", "2",
                                                                     "--max-batch-sizes", "8"])
    assert [r[0] for r in rows] == list(window_kv.SHAPES) and all(r[4] <= r[3] for r in rows)
    assert rows[0][4] < rows[0][3]   # Gemma 3 1B: 22 of its 26 layers keep a window of 512 and a step
    # two sequences of 1024 + 16 tokens: 65 blocks each in the other pool; the window's 512 positions and a
    # prefill chunk in the window pool
    assert main_peak == 130 and 0 < window_peak <= window_blocks and window_peak < main_peak
    assert "| Gemma 3 1B | 8 | 22 of 26 (W 512) |" in capsys.readouterr().out


def test_delta_rule_prints_each_step_beside_its_floor(capsys):
    table, compiled, chunked = delta_rule.main(["--rows", "1,2", "--prompt", "64", "--dtype", "float32"])
    assert [r[0] for r in table] == [1, 2] and all(took > 0 and floor > 0 for _, took, floor in table)
    assert table[1][2] == 2 * table[0][2]   # the floor: each row's 2 MiB state read and written
    assert compiled > 0 and chunked > 0
    assert "| 2 |" in capsys.readouterr().out
