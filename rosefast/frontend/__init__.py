"""The path every token crosses on its way to the client: admission, collector (the merge), fanout — each
compiled, each with a pure twin (rosefast.EXTENSIONS and rosefast.flavours() report every compiled module)."""
