"""Loads the compiled op library exactly once, from one path, and checks that it was built
against the installed TensorFlow's minor release."""

import glob
import os
import warnings

import tensorflow as tf

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))


_ops = None
# Why the op library could not be loaded at import (None: it loaded). Then every op runs
# the portable path (stock TensorFlow ops, `tf_largeconv.ops.portable`).
_failure = None


def fix_hint(first=""):
  """How to get an op library that loads into the installed TensorFlow (`first`: one more
  way, named first)."""
  return (
    f"To fix it, {first}install the tf_largeconv wheel built for TensorFlow "
    f"{_minor(tf.__version__)} ('pip install --force-reinstall' it), or rebuild against the "
    "installed TensorFlow: 'make build' in a source checkout, or 'pip install "
    "--no-build-isolation --force-reinstall .'"
  )


def _library_path(stem):
  matches = sorted(glob.glob(os.path.join(_PKG_DIR, stem + "*.so")))
  if not matches:
    raise ImportError(
      f"tf_largeconv: compiled library '{stem}*.so' not found in {_PKG_DIR}. " + fix_hint()
    )
  return matches[0]


def _check_build_version():
  try:
    from tf_largeconv import _build_info
  except ImportError as e:
    raise ImportError(
      f"tf_largeconv: {_PKG_DIR}/_build_info.py is missing, so the op library's "
      "TensorFlow version is unknown. " + fix_hint()
    ) from e
  built = _build_info.TF_VERSION
  if _minor(built) != _minor(tf.__version__):
    raise ImportError(
      f"tf_largeconv was built against TensorFlow {built} but TensorFlow "
      f"{tf.__version__} is installed; its op library loads into TensorFlow "
      f"{_minor(built)}.x only. "
      + fix_hint(
        f"install TensorFlow {_minor(built)} (pip install 'tensorflow-cpu=={_minor(built)}.*' "
        f"or 'tensorflow=={_minor(built)}.*'), or "
      )
    )


def _minor(version):
  """'2.21' of '2.21.0' (or of '2.21.0rc1'). The op library is built per TensorFlow minor
  release (a wheel's extras pin it), so it is loaded into any patch release of its own; one
  that still fails to load there falls back as any other."""
  return ".".join(version.split(".")[:2])


def core():
  """Returns the framework-free core module (planner, geometry, host kernels)."""
  _library_path("_core")  # a missing build gets the message above, not a bare ImportError
  from tf_largeconv import _core

  return _core


def ops():
  """Returns the loaded op-library module, loading it on first use."""
  global _ops
  if _ops is None:
    _check_build_version()
    path = _library_path("_large_conv_ops")
    try:
      _ops = tf.load_op_library(path)
    except tf.errors.NotFoundError as e:
      raise ImportError(f"tf_largeconv: could not load {path}: {e.message}. " + fix_hint()) from e
  return _ops


def workspace_pool_stats():
  """The op library's pool of workspaces kept between calls (cc/tf/workspace_pool.h):
  (idle workspaces, their bytes, calls that reused one). For tests and diagnostics."""
  import ctypes

  ops()
  lib = ctypes.CDLL(_library_path("_large_conv_ops"))
  values = [ctypes.c_int64() for _ in range(3)]
  lib.LargeConvWorkspacePoolStats(*[ctypes.byref(v) for v in values])
  return tuple(v.value for v in values)


def spectrum_cache_stats():
  """The op library's cache of filter spectra kept between calls
  (cc/core/cpu/spectrum_cache.h): (entries, their bytes). For tests and diagnostics."""
  import ctypes

  ops()
  lib = ctypes.CDLL(_library_path("_large_conv_ops"))
  values = [ctypes.c_int64() for _ in range(2)]
  lib.LargeConvSpectrumCacheStats(*[ctypes.byref(v) for v in values])
  return tuple(v.value for v in values)


def op_library_cpu_isa():
  """The instruction-set level the op library's CPU kernels run at ('avx', 'avx2' or
  'avx512'; cc/core/cpu/isa.h), which it chooses on its first use as `_core` does."""
  import ctypes

  ops()
  fn = ctypes.CDLL(_library_path("_large_conv_ops")).LargeConvCpuIsa
  fn.restype = ctypes.c_char_p
  return fn().decode()


def _warn_cpu_isa():
  """Warns once where LARGECONV_ISA asks for what this CPU cannot run, or for no level."""
  problem = core().cpu_isa()["problem"]
  if problem:
    warnings.warn(f"tf_largeconv: {problem}", RuntimeWarning, stacklevel=4)


def load_or_fall_back():
  """Loads the op library at import. If it cannot be loaded (a TensorFlow upgrade, an ABI
  mismatch, a missing build), warns once with the reason and the rebuild command and
  records it: from then on every op runs the portable path. `_core`, which needs no
  TensorFlow, must still be there (its import errors name the rebuild command)."""
  global _failure
  core()
  _warn_cpu_isa()
  try:
    ops()
  except ImportError as e:
    _failure = str(e)
    warnings.warn(
      "tf_largeconv: the LargeConv op library could not be loaded, so every op runs the "
      "portable path (stock TensorFlow ops: the same results, more time and memory). "
      f"Reason: {_failure}",
      RuntimeWarning,
      stacklevel=3,
    )


def failure():
  """Why the op library could not be loaded at import, or None if it was loaded."""
  return _failure
