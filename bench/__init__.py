"""Benchmarks: every figure measured side by side with its peer in one run, reported as a ratio."""
