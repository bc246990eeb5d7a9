"""Temporary memory of a convolution op's kernels, forward and gradient.

LargeConv ops: the planner's own figure (`tf_largeconv.planning.plan_problem`), which
the kernel takes through TensorFlow's allocator and never exceeds. TensorFlow's kernels
(oneDNN's on this build's CPUs): a model of their scratch fitted to measured growth, see
`tf_conv_bytes`.
"""

from __future__ import annotations

import math
import os
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


# oneDNN reorders a convolution's activations into its blocked layout when both sides have
# at least this many channels: a copy of one activation tensor (forward and gradient), the
# size of the larger of input and output. Fitted as IM2COL_PIXELS_PER_THREAD (the ResNet,
# U-Net and RepLKNet cases of benchmarks.cpu.memory).
REORDER_MIN_CHANNELS = 64
REORDER_COPIES = (1, 1)


def tf_conv_bytes(
  in_shape: list[int],
  filter_shape: list[int],
  out_shape: list[int],
  itemsize: int,
  threads: int,
  depthwise: bool,
) -> tuple[int, int]:
  """TensorFlow's CPU convolution's scratch, (forward, gradient), for NHWC `in_shape` and
  HWIO `filter_shape` (HWCM for depthwise)."""
  patch = math.prod(filter_shape[:-2]) * (1 if depthwise else filter_shape[-2])
  base = (threads + 1) * math.prod(filter_shape) * itemsize
  if in_shape[0] > 1 and patch >= IM2COL_MIN_PATCH:
    base = threads * IM2COL_PIXELS_PER_THREAD * patch * itemsize
  if min(in_shape[-1], out_shape[-1]) < REORDER_MIN_CHANNELS:
    return base, base
  big = max(math.prod(in_shape), math.prod(out_shape)) * itemsize
  return base + int(REORDER_COPIES[0] * big), base + int(REORDER_COPIES[1] * big)


def _threads() -> int:
  from tf_largeconv.planning import device

  return device.intra_op_threads()


def _large_conv(op: Any, input_grad: bool) -> tuple[int, int]:
  forward, grads = large_conv_passes(op, input_grad)
  # The two gradient ops are independent: TF's executor may run them at once.
  return sum(forward), sum(grads)


def of(op: Any, input_grad: bool = True) -> tuple[int, int]:
  """(forward, gradient) temporary bytes of graph op `op`; 0 for ops that take none.
  `input_grad`: whether the gradient computes the input's gradient too."""
  if op.type in _optable.LARGE_CONVS and op.type != "LargeConv>Conv3D":
    return _large_conv(op, input_grad)
  if op.type not in _optable.TF_CONVS or op.type == "Conv3D":
    return 0, 0
  if op.type == "Conv2DBackpropInput":
    x, w = _shape(op.outputs[0]), _shape(op.inputs[1])
  else:
    x, w = _shape(op.inputs[0]), _shape(op.inputs[1])
  y = x if op.type == "Conv2DBackpropInput" else _shape(op.outputs[0])
  if op.type == "Conv2DBackpropInput":
    y = _shape(op.inputs[2])
  size = op.inputs[1].dtype.size
  return tf_conv_bytes(x, w, y, size, _threads(), op.type.startswith("Depthwise"))


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


def large_conv_passes(op: Any, input_grad: bool) -> tuple[tuple[int, ...], tuple[int, ...]]:
  """The workspaces of LargeConv op `op`'s kernels, each taken from the package's workspace
  pool (`Workspaces`): (the forward's,), (its gradients': input, filter); empty for other
  ops."""
  from tf_largeconv._problem import ConvProblem
  from tf_largeconv.ops.gradients import _CONV2D_ATTRS
  from tf_largeconv.ops.gradients import _decode
  from tf_largeconv.planning._plan import plan_problem

  skipped = ("LargeConv>Conv3D", "LargeConv>Conv2DRoute")
  if op.type not in _optable.LARGE_CONVS or op.type in skipped:
    return (), ()
  attrs = _decode({k: op.get_attr(k) for k in _CONV2D_ATTRS})
  out_is_input = op.type == "LargeConv>Conv2DBackpropInput"
  x, w = _shape(op.outputs[0] if out_is_input else op.inputs[0]), _shape(op.inputs[1])
  plan = plan_problem(ConvProblem.from_attrs(attrs).bind(x, w), op.inputs[1].dtype)
  grads = (plan.backprop_input if input_grad else None, plan.backprop_filter)
  forward = (plan.forward.workspace_bytes,) if plan.forward else ()
  return forward, tuple(p.workspace_bytes for p in grads if p)


def keeps_memory(op: Any) -> bool:
  """Whether LargeConv op `op` keeps memory between calls (its keep_memory attribute; the
  route op has none and runs no kernel of its own): its workspaces then go to the pool
  (`Workspaces`)."""
  try:
    return bool(op.get_attr("keep_memory"))
  except ValueError:
    return True


class Workspaces:
  """The package's workspace pool (`cc/tf/workspace_pool.cc`): a LargeConv kernel's
  workspace of 256 KiB or more is kept when the kernel returns, newest first, the oldest
  dropped beyond the budget (LARGECONV_WORKSPACE_POOL_MIB, default 128 MiB); a kernel takes
  the smallest kept one of its size up to twice it, or a new one."""

  MIN = 256 << 10

  def __init__(self) -> None:
    mib = os.environ.get("LARGECONV_WORKSPACE_POOL_MIB", "").strip()
    self.budget = (int(mib) if mib.isdigit() else 128) << 20
    self.idle: list[int] = []

  @property
  def held(self) -> int:
    return sum(self.idle)

  def run(self, sizes: tuple[int, ...]) -> int:
    """The bytes of workspace held while kernels of workspaces `sizes` run at once (the
    kept ones and theirs); then keeps theirs."""
    active = []
    for b in sizes:
      fits = [s for s in self.idle if b <= s <= 2 * b] if b >= self.MIN and self.budget else []
      if fits:
        self.idle.remove(min(fits))
      active.append(min(fits) if fits else b)
    now = self.held + sum(active)
    for b in active:
      if self.MIN <= b <= self.budget:
        self.idle.insert(0, b)
    while self.held > self.budget:
      self.idle.pop()
    return now
