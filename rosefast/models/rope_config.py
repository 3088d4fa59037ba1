"""A config's RoPE as ModelArgs holds it: (theta, sorted (key, value) pairs of its parameters)."""


def rope_of(config):
    """(theta, scaling) from a Hugging Face config dict's rope_parameters / rope_scaling / rope_theta."""
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    theta = params.pop("rope_theta", None) or config.get("rope_theta") or 10000.0
    rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params["rope_type"] = rope_type
    if rope_type == "longrope" and "original_max_position_embeddings" not in params:   # Phi-3's top-level field
        params["original_max_position_embeddings"] = config.get("original_max_position_embeddings")
    return float(theta), tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in params.items()))
