"""Weight-only quantized linear layers on CPU (ROSEFAST_QUANTIZATION): int4 as GGUF's Q4_1 (group 32, a scale
and a min), int8 as its Q8_0 (group 32, a scale) or per output channel, and a GGUF file's own blocks in any of
the formats the kernels take (Q4_0/Q4_1, Q5_0/Q5_1, Q8_0, Q4_K, Q5_K, Q6_K; a K-quant file such as Q4_K_M mixes
them tensor by tensor).

    count, source = quantize_linears(model, "auto", file_tiles)   # the file's blocks, else quantized at load

int4 is y = x W^T with W[n, k] = d[n, g] q[n, k] + m[n, g] (g = k // 32, q in 0..15): Q4_1 exactly. A GGUF
file's blocks and its lm_head's are taken as they are — no dequantize-and-requantize round trip; a fused q|k|v
whose parts differ in type is one BlockLinear of three parts — and a Hugging Face directory is quantized at load
with Q4_1's scheme (per group: d = (max - min) / 15, m = min; Q8_0: d = max |W| / 127).

Two ways to run them. Our kernels (rosefast.kernels.quant_ops, csrc/quant_kernels.h), on the tier the CPU runs
(AVX-512 VNNI, AVX-VNNI, AVX2, NEON or portable C; ROSEFAST_CPU_KERNELS picks one), on the blocks' own numbers
(re-laid out in tiles of 16 rows), the activations as two int8 digits per 32 inputs (finer than bf16; one digit,
llama.cpp's way, parted greedy texts): 1.5-3x torch's ops on AVX-512 VNNI. Or torch's CPU weight-only ops (the
pure-Python flavour, or ROSEFAST_CPU_KERNELS=torch): int4 with d and the zero m + 8 d rounded to bf16 (torch
computes (q - 8) scale + zero), int8 per output channel (s = max |W[n]| / 127; Q8_0 blocks are re-quantized so;
the other formats dequantized once and quantized again to these), on bf16 activations (their fp32 path is 20-60x
slower): the numbers of a bf16 model, no longer the file's.
"""
import logging

import torch
from torch import nn

from rosefast.config import QUANTIZATION_MODES
from rosefast.kernels import quant_ops
from rosefast.models.layers import layer_linears, put_linear
from rosefast.quant.formats import GROUP, dequantize_q8_0, quantize_int8, quantize_q4_1, quantize_q8_0
from rosefast.models.packed import PackedLinear
from rosefast.quant.tiles import dequantize_parts, dequantize_tiles, pack_tiles, unpack_tiles

log = logging.getLogger("rosefast.engine")



def block_kernels(setting="auto", activations="two-digit"):
    """Our block kernels' tier for a cpu_kernels setting with its activations' digits (rosefast.config.ACTIVATIONS),
    or None (torch's weight-only ops); a tier object passes through."""
    return quant_ops.pick(setting, activations) if isinstance(setting, str) else setting


class _TiledLinear(nn.Module):
    """What the quantized linears share: run on our kernels' tiles (self.weights), or on torch's op."""

    def _on_tiles(self, tiles):
        self.weights = quant_ops.impl.Weights(tiles, self.bias, self.in_features)

    @classmethod
    def of_tiles(cls, tiles, bias, kernels):
        """The layer on our kernels (a tier) with its weight already re-laid out (tiles_cache), nothing packed."""
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self.kernels, self.out_features, self.in_features = kernels, tiles.n, tiles.in_features
        self.bias = self._bias(bias)
        self._on_tiles([tiles])
        return self

    def _tiled(self, x):
        dt = x.dtype
        if x.dim() == 2 and (dt is torch.float32 or dt is torch.bfloat16):   # the model's case: no reshaping
            # (each no-op reshape, view or .to costs 0.5-4 us here, 120 linears a step)
            return self.kernels.linear(x.contiguous(), self.weights, quant_ops.step.sequences)
        x2 = x.reshape(-1, self.in_features).to(torch.bfloat16 if dt is torch.bfloat16 else torch.float32)
        y = self.kernels.linear(x2.contiguous(), self.weights, quant_ops.step.sequences)
        return y.to(dt).view(*x.shape[:-1], self.out_features)

    def _torch_op_out(self, y, x):
        """A torch weight-only op's bf16 output, the bias added, in x's dtype."""
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype)

    def _bias(self, bias):
        return None if bias is None else bias.detach().to(torch.float32 if self.kernels else torch.bfloat16)

    def _tiles_nbytes(self):
        return sum(t.nbytes() for t in self.weights.parts)

    def formats(self):
        """The block formats of its parts, in order ("torch" on torch's op)."""
        return [t.fmt for t in self.weights.parts] if self.kernels is not None else ["torch"]


class BlockLinear(_TiledLinear):
    """y = x W^T + b on our kernels with W as a GGUF file holds it: parts (quant_tiles.Tiles) one after another
    along the outputs, each in its own block format (a fused q|k|v whose v is Q6_K and q, k Q4_K)."""

    def __init__(self, tiles, bias=None, kernels="auto"):
        super().__init__()
        self.kernels = block_kernels(kernels)
        if self.kernels is None:
            raise ValueError("BlockLinear runs on the compiled block kernels; on torch's ops use torch_linear()")
        self.in_features, self.out_features = tiles[0].in_features, sum(t.n for t in tiles)
        self.bias = self._bias(bias)
        self._on_tiles(tiles)

    def forward(self, x):
        return self._tiled(x)

    def nbytes(self):
        return self._tiles_nbytes()

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"{'|'.join(f.upper() for f in self.formats())} on {self.kernels.name} block kernels")


class BlockEmbedding(nn.Module):
    """An embedding looked up in a GGUF's blocks as the kernels hold them (no table beside them): a tied model's
    in its lm_head's tiles (`shared`: counted there), an untied one's in its own. Each looked-up row is the file's
    numbers, as the converted table held them."""

    def __init__(self, weights, dtype, shared):
        """weights: quant_ops.impl.Weights (the lm_head's, or the embedding's own tiles')."""
        super().__init__()
        self.weights, self.dtype, self.shared = weights, dtype, shared
        self.num_embeddings, self.embedding_dim = weights.out_features, weights.in_features

    def forward(self, ids):
        return quant_ops.impl.rows(self.weights, ids, self.dtype)

    def nbytes(self):
        """Its tiles' bytes, 0 when they are the lm_head's."""
        return 0 if self.shared else sum(t.nbytes() for t in self.weights.parts)

    def extra_repr(self):
        whose = "the lm_head's" if self.shared else "its own"
        return f"{self.num_embeddings}, {self.embedding_dim}, {whose} {self.weights.parts[0].fmt.upper()} blocks"


def torch_linear(tiles, bias=None):
    """A file's blocks where torch's weight-only ops run them: Q4_1 (Q4_0) as they are, Q8_0 per channel, and any
    other format dequantized once and quantized again (4-bit formats to Q4_1, the rest to int8 per channel)."""
    fmts = {t.fmt for t in tiles}
    if fmts == {"q4_1"}:
        q, s, m = (torch.cat(x) for x in zip(*(unpack_tiles(t) for t in tiles)))
        return Int4Linear(q.to(torch.uint8), s[:, ::2].to(torch.float16), m.to(torch.float16), bias, None)
    weight = torch.cat([dequantize_tiles(t) for t in tiles])
    if fmts <= {"q4_1", "q4_k"}:
        return Int4Linear(*quantize_q4_1(weight), bias, None)
    return Int8Linear(*quantize_int8(weight), bias, None)


class Int4Linear(_TiledLinear):
    """y = x W^T + b with W as Q4_1: 4-bit q, a scale d and a min m per 32 inputs."""

    def __init__(self, q, d, m, bias=None, kernels="auto"):
        """q: [N, K] integers 0..15; d, m: [N, K / 32] float (Q4_1's scale and min); kernels: a cpu_kernels
        setting ("auto": the best tier here, a tier's name, "torch"), a tier (quant_ops.pick), or None (torch's
        op)."""
        super().__init__()
        self.out_features, self.in_features = q.shape
        self.kernels = block_kernels(kernels)
        self.bias = self._bias(bias)
        if self.kernels is not None:
            self._on_tiles([pack_tiles("q4_1", (q, d, m))])
            return
        scale, zero = d.to(torch.float32), m.to(torch.float32) + 8 * d.to(torch.float32)
        self.scales_zeros = torch.stack((scale.t(), zero.t()), dim=-1).to(torch.bfloat16).contiguous()  # [K/G, N, 2]
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), 2)

    def forward(self, x):
        if self.kernels is not None:
            return self._tiled(x)
        return self._torch_op_out(torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), self.packed, GROUP, self.scales_zeros), x)

    def nbytes(self):
        if self.kernels is not None:
            return self._tiles_nbytes()
        return self.packed.numel() * self.packed.element_size() + self.scales_zeros.numel() * 2

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, Q4_1 group {GROUP}, "
                f"{self.kernels.name + ' block kernels' if self.kernels is not None else 'torch int4 op'}")


class Int8Linear(_TiledLinear):
    """y = x W^T + b with W as int8: Q8_0 blocks (a scale per 32 inputs) on our kernels, per output channel
    on torch's op."""

    def __init__(self, q, scale, bias=None, kernels="auto"):
        """q: [N, K] int8; scale: [N] (per channel) or [N, K / 32] (Q8_0's d); kernels as Int4Linear's."""
        super().__init__()
        self.out_features, self.in_features = q.shape
        self.kernels = block_kernels(kernels)
        self.bias = self._bias(bias)
        if self.kernels is not None:
            blocks = scale if scale.dim() == 2 else scale[:, None].expand(-1, self.in_features // GROUP)
            self._on_tiles([pack_tiles("q8_0", (q, blocks))])
            return
        if scale.dim() == 2:
            q, scale = quantize_int8(dequantize_q8_0(q, scale))
        self.q = q.to(torch.int8).contiguous()
        self.scale = scale.to(torch.bfloat16).contiguous()

    @classmethod
    def from_weight(cls, weight, bias=None, kernels="auto"):
        """Quantized at load: Q8_0 blocks for our kernels, per channel for torch's op."""
        kernels = block_kernels(kernels)
        return cls(*(quantize_q8_0 if kernels is not None else quantize_int8)(weight), bias, kernels=kernels)

    def forward(self, x):
        if self.kernels is not None:
            return self._tiled(x)
        return self._torch_op_out(torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16), self.q, self.scale), x)

    def nbytes(self):
        if self.kernels is not None:
            return self._tiles_nbytes()
        return self.q.numel() + self.scale.numel() * 2

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                + (f"Q8_0 on {self.kernels.name} block kernels" if self.kernels is not None
                   else "int8 per channel, torch op"))


def check_mode(mode, device):
    if mode not in QUANTIZATION_MODES:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATION_MODES)}, got {mode!r}")
    if mode not in ("none", "auto") and device.type != "cpu":
        raise ValueError(f"quantization {mode!r} runs on CPU only here; on {device.type} use bf16 "
                         "(ROSEFAST_QUANTIZATION=none)")


def head_mode(setting, linears):
    """The lm_head's quantization for a `quantize_lm_head` setting, the linears' mode being `linears`: "auto" is
    int8 when the linears are quantized (see README, quantized linears: 1.3-3 ms a step less than the bf16 head at
    batch 1, unlike int4's, which costs the most accuracy; a GGUF's own head blocks where it has them), else none;
    "true" is the linears' own mode."""
    if setting == "true":
        return "int8" if linears == "blocks" else linears
    if setting == "auto":
        return "int8" if linears in ("int8", "int4", "blocks") else "none"
    return setting


def _from_file(tiles, bias, kernels):
    """A linear from a GGUF's blocks, re-laid out (tiles_cache: [Tiles, ...] along the rows): Q4_1 and Q8_0 alone
    as Int4Linear / Int8Linear, any other format or mix on our kernels as they are, or on torch's ops as
    torch_linear makes them."""
    if kernels is None:
        return torch_linear(tiles, bias)
    fmts = [t.fmt for t in tiles]
    if fmts == ["q4_1"] or fmts == ["q8_0"]:
        return (Int4Linear if fmts == ["q4_1"] else Int8Linear).of_tiles(tiles[0], bias, kernels)
    return BlockLinear(tiles, bias, kernels)


def _described(tiles):
    return "|".join(t.fmt.upper() for t in tiles)


def quantizes(mode, device):
    """Whether quantize_linears in `mode` on `device` quantizes at all (and so may take a GGUF's blocks, which the
    builder reads only then): none never; auto on a GPU keeps its dtype."""
    return mode != "none" and not (mode == "auto" and device.type != "cpu")


def quantize_linears(model, mode, from_file=None, head="none", kernels="auto", activations="two-digit"):
    """Replace the layers' qkv, o, gate_up and down (and the lm_head, by `head_mode(head, mode)`) by quantized
    ones; a GGUF file's blocks (`from_file`: the file's tiles, rosefast.sources.tiles_cache) are taken as they
    are where they are the mode's own (Q4_1 linears for int4, Q8_0 for int8; any other block formats for auto;
    the file's own head blocks for an int8 head); "auto" is the file's own blocks, whatever their formats, when every linear
    is in one the kernels take, else nothing; `kernels`: a cpu_kernels setting (`activations`: its digits). Returns
    (layers replaced, source)."""
    if not quantizes(mode, next(model.parameters()).device):
        return 0, None
    kernels = block_kernels(kernels, activations)
    own = {"q4_1": "int4", "q8_0": "int8", "blocks": "blocks"}.get(from_file["linears"]) if from_file else None
    if mode == "auto":
        if own is None:
            return 0, None
        mode = own
    count = 0
    for i, layer in enumerate(model.layers):
        for name in layer_linears(model.args, i):
            linear = layer.get_submodule(name)
            bias = linear.bias
            if own == mode:
                put_linear(layer, name, _from_file(from_file[i][name], bias, kernels))
                count += 1
                continue
            # a weight left in the file (loader.load_model(lean=True)): the blocks dequantized, then quantized
            weight = dequantize_parts(from_file[i][name]) if linear.weight.is_meta else linear.weight
            if mode == "int4":
                put_linear(layer, name, Int4Linear(*quantize_q4_1(weight), bias, kernels))
            else:
                put_linear(layer, name, Int8Linear.from_weight(weight, bias, kernels))
            count += 1
    asked, head = head, head_mode(head, mode)
    head_source = "quantized at load"
    if head != "none":
        stored = model.embed.weight if model.lm_head is None else model.lm_head.weight
        file_head = from_file.get("head") if from_file is not None else None

        def weight():   # to quantize at load; one left in the file (load_model(lean=True)) from its blocks
            return dequantize_parts(from_file["head"]) if stored.is_meta else stored
        if file_head is not None and asked == "int8" and file_head[0].fmt != "q8_0":
            file_head = None   # int8 asked for by name: Q8_0, the file's own only when it is that
        if head == "int4":
            model.lm_head = Int4Linear(*quantize_q4_1(weight()), kernels=kernels)
        elif file_head is not None and (kernels is not None or file_head[0].fmt == "q8_0"):
            model.lm_head, head_source = _from_file(file_head, None, kernels), f"the GGUF's {_described(file_head)} blocks"
            if model.args.tie_word_embeddings and kernels is not None and isinstance(model.embed, nn.Embedding):
                model.embed = BlockEmbedding(model.lm_head.weights, model.embed.weight.dtype, True)   # no table
                head_source += ", the embedding looked up in them"
        else:
            model.lm_head = Int8Linear.from_weight(weight(), kernels=kernels)
        count += 1
    embedding = ""
    if from_file is not None and "embed" in from_file and kernels is not None and isinstance(model.embed, nn.Embedding):
        tiles = from_file["embed"]
        weights = quant_ops.impl.Weights(tiles, None, tiles[0].in_features)
        model.embed = BlockEmbedding(weights, model.embed.weight.dtype, False)
        embedding = f", the embedding looked up in its own {_described(from_file['embed'])} blocks"   # no table
    if own == mode:
        source = f"the GGUF's {from_file['linears'].upper()} blocks" if mode != "blocks" else "the GGUF's blocks"
        types = ", ".join(f"{n} {c}" for n, c in sorted(from_file["types"].items()))
        source += f" ({types} tensors)" if mode == "blocks" else ""
    else:
        source = "quantized at load"
    on = f"our {kernels.name} block kernels{', one-digit activations' if kernels.digits == 1 else ''}" \
        if kernels is not None else (
        "torch's weight-only ops (bf16 numbers" + (": blocks dequantized once and quantized again to Q4_1 or int8)"
                                                   if mode == "blocks" else ")"))
    tiled = [m for m in model.modules() if isinstance(m, _TiledLinear)]
    total, params = sum(m.nbytes() for m in tiled), sum(m.out_features * m.in_features for m in tiled)
    log.info("quantization %s: %d linear layers (%s), lm_head %s (%s)%s, on %s; those layers %.1f MB, %.2f bits a "
             "weight", mode, count, source, head, head_source if head != "none" else "as loaded", embedding, on,
             total / 1e6, 8 * total / max(params, 1))
    return count, source


def weight_bytes(model):
    """(bytes of the weights as served, their count) — quantized layers at their packed size."""
    total = params = 0
    for module in model.modules():
        if isinstance(module, _TiledLinear):
            total += module.nbytes()
            params += module.out_features * module.in_features
        elif isinstance(module, BlockEmbedding):   # a tied one's tiles are the head's, counted there
            total += module.nbytes()
            params += module.num_embeddings * module.embedding_dim
        elif isinstance(module, PackedLinear):   # oneDNN's bf16 copy (of the embedding too, for a tied head)
            total += module.out_features * module.in_features * 2
            params += module.out_features * module.in_features
        else:
            for p in module.parameters(recurse=False):
                total += p.numel() * p.element_size()
                params += p.numel()
    return total, params
