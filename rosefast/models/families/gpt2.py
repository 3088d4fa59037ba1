"""GPT-2: learned positions, LayerNorm, fused qkv, GELU, a tied lm_head (rosefast.models.gpt2): its own config
names, read whole here."""
from rosefast.models.family import Family


def _read_args(config):
    hidden, heads = config["n_embd"], config["n_head"]
    return dict(arch="gpt2", vocab_size=config["vocab_size"], hidden_size=hidden, num_layers=config["n_layer"],
                num_heads=heads, num_kv_heads=heads, head_dim=hidden // heads,
                intermediate_size=config.get("n_inner") or 4 * hidden, norm_eps=config.get("layer_norm_epsilon", 1e-5),
                max_position_embeddings=config["n_positions"], tie_word_embeddings=True,
                qkv_bias=True, o_bias=True, mlp_bias=True)


FAMILY = Family("gpt2", "gpt2", "GPT-2", read_args=_read_args, hf_config="GPT2Config", tiny_random_norms=False,
                tiny=dict(n_embd=64, n_layer=2, n_head=4, n_positions=1024, initializer_range=0.1))
