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
    t0 = time.monotonic()
    time.sleep(seconds)
    with open(os.environ["SPANS"], "a") as f:
        f.write(json.dumps([kind, os.environ["PYTEST_XDIST_WORKER"], t0, time.monotonic()]) + "\\n")


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


def test_a_timing_test_runs_while_no_other_test_does_and_the_others_run_side_by_side(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text("from tests.conftest import alone_when_timed  # noqa: F401\n")
    (suite / "pytest.ini").write_text("[pytest]\nmarkers =\n    timing: runs alone\n")
    (suite / "test_timed.py").write_text(TIMED)
    for name in "abcd":   # files enough that the other process still has some while the timed test runs
        (suite / f"test_{name}_plain.py").write_text(PLAIN)
    spans = tmp_path / "spans.jsonl"
    env = dict(os.environ, SPANS=str(spans), PYTHONPATH=str(ROOT))
    env.pop("PYTEST_XDIST_WORKER", None)   # (this suite itself may run under xdist)
    run = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadfile", "-q", "-p",
                          "no:cacheprovider", str(suite)], cwd=suite, env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = [json.loads(line) for line in spans.read_text().splitlines()]
    (timed,) = [r for r in rows if r[0] == "timed"]
    plain = [r for r in rows if r[0] == "plain"]
    assert len(plain) == 27
    during = [r for r in plain if r[2] < timed[3] and r[3] > timed[2]]
    assert not during, (timed, during)   # nothing ran beside the timed test
    side_by_side = [(a, b) for a in plain for b in plain if a[1] != b[1] and a[2] < b[3] and a[3] > b[2]]
    assert side_by_side, plain   # the other tests did share the run's two processes
