"""Temporary memory of a convolution op's kernels, forward and gradient.

LargeConv ops: the planner's own figure (`tf_largeconv.planning.plan_from_attrs`), which
the kernel takes through TensorFlow's allocator and never exceeds. TensorFlow's kernels
(oneDNN's on this build's CPUs): a model of their scratch fitted to measured growth, see
`tf_conv_bytes`.
"""

from __future__ import annotations

import math
from typing import Any

from tf_largeconv.memory import _optable

# oneDNN's CPU convolutions run a direct (JIT) kernel, with scratch of a few filter copies
# per thread, unless the filter is large for its channels; then (more than one image) a
# GEMM over im2col patches, in blocks of about this many output pixels per thread.
# Fitted to RssAnon growth of tf.nn.conv2d in a fresh process (benchmarks.cpu.memory).
IM2COL_PIXELS_PER_THREAD = 3600
# The patch size (kernel area x input channels) from which oneDNN takes the im2col path.
IM2COL_MIN_PATCH = 4096


def _shape(t: Any) -> list[int]:
  return [int(d) if d is not None else 0 for d in t.shape]


def tf_conv_bytes(
  in_shape: list[int], filter_shape: list[int], itemsize: int, threads: int, depthwise: bool
) -> int:
  """TensorFlow's CPU convolution's scratch, forward, for NHWC `in_shape` and HWIO
  `filter_shape` (HWCM for depthwise)."""
  patch = math.prod(filter_shape[:-2]) * (1 if depthwise else filter_shape[-2])
  filter_bytes = math.prod(filter_shape) * itemsize
  if in_shape[0] > 1 and patch >= IM2COL_MIN_PATCH:
    return threads * IM2COL_PIXELS_PER_THREAD * patch * itemsize
  return (threads + 1) * filter_bytes


def _threads() -> int:
  from tf_largeconv.planning import device

  return device.intra_op_threads()


def _large_conv(op: Any) -> tuple[int, int]:
  from tf_largeconv.ops.gradients import _CONV2D_ATTRS
  from tf_largeconv.ops.gradients import _decode
  from tf_largeconv.planning._plan import plan_from_attrs

  if op.type == "LargeConv>Conv2DRoute":
    return 0, 0
  attrs = _decode({k: op.get_attr(k) for k in _CONV2D_ATTRS})
  if op.type == "LargeConv>Conv2DBackpropInput":
    x, w = _shape(op.outputs[0]), _shape(op.inputs[1])
  else:
    x, w = _shape(op.inputs[0]), _shape(op.inputs[1])
  plan = plan_from_attrs(x, w, attrs, op.inputs[1].dtype)
  passes = [p.workspace_bytes for p in (plan.backprop_input, plan.backprop_filter) if p]
  fwd = plan.forward.workspace_bytes if plan.forward else 0
  return fwd, max(passes, default=0)


def of(op: Any) -> tuple[int, int]:
  """(forward, gradient) temporary bytes of graph op `op`; 0 for ops that take none."""
  if op.type in _optable.LARGE_CONVS and op.type != "LargeConv>Conv3D":
    return _large_conv(op)
  if op.type not in _optable.TF_CONVS or op.type == "Conv3D":
    return 0, 0
  if op.type == "Conv2DBackpropInput":
    x, w = _shape(op.outputs[0]), _shape(op.inputs[1])
  else:
    x, w = _shape(op.inputs[0]), _shape(op.inputs[1])
  ws = tf_conv_bytes(x, w, op.inputs[1].dtype.size, _threads(), op.type.startswith("Depthwise"))
  return ws, ws


def largeconv_bound(op: Any) -> int | None:
  """The LargeConv planner's workspace for the forward pass of TF convolution op `op` (as
  LargeConv2D / LargeDepthwiseConv2D would run it), or None where it has no plan."""
  from tf_largeconv.planning import plan

  if op.type not in ("Conv2D", "DepthwiseConv2dNative"):
    return None
  padding = op.get_attr("padding").decode()
  if padding not in ("SAME", "VALID") or op.get_attr("data_format") != b"NHWC":
    return None
  x, w = _shape(op.inputs[0]), _shape(op.inputs[1])
  if op.type == "DepthwiseConv2dNative":  # a grouped convolution, one group per channel
    w = [w[0], w[1], 1, w[2] * w[3]]
  try:
    p = plan(x, w, list(op.get_attr("strides")), padding, dilations=list(op.get_attr("dilations")))
  except (ValueError, TypeError):
    return None
  return p.forward.workspace_bytes if p.forward else None
