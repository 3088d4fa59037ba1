"""Linear weights packed once for oneDNN (CPU bf16): the same numbers as F.linear, for layers and models."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from rosefast import build
from rosefast.models.packed import PackedLinear, pack_linears, packing_available
from tests.paged import run_ours
from tests.test_model_runner import TEXTS, runner_for

pytestmark = pytest.mark.skipif(not packing_available(torch.bfloat16, torch.device("cpu")),
                                reason="oneDNN packed linear not available in this torch build")


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", [1, 5, 33, 100])
def test_packed_linear_gives_f_linear_numbers(bias, rows):
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(96, 64, generator=g).bfloat16()
    b = torch.randn(96, generator=g).bfloat16() if bias else None
    x = torch.randn(rows, 64, generator=g).bfloat16()
    layer = PackedLinear(w, b, batch_hint=8)
    assert (layer.in_features, layer.out_features) == (64, 96)
    assert torch.equal(layer(x), F.linear(x, w, b))


def linears(model):
    return [type(m).__name__ for m in model.modules() if isinstance(m, (nn.Linear, PackedLinear))]


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
def test_bf16_model_packed_gives_unpacked_logits(arch, monkeypatch):
    from rosefast.sources import load_tokenizer, tiny_random

    model = tiny_random(arch)
    prompts = [load_tokenizer(model)(t).input_ids for t in TEXTS]
    packed_runner = runner_for(model, dtype="bfloat16", device="cpu")   # packing is for CPU bf16
    assert set(linears(packed_runner.model)) == {"PackedLinear"}
    fast = run_ours(packed_runner, prompts, 4)
    monkeypatch.setattr(build, "pack_linears", lambda *a, **k: 0)   # (where the model is made)
    plain_runner = runner_for(model, dtype="bfloat16", device="cpu")
    assert set(linears(plain_runner.model)) == {"Linear"}
    ref = run_ours(plain_runner, prompts, 4, next_tokens=[[int(s[-1].argmax()) for s in seq[:-1]] for seq in fast])
    for a, b in zip(fast, ref):
        assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_fp32_and_other_devices_stay_on_f_linear():
    from rosefast.sources import tiny_random

    runner = runner_for(tiny_random("llama"), dtype="float32")
    assert set(linears(runner.model)) == {"Linear"} and runner.model.lm_head is None
    assert pack_linears(runner.model) == 0
    assert not packing_available(torch.bfloat16, torch.device("meta"))
