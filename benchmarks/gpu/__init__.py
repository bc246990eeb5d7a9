"""GPU benchmarks and probes of the CUDA kernels against cuDNN: torch and the built
tf_largeconv/_cuda extension (`make cuda`), no TensorFlow. Run from the repository root,
e.g. `python -m benchmarks.gpu.bench`."""

import os
import sys

_TESTS = os.path.join(
  os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tests"
)


def use_test_helpers():
  """Puts tests/gpu and tests/ on the module path: the benchmarks load the extension and
  run torch's convolutions as the GPU tests do (tests/gpu/conftest.py's load_extension,
  tests/gpu/torch_conv.py)."""
  for path in (os.path.join(_TESTS, "gpu"), _TESTS):
    if path not in sys.path:
      sys.path.append(path)
