"""Reading a mixture-of-experts config (Qwen3-MoE, Qwen2-MoE, Mixtral, OLMoE) into ModelArgs' expert fields, and
the GGUF keys llama.cpp's converter writes them as, for the MoE families' modules."""


def moe_fields(config):
    """{ModelArgs field: value} of a Hugging Face MoE config: the experts, top-k, an expert's width (Mixtral's is
    its intermediate_size), whether the top k are renormalized (Mixtral: always), a shared expert's width, and the
    layers left dense (`mlp_only_layers`, or off the `decoder_sparse_step`)."""
    n = config["num_hidden_layers"]
    step = config.get("decoder_sparse_step") or 1
    only = set(config.get("mlp_only_layers") or ())
    norm = config.get("norm_topk_prob")
    return {"num_experts": config.get("num_experts") or config["num_local_experts"],
            "experts_per_token": config["num_experts_per_tok"],
            "expert_size": config.get("moe_intermediate_size") or config["intermediate_size"],
            "norm_topk_prob": True if norm is None else bool(norm),
            "shared_expert_size": config.get("shared_expert_intermediate_size") or 0,
            "dense_layers": tuple(i for i in range(n) if i in only or (i + 1) % step)}


def gguf_moe_fixes(reader, arch, norm_topk_prob):
    """The config fields transformers' GGUF reader leaves out of an MoE file: an expert's width, a shared expert's,
    and the renormalization llama.cpp applies to this architecture (it is not in the file)."""
    fixes = {"norm_topk_prob": norm_topk_prob}
    width = reader.value(f"{arch}.expert_feed_forward_length")
    if width:
        fixes["moe_intermediate_size"] = int(width)
    shared = reader.value(f"{arch}.expert_shared_feed_forward_length")
    if shared:
        fixes["shared_expert_intermediate_size"] = int(shared)
    return fixes
