"""`tf_largeconv.info()`: what this installation runs, for bug reports and for checking an
install."""

from __future__ import annotations

import importlib
import os
from typing import Any

import tensorflow as tf

from tf_largeconv import _loader

VERSION = "0.1.0"


def _cuda_module() -> Any:
  """The `_cuda` module (the GPU kernels' own Python module), or None where it is not
  built."""
  try:
    return importlib.import_module("tf_largeconv._cuda")
  except ImportError:
    return None


def _cpu_isa(loaded: bool) -> dict[str, Any]:
  """info()'s `cpu_isa`: `_core`'s choice, with the level the op library runs."""
  choice = dict(_loader.core().cpu_isa())
  if loaded:
    choice["level"] = _loader.op_library_cpu_isa()
  return choice


def info() -> dict[str, Any]:
  """What this installation of tf_largeconv runs, as a dict.

  Keys:
    version: the package's version.
    tensorflow_built: the TensorFlow version the op library was compiled against (None
      where the build record is missing).
    tensorflow_running: the TensorFlow version imported now.
    op_library: the path of the op library file (None where there is none).
    cpu_kernels: whether the op library's CPU kernels are loaded.
    gpu_kernels: whether the op library holds CUDA kernels and TensorFlow sees a GPU for
      them to run on.
    cuda_built: whether the library was built with the CUDA kernels.
    cufft: where the CUDA kernels are built, what loading cuFFT (at run time, by soname)
      found: {'status': '' or why not, 'path': ..., 'version': ...}; None otherwise.
    fft_backend: the FFT library of each device: DUCC (TensorFlow's own copy) on the CPU,
      cuFFT on a GPU.
    tf_kernels_priced_as: 'onednn' or 'eigen', the TensorFlow CPU kernels the planner
      weighs its own against.
    tf_cpu_allocator: what serves TensorFlow's CPU tensors in this process, which decides
      whether a stream's `memory_limit` holds: 'onednn' (oneDNN's allocator: a pool),
      'bfc' (TF_CPU_ALLOCATOR_USE_BFC=true: a pool) or 'malloc' (no pool; the limit may be
      exceeded).
    cpu_isa: the instruction-set level of the CPU kernels: {'level': what the op library
      runs ('avx', 'avx2' or 'avx512'; `_core`'s where the library is not loaded),
      'available': the levels this CPU runs, 'requested': the LARGECONV_ISA environment
      variable (None where unset), 'problem': why that request was not followed, or ''}.
      AVX runs unless LARGECONV_ISA names a wider level this CPU has.
    fallback: why the op library could not be loaded, so that every op runs the portable
      path (stock TensorFlow ops); None where it was loaded.
  """
  try:
    _build_info = importlib.import_module("tf_largeconv._build_info")
    built, with_cuda = _build_info.TF_VERSION, bool(getattr(_build_info, "WITH_CUDA", False))
  except ImportError:
    built, with_cuda = None, False
  try:
    library: str | None = _loader._library_path("_large_conv_ops")
  except ImportError:
    library = None
  failure = _loader.failure()
  loaded = failure is None and library is not None
  cuda = _cuda_module()
  from tf_largeconv.planning import device

  return {
    "version": VERSION,
    "tensorflow_built": built,
    "tensorflow_running": tf.__version__,
    "op_library": os.path.abspath(library) if library else None,
    "cpu_kernels": loaded,
    "gpu_kernels": loaded and with_cuda and bool(tf.config.list_logical_devices("GPU")),
    "cuda_built": with_cuda,
    "cufft": dict(cuda.cufft()) if cuda is not None else None,
    "fft_backend": {"CPU": "DUCC (TensorFlow's copy)", "GPU": "cuFFT"},
    "tf_kernels_priced_as": _loader.core().tf_kernels(),
    "tf_cpu_allocator": device.allocator(),
    "cpu_isa": _cpu_isa(loaded),
    "fallback": failure,
  }
