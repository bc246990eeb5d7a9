"""Depthwise and grouped convolution: forward and both gradients against the float64
oracle, against tf.nn.depthwise_conv2d / tf.nn.conv2d where TF computes them, and bad
group configurations."""

import numpy as np
import pytest
import tensorflow as tf
from reference import Conv
from reference import PassCheck
from reference import planned_fft
from reference import tolerance

import tf_largeconv as lc

# (input NHWC, kernel (h, w), multiplier, strides, padding, dilations)
DEPTHWISE = [
  ((2, 12, 13, 3), (1, 1), 1, (1, 1), "SAME", (1, 1)),
  ((1, 14, 15, 4), (3, 3), 2, (1, 1), "SAME", (1, 1)),
  ((2, 17, 16, 5), (5, 4), 3, (2, 1), "VALID", (1, 1)),  # unequal strides
  ((1, 19, 21, 3), (3, 3), 1, (2, 2), "SAME", (2, 2)),  # stride with dilation
  ((1, 20, 18, 2), (4, 5), 2, (1, 3), ((1, 2), (3, 0)), (2, 1)),
  ((1, 24, 22, 6), (13, 13), 1, (1, 1), "SAME", (1, 1)),
  ((1, 40, 38, 3), (31, 31), 1, (1, 1), "SAME", (1, 1)),
  ((1, 20, 23, 2), (51, 51), 2, (1, 1), "SAME", (1, 1)),  # filter > input
  ((4, 9, 9, 20), (7, 7), 1, (1, 1), "SAME", (1, 1)),  # more groups than a batch
]


def _case_id(c):
  x, k, m, s, p, d = c
  return f"x{'x'.join(map(str, x))}-k{k[0]}x{k[1]}-m{m}-s{s[0]}{s[1]}-{p}-d{d[0]}{d[1]}"


def _pad_arg(p, fmt):
  if isinstance(p, str):
    return p
  (t, b), (l, r) = p
  return [[0, 0], [t, b], [l, r], [0, 0]] if fmt == "NHWC" else [[0, 0], [0, 0], [t, b], [l, r]]


@pytest.mark.parametrize("algorithm", ["direct", "fft"])
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
@pytest.mark.parametrize("case", DEPTHWISE, ids=[_case_id(c) for c in DEPTHWISE])
def test_depthwise_forward_and_gradients_match_oracle(rng, case, data_format, algorithm):
  x_shape, (kh, kw), mult, s, p, d = case
  c = x_shape[3]
  if data_format == "NCHW":
    x_shape = (x_shape[0], x_shape[3], x_shape[1], x_shape[2])
  x = tf.constant(rng.standard_normal(x_shape))
  f = tf.constant(rng.standard_normal((kh, kw, c, mult)))
  grouped = f.numpy().reshape(kh, kw, 1, c * mult)
  ref = Conv(x_shape, grouped.shape, s, p, d, data_format)
  dy = tf.constant(rng.standard_normal(ref.output_shape()))
  with tf.GradientTape() as tape:
    tape.watch([x, f])
    y = lc.depthwise_conv2d(
      x,
      f,
      list(s),
      _pad_arg(p, data_format),
      data_format=data_format,
      dilations=list(d),
      algorithm=algorithm,
    )
  dx, df = tape.gradient(y, [x, f], output_gradients=dy)
  xn, dyn = x.numpy(), dy.numpy()
  fft = planned_fft(
    lc.plan(
      x_shape,
      grouped.shape,
      list(s),
      _pad_arg(p, data_format),
      data_format=data_format,
      dilations=list(d),
      dtype=tf.float64,
      algorithm=algorithm,
    ).passes
  )
  assert all((f is not None) == (algorithm == "fft") for f in fft.values()), fft
  ref.check("forward", y, xn, grouped, "float64", fft["forward"])
  ref.check("backprop_input", dx, grouped, dyn, "float64", fft["backprop_input"])
  # The op's filter gradient is the grouped one, reshaped to the depthwise filter's shape.
  ref.check(
    "backprop_filter", np.reshape(df, grouped.shape), xn, dyn, "float64", fft["backprop_filter"]
  )


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("algorithm", ["direct", "fft"])
def test_depthwise_dtypes(rng, dtype, algorithm):
  x = tf.cast(rng.standard_normal((2, 20, 21, 4)), dtype)
  f = tf.cast(rng.standard_normal((9, 9, 4, 2)), dtype)
  y = lc.depthwise_conv2d(x, f, [1, 1, 1, 1], "SAME", algorithm=algorithm)
  assert y.dtype == dtype
  xd, fd = tf.cast(x, tf.float64).numpy(), tf.cast(f, tf.float64).numpy()
  g = fd.reshape(9, 9, 1, 8)
  ref = Conv(xd.shape, g.shape, (1, 1), "SAME")
  fft = planned_fft(lc.plan(xd.shape, g.shape, 1, "SAME", dtype=dtype, algorithm=algorithm).passes)[
    "forward"
  ]
  ref.check("forward", tf.cast(y, tf.float64), xd, g, dtype, fft)


@pytest.mark.parametrize(
  "case",
  [c for c in DEPTHWISE if c[3][0] == c[3][1] and (c[3] == (1, 1) or c[5] == (1, 1))],
  ids=_case_id,
)
def test_depthwise_matches_tf_where_tf_computes_it(rng, case):
  x_shape, (kh, kw), mult, s, p, d = case
  x = rng.standard_normal(x_shape).astype(np.float32)
  f = rng.standard_normal((kh, kw, x_shape[3], mult)).astype(np.float32)
  pad = _pad_arg(p, "NHWC")
  want = tf.nn.depthwise_conv2d(x, f, [1, s[0], s[1], 1], pad, dilations=list(d)).numpy()
  got = lc.depthwise_conv2d(x, f, [1, s[0], s[1], 1], pad, dilations=list(d)).numpy()
  scale = np.abs(want).max()
  assert np.abs(got - want).max() <= 1e-5 * scale * np.sqrt(kh * kw)


def test_stride_with_dilation_is_right_where_tf_is_not(rng):
  x = rng.standard_normal((1, 19, 21, 3))
  f = rng.standard_normal((3, 3, 3, 1))
  got = lc.depthwise_conv2d(x, f, [1, 2, 2, 1], "SAME", dilations=[2, 2]).numpy()
  ref = Conv(x.shape, (3, 3, 1, 3), (2, 2), "SAME", (2, 2))
  np.testing.assert_allclose(got, ref.forward(x, f.reshape(3, 3, 1, 3)), rtol=1e-10, atol=1e-10)


# (input NHWC, filter, strides, padding) with groups = C_in / filter in-depth.
GROUPED = [
  ((2, 16, 15, 8), (3, 3, 4, 6), (1, 1), "SAME"),  # 2 groups
  ((1, 20, 21, 9), (7, 5, 3, 6), (2, 1), "VALID"),  # 3 groups
  ((1, 30, 28, 8), (21, 21, 2, 8), (1, 1), "SAME"),  # 4 groups
  ((2, 12, 12, 32), (5, 5, 8, 16), (1, 2), "SAME"),  # 4 groups, more channels
]


@pytest.mark.parametrize("algorithm", ["direct", "fft"])
@pytest.mark.parametrize("case", GROUPED)
def test_grouped_matches_tf_conv2d_and_oracle(rng, case, algorithm):
  x_shape, w_shape, s, p = case
  x = tf.constant(rng.standard_normal(x_shape), tf.float32)
  w = tf.constant(rng.standard_normal(w_shape), tf.float32)
  ref = Conv(x_shape, w_shape, s, p)
  dy = tf.constant(rng.standard_normal(ref.output_shape()), tf.float32)
  with tf.GradientTape(persistent=True) as tape:
    tape.watch([x, w])
    ours = lc.conv2d(x, w, list(s), p, algorithm=algorithm)
    theirs = tf.nn.conv2d(x, w, list(s), p)
  xn, wn, dyn = x.numpy(), w.numpy(), dy.numpy()
  fft = planned_fft(lc.plan(x_shape, w_shape, list(s), p, algorithm=algorithm).passes)
  grads = tape.gradient(ours, [x, w], output_gradients=dy)
  ref.check_passes("float32", fft, xn, wn, dyn, ours, *grads)
  check = PassCheck(ref, "forward", xn, wn)
  # TF sums directly in float32: its own elementwise bound adds to ours.
  check.check(
    ours,
    "float32",
    fft["forward"],
    "vs tf.nn.conv2d",
    want=theirs.numpy(),
    want_tolerance=tolerance("float32", check.terms, check.magnitude),
  )
  try:
    tf_grads = tape.gradient(theirs, [x, w], output_gradients=dy)
  except tf.errors.InvalidArgumentError as e:
    # TF's CPU kernels compute grouped gradients only through oneDNN, which TF turns on
    # only on some CPUs; the oracle has checked ours above.
    assert "grouped convolutions are not supported" in e.message
    return
  for name, a, b, ours_g, theirs_g in (
    ("backprop_input", wn, dyn, grads[0], tf_grads[0]),
    ("backprop_filter", xn, dyn, grads[1], tf_grads[1]),
  ):
    c = PassCheck(ref, name, a, b)
    c.check(
      ours_g,
      "float32",
      fft[name],
      f"{name} vs TF",
      want=theirs_g.numpy(),
      want_tolerance=tolerance("float32", c.terms, c.magnitude),
    )


def test_bad_group_configurations_name_the_shapes():
  x = tf.zeros((1, 8, 8, 6))
  with pytest.raises(
    tf.errors.InvalidArgumentError,
    match="input depth 6 must be a positive multiple of filters in-depth",
  ):
    lc.conv2d(x, tf.zeros((3, 3, 4, 4)), 1, "SAME")
  with pytest.raises(
    tf.errors.InvalidArgumentError, match="out-depth.*4 must be divisible by the number of groups 3"
  ):
    lc.conv2d(x, tf.zeros((3, 3, 2, 4)), 1, "SAME")
  with pytest.raises(ValueError, match="filter in_channels .* 4 must equal the input depth 6"):
    lc.depthwise_conv2d(x, tf.zeros((3, 3, 4, 1)), 1, "SAME")
  with pytest.raises(ValueError, match="filter must be 4-D"):
    lc.depthwise_conv2d(x, tf.zeros((3, 3, 6)), 1, "SAME")
  fn = tf.function(
    lambda a, b: lc.depthwise_conv2d(a, b, 1, "SAME"),
    input_signature=[tf.TensorSpec((1, 8, 8, None)), tf.TensorSpec((3, 3, None, 1))],
  )
  with pytest.raises(tf.errors.InvalidArgumentError, match="must equal the input depth"):
    fn(x, tf.zeros((3, 3, 4, 1)))


def test_depthwise_plan_batches_groups():
  p = lc.plan((8, 56, 56, 128), (31, 31, 1, 128), 1, "SAME")
  assert p.forward.algorithm == "fft"
  assert p.forward.group_block == 128 and p.forward.vec_block == 16
