"""Linears on GGUF's Q4_1 / Q8_0 blocks: the compiled flavour (csrc/quant_kernels.h, AVX-512 VNNI) or its torch
twin (ROSEFAST_NO_EXTENSIONS=1, and for tests).

    if impl.fast(): y = impl.linear(x, w, d, m, bias, out_features, q8)   # tiles from quant_tiles
"""
from rosefast._select import select

impl = select("quant_ops", package="rosefast.models")
