"""The device check's stage programs (benches/device_check.sh) dry-run on the CPU with a tiny model: they reach
into the engine (its runner, sampler, kernels and server), and between GPU runs nothing else notices a renamed
module or a changed signature (the first GPU run lost its equality, throughput and attention stages that way)."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
SCRIPT = ROOT / "benches" / "device_check.sh"


def stage_programs():
    """{file name: source} of the programs the script writes with `cat > "$WORK/name.py" <<'EOF'`."""
    return dict(re.findall(r"cat > \"\$WORK/(\w+\.py)\" <<'EOF'\n(.*?)\nEOF\n", SCRIPT.read_text(), re.S))


@pytest.fixture(scope="module")
def dry_run(tiny_llama, tmp_path_factory):
    work = tmp_path_factory.mktemp("devcheck")
    out = work / "out"
    out.mkdir()
    for name, source in stage_programs().items():
        (work / name).write_text(source + "\n")
    env = dict(os.environ, DEVCHECK_DEVICE="cpu", DEVCHECK_MODEL=str(tiny_llama.path), DEVCHECK_MODEL_KIND="tiny",
               OUT=str(out), PYTHONPATH=str(ROOT), EQ_TOKENS="4", TP_TOKENS="4", TP_LEVELS="1,3", ATT_BATCH="2",
               ATT_CTX="64")

    def run(name):
        done = subprocess.run([sys.executable, str(work / name)], env=env, cwd=ROOT, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        return done.stdout

    return run, out


def test_the_script_writes_the_programs_the_stages_run():
    assert sorted(stage_programs()) == ["attention.py", "common.py", "equality.py", "gunicorn_cuda.py",
                                        "stub_model.py", "throughput.py"]


def test_the_equality_stage_runs_every_dtype_and_graph_setting(dry_run):
    run, out = dry_run
    run("equality.py")
    report = json.loads((out / "equality.json").read_text())
    assert [(r["dtype"], r["cuda_graph"]) for r in report["runs"]] == [
        ("float32", True), ("float32", False), ("bfloat16", True), ("bfloat16", False)]
    assert all("error" not in r and len(r["per_prompt"]) == report["prompts"] == 8 for r in report["runs"])


def test_the_throughput_stage_times_every_config_and_level(dry_run):
    run, out = dry_run
    run("throughput.py")
    report = json.loads((out / "throughput.json").read_text())
    assert len(report["configs"]) == 4
    for entry in report["configs"]:
        assert "error" not in entry, entry
        levels = [row["concurrent"] for row in entry["rows"]]
        assert levels[:2] == [1, 3]   # each level's every token came out, and its steps were timed
        assert all(row["tokens_out"] == row["concurrent"] * row["tokens_each"] and row["decode_steps"] > 0
                   and isinstance(row["tok_s"], float) for row in entry["rows"])


def test_the_attention_stage_times_each_kernel(dry_run):
    run, out = dry_run
    run("attention.py")
    report = json.loads((out / "attention.json").read_text())
    errors = {k: v for k, v in report.items() if str(v).startswith("ERROR")}
    assert not errors
    for key in ("twin_attention_ms_per_layer_width_ctx", "twin_attention_ms_per_layer_width_model",
                "step_wall_ms_eager", "gather_only_ms_per_layer", "sdpa_default_nomask_ms_per_layer"):
        assert isinstance(report[key], float), key   # measured (a failed measurement is an ERROR string)
    assert report["sdpa_vs_twin_max_abs_diff"] < 0.05


def test_the_server_stage_streams_through_gunicorn(dry_run):
    run, _ = dry_run
    result = json.loads(run("gunicorn_cuda.py").strip().splitlines()[-1])
    assert result["whole"] and result["spawned_at_load"] and result["spawned_in_step"]
