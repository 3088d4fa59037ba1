"""Generation defaults that come with a model: what a request leaves out, the model's own settings fill in
(as vLLM does by default). A Hugging Face directory's generation_config.json gives them; the embedded
default model carries the settings its model card recommends."""
import json

from rosefast.sources.resolve import DEFAULT_MODEL

FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
# SmolLM2-135M-Instruct's model card generates with temperature 0.2, top_p 0.9; its GGUF has no
# generation_config.json
EMBEDDED = {DEFAULT_MODEL: {"temperature": 0.2, "top_p": 0.9}}


def generation_defaults(model):
    """The sampling defaults of a ResolvedModel: {field: value} for the FIELDS it sets (may be empty)."""
    path = model.path / "generation_config.json"
    if path.is_file():
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
        return {k: config[k] for k in FIELDS if isinstance(config.get(k), (int, float))
                and not isinstance(config.get(k), bool)}
    return dict(EMBEDDED.get(model.source == "embedded" and model.name, {}))
