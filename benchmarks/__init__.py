"""Benchmarks and measurements of tf_largeconv, kept beside the package and not installed.

Run from the repository root, e.g. `python -m benchmarks.cpu.bench` (`make bench`),
`python -m benchmarks.demo` (`make demo`) or, on a GPU machine,
`python -m benchmarks.gpu.bench`. What they need beyond the package is its `bench` extra.
"""
