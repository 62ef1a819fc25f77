"""Benchmark suite of gpu-exporter (not part of the test suite; see BENCHMARKS.md).

`python bench/run_all.py [--quick]` runs every benchmark and writes `bench/results/`.
The modules keep their pure parts (statistics, /proc parsing, scenario and rule generation,
Markdown rendering) free of side effects so that `tests/test_bench.py` can test them.
"""
