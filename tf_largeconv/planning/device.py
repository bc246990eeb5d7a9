"""Where a convolution runs: the CPU threads TensorFlow gives its kernels, and whether an
op taking a tensor runs on a GPU."""

from __future__ import annotations

import functools
import os
from typing import Any

import tensorflow as tf


def intra_op_threads() -> int:
  """Threads TensorFlow's CPU kernels get (what the op plans its slots for)."""
  n = tf.config.threading.get_intra_op_parallelism_threads()
  if n > 0:
    return n
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not Linux
    return os.cpu_count() or 1


def runs_on_gpu(tensor: Any) -> bool:
  """Whether an op taking `tensor` runs on a GPU, as TensorFlow places it: where the tensor
  names a device (eager tensors always do; graph tensors under a tf.device scope), that
  device's type; otherwise a GPU if one is visible, as TF prefers it."""
  device = (getattr(tensor, "device", None) or "").upper()
  if "GPU" in device:
    return True
  if "CPU" in device:
    return False
  return _gpu_visible()


@functools.cache
def _gpu_visible() -> bool:
  # Logical devices are fixed once TensorFlow's runtime is up; asked once, not per trace.
  return bool(tf.config.list_logical_devices("GPU"))
