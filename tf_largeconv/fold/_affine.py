"""A block tensor as an affine function of the block input (see the package docstring), and
the check that zero-padding it keeps the function exact at the border."""

import dataclasses

import tensorflow as tf

from tf_largeconv import ops as _ops
from tf_largeconv.fold import _kernels


@dataclasses.dataclass
class Affine:
  """A block tensor as an affine function of the block input."""

  kernel: tf.Tensor  # [kh, kw, C0 / groups, C]
  groups: int
  bias: object  # [C] tensor, or None where no bias can reach
  offset: tuple  # (oh, ow)
  size: tuple  # (height, width), for the input size the fold is made at
  stride: tuple = (1, 1)
  bias_from: str | None = None  # the layer that added the bias, for messages
  spill_from: str | None = None  # the last layer that spread the formula beyond the tensor's edge
  stride_from: str | None = None
  err: object = None  # (counting) the formula minus the tensor, on the probe input

  @property
  def channels(self):
    return self.kernel.shape[3]

  def border_issue(self, pads, in_size):
    """None if zero-padding this tensor by pads = (top, bottom, left, right) is exact,
    else why not. Row i of the formula reads input rows i*s - oh .. i*s - oh + kh - 1, so
    it is zero above the tensor when oh >= kh - 1, below when oh <= height - H."""
    if not any(pads):
      return None
    if self.bias is not None:
      return f"its input carries a bias (added by {self.bias_from})"
    kh, kw = self.kernel.shape[:2]
    zero = (
      self.offset[0] >= kh - 1,
      self.offset[0] <= self.size[0] - in_size[0],
      self.offset[1] >= kw - 1,
      self.offset[1] <= self.size[1] - in_size[1],
    )
    if all(z or not p for z, p in zip(zero, pads)):
      return None
    return (
      f"its input is not zero beyond its border (it comes from {self.spill_from}), "
      "while the padding is"
    )

  def formula(self, probe, pads):
    """(counting) The formula on the probe input over the tensor padded by pads."""
    kh, kw = self.kernel.shape[:2]
    lo = (-pads[0] - self.offset[0], -pads[2] - self.offset[1])
    hi = (
      self.size[0] + pads[1] + kh - 2 - self.offset[0],
      self.size[1] + pads[3] + kw - 2 - self.offset[1],
    )
    h, w = probe.shape[1:3]
    m = max(0, -lo[0], -lo[1], hi[0] - h + 1, hi[1] - w + 1)
    x = tf.pad(probe, [[0, 0], [m, m], [m, m], [0, 0]])
    x = x[:, lo[0] + m : hi[0] + m + 1, lo[1] + m : hi[1] + m + 1]
    f = _ops.conv2d(x, self.kernel, 1, "VALID")
    return f if self.bias is None else f + self.bias


def check_no_stride_before(t, desc, what):
  """Raises ValueError if t is strided: `what` (a layer's spatial part) cannot follow."""
  if t.stride != (1, 1):
    raise ValueError(
      f"{desc} has {what} after the stride of {t.stride_from}: a stride "
      "before a spatial kernel is not one convolution"
    )


def identity(channels, size, dtype):
  """The block input's own description."""
  return Affine(
    kernel=tf.ones([1, 1, 1, channels], dtype),
    groups=channels,
    bias=None,
    offset=(0, 0),
    size=tuple(size),
  )


def aligned(states):
  """The states' kernels zero-padded to one extent and offset; returns them, offset."""
  off = tuple(max(t.offset[a] for t in states) for a in (0, 1))
  ext = tuple(max(off[a] - t.offset[a] + t.kernel.shape[a] for t in states) for a in (0, 1))
  kernels = []
  for t in states:
    top, left = off[0] - t.offset[0], off[1] - t.offset[1]
    kernels.append(
      _kernels.pad_kernel(
        t.kernel, top, ext[0] - top - t.kernel.shape[0], left, ext[1] - left - t.kernel.shape[1]
      )
    )
  return kernels, off
