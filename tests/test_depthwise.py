"""Depthwise and grouped convolution: forward and both gradients against the float64
oracle, against tf.nn.depthwise_conv2d / tf.nn.conv2d where TF computes them, and bad
group configurations."""

import numpy as np
import pytest
import tensorflow as tf

import tf_largeconv as lc
from reference import Conv, assert_close, operand_norm

# (input NHWC, kernel (h, w), multiplier, strides, padding, dilations)
DEPTHWISE = [
    ((2, 12, 13, 3), (1, 1), 1, (1, 1), "SAME", (1, 1)),
    ((1, 14, 15, 4), (3, 3), 2, (1, 1), "SAME", (1, 1)),
    ((2, 17, 16, 5), (5, 4), 3, (2, 1), "VALID", (1, 1)),      # unequal strides
    ((1, 19, 21, 3), (3, 3), 1, (2, 2), "SAME", (2, 2)),       # stride with dilation
    ((1, 20, 18, 2), (4, 5), 2, (1, 3), ((1, 2), (3, 0)), (2, 1)),
    ((1, 24, 22, 6), (13, 13), 1, (1, 1), "SAME", (1, 1)),
    ((1, 40, 38, 3), (31, 31), 1, (1, 1), "SAME", (1, 1)),
    ((1, 20, 23, 2), (51, 51), 2, (1, 1), "SAME", (1, 1)),     # filter > input
    ((4, 9, 9, 20), (7, 7), 1, (1, 1), "SAME", (1, 1)),        # more groups than a batch
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
    y = lc.depthwise_conv2d(x, f, list(s), _pad_arg(p, data_format), data_format=data_format,
                            dilations=list(d), algorithm=algorithm)
  dx, df = tape.gradient(y, [x, f], output_gradients=dy)
  xn, dyn = x.numpy(), dy.numpy()
  fft = algorithm == "fft"
  assert_close(y, ref.forward(xn, grouped), "float64", kh * kw,
               ref.forward(np.abs(xn), np.abs(grouped)), "forward",
               operand_norm(xn, grouped) if fft else 0.0, xn.size)
  assert_close(dx, ref.backprop_input(grouped, dyn), "float64", kh * kw * mult,
               ref.backprop_input(np.abs(grouped), np.abs(dyn)), "input gradient",
               operand_norm(grouped, dyn) if fft else 0.0, dyn.size)
  want_df = ref.backprop_filter(xn, dyn).reshape(kh, kw, c, mult)
  mag_df = ref.backprop_filter(np.abs(xn), np.abs(dyn)).reshape(kh, kw, c, mult)
  assert_close(df, want_df, "float64", x_shape[0] * ref.oh * ref.ow, mag_df,
               "filter gradient", operand_norm(xn, dyn) if fft else 0.0, xn.size)


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
  assert_close(tf.cast(y, tf.float64), ref.forward(xd, g), dtype, 81,
               ref.forward(np.abs(xd), np.abs(g)), "forward",
               operand_norm(xd, g) if algorithm == "fft" else 0.0, xd.size)


@pytest.mark.parametrize("case", [c for c in DEPTHWISE if c[3][0] == c[3][1] and
                                  (c[3] == (1, 1) or c[5] == (1, 1))], ids=_case_id)
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
  np.testing.assert_allclose(got, ref.forward(x, f.reshape(3, 3, 1, 3)), rtol=1e-10,
                             atol=1e-10)


# (input NHWC, filter, strides, padding) with groups = C_in / filter in-depth.
GROUPED = [
    ((2, 16, 15, 8), (3, 3, 4, 6), (1, 1), "SAME"),     # 2 groups
    ((1, 20, 21, 9), (7, 5, 3, 6), (2, 1), "VALID"),    # 3 groups
    ((1, 30, 28, 8), (21, 21, 2, 8), (1, 1), "SAME"),   # 4 groups
    ((2, 12, 12, 32), (5, 5, 8, 16), (1, 2), "SAME"),   # 4 groups, more channels
]


@pytest.mark.parametrize("algorithm", ["direct", "fft"])
@pytest.mark.parametrize("case", GROUPED)
def test_grouped_matches_tf_conv2d_and_oracle(rng, case, algorithm):
  x_shape, w_shape, s, p = case
  x = tf.constant(rng.standard_normal(x_shape), tf.float32)
  w = tf.constant(rng.standard_normal(w_shape), tf.float32)
  with tf.GradientTape(persistent=True) as tape:
    tape.watch([x, w])
    ours = lc.conv2d(x, w, list(s), p, algorithm=algorithm)
    theirs = tf.nn.conv2d(x, w, list(s), p)
  ref = Conv(x_shape, w_shape, s, p)
  xn, wn = x.numpy(), w.numpy()
  mag = ref.forward(np.abs(xn), np.abs(wn))
  norm = operand_norm(xn, wn) if algorithm == "fft" else 0.0
  terms = w_shape[0] * w_shape[1] * w_shape[2]
  assert_close(ours, ref.forward(xn, wn), "float32", terms, mag, "forward", norm, xn.size)
  assert_close(ours, theirs.numpy().astype(np.float64), "float32", 2 * terms, 2 * mag,
               "vs tf.nn.conv2d", 2 * norm, xn.size)
  for g_ours, g_tf in zip(tape.gradient(ours, [x, w]), tape.gradient(theirs, [x, w])):
    scale = np.abs(g_tf.numpy()).max()
    assert np.abs(g_ours.numpy() - g_tf.numpy()).max() <= 1e-5 * scale * np.sqrt(terms)


def test_bad_group_configurations_name_the_shapes():
  x = tf.zeros((1, 8, 8, 6))
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="input depth 6 must be a positive multiple of filters in-depth"):
    lc.conv2d(x, tf.zeros((3, 3, 4, 4)), 1, "SAME")
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="out-depth.*4 must be divisible by the number of groups 3"):
    lc.conv2d(x, tf.zeros((3, 3, 2, 4)), 1, "SAME")
  with pytest.raises(ValueError, match="filter in_channels .* 4 must equal the input depth 6"):
    lc.depthwise_conv2d(x, tf.zeros((3, 3, 4, 1)), 1, "SAME")
  with pytest.raises(ValueError, match="filter must be 4-D"):
    lc.depthwise_conv2d(x, tf.zeros((3, 3, 6)), 1, "SAME")
  fn = tf.function(lambda a, b: lc.depthwise_conv2d(a, b, 1, "SAME"),
                   input_signature=[tf.TensorSpec((1, 8, 8, None)),
                                    tf.TensorSpec((3, 3, None, 1))])
  with pytest.raises(tf.errors.InvalidArgumentError, match="must equal the input depth"):
    fn(x, tf.zeros((3, 3, 4, 1)))


def test_depthwise_plan_batches_groups():
  p = lc.plan((8, 56, 56, 128), (31, 31, 1, 128), 1, "SAME")
  assert p.forward.algorithm == "fft"
  assert p.forward.group_block == 128 and p.forward.vec_block == 16
