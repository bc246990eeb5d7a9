"""Static shapes from the C++ shape functions agree with runtime shapes and with the
geometry the pybind11 module reports (one formula everywhere)."""

import numpy as np
import pytest
import tensorflow as tf

import tf_largeconv as lc
from tf_largeconv import _core

CASES = [
  ((2, 17, 19, 3), (5, 4, 3, 6), [1, 2, 3, 1], "SAME", [1, 1, 1, 1], "NHWC"),
  ((2, 17, 19, 3), (5, 4, 3, 6), [1, 2, 3, 1], "VALID", [1, 1, 1, 1], "NHWC"),
  ((1, 3, 21, 20), (3, 3, 3, 2), [1, 1, 2, 3], "SAME", [1, 1, 2, 1], "NCHW"),
  (
    (1, 21, 20, 3),
    (3, 3, 3, 2),
    [1, 1, 1, 1],
    [[0, 0], [1, 4], [2, 0], [0, 0]],
    [1, 3, 2, 1],
    "NHWC",
  ),
  (
    (1, 4, 21, 20),
    (2, 7, 2, 6),
    [1, 1, 3, 1],
    [[0, 0], [0, 0], [5, 4], [2, 0]],
    [1, 1, 1, 2],
    "NCHW",
  ),
  ((1, 5, 4, 1), (11, 13, 1, 1), [1, 2, 2, 1], "SAME", [1, 1, 1, 1], "NHWC"),
]


def _attrs(padding):
  if isinstance(padding, str):
    return padding, []
  return "EXPLICIT", [v for pair in padding for v in pair]


@pytest.mark.parametrize("case", CASES)
def test_static_shape_equals_runtime_and_core(case):
  x_shape, w_shape, strides, padding, dilations, fmt = case
  x = tf.zeros(x_shape)
  w = tf.zeros(w_shape)
  fn = tf.function(
    lambda a, b: lc.conv2d(a, b, strides, padding, fmt, dilations, algorithm="direct")
  )
  static = fn.get_concrete_function(tf.TensorSpec(x_shape), tf.TensorSpec(w_shape))
  static_shape = tuple(static.structured_outputs.shape.as_list())
  runtime_shape = tuple(fn(x, w).shape)
  pad, explicit = _attrs(padding)
  core_shape = _core.geometry(list(x_shape), list(w_shape), strides, pad, explicit, fmt, dilations)[
    "output_shape"
  ]
  assert static_shape == runtime_shape == tuple(core_shape)


def test_partially_known_shapes():
  fn = tf.function(lambda a, b: lc.conv2d(a, b, 2, "SAME"))
  out = fn.get_concrete_function(
    tf.TensorSpec((None, 31, None, 3)), tf.TensorSpec((5, 5, 3, 7))
  ).structured_outputs
  assert out.shape.as_list() == [None, 16, None, 7]
  out = fn.get_concrete_function(tf.TensorSpec(None), tf.TensorSpec(None)).structured_outputs
  assert out.shape.as_list() == [None, None, None, None]


def test_backprop_shape_functions():
  fn = tf.function(lambda w, dy: lc.conv2d_backprop_input([2, 9, 9, 3], w, dy, 2, "SAME"))
  out = fn.get_concrete_function(
    tf.TensorSpec((3, 3, 3, 4)), tf.TensorSpec((2, 5, 5, 4))
  ).structured_outputs
  assert out.shape.as_list() == [2, 9, 9, 3]
  fn = tf.function(lambda x, dy: lc.conv2d_backprop_filter(x, [3, 3, 3, 4], dy, 2, "SAME"))
  out = fn.get_concrete_function(
    tf.TensorSpec((2, 9, 9, 3)), tf.TensorSpec((2, 5, 5, 4))
  ).structured_outputs
  assert out.shape.as_list() == [3, 3, 3, 4]
  with pytest.raises(ValueError, match="out_backprop has shape"):
    fn.get_concrete_function(tf.TensorSpec((2, 9, 9, 3)), tf.TensorSpec((2, 9, 9, 4)))


def test_geometry_matches_tf_same_padding_rule():
  # TF's SAME rule: total = max((ceil(H/s)-1)*s + (K-1)*d + 1 - H, 0), smaller half first.
  for size in range(1, 30):
    for k in range(1, 9):
      for s in range(1, 4):
        for d in range(1, 3):
          g = _core.geometry(
            [1, size, 1, 1], [k, 1, 1, 1], [1, s, 1, 1], "SAME", [], "NHWC", [1, d, 1, 1]
          )
          out = -(-size // s)
          total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
          assert (g["out_h"], g["pad_top"], g["pad_bottom"]) == (
            out,
            total // 2,
            total - total // 2,
          )


def test_geometry_handles_sizes_beyond_int32():
  g = _core.geometry(
    [1, 46500, 46500, 1], [101, 101, 1, 8], [1, 1, 1, 1], "SAME", [], "NHWC", [1, 1, 1, 1]
  )
  assert g["output_shape"] == (1, 46500, 46500, 8)
  g = _core.geometry(
    [3, 2**33, 5, 2], [3, 3, 2, 4], [1, 1, 1, 1], "VALID", [], "NHWC", [1, 1, 1, 1]
  )
  assert g["out_h"] == 2**33 - 2
  assert g["macs"] == pytest.approx(3.0 * (2**33 - 2) * 3 * 4 * 9 * 2)


def test_core_forward_equals_tf_op(rng):
  for fmt, x_shape in (("NHWC", (2, 13, 12, 3)), ("NCHW", (2, 3, 13, 12))):
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal((4, 5, 3, 6)).astype(np.float32)
    ours = _core.conv2d(
      x,
      w,
      [1, 1, 2, 1] if fmt == "NHWC" else [1, 1, 1, 2],
      "SAME",
      [],
      fmt,
      [1, 1, 1, 1],
      algorithm="direct",
    )
    tf_op = lc.conv2d(x, w, [1, 2], "SAME", data_format=fmt, algorithm="direct")
    np.testing.assert_array_equal(ours, tf_op.numpy())
    assert ours.dtype == np.float32
    ours64 = _core.conv2d(
      x.astype(np.float64), w.astype(np.float64), [1, 1, 1, 1], "VALID", data_format=fmt
    )
    assert ours64.dtype == np.float64


def test_core_int32_equals_tf_op(rng):
  """_core's int32 kernels (exact) are the op's; its planner gives int32 no FFT."""
  x = rng.integers(-(2**31), 2**31, (2, 9, 8, 3)).astype(np.int32)
  w = rng.integers(-(2**31), 2**31, (4, 3, 3, 5)).astype(np.int32)
  dy = rng.integers(-(2**31), 2**31, (2, 9, 8, 5)).astype(np.int32)
  args = ([1, 1, 1, 1], "SAME")
  for ours, theirs in (
    (_core.conv2d(x, w, *args), lc.conv2d(x, w, 1, "SAME")),
    (
      _core.conv2d_backprop_input([2, 9, 8, 3], w, dy, *args),
      lc.conv2d_backprop_input([2, 9, 8, 3], w, dy, 1, "SAME"),
    ),
    (
      _core.conv2d_backprop_filter(x, [4, 3, 3, 5], dy, *args),
      lc.conv2d_backprop_filter(x, [4, 3, 3, 5], dy, 1, "SAME"),
    ),
  ):
    assert ours.dtype == np.int32
    np.testing.assert_array_equal(ours, theirs.numpy())
  assert all(
    p["algorithm"] == "direct"
    for p in _core.plan([2, 64, 64, 3], [31, 31, 3, 5], *args, dtype="int32")
  )
  with pytest.raises(ValueError, match="algorithm='fft' cannot compute integer dtypes"):
    _core.conv2d(x, w, *args, algorithm="fft")


def test_core_backprops_equal_tf_ops(rng):
  x = rng.standard_normal((2, 11, 10, 4))
  w = rng.standard_normal((3, 3, 2, 6))
  dy = rng.standard_normal((2, 6, 5, 6))
  args = ([1, 2, 2, 1], "SAME")
  np.testing.assert_array_equal(
    _core.conv2d_backprop_input([2, 11, 10, 4], w, dy, *args, algorithm="fft"),
    lc.conv2d_backprop_input([2, 11, 10, 4], w, dy, *args, algorithm="fft").numpy(),
  )
  np.testing.assert_array_equal(
    _core.conv2d_backprop_filter(x, [3, 3, 2, 6], dy, *args, algorithm="fft"),
    lc.conv2d_backprop_filter(x, [3, 3, 2, 6], dy, *args, algorithm="fft").numpy(),
  )


def test_core_rejects_bad_input():
  with pytest.raises(ValueError, match="padding"):
    _core.geometry([1, 5, 5, 1], [3, 3, 1, 1], [1, 1, 1, 1], "FULL")
  with pytest.raises(ValueError, match="larger than the padded input"):
    _core.conv2d(np.zeros((1, 2, 5, 1)), np.zeros((3, 3, 1, 1)), [1, 1, 1, 1], "VALID")
  with pytest.raises(ValueError, match="4-D"):
    _core.conv2d(np.zeros((2, 5, 1)), np.zeros((3, 3, 1, 1)), [1, 1, 1, 1], "VALID")
