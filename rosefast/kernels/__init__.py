"""The kernels, each a selector with a compiled flavour and its torch twin (rosefast._select): a layer's small ops
and paged attention (layer_ops; Triton on CUDA), the linears on GGUF's block formats (quant_ops: a tier per CPU
family, csrc/quant_kernels.h) and a Llama layer's decode step as one call (decode_layer). They know tensors and
block tiles (rosefast.quant), never a model family or a file."""
