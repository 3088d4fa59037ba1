"""How a model's prompt becomes one embedding: the pooling its own files name (sentence-transformers'
`modules.json` with a Pooling module's `config.json`, and a Normalize module or not), else the last token's
final hidden state, L2-normalized (vLLM's default for a decoder model)."""
import json
from dataclasses import dataclass

MODES = ("last", "mean", "cls")
_ST_MODES = {"pooling_mode_lasttoken": "last", "pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls"}


@dataclass(frozen=True)
class Pooling:
    mode: str = "last"        # last, mean or cls: which final hidden states make the vector
    normalize: bool = True    # L2-normalized
    source: str = "default"   # where it was read: "default" or "sentence-transformers"


def pooling_of(path):
    """The Pooling of the model directory at `path` (None: not a directory): its sentence-transformers modules
    where they name one this engine runs, else the default. A ValueError for a pooling it names that is not
    served (max, weighted mean...), naming it."""
    if path is None:
        return Pooling()
    try:
        with open(path / "modules.json", encoding="utf-8") as f:
            modules = json.load(f)
    except (OSError, ValueError):
        return Pooling()
    kinds = {m.get("type", "").rsplit(".", 1)[-1]: m.get("path", "") for m in modules if isinstance(m, dict)}
    if "Pooling" not in kinds:
        return Pooling()
    with open(path / kinds["Pooling"] / "config.json", encoding="utf-8") as f:
        config = json.load(f)
    chosen = [mode for key, mode in _ST_MODES.items() if config.get(key)]
    other = sorted(k for k, v in config.items() if k.startswith("pooling_mode") and v and k not in _ST_MODES)
    if len(chosen) != 1 or other:
        raise ValueError(f"the model's sentence-transformers pooling ({', '.join(other + chosen) or 'none'}) is "
                         f"not served: one of {', '.join(_ST_MODES)} is")
    return Pooling(chosen[0], "Normalize" in kinds, "sentence-transformers")
