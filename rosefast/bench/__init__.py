"""The streaming benchmark: `python -m rosefast.bench.streaming` (in-process, or --url over HTTP)."""
