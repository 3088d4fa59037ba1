"""Reading a GGUF's metadata as llama.cpp writes it, for the families' gguf_fixes: `reader` is any object with
`value(key, default=None)` and `tensors` ({name: tensor with .data}), as rosefast.sources.gguf_file.GGUFFile has."""
import math


def tensor_values(reader, name):
    """A small tensor of the file (RoPE factors) as a list of floats, or None."""
    t = reader.tensors.get(name)
    return None if t is None else [float(x) for x in t.data.reshape(-1)]


def rope_scaling(reader, arch):
    """The global RoPE's scaling as a Hugging Face rope_parameters fragment (linear: Gemma 3's 4B and larger)."""
    kind = reader.value(f"{arch}.rope.scaling.type")
    factor = reader.value(f"{arch}.rope.scaling.factor")
    if kind == "linear" and factor and factor != 1.0:
        return {"rope_type": "linear", "factor": float(factor)}
    return {"rope_type": "default"}


def llama3_factors(inv_freq, factor, low, high, old_len):
    """llama.cpp's converter's `rope_freqs` for Llama 3's RoPE scaling: each frequency's divisor."""
    out = []
    for freq in inv_freq:
        wavelen = 2 * math.pi / freq
        if wavelen < old_len / high:
            out.append(1.0)
        elif wavelen > old_len / low:
            out.append(factor)
        else:
            smooth = (old_len / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return out
