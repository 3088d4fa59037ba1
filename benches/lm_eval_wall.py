"""lm-evaluation-harness wall time: its `local-completions` model against this server (gunicorn, the default
model) vs its in-process `hf` backend on the same model and dtype, over the same local multiple-choice task
(N loglikelihood requests), one run each.

    python -m benches.lm_eval_wall --docs 50          # 50 questions x 4 choices = 200 loglikelihood requests
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

SUBJECTS = ["The sun", "A river", "The old library", "My neighbour's cat", "The first train", "A quiet lake",
            "The market", "An orchestra", "The mountain path", "A winter storm"]
ENDINGS = [" rises in the east.", " was closed for the holidays.", " sang until midnight.", " froze overnight."]

MC_TASK = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {path}
test_split: test
output_type: multiple_choice
target_delimiter: ""
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


def mc_task(name, path):
    """An lm-eval multiple-choice task over a local JSONL file of {question, choices, answer} documents."""
    return MC_TASK.format(name=name, path=path)


def write_task(folder, docs):
    data = folder / "docs.jsonl"
    with open(data, "w") as f:
        for i in range(docs):
            subject = f"{SUBJECTS[i % len(SUBJECTS)]} ({i})"
            f.write(json.dumps({"question": subject, "choices": ENDINGS, "answer": i % 4}) + "\n")
    (folder / "rf_wall.yaml").write_text(mc_task("rf_wall", data))


def start_server(port, dtype):
    env = {**os.environ, "ROSEFAST_DTYPE": dtype, "ROSEFAST_SERVED_MODEL_NAME": "smollm2"}
    proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "-k", "gevent", "server:app", "--bind",
                             f"127.0.0.1:{port}"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except requests.RequestException:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("the server did not start")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--docs", type=int, default=50)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--port", type=int, default=8031)
    p.add_argument("--concurrent", type=int, default=1, help="local-completions' num_concurrent")
    a = p.parse_args(argv)
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import lm_eval
    from lm_eval.tasks import TaskManager

    from rosefast.sources import resolve_model

    model = resolve_model()
    folder = Path(tempfile.mkdtemp(prefix="rf-lm-eval-"))
    write_task(folder, a.docs)
    tasks = TaskManager(include_path=str(folder))
    server = start_server(a.port, a.dtype)
    try:
        t = time.perf_counter()
        served = lm_eval.simple_evaluate(
            model="local-completions", tasks=["rf_wall"], task_manager=tasks, batch_size=a.batch_size,
            model_args=f"base_url=http://127.0.0.1:{a.port}/v1/completions,model=smollm2,tokenizer={model.path},"
                       f"tokenizer_backend=huggingface,tokenized_requests=True,num_concurrent={a.concurrent},max_retries=1")
        served_s = time.perf_counter() - t
    finally:
        server.terminate()
        server.wait(30)
    t = time.perf_counter()
    local = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={model.path},dtype={a.dtype},device=cpu",
                                    tasks=["rf_wall"], task_manager=tasks, batch_size=a.batch_size)
    local_s = time.perf_counter() - t
    n = a.docs * len(ENDINGS)
    print(f"{n} loglikelihood requests ({a.docs} questions x {len(ENDINGS)} choices), {a.dtype}, batch {a.batch_size}, "
          f"{a.concurrent} concurrent")
    print("| backend | wall s | requests/s | acc |")
    print("|---|---|---|---|")
    for name, secs, res in (("local-completions -> rosefast (gunicorn)", served_s, served),
                            ("hf (in-process)", local_s, local)):
        print(f"| {name} | {secs:.1f} | {n / secs:.1f} | {res['results']['rf_wall']['acc,none']:.3f} |")
    print(f"rosefast / hf wall time: {served_s / local_s:.2f}x")


if __name__ == "__main__":
    main()
