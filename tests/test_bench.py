"""The streaming benchmark: schedule arithmetic, percentiles, in-process and --url runs, JSON and PNG."""
import json
import os
import sys

import numpy as np
import pytest

from rosefast.bench import streaming
from rosefast.bench.schedule import arrival_offsets, lags
from rosefast.bench.stats import percentile
from tests.serving import Server, tiny_env


def test_absolute_targets_are_exact():
    assert arrival_offsets("absolute", 5, 0.01) == pytest.approx([0, 0.01, 0.02, 0.03, 0.04])
    assert arrival_offsets("relative", 5, 0.01) is None


@pytest.mark.parametrize("kind, burstiness, cv", [("poisson", 1.0, 1.0), ("gamma", 0.25, 2.0), ("gamma", 4.0, 0.5)])
def test_random_schedules_have_the_mean_gap_they_claim(kind, burstiness, cv):
    offsets = arrival_offsets(kind, 20001, 0.005, burstiness, seed=3)
    gaps = np.diff(offsets)
    assert offsets[0] == 0 and np.all(gaps >= 0)
    assert gaps.mean() == pytest.approx(0.005, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.1)
    assert arrival_offsets(kind, 100, 0.005, burstiness, seed=3) == offsets[:100]   # seeded
    assert arrival_offsets(kind, 100, 0.005, burstiness, seed=4) != offsets[:100]


def test_lag_is_measured_against_the_target():
    assert lags([10.0, 10.5, 11.2], [10.0, 10.4, 11.0]) == pytest.approx([0.0, 0.1, 0.2])


def test_bad_schedule_arguments():
    with pytest.raises(ValueError, match="submit schedule must be one of"):
        arrival_offsets("weekly", 3, 0.1)
    with pytest.raises(ValueError, match="burstiness must be > 0"):
        arrival_offsets("gamma", 3, 0.1, burstiness=0)


def test_percentile_matches_numpy():
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 100, 1001):
        data = rng.exponential(3.0, n).tolist()
        for q in (0, 1, 50, 95, 99, 100):
            assert percentile(data, q) == pytest.approx(float(np.percentile(data, q)))


REPORT_LINES = ["Model:", "Settings:", "Requests:", "Prompt tokens (accepted):", "Submit wall:",
                "Submit interval/schedule:", "Submitter: ", "Submit lag:", "Reject latency:", "TTFT:", "TPOT:", "Latency:",
                "Throughput:", " per token: "]
INPROCESS_LINES = ["add_request latency:", "Tokenize:", "Queue wait (post-tok):", "Prefill->first token:", "ITL:"]


def test_in_process_run_prints_every_line_json_and_png(tiny_llama, tmp_path, capsys):
    out_json, out_png = tmp_path / "r.json", tmp_path / "r.png"
    f = streaming.main(["--model", "tiny", "--dtype", "float32", "--num-requests", "12", "--max-new-tokens", "6",
                        "--submit-interval-ms", "1", "--submit-schedule", "poisson", "--tokenize-workers", "2",
                        "--no-stop-on-eos", "--output-json", str(out_json), "--plot", str(out_png),
                        "--no-progress"])
    text = capsys.readouterr().out
    for line in REPORT_LINES + INPROCESS_LINES:
        assert line in text, line
    assert f["completed"] == 12 and f["completion_tokens"] == 72
    assert "Engine steps: " in text and f["engine"]["tokens_per_step"] == 72 / f["engine"]["steps"]
    data = json.loads(out_json.read_text())
    assert data["figures"]["completion_tokens"] == 72 and data["settings"]["num_requests"] == 12
    assert len(data["samples"]) == 12
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_in_process_rejects_are_counted(tiny_llama, capsys):
    f = streaming.main(["--model", "tiny", "--dtype", "float32", "--num-requests", "10", "--max-new-tokens", "30",
                        "--max-inflight-requests", "2", "--no-stop-on-eos", "--warmup-runs", "0", "--no-progress"])
    assert f["rejected"] >= 1 and f["completed"] + f["rejected"] == 10 and f["reject_latency"]["n"] == f["rejected"]
    assert "Rejected: " in capsys.readouterr().out


def test_repeated_runs_gaps_and_wall_are_taken_within_each_run():
    from rosefast.bench.drivers import Sample
    from rosefast.bench.report import figures

    # two runs of 4 made-up submit times, 5 ms apart, the second run 10 s after the first (nothing is timed here)
    samples = [Sample(i, t_call=t0 + 0.005 * i) for t0 in (10.0, 20.0) for i in range(4)]
    f = figures(samples, None, http=True)
    assert f["submit_gap"]["n"] == 6 and f["submit_gap"]["mean"] == pytest.approx(5.0)   # ms, not the pause
    assert f["submit_wall_ms"] == pytest.approx(30.0)


def test_in_process_streams_are_read_by_greenlets_on_one_thread(tiny_llama, monkeypatch):
    """No consumer thread per stream (a thread per request, all woken each step): the streams' readers are
    greenlets of the benchmark's one hub thread, woken once a step, as the server's are."""
    import threading

    from rosefast.bench.hub import HubConsumers

    started = []
    start = threading.Thread.start
    monkeypatch.setattr(threading.Thread, "start", lambda self: (started.append(self.name), start(self)))
    f = streaming.main(["--model", "tiny", "--dtype", "float32", "--num-requests", "24", "--max-new-tokens", "4",
                        "--no-stop-on-eos", "--warmup-runs", "0", "--no-progress"])
    assert f["completed"] == 24 and f["completion_tokens"] == 96
    assert len(started) < 24 and started.count("rosefast-bench-hub") == 1, started
    hub, where = HubConsumers(), []
    try:
        done = threading.Event()
        for i in range(3):
            hub.spawn(lambda i: (where.append(threading.get_ident()), i == 2 and done.set()), i)
        assert done.wait(10)
    finally:
        hub.close()
    assert len(set(where)) == 1 and where[0] != threading.get_ident()


def _policy():
    return os.sched_getscheduler(0) & ~getattr(os, "SCHED_RESET_ON_FORK", 0)


@pytest.mark.skipif(not hasattr(os, "sched_setscheduler"), reason="no SCHED_FIFO on this OS")
def test_the_arrival_loop_runs_real_time_only_while_it_submits():
    """A woken submit must not wait for a core the engine's threads hold: the loop's own thread is SCHED_FIFO
    while it submits, normal again afterwards, and a thread it starts is not real-time."""
    import threading
    from types import SimpleNamespace

    from rosefast.bench.drivers import run_arrivals
    from rosefast.bench.priority import resolve

    effective, why = resolve("auto")
    if effective != "realtime":
        pytest.skip(f"SCHED_FIFO is not permitted here: {why}")
    seen = []

    def submit(prompt, sample):
        child = []
        t = threading.Thread(target=lambda: child.append(_policy()))
        t.start()
        t.join()
        seen.append((_policy(), child[0]))

    before = _policy()
    for mode, inside in (("realtime", os.SCHED_FIFO), ("normal", before)):
        seen.clear()
        args = SimpleNamespace(submit_interval_ms=1.0, submit_schedule="absolute", burstiness=1.0, seed=0,
                               submitter_priority=mode)
        samples = run_arrivals(args, ["a", "b", "c"], submit)
        assert [s.target is not None for s in samples] == [True] * 3
        assert seen == [(inside, before)] * 3, mode
        assert _policy() == before


@pytest.mark.skipif(not hasattr(os, "sched_setscheduler"), reason="no SCHED_FIFO on this OS")
def test_a_refused_real_time_falls_back_under_auto_and_fails_under_realtime():
    """Where the OS refuses SCHED_FIFO (here: the interpreter run without CAP_SYS_NICE), auto runs the loop
    normal and says why; realtime stops with the fix named."""
    import shutil
    import subprocess

    from rosefast.bench.priority import resolve

    if os.geteuid() != 0 and resolve("auto")[0] == "realtime":
        pytest.skip("this user may take SCHED_FIFO (RLIMIT_RTPRIO): nothing here refuses it")
    code = ("from rosefast.bench.priority import resolve\n"
            "print(resolve('auto'))\n"
            "try:\n    resolve('realtime')\nexcept SystemExit as e:\n    print('exit:', e)\n")
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("root without setpriv: cannot run a process the OS refuses SCHED_FIFO")
        cmd = ["setpriv", "--bounding-set=-sys_nice", "--inh-caps=-sys_nice", sys.executable, "-c", code]
    else:
        cmd = [sys.executable, "-c", code]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True).stdout
    assert "('normal', 'the OS refused SCHED_FIFO (Operation not permitted); woken submits may wait" in out, out
    assert "exit: --submitter-priority realtime: the OS refused SCHED_FIFO" in out and "CAP_SYS_NICE" in out, out
    assert resolve("normal") == ("normal", "as asked (--submitter-priority normal)")
    with pytest.raises(ValueError, match="submitter priority must be one of"):
        resolve("high")


def test_relative_schedule_stretches_the_interval(tiny_llama):
    f = streaming.main(["--model", "tiny", "--dtype", "float32", "--num-requests", "8", "--max-new-tokens", "2",
                        "--submit-interval-ms", "5", "--submit-schedule", "relative", "--warmup-runs", "0",
                        "--prompt-repeats", "50", "--no-progress"])
    # sleeping after each submit: the real gap is add_request time + interval, never less than the interval
    assert f["submit_gap"]["p50"] >= 5.0
    assert "submit_lag" not in f


def run_against(env, capsys, *argv):
    """The benchmark's --url mode against a test gunicorn with `env`; (figures, report), every HTTP line checked."""
    server = Server(env)
    try:
        f = streaming.main(["--url", server.url, *argv, "--no-stop-on-eos", "--warmup-runs", "0", "--no-progress"])
    finally:
        server.stop()
    text = capsys.readouterr().out
    for line in REPORT_LINES + ["Response headers:", "ITL (per SSE event"]:
        assert line in text, line
    return f, text


def test_url_mode_against_gunicorn(tiny_llama, capsys):
    f, text = run_against(tiny_env(tiny_llama, max_inflight_requests=2), capsys, "--num-requests", "10",
                          "--max-new-tokens", "40")
    for line in INPROCESS_LINES[1:4]:
        assert line not in text   # only the server knows those
    assert f["rejected"] >= 1 and f["errors"] == 0
    assert f["completed"] + f["rejected"] == 10
    assert "Engine steps: " in text and f["engine"]["steps"] > 0   # read from the server's /metrics


def test_url_mode_with_the_lean_client_against_the_stand_in(default_model, capsys):
    env = {"ROSEFAST_MODEL": "stand-in", "ROSEFAST_STAND_IN_STEP_MS": 2, "ROSEFAST_MAX_INFLIGHT_REQUESTS": 3}
    f, _ = run_against(env, capsys, "--client", "raw", "--num-requests", "12", "--max-new-tokens", "20")
    assert f["rejected"] >= 1 and f["errors"] == 0 and f["completed"] + f["rejected"] == 12
    assert f["completion_tokens"] == 20 * f["completed"]
    assert 0 < f["events_per_token"] <= 1


def test_in_process_stand_in(default_model):
    switch = sys.getswitchinterval()
    f = streaming.main(["--model", "stand-in", "--stand-in-step-ms", "1", "--num-requests", "16", "--max-new-tokens",
                        "24", "--no-stop-on-eos", "--warmup-runs", "0", "--no-progress"])
    assert f["completed"] == 16 and f["completion_tokens"] == 16 * 24 and f["errors"] == 0
    assert sys.getswitchinterval() == switch   # its own 0.5 ms for its run only: the caller's is given back
