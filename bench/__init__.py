"""Benchmarks run side by side against what users would pick instead (``python -m bench``)."""
