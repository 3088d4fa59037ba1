"""The model code: one module per family's layer and forward on the paged KV cache (llama, gpt2), the families'
registry (registry.FAMILIES), ModelArgs read from a config (args), the building blocks they share (layers), and
the linears they run (packed for oneDNN, quantized on the block kernels). Built into a ready model by
rosefast.build; nothing here reads a file or knows where a model came from (rosefast.sources)."""
