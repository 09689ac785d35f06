"""Benchmarks: speed and accuracy measurements printed as ratios taken in one run.

Run all with ``python -m benchmarks`` or one with ``python -m benchmarks NAME [ARGS...]``; the
names are the keys of :data:`benchmarks.__main__.BENCHMARKS`. Nothing here asserts on time.
"""
