"""lm-evaluation-harness scores a served model: its `local-completions` model against a real gunicorn, on
local multiple-choice and generate_until tasks, equals its own in-process `hf` backend on the same tiny
model in fp32 (loglikelihoods within 1e-3, the same greedy flags, the same generations)."""
import json
import os

import pytest

from rosefast.engine.llm_engine import LLMEngine
from rosefast.engine.sampling_params import SamplingParams
from benches.lm_eval_wall import mc_task
from tests.serving import Server, tiny_env

lm_eval = pytest.importorskip("lm_eval")

QUESTIONS = ["The capital of France is", "Two plus two equals", "The color of the sky is"]
TASKS = ["rf_mc", "rf_gen"]   # rf_mc: benches.lm_eval_wall.mc_task
GEN_TASK = """task: rf_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {dir}/gen.jsonl
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 8
  do_sample: false
  temperature: 0
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""


@pytest.fixture
def task_dir(tmp_path, tiny_llama):
    engine = LLMEngine(model=tiny_llama, dtype="float32", kv_cache_tokens=4096)
    greedy = [engine.generate([q], SamplingParams(max_tokens=1, temperature=0), use_tqdm=False)[0]["text"]
              for q in QUESTIONS]
    with open(tmp_path / "mc.jsonl", "w") as f:   # each question's choices include its greedy continuation
        for q, g in zip(QUESTIONS, greedy):
            f.write(json.dumps({"question": q, "choices": [" Paris", g, " blue and green"], "answer": 0}) + "\n")
    with open(tmp_path / "gen.jsonl", "w") as f:
        for q in ("Q: Say hello.\nA:", "Q: Count to three.\nA:"):
            f.write(json.dumps({"question": q, "answer": " hello"}) + "\n")
    (tmp_path / "rf_mc.yaml").write_text(mc_task("rf_mc", tmp_path / "mc.jsonl"))
    (tmp_path / "rf_gen.yaml").write_text(GEN_TASK.format(dir=tmp_path))
    return tmp_path


def responses(results, task):
    return [s["resps"] for s in sorted(results["samples"][task], key=lambda s: s["doc_id"])]


def test_local_completions_equals_the_hf_backend(task_dir, tiny_llama, monkeypatch):
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tasks = TaskManager(include_path=str(task_dir))
    server = Server(tiny_env(tiny_llama))
    try:
        served = lm_eval.simple_evaluate(
            model="local-completions", tasks=TASKS, task_manager=tasks, log_samples=True,
            model_args=f"base_url={server.url}/v1/completions,model=tiny,tokenizer={tiny_llama.path},"
                       "tokenizer_backend=huggingface,tokenized_requests=True,num_concurrent=2,max_retries=1")
    finally:
        server.stop()
    local = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={tiny_llama.path},dtype=float32,device=cpu",
                                    tasks=TASKS, task_manager=tasks, log_samples=True, batch_size=1)
    ours, theirs = responses(served, "rf_mc"), responses(local, "rf_mc")
    assert len(ours) == len(QUESTIONS)
    flags = []
    for doc_ours, doc_theirs in zip(ours, theirs):
        for (ll, greedy), (ll_hf, greedy_hf) in zip((r[0] for r in doc_ours), (r[0] for r in doc_theirs)):
            assert abs(ll - ll_hf) < 1e-3 and greedy == greedy_hf
            flags.append(greedy)
    assert any(flags) and not all(flags)   # the greedy continuations are recognised as such, the others not
    assert responses(served, "rf_gen") == responses(local, "rf_gen")
    assert served["results"]["rf_mc"]["acc,none"] == local["results"]["rf_mc"]["acc,none"]
