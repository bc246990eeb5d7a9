"""Gradients of tf_largeconv.conv2d: numerical Jacobians for both inputs, the backprop ops
against the float64 oracle (incl. dilations and NCHW, which TF's CPU kernels lack), and
second-order gradients against TF."""

import numpy as np
import pytest
import tensorflow as tf
from reference import Conv
from reference import planned_fft

import tf_largeconv as lc

JACOBIAN_CASES = [
  # (input NHWC, filter, strides, padding, dilations)
  ((1, 6, 7, 2), (3, 3, 2, 3), (1, 1), "SAME", (1, 1)),
  ((2, 7, 6, 2), (3, 2, 2, 2), (2, 1), "VALID", (1, 1)),
  ((1, 8, 8, 1), (3, 3, 1, 2), (1, 2), "SAME", (2, 2)),
  ((1, 7, 6, 2), (2, 3, 2, 9), (1, 1), [[0, 0], [1, 2], [0, 1], [0, 0]], (1, 1)),
  ((1, 5, 5, 4), (3, 3, 2, 4), (1, 1), "SAME", (1, 1)),  # grouped, 2 groups
]


def _to_nchw(pad):
  return pad if isinstance(pad, str) else [pad[0], pad[3], pad[1], pad[2]]


@pytest.mark.parametrize("algorithm", ["direct", "fft"])
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
@pytest.mark.parametrize("case", JACOBIAN_CASES)
def test_jacobians_both_inputs(rng, case, data_format, algorithm):
  x_shape, w_shape, s, p, d = case
  if data_format == "NCHW":
    x_shape = (x_shape[0], x_shape[3], x_shape[1], x_shape[2])
    p = _to_nchw(p)
  x = tf.constant(rng.standard_normal(x_shape))
  w = tf.constant(rng.standard_normal(w_shape))

  def f(a, b):
    return lc.conv2d(
      a, b, list(s), p, data_format=data_format, dilations=list(d), algorithm=algorithm
    )

  theoretical, numerical = tf.test.compute_gradient(f, [x, w])
  assert len(theoretical) == 2
  for t, n in zip(theoretical, numerical):
    assert t.shape == n.shape and t.size > 0
    np.testing.assert_allclose(t, n, rtol=1e-6, atol=1e-6)


BACKPROP_CASES = [
  ((2, 12, 11, 3), (3, 4, 3, 5), (1, 1), "SAME", (1, 1)),
  ((1, 15, 16, 2), (5, 5, 2, 16), (2, 3), "VALID", (1, 1)),
  ((2, 14, 13, 4), (3, 3, 4, 12), (2, 2), "SAME", (2, 3)),
  ((1, 13, 12, 2), (4, 3, 2, 2), (3, 2), ((1, 2), (3, 0)), (2, 1)),
  ((1, 30, 31, 1), (21, 20, 1, 3), (1, 1), "SAME", (1, 1)),
  ((1, 9, 10, 6), (3, 3, 2, 9), (1, 2), "SAME", (1, 2)),  # 3 groups, 3 out per group
  ((1, 9, 10, 8), (3, 3, 2, 40), (2, 1), "VALID", (1, 1)),  # 4 groups, 10 out per group
  ((2, 11, 9, 3), (41, 41, 3, 2), (1, 1), "SAME", (1, 1)),
]


@pytest.mark.parametrize("algorithm", ["direct", "fft"])
@pytest.mark.parametrize("dtype_name", ["float64", "float32", "float16", "bfloat16"])
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
@pytest.mark.parametrize("case", BACKPROP_CASES)
def test_backprop_ops_match_oracle(rng, case, data_format, dtype_name, algorithm):
  x_shape, w_shape, s, p, d = case
  dtype = tf.as_dtype(dtype_name)
  if data_format == "NCHW":
    x_shape = (x_shape[0], x_shape[3], x_shape[1], x_shape[2])
  ref = Conv(x_shape, w_shape, s, p, d, data_format)
  if isinstance(p, str):
    pad_arg = p
  else:
    (t, b), (l, r) = p
    pad_arg = (
      [[0, 0], [t, b], [l, r], [0, 0]]
      if data_format == "NHWC"
      else [[0, 0], [0, 0], [t, b], [l, r]]
    )
  x = tf.cast(rng.standard_normal(x_shape), dtype)
  w = tf.cast(rng.standard_normal(w_shape), dtype)
  dy = tf.cast(rng.standard_normal(ref.output_shape()), dtype)
  with tf.GradientTape() as tape:
    tape.watch([x, w])
    y = lc.conv2d(
      x, w, list(s), pad_arg, data_format=data_format, dilations=list(d), algorithm=algorithm
    )
  dx, dw = tape.gradient(y, [x, w], output_gradients=dy)
  assert dx.dtype == dtype and dw.dtype == dtype
  xd, wd, dyd = (tf.cast(t, tf.float64).numpy() for t in (x, w, dy))
  fft = planned_fft(
    lc.plan(
      x_shape,
      w_shape,
      list(s),
      pad_arg,
      data_format=data_format,
      dilations=list(d),
      dtype=dtype,
      algorithm=algorithm,
    ).passes
  )
  assert all((f is not None) == (algorithm == "fft") for f in fft.values()), fft
  ref.check_passes(
    dtype_name,
    fft,
    xd,
    wd,
    dyd,
    dx=tf.cast(dx, tf.float64),
    dw=tf.cast(dw, tf.float64),
    what=f"({algorithm}) ",
  )


@pytest.mark.parametrize("algorithm", ["direct", "fft"])
@pytest.mark.parametrize("padding", ["SAME", "VALID"])
@pytest.mark.parametrize("strides", [1, 2])
def test_first_and_second_order_match_tf(rng, strides, padding, algorithm):
  x0 = rng.standard_normal((2, 9, 10, 3))
  w0 = rng.standard_normal((3, 4, 3, 4))
  results = []
  ours = lambda *a: lc.conv2d(*a, algorithm=algorithm)  # noqa: E731
  for conv in (ours, tf.nn.conv2d):
    x, w = tf.Variable(x0), tf.Variable(w0)
    with tf.GradientTape(persistent=True) as outer:
      with tf.GradientTape() as inner:
        y = conv(x, w, strides, padding)
        loss = tf.reduce_sum(tf.sin(y))
      gx, gw = inner.gradient(loss, [x, w])
      second = tf.reduce_sum(gx * gx) + tf.reduce_sum(tf.cos(gw))
    results.append([y, gx, gw] + outer.gradient(second, [x, w]))
  for got, want in zip(*results):
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-9, atol=1e-9)


def test_gradient_inside_tf_function(rng):
  x = tf.constant(rng.standard_normal((1, 12, 12, 2)), tf.float32)
  w = tf.constant(rng.standard_normal((5, 5, 2, 3)), tf.float32)

  @tf.function
  def grads(a, b, conv):  # a 5x5 filter on 2 channels: auto plans our own FFT here
    with tf.GradientTape() as tape:
      tape.watch([a, b])
      loss = tf.reduce_sum(conv(a, b, 1, "SAME") ** 2)
    return tape.gradient(loss, [a, b])

  for ours, theirs in zip(grads(x, w, lc.conv2d), grads(x, w, tf.nn.conv2d)):
    np.testing.assert_allclose(ours, theirs, rtol=2e-4, atol=2e-4)
