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


def onednn() -> bool:
  """Whether TensorFlow runs oneDNN's operations, as it decides it and the planner reads it
  (`info()["tf_kernels_priced_as"]`): TF_ENABLE_ONEDNN_OPTS where it is 0, 1, false or
  true, else on where the x86 CPU has AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX. Where the
  compiled core is missing, the variable alone decides (on unless it says 0)."""
  try:
    from tf_largeconv import _loader

    return bool(_loader.core().tf_kernels() == "onednn")
  except ImportError:
    return os.environ.get("TF_ENABLE_ONEDNN_OPTS", "1").strip().lower() not in ("0", "false")


@functools.cache
def allocator() -> str:
  """TensorFlow's CPU allocator in this process, by TensorFlow's own word (it picks one when
  its runtime starts, and its pools report figures, `get_memory_info`, where malloc does
  not):
  - "malloc" where no pool reports figures: malloc serves every tensor;
  - "onednn" where oneDNN's operations are on (`onednn()`) and TF_CPU_ALLOCATOR_USE_BFC
    does not say 1 or true (any case): oneDNN's allocator, the pool for requests of 256
    KiB and more, malloc below;
  - else "bfc": TensorFlow's pool serves every tensor (TF_CPU_ALLOCATOR_USE_BFC=true, or
    a build that asks for it)."""
  try:
    tf.config.experimental.get_memory_info("CPU:0")
  except ValueError:
    return "malloc"
  setting = os.environ.get("TF_CPU_ALLOCATOR_USE_BFC")
  if (setting is None or setting.lower() not in ("1", "true")) and onednn():
    return "onednn"
  return "bfc"
