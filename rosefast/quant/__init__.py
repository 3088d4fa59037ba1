"""Quantization as data: GGUF's block formats unpacked, dequantized and made (formats), and the tiles the block
kernels read, 16 rows interleaved (tiles). numpy and torch only: no kernels, no models, no files."""
