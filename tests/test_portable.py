"""The portable path (tf_largeconv/_portable.py): tf.nn.conv2d's results from stock TF ops,
under XLA too, with TF's own gradients, and one loop step within the workspace limit."""

import numpy as np
import pytest
import tensorflow as tf

from tf_largeconv import _args
from tf_largeconv import _loader
from tf_largeconv import _portable

CASES = [
    # (input NHWC, filter, strides, padding, dilations)
    ((2, 40, 50, 3), (7, 9, 3, 4), 1, "SAME", None),
    ((2, 40, 50, 3), (7, 9, 3, 4), (2, 3), "VALID", None),
    ((1, 40, 50, 4), (5, 5, 2, 6), 1, "SAME", None),  # grouped
    ((2, 40, 50, 3), (7, 9, 3, 4), 1, "SAME", (2, 3)),
    ((2, 40, 50, 3), (7, 9, 3, 4), 1, [[0, 0], [3, 1], [0, 5], [0, 0]], None),
    ((1, 23, 31, 2), (31, 5, 2, 2), (3, 1), "SAME", None),  # filter taller than the image
    ((1, 60, 70, 1), (41, 41, 1, 3), 1, "VALID", None),
]


def _to_nchw(shape):
  return (shape[0], shape[3], shape[1], shape[2])


def _run(x, w, strides, padding, data_format, dilations, limit=None):
  a = _args.conv_attrs(strides, padding, data_format, dilations)
  return _portable.conv2d(x, w, a["strides"], a["padding"], a["explicit_paddings"],
                          a["data_format"], a["dilations"], workspace_limit=limit)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[1])))
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
def test_matches_tf_conv2d_float64(rng, case, data_format):
  x_shape, w_shape, strides, padding, dilations = case
  x = rng.standard_normal(x_shape)
  w = rng.standard_normal(w_shape)
  want = tf.nn.conv2d(x, w, strides, padding, dilations=dilations).numpy()
  if data_format == "NCHW":
    x = np.transpose(x, (0, 3, 1, 2))
    if not isinstance(padding, str):
      padding = [padding[0], padding[3], padding[1], padding[2]]
  got = _run(tf.constant(x), tf.constant(w), strides, padding, data_format, dilations).numpy()
  if data_format == "NCHW":
    got = np.transpose(got, (0, 2, 3, 1))
  assert got.shape == want.shape
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * np.abs(want).max())


def test_geometry_agrees_with_the_package(rng):
  """The portable path's own padding formula equals the C++ geometry's on a grid."""
  core = _loader.core()
  for size in range(1, 30, 3):
    for k in (1, 2, 5, 8):
      for stride in (1, 2, 3):
        for dilation in (1, 2):
          for padding in ("SAME", "VALID", "EXPLICIT"):
            explicit = (int(rng.integers(0, 4)), int(rng.integers(0, 4)))
            if padding != "EXPLICIT" and padding == "VALID" and size < (k - 1) * dilation + 1:
              continue
            flat = [0, 0, *explicit, 0, 0, 0, 0] if padding == "EXPLICIT" else []
            try:
              g = core.geometry([1, size, 7, 1], [k, 1, 1, 1], [1, stride, 1, 1], padding,
                                flat, "NHWC", [1, dilation, 1, 1])
            except ValueError:
              with pytest.raises(ValueError):
                _portable.axis_geometry(size, k, stride, dilation, padding, explicit)
              continue
            out, before, _ = _portable.axis_geometry(size, k, stride, dilation, padding,
                                                     explicit)
            assert out == g["output_shape"][1], (size, k, stride, dilation, padding)
            assert before == g["pad_top"], (size, k, stride, dilation, padding)


def test_compiles_under_xla(rng):
  x = tf.constant(rng.standard_normal((2, 50, 60, 2)), tf.float32)
  w = tf.constant(rng.standard_normal((21, 21, 2, 3)), tf.float32)

  @tf.function(jit_compile=True)
  def run(x, w):
    return _run(x, w, 1, "SAME", "NHWC", None, limit=1 << 20)

  got = run(x, w).numpy()
  want = tf.nn.conv2d(x, w, 1, "SAME").numpy()
  np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max())


def test_gradients_are_tfs(rng):
  x = tf.constant(rng.standard_normal((1, 30, 26, 2)))
  w = tf.constant(rng.standard_normal((9, 7, 2, 3)))
  dy = tf.constant(rng.standard_normal((1, 15, 13, 3)))
  grads = []
  for fn in (lambda x, w: _run(x, w, 2, "SAME", "NHWC", None),
             lambda x, w: tf.nn.conv2d(x, w, 2, "SAME")):
    with tf.GradientTape() as tape:
      tape.watch([x, w])
      y = fn(x, w)
    grads.append(tape.gradient(y, [x, w], output_gradients=dy))
  for got, want in zip(*grads):
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=0,
                               atol=1e-11 * np.abs(want.numpy()).max())


def test_one_step_fits_the_limit():
  """Tile sizes and tiles per step are chosen so that one loop step fits the limit; a
  smaller limit gives smaller transforms; below the smallest step the error names it."""
  args = (4, 1, 3, 135, 135, 187, 347)
  big = _portable.plan_tiles(*args, 64 << 20)
  small = _portable.plan_tiles(*args, 4 << 20)
  for limit, p in ((64 << 20, big), (4 << 20, small)):
    assert _portable.step_bytes(4, 1, 3, p.fft_h, p.fft_w, p.per_step) <= limit, p
    assert p.per_step * p.steps >= p.tiles_h * p.tiles_w
    assert (p.tile_h * p.tiles_h >= 187) and (p.tile_w * p.tiles_w >= 347)
  assert small.fft_h * small.fft_w < big.fft_h * big.fft_w
  minimum = _portable.step_bytes(4, 1, 3, 135, 135, 1)
  assert _portable.plan_tiles(*args, minimum).fft_h == 135
  with pytest.raises(ValueError, match=f"needs at least {minimum} bytes"):
    _portable.plan_tiles(*args, minimum - 1)
