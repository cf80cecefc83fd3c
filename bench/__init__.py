"""Benchmarks: `make bench` (python -m bench.run) measures every performance promise."""
