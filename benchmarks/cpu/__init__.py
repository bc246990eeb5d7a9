"""CPU benchmarks: tf_largeconv against TensorFlow's own kernels (and scipy, dask-image),
each case in a fresh process. The entry point is `python -m benchmarks.cpu.bench`."""
