"""The CUDA direct tile kernels (cc/core/cuda/tiles.h), run on the host by the emulator in
cc/core/cuda/emulate.h, against the float64 oracle. The emulator runs each phase of a block
for all its threads before the next, as __syncthreads() does, and poisons shared memory with
NaN before every load, so these tests check the exact index arithmetic the device runs:
tiling, patch bounds, strides, dilations, paddings, groups, layouts and the backprop-filter
slicing. The same kernels on a real GPU are tested in tests/gpu/."""

import itertools

import numpy as np
import pytest

from cases import CASES, attrs, to_format
from reference import Conv, assert_close
from tf_largeconv import _core

EMU = "cuda_emulation"


@pytest.mark.parametrize("case,fmt,dtype", list(itertools.product(
    CASES, ["NHWC", "NCHW"], [np.float32, np.float64])))
def test_emulated_tiles_match_oracle(rng, case, fmt, dtype):
  x_shape, w_shape, strides, padding, dilations = case
  x = rng.standard_normal(x_shape)
  w = rng.standard_normal(w_shape)
  xf = to_format(fmt, x).astype(dtype)
  ref = Conv(xf.shape, w_shape, strides, padding, dilations, fmt)
  dy = rng.standard_normal(ref.output_shape()).astype(dtype)
  s, pad, ex, d = attrs(strides, padding, dilations, fmt)
  name = np.dtype(dtype).name
  kwargs = dict(explicit_paddings=ex, data_format=fmt, dilations=d, algorithm=EMU)

  y = _core.conv2d(xf, w.astype(dtype), s, pad, **kwargs)
  want = ref.forward(xf, w)
  mag = ref.forward(np.abs(xf), np.abs(w))
  assert_close(y, want, name, w_shape[0] * w_shape[1] * w_shape[2], mag, "forward")

  dx = _core.conv2d_backprop_input(list(xf.shape), w.astype(dtype), dy, s, pad, **kwargs)
  want = ref.backprop_input(w, dy)
  mag = ref.backprop_input(np.abs(w), np.abs(dy))
  assert_close(dx, want, name, w_shape[0] * w_shape[1] * w_shape[3], mag, "backprop_input")

  dw = _core.conv2d_backprop_filter(xf, list(w_shape), dy, s, pad, **kwargs)
  want = ref.backprop_filter(xf, dy)
  mag = ref.backprop_filter(np.abs(xf), np.abs(dy))
  assert_close(dw, want, name, int(np.prod(ref.output_shape())), mag, "backprop_filter")


@pytest.mark.parametrize("limit", [0, 3000, -1])
def test_backprop_filter_slicing_is_exact_under_any_limit(rng, limit):
  """Backprop-filter's batch slices and their fixed-order reduction: one slice (no
  workspace), a few, and the default number all give the oracle's answer."""
  x = rng.standard_normal((4, 19, 17, 2))
  w_shape = (6, 5, 2, 3)
  ref = Conv(x.shape, w_shape, (1, 1), "SAME")
  dy = rng.standard_normal(ref.output_shape())
  dw = _core.conv2d_backprop_filter(x, list(w_shape), dy, [1, 1, 1, 1], "SAME", algorithm=EMU,
                                    workspace_limit=limit)
  mag = ref.backprop_filter(np.abs(x), np.abs(dy))
  assert_close(dw, ref.backprop_filter(x, dy), "float64", int(np.prod(dy.shape)), mag)


def test_emulated_tiles_propagate_non_finite_values():
  x = np.ones((1, 6, 6, 1), np.float32)
  x[0, 2, 3, 0] = np.inf
  y = _core.conv2d(x, np.ones((3, 3, 1, 1), np.float32), [1, 1, 1, 1], "VALID", algorithm=EMU)
  want = Conv(x.shape, (3, 3, 1, 1)).forward(x, np.ones((3, 3, 1, 1)))
  np.testing.assert_array_equal(y, want.astype(np.float32))
