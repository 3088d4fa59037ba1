"""make test spreads the suite over processes (pytest-xdist); a test marked `timing` still runs alone
(tests/conftest.py's alone_when_timed): checked on a small suite of its own, run the way make test runs ours."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PLAIN = """
import json, os, time, pytest


def span(kind, seconds):
    # WAIT_FOR: a run whose first test this one waits for (60 s at most), so the two runs are under way at once
    # however slowly a loaded machine starts the other (its two processes took over 8 s to start beside a busy one)
    deadline = time.monotonic() + 60
    while os.environ.get("WAIT_FOR") and time.monotonic() < deadline and not any(
            json.loads(line)[1].startswith(os.environ["WAIT_FOR"]) for line in open(os.environ["SPANS"])):
        time.sleep(0.02)
    t0 = time.monotonic()
    time.sleep(seconds)
    with open(os.environ["SPANS"], "a") as f:
        f.write(json.dumps([kind, os.environ["RUN"] + os.environ.get("PYTEST_XDIST_WORKER", ""), t0,
                            time.monotonic()]) + "\\n")


@pytest.mark.parametrize("i", range(5))
def test_plain(i):
    span("plain", 0.2)
"""

# the timed test after plain ones in a file of its own, the largest (xdist hands out the largest files first): it
# starts while the other process is still busy with plain files
TIMED = PLAIN + """

@pytest.mark.parametrize("i", range(2))
def test_more_plain(i):
    span("plain", 0.2)


@pytest.mark.timing
def test_timed():
    span("timed", 1.0)
"""


def _suite(path, timed, plain_files):
    path.mkdir()
    (path / "conftest.py").write_text("from tests.conftest import alone_when_timed  # noqa: F401\n")
    (path / "pytest.ini").write_text("[pytest]\nmarkers =\n    timing: runs alone\n")
    if timed:
        (path / "test_timed.py").write_text(TIMED)
    for name in plain_files:
        (path / f"test_{name}_plain.py").write_text(PLAIN)
    return path


def _start(suite, spans, run, *args, locks=None, wait_for=""):
    env = dict(os.environ, SPANS=str(spans), PYTHONPATH=str(ROOT), RUN=run, WAIT_FOR=wait_for)
    env.pop("PYTEST_XDIST_WORKER", None)   # (this suite itself may run under xdist, and share its locks with
    env.pop("ROSEFAST_TEST_LOCKS", None)   # another run: the small suite's timed test would wait on this one)
    if locks is not None:
        env["ROSEFAST_TEST_LOCKS"] = str(locks)
    return subprocess.Popen([sys.executable, "-m", "pytest", *args, "-q", "-p", "no:cacheprovider", str(suite)],
                            cwd=suite, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(proc):
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out


def _overlap(a, b):
    return a[2] < b[3] and a[3] > b[2]


def test_a_timing_test_runs_while_no_other_test_does_and_the_others_run_side_by_side(tmp_path):
    # files enough that the other process still has some while the timed test runs
    suite = _suite(tmp_path / "suite", True, "abcd")
    spans = tmp_path / "spans.jsonl"
    _finish(_start(suite, spans, "a", "-n", "2", "--dist", "loadfile"))
    rows = [json.loads(line) for line in spans.read_text().splitlines()]
    (timed,) = [r for r in rows if r[0] == "timed"]
    plain = [r for r in rows if r[0] == "plain"]
    assert len(plain) == 27
    during = [r for r in plain if _overlap(r, timed)]
    assert not during, (timed, during)   # nothing ran beside the timed test
    side_by_side = [(a, b) for a in plain for b in plain if a[1] != b[1] and _overlap(a, b)]
    assert side_by_side, plain   # the other tests did share the run's two processes


def test_two_runs_sharing_a_lock_directory_take_turns_with_a_timed_test(tmp_path):
    """make test's two legs at once (the compiled run over two processes, the pure-twin run serially beside it):
    through ROSEFAST_TEST_LOCKS a timed test of one waits for the other's tests under way and holds back its next."""
    spans = tmp_path / "spans.jsonl"
    # the serial run first (40 tests of 0.2 s), each of its tests waiting until the other run has finished one, so
    # the two are under way at once on a machine of any speed and load
    spans.write_text("")
    serial = _start(_suite(tmp_path / "serial", False, "cdefghij"), spans, "b", locks=tmp_path, wait_for="a")
    runs = [serial, _start(_suite(tmp_path / "xdist", True, "ab"), spans, "a", "-n", "2", "--dist", "loadfile",
                           locks=tmp_path)]
    for proc in runs:
        _finish(proc)
    rows = [json.loads(line) for line in spans.read_text().splitlines()]
    (timed,) = [r for r in rows if r[0] == "timed"]
    plain = [r for r in rows if r[0] == "plain"]
    assert len(plain) == 17 + 40
    during = [r for r in plain if _overlap(r, timed)]
    assert not during, (timed, during)   # the serial run's tests too waited for the timed one
    beside = [(a, b) for a in plain for b in plain if a[1] == "b" and a[1] != b[1] and _overlap(a, b)]
    assert beside, plain   # the two runs' plain tests did run side by side
