"""One module per model family, each written as its differences from the one it resembles (Llama for most)."""
