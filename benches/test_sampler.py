"""The sampler's cost per step at batch 1, 32, 256 over SmolLM2's vocabulary (49,152), bf16 logits as the
model gives them: greedy, temperature 1, top_p 0.9, all three penalties, logprobs (top 5) — the batched
sampler beside the per-row loop it replaced (benches/row_sampler.py), which has no penalties or logprobs."""
import pytest
import torch

from benches.row_sampler import RowSampler
from rosefast.engine.sampler import Sampler
from rosefast.engine.sampling_params import SamplingParams
from rosefast.engine.sequence import Sequence

VOCAB = 49152
MODES = {
    "greedy": dict(temperature=0),
    "temperature": dict(temperature=1.0),
    "top_p": dict(temperature=1.0, top_p=0.9),
    "penalties": dict(temperature=1.0, repetition_penalty=1.1, frequency_penalty=0.5, presence_penalty=0.5),
    "logprobs": dict(temperature=1.0, logprobs=5),
}


@pytest.mark.parametrize("batch", [1, 32, 256], ids=lambda b: f"b{b}")
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("impl", ["batched", "row_loop"])
def test_sampler(benchmark, impl, mode, batch):
    if impl == "row_loop" and mode in ("penalties", "logprobs"):
        pytest.skip("the per-row loop had no penalties or logprobs")
    logits = (torch.randn(batch, VOCAB, generator=torch.Generator().manual_seed(0)) * 3).to(torch.bfloat16)
    params = SamplingParams(max_tokens=64, **MODES[mode])
    seqs = [Sequence(i, list(range(i, i + 40)), params, (0,), seed=i) for i in range(batch)]
    sampler = Sampler(VOCAB) if impl == "batched" else RowSampler()
    benchmark.group = f"sampler {mode} b{batch}"
    benchmark.extra_info.update(steps=1, impl=impl, mode=mode, batch=batch)
    rounds = 3 if impl == "row_loop" and batch == 256 else 10
    result = benchmark.pedantic(sampler, args=(logits, seqs), rounds=rounds, warmup_rounds=1)
    tokens = result.token_ids if impl == "batched" else result
    assert len(tokens) == batch and all(0 <= t < VOCAB for t in tokens)
