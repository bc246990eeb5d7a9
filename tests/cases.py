"""Convolution configurations shared by the tests of the CUDA kernels (emulated on the host
in test_cuda_emulation.py, on a device in gpu/): every tiling edge the kernels have."""

import os

import numpy as np


def gpu_required():
  """True where GPU tests must run (LARGECONV_REQUIRE_GPU=1, set by `make gpu-check`): a
  skip for want of a GPU is then a failure."""
  return os.environ.get("LARGECONV_REQUIRE_GPU", "") not in ("", "0")


# (x NHWC, w HWIO, strides, padding, dilations)
CASES = [
  ((1, 9, 11, 1), (3, 3, 1, 1), (1, 1), "VALID", (1, 1)),
  ((2, 13, 10, 3), (5, 4, 3, 2), (1, 1), "SAME", (1, 1)),
  ((1, 40, 37, 1), (35, 33, 1, 3), (1, 1), "VALID", (1, 1)),  # chunks of 16 x 32 taps
  ((2, 21, 19, 4), (7, 6, 2, 6), (2, 3), "SAME", (1, 1)),  # grouped, unequal strides
  ((1, 23, 25, 2), (4, 5, 2, 4), (1, 1), "SAME", (3, 2)),  # dilations
  ((2, 27, 22, 6), (5, 3, 1, 6), (3, 2), "SAME", (2, 3)),  # depthwise, stride+dilation
  ((1, 12, 14, 5), (3, 3, 5, 7), (1, 1), ((2, 1), (0, 3)), (1, 1)),  # explicit, 7 = 4 + 3
  ((3, 8, 8, 2), (8, 8, 2, 1), (5, 5), "VALID", (1, 1)),
  ((1, 70, 9, 1), (2, 1, 1, 2), (33, 1), "SAME", (1, 1)),  # stride beyond the tile
  ((1, 6, 7, 1), (9, 11, 1, 1), (1, 1), "SAME", (1, 1)),  # filter larger than input
  ((0, 6, 7, 2), (3, 3, 2, 2), (1, 1), "SAME", (1, 1)),  # empty batch
]


def attrs(strides, padding, dilations, fmt):
  """strides, padding, explicit_paddings, dilations as Conv2D takes them in `fmt`."""
  s = [1, strides[0], strides[1], 1] if fmt == "NHWC" else [1, 1, strides[0], strides[1]]
  d = [1, dilations[0], dilations[1], 1] if fmt == "NHWC" else [1, 1, dilations[0], dilations[1]]
  if isinstance(padding, str):
    return s, padding, [], d
  (t, b), (l, r) = padding
  ex = [0, 0, t, b, l, r, 0, 0] if fmt == "NHWC" else [0, 0, 0, 0, t, b, l, r]
  return s, "EXPLICIT", ex, d


def to_format(fmt, a):
  """An NHWC array in `fmt`, contiguous."""
  return a if fmt == "NHWC" else np.ascontiguousarray(np.transpose(a, (0, 3, 1, 2)))
