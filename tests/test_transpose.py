"""tf_largeconv.conv2d_transpose against the independent float64 oracle
(tests/reference_transpose.py) and tf.nn.conv2d_transpose: TF's own test shapes, strides 1
and 2, SAME/VALID/explicit padding, NCHW, dilations, groups, every dtype; its argument
checks, static shapes, gradients of first and second order, plan_transpose; and the Keras
3 and tf_keras LargeConv2DTranspose layers against Conv2DTranspose."""

import keras
import numpy as np
import pytest
import reference
import reference_transpose
import tensorflow as tf

import tf_largeconv as lc
from tf_largeconv.keras import LargeConv2DTranspose
from tf_largeconv.keras import convert

# (input NHWC, filters [h, w, out_channels / groups, in_channels], output_shape NHWC,
# strides, padding, dilations)
CASES = [
  # tf.nn.conv2d_transpose's own tests (conv2d_transpose_test.py)
  ((2, 6, 4, 3), (3, 3, 2, 3), (2, 6, 4, 2), (1, 1), "SAME", (1, 1)),
  ((2, 6, 4, 3), (3, 3, 2, 3), (2, 12, 8, 2), (2, 2), "SAME", (1, 1)),
  ((2, 6, 4, 3), (3, 3, 2, 3), (2, 13, 9, 2), (2, 2), "VALID", (1, 1)),
  # odd outputs under SAME (ceil(11 / 2) = 6), and VALID with the largest output of 4
  ((2, 6, 4, 3), (3, 3, 2, 3), (2, 11, 7, 2), (2, 2), "SAME", (1, 1)),
  ((1, 4, 5, 2), (4, 3, 3, 2), (1, 10, 11, 3), (2, 2), "VALID", (1, 1)),
  # explicit, unequal pairs and strides
  ((1, 5, 6, 2), (4, 3, 3, 2), (1, 9, 7, 3), (2, 1), ((1, 2), (0, 1)), (1, 1)),
  # dilations; with strides and VALID
  ((1, 7, 6, 2), (3, 3, 2, 2), (1, 7, 6, 2), (1, 1), "SAME", (2, 2)),
  ((1, 4, 5, 2), (3, 2, 2, 2), (1, 12, 15, 2), (2, 3), "VALID", (2, 1)),
  # grouped: 2 groups of 2 output channels, 2 input channels each
  ((1, 5, 5, 4), (3, 3, 2, 4), (1, 10, 10, 4), (2, 2), "SAME", (1, 1)),
  # a large filter
  ((1, 12, 12, 2), (15, 15, 3, 2), (1, 24, 24, 3), (2, 2), "SAME", (1, 1)),
]
TF_CPU_CASES = [c for c in CASES if c[5] == (1, 1) and c[1][3] == c[0][3] and c[1][2] == c[2][3]]


def _id(case):
  x, w, out, s, p, d = case
  pad = p if isinstance(p, str) else "explicit"
  return f"{'x'.join(map(str, w))}-to-{'x'.join(map(str, out))}-s{s[0]}{s[1]}-{pad}-d{d[0]}{d[1]}"


def _nchw(a):
  return np.transpose(a, (0, 3, 1, 2))


def _shape(shape, fmt):
  return tuple(shape) if fmt == "NHWC" else (shape[0], shape[3], shape[1], shape[2])


def _padding(padding, fmt):
  """The padding argument in data_format order (explicit pairs for four dimensions)."""
  if isinstance(padding, str):
    return padding
  (t, b), (l, r) = padding
  return [[0, 0], [t, b], [l, r], [0, 0]] if fmt == "NHWC" else [[0, 0], [0, 0], [t, b], [l, r]]


def _data(rng, case, fmt, dtype=np.float64):
  x_shape, w_shape = case[0], case[1]
  x = rng.standard_normal(x_shape)
  if fmt == "NCHW":
    x = _nchw(x)
  return x.astype(dtype), rng.standard_normal(w_shape).astype(dtype)


def _call(case, x, w, fmt, **kwargs):
  _, _, out, s, p, d = case
  return lc.conv2d_transpose(
    x, w, _shape(out, fmt), s, _padding(p, fmt), data_format=fmt, dilations=d, **kwargs
  )


def _check(case, fmt, x, w, got, dtype_name, algorithm):
  """`got` against the oracle within the bound of the path that computed it: the transpose
  is the backprop_input pass of reference.Conv's convolution (which gives the bound only;
  the value compared with is reference_transpose's)."""
  _, w_shape, out, s, p, d = case
  want = reference_transpose.conv2d_transpose(x, w, _shape(out, fmt), s, p, d, fmt)
  if algorithm == "portable":  # FFT over the whole image in float64 (as test_portable)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * np.abs(want).max())
    return
  plan = lc.plan_transpose(
    x.shape,
    w_shape,
    _shape(out, fmt),
    s,
    _padding(p, fmt),
    data_format=fmt,
    dilations=d,
    dtype=dtype_name,
    algorithm=algorithm,
  )
  fft = reference.planned_fft(plan.passes)["backprop_input"]
  conv = reference.Conv(_shape(out, fmt), w_shape, s, p, d, fmt)
  check = reference.PassCheck(conv, "backprop_input", w, x)
  check.check(np.asarray(got, np.float64), dtype_name, fft, "transpose", want=want)


@pytest.mark.parametrize("algorithm", ["direct", "fft", "auto", "portable"])
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_matches_oracle_float64(rng, case, fmt, algorithm):
  x, w = _data(rng, case, fmt)
  got = _call(case, tf.constant(x), tf.constant(w), fmt, algorithm=algorithm)
  assert got.shape == _shape(case[2], fmt)
  _check(case, fmt, x, w, got.numpy(), "float64", algorithm)


def test_oracle_agrees_with_tf(rng):
  """The oracle itself, against TensorFlow's kernel in float64 (where it runs on a CPU)."""
  for case in TF_CPU_CASES:
    x, w = _data(rng, case, "NHWC")
    _, _, out, s, p, _ = case
    want = tf.nn.conv2d_transpose(x, w, out, s, _padding(p, "NHWC")).numpy()
    got = reference_transpose.conv2d_transpose(x, w, out, s, p)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * np.abs(want).max())


@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("algorithm", ["direct", "fft"])
@pytest.mark.parametrize("case", [CASES[1], CASES[5], CASES[7], CASES[9]], ids=_id)
def test_dtypes_match_oracle(rng, case, dtype_name, algorithm):
  x, w = _data(rng, case, "NHWC")
  dtype = tf.as_dtype(dtype_name)
  xt, wt = tf.cast(x, dtype), tf.cast(w, dtype)
  got = _call(case, xt, wt, "NHWC", algorithm=algorithm)
  assert got.dtype == dtype
  # The oracle gets exactly the values the op gets (rounded to the dtype under test).
  xr, wr = tf.cast(xt, tf.float64).numpy(), tf.cast(wt, tf.float64).numpy()
  _check(case, "NHWC", xr, wr, tf.cast(got, tf.float64).numpy(), dtype_name, algorithm)


@pytest.mark.parametrize("case", TF_CPU_CASES, ids=_id)
def test_matches_tf_float32_and_int32(rng, case):
  x, w = _data(rng, case, "NHWC", np.float32)
  _, _, out, s, p, _ = case
  want = tf.nn.conv2d_transpose(x, w, out, s, _padding(p, "NHWC")).numpy()
  for algorithm in ("auto", "direct", "fft", "tf"):
    got = _call(case, x, w, "NHWC", algorithm=algorithm).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
  xi, wi = rng.integers(-50, 50, x.shape, np.int32), rng.integers(-50, 50, w.shape, np.int32)
  want = tf.nn.conv2d_transpose(xi, wi, out, s, _padding(p, "NHWC")).numpy()
  np.testing.assert_array_equal(_call(case, xi, wi, "NHWC").numpy(), want)


def test_tf_test_constant_cases():
  """conv2d_transpose_test.py's counting tests, whose expected values are TF's: all-ones
  inputs and filters, float32 and int32, strides 1 and 2, SAME and VALID."""
  for dtype in (tf.float32, tf.int32):
    for out, s, p in (
      ((2, 6, 4, 2), 1, "SAME"),
      ((2, 12, 8, 2), 2, "SAME"),
      ((2, 13, 9, 2), 2, "VALID"),
    ):
      x = tf.ones((2, 6, 4, 3), dtype)
      f = tf.ones((3, 3, 2, 3), dtype)
      want = tf.nn.conv2d_transpose(x, f, out, strides=s, padding=p)
      got = lc.conv2d_transpose(x, f, out, strides=s, padding=p)
      np.testing.assert_array_equal(got.numpy(), want.numpy())
  # The single-stride test's closed form: 12 at the corners, 18 on the edges, 27 inside.
  value = lc.conv2d_transpose(tf.ones((2, 6, 4, 3)), tf.ones((3, 3, 2, 3)), [2, 6, 4, 2], 1)
  assert value[0, 0, 0, 0] == 12 and value[0, 0, 1, 0] == 18 and value[0, 2, 2, 1] == 27


def test_output_shape_forms(rng):
  x, w = _data(rng, CASES[1], "NHWC", np.float32)
  want = lc.conv2d_transpose(x, w, [2, 12, 8, 2], 2).numpy()
  for form in (
    [12, 8],
    (2, 12, 8, 2),
    np.array([2, 12, 8, 2]),
    tf.constant([2, 12, 8, 2], tf.int64),
    tf.constant([12, 8]),
  ):
    np.testing.assert_array_equal(lc.conv2d_transpose(x, w, form, [2, 2]).numpy(), want)
  nchw = lc.conv2d_transpose(_nchw(x), w, [12, 8], 2, data_format="NCHW")
  np.testing.assert_allclose(np.transpose(nchw.numpy(), (0, 2, 3, 1)), want, rtol=1e-5, atol=1e-5)


def test_static_shape_inference():
  """tf.nn.conv2d_transpose's shape-inference test (a batch from tf.shape), an unknown
  input shape with a constant output_shape, and the 2-value form."""
  f = tf.zeros((3, 3, 5, 1))

  @tf.function
  def stacked(x):
    return lc.conv2d_transpose(x, f, tf.stack([tf.shape(x)[0], 10, 5, 5]), 1, "SAME")

  assert stacked.get_concrete_function(tf.TensorSpec([3, 10, 5, 1])).output_shapes.as_list() == [
    3,
    10,
    5,
    5,
  ]
  assert stacked.get_concrete_function(tf.TensorSpec([None, 10, 5, 1])).output_shapes.as_list() == [
    None,
    10,
    5,
    5,
  ]

  @tf.function
  def constant(x):
    return lc.conv2d_transpose(x, f, [3, 20, 10, 5], 2, "SAME")

  assert constant.get_concrete_function(
    tf.TensorSpec([None, None, None, 1])
  ).output_shapes.as_list() == [3, 20, 10, 5]

  @tf.function
  def spatial(x):
    return lc.conv2d_transpose(x, f, [20, 10], 2, "SAME", data_format="NCHW")

  assert spatial.get_concrete_function(tf.TensorSpec([None, 1, 10, 5])).output_shapes.as_list() == [
    None,
    5,
    20,
    10,
  ]


def test_empty_tensors_and_unknown_rank():
  f = tf.ones((3, 3, 2, 3))
  empty = lc.conv2d_transpose(tf.ones((0, 6, 4, 3)), f, [0, 12, 8, 2], 2)
  assert empty.shape == tf.nn.conv2d_transpose(tf.ones((0, 6, 4, 3)), f, [0, 12, 8, 2], 2).shape
  assert lc.conv2d_transpose(
    tf.ones((2, 6, 4, 3)), tf.ones((3, 3, 0, 3)), [2, 12, 8, 0], 2
  ).shape == (2, 12, 8, 0)
  run = tf.function(
    lambda x: lc.conv2d_transpose(x, f, [2, 12, 8, 2], 2), input_signature=[tf.TensorSpec(None)]
  )
  assert run.get_concrete_function().output_shapes.as_list() == [2, 12, 8, 2]
  np.testing.assert_array_equal(
    run(tf.ones((2, 6, 4, 3))).numpy(),
    lc.conv2d_transpose(tf.ones((2, 6, 4, 3)), f, [2, 12, 8, 2], 2).numpy(),
  )


X, F = np.ones((2, 6, 4, 3), np.float32), np.ones((3, 3, 2, 3), np.float32)
# (input, filters, output_shape, other arguments, error types, words the message contains)
SHAPE_ERRORS = [
  # conv2d_transpose_test.py: testConv2DTransposeInvalidOutputShape, ...LargeOutputShape
  (
    np.ones((1, 1, 1, 1)),
    np.ones((1, 1, 1, 1)),
    [2, -2],
    dict(strides=[1]),
    "output_shape must be non-negative",
  ),
  (
    np.ones((2, 2, 2, 2)),
    [[[[1.0]]]],
    [114078056, 179835296],
    dict(strides=[10]),
    "filters dimension 3 (in_channels) 1 must equal the input depth 2",
  ),
  (
    X,
    F,
    [2, 13, 8, 2],
    dict(strides=2),
    "output_shape [2, 13, 8, 2] does not fit the input's shape [2, 6, 4, 3]",
  ),
  (
    X,
    F,
    [2, 12, 9, 2],
    dict(strides=2, padding="VALID"),
    "output_shape [2, 12, 9, 2] does not fit",
  ),
  (
    X,
    F,
    [2, 11, 7, 2],
    dict(strides=2, padding=[[0, 0], [1, 1], [1, 0], [0, 0]]),
    "must have them",
  ),
  (X, F, [3, 12, 8, 2], dict(strides=2), "output_shape's batch 3 must equal the input's batch 2"),
  (
    X,
    F,
    [2, 12, 8, 3],
    dict(strides=2),
    "output_shape's depth 3 must be a multiple of the filters' dimension 2",
  ),
  (X, F, [2, 12, 8], dict(strides=2), "output_shape must be a vector of 4 sizes"),
  (X, F, [[2, 12, 8, 2]], dict(strides=2), "output_shape must be a vector of 4 sizes"),
  (np.ones((1, 2, 6, 4, 3)), F, [2, 12, 8, 2], dict(strides=2), "input must be 4-D"),
  (X, np.ones((3, 3, 2)), [2, 12, 8, 2], dict(strides=2), "filters must be 4-D"),
  (
    np.ones((2, 6, 4, 5)),
    F,
    [2, 12, 8, 2],
    dict(strides=2),
    "input channels does not match filter's input channels, 5 != 3",
  ),
  (
    X,
    np.ones((5, 5, 2, 3)),
    [2, 2, 1, 2],
    dict(strides=1, padding="VALID"),
    "for output_shape [2, 2, 1, 2] and filters [5, 5, 2, 3]",
  ),
]


@pytest.mark.parametrize("x,w,output_shape,kwargs,words", SHAPE_ERRORS)
def test_shape_errors_name_the_argument(x, w, output_shape, kwargs, words):
  """Eager: InvalidArgumentError, as TensorFlow's kernel; traced: ValueError, at trace time
  (TensorFlow's own conv2d_transpose traces a wrong static shape and fails at run time)."""
  with pytest.raises(tf.errors.InvalidArgumentError, match=_words(words)):
    lc.conv2d_transpose(x, w, output_shape, **kwargs)

  @tf.function
  def traced():
    return lc.conv2d_transpose(
      tf.constant(x, tf.float32), tf.constant(w, tf.float32), output_shape, **kwargs
    )

  with pytest.raises(ValueError, match=_words(words)):
    traced.get_concrete_function()


def _words(words):
  return words.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")


def test_run_time_shape_errors():
  """Shapes known only at run time: the op's InvalidArgumentError, in TensorFlow's words."""

  @tf.function(input_signature=[tf.TensorSpec(None, tf.float32), tf.TensorSpec([None], tf.int32)])
  def run(x, output_shape):
    return lc.conv2d_transpose(x, F, output_shape, 2)

  assert run(X, [2, 12, 8, 2]).shape == (2, 12, 8, 2)
  with pytest.raises(
    tf.errors.InvalidArgumentError, match="Size of out_backprop doesn't match computed"
  ):
    run(X, [2, 13, 8, 2])
  with pytest.raises(tf.errors.InvalidArgumentError, match="must have the same batch size"):
    run(X, [3, 12, 8, 2])


@pytest.mark.parametrize(
  "kwargs,error,words",
  [
    (dict(padding="FOO"), ValueError, "padding must be 'SAME', 'VALID'"),
    (dict(padding="EXPLICIT"), ValueError, "'EXPLICIT' is not a valid value for `padding`"),
    (
      dict(padding=[[0, 0], [1, 1], [1, 1]]),
      ValueError,
      "When padding is a list, it must be of size 4",
    ),
    (dict(strides=[2, 2, 2]), ValueError, "strides should be of length 1, 2 or 4"),
    (dict(dilations=1.5), ValueError, "dilations must be an int"),
    (dict(data_format="NHCW"), ValueError, "data_format must be 'NHWC' or 'NCHW'"),
    (dict(algorithm="fast"), ValueError, "algorithm must be one of"),
    (dict(workspace_limit=-2), ValueError, "workspace_limit must be None"),
    (dict(output_shape=[2.0, 12.0, 8.0, 2.0]), TypeError, "output_shape must be a 1-D"),
    (
      dict(output_shape=tf.constant([2.0, 12.0, 8.0, 2.0])),
      TypeError,
      "output_shape must be a 1-D tensor of ints",
    ),
    (
      dict(filters=tf.ones((3, 3, 2, 3), tf.float64)),
      TypeError,
      "filters must have the same dtype",
    ),
    (
      dict(algorithm="fft", input=X.astype(np.int32), filters=F.astype(np.int32)),
      ValueError,
      "cannot compute int32 exactly",
    ),
    (
      dict(
        algorithm="tf",
        data_format="NCHW",
        input=np.ones((2, 3, 6, 4), np.float32),
        output_shape=[2, 2, 12, 8],
      ),
      ValueError,
      "algorithm='tf' runs tf.nn.conv2d_transpose",
    ),
  ],
)
def test_argument_errors(kwargs, error, words):
  args = dict(input=tf.constant(X), filters=tf.constant(F), output_shape=[2, 12, 8, 2], strides=2)
  args.update(kwargs)
  with pytest.raises(error, match=_words(words)):
    lc.conv2d_transpose(**args)


def _second_order(fn, x, w):
  """y = fn(x, w); the gradients of sum(y * r) for a fixed r, and the gradients of the sum
  of their squares (second order)."""
  with tf.GradientTape(persistent=True) as outer:
    outer.watch([x, w])
    with tf.GradientTape() as inner:
      inner.watch([x, w])
      y = fn(x, w)
      loss = tf.reduce_sum(y * tf.cos(tf.reshape(tf.range(tf.size(y), dtype=y.dtype), tf.shape(y))))
    gx, gw = inner.gradient(loss, [x, w])
    total = tf.reduce_sum(gx * gx) + tf.reduce_sum(gw * gw * gw)
  return [gx, gw] + outer.gradient(total, [x, w])


@pytest.mark.parametrize("algorithm", ["direct", "fft", "auto", "portable"])
@pytest.mark.parametrize("case", [CASES[1], CASES[2], CASES[5]], ids=_id)
def test_gradients_first_and_second_order_match_tf(rng, case, algorithm):
  x, w = _data(rng, case, "NHWC")
  x, w = tf.constant(x), tf.constant(w)
  _, _, out, s, p, _ = case
  want = _second_order(lambda a, b: tf.nn.conv2d_transpose(a, b, out, s, _padding(p, "NHWC")), x, w)
  got = _second_order(lambda a, b: _call(case, a, b, "NHWC", algorithm=algorithm), x, w)
  for name, g, r in zip(("d input", "d filters", "d2 input", "d2 filters"), got, want):
    r = r.numpy()
    np.testing.assert_allclose(g.numpy(), r, rtol=0, atol=1e-10 * np.abs(r).max(), err_msg=name)


@pytest.mark.parametrize("case", [CASES[5], CASES[7], CASES[8]], ids=_id)
def test_gradients_numerically_nchw_dilated_grouped(rng, case):
  """Where TF's CPU kernels do not run (NCHW, dilations, groups): both gradients against
  finite differences (exact for a linear map up to float64 rounding), and the second order
  through its own definition: d/dw of <d input, v> is the transpose of v's conv2d ..., checked
  by finite differences of the first-order gradients."""
  x, w = _data(rng, case, "NCHW")
  x, w = tf.constant(x), tf.constant(w)
  fn = lambda a, b: _call(case, a, b, "NCHW")  # noqa: E731
  theoretical, numerical = tf.test.compute_gradient(fn, [x, w])
  for t, n in zip(theoretical, numerical):
    np.testing.assert_allclose(t, n, rtol=0, atol=1e-7 * np.abs(n).max())

  def first(a, b):
    return _second_order(fn, a, b)[1]  # d filters, which depends on the input

  theoretical, numerical = tf.test.compute_gradient(first, [x, w])
  for t, n in zip(theoretical, numerical):
    np.testing.assert_allclose(t, n, rtol=0, atol=1e-6 * np.abs(n).max())


def test_plan_transpose_is_the_conv2d_plan():
  x_shape, w_shape, out = (4, 32, 32, 8), (31, 31, 4, 8), (4, 64, 64, 4)
  p = lc.plan_transpose(x_shape, w_shape, out, 2, "SAME")
  q = lc.plan(out, w_shape, 2, "SAME")
  assert p.output_shape == x_shape
  assert [(a.algorithm, a.workspace_bytes, a.fft_size) for a in p.passes] == [
    (a.algorithm, a.workspace_bytes, a.fft_size) for a in q.passes
  ]
  assert lc.plan_transpose(x_shape, w_shape, out[1:3], 2, "SAME").output_shape == x_shape
  with pytest.raises(ValueError, match="does not fit"):
    lc.plan_transpose(x_shape, w_shape, (4, 65, 64, 4), 2, "VALID")
  with pytest.raises(ValueError, match="input depth must equal"):
    lc.plan_transpose((4, 32, 32, 5), w_shape, out, 2, "SAME")


def _plan_summary(p):
  return (
    p.output_shape,
    [
      (a.name, a.algorithm, a.workspace_bytes, a.flops, a.fft_size, a.tile, a.tiles)
      for a in p.passes
    ],
  )


@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
@pytest.mark.parametrize("algorithm", ["auto", "direct", "fft"])
def test_plan_transpose_takes_height_and_width_alone_in_either_layout(fmt, algorithm):
  """The 2-value output_shape is (height, width) whatever data_format is: it plans as the
  4-value form does, for a non-square output whose transposed order would not fit."""
  x_shape, w_shape, out = (2, 12, 20, 6), (9, 5, 3, 6), (2, 24, 40, 3)
  full = lc.plan_transpose(
    _shape(x_shape, fmt), w_shape, _shape(out, fmt), 2, "SAME", data_format=fmt, algorithm=algorithm
  )
  alone = lc.plan_transpose(
    _shape(x_shape, fmt), w_shape, out[1:3], 2, "SAME", data_format=fmt, algorithm=algorithm
  )
  assert full.output_shape == _shape(x_shape, fmt)
  assert _plan_summary(alone) == _plan_summary(full)
  # The conv2d it transposes, planned on its own, is the same plan.
  conv = lc.plan(_shape(out, fmt), w_shape, 2, "SAME", data_format=fmt, algorithm=algorithm)
  assert _plan_summary(alone) == _plan_summary(conv)


def test_auto_routes_small_filters_to_tensorflow_as_conv2d_does(rng):
  """Where the planner prefers TensorFlow's kernel for the conv2d this transposes, 'auto'
  runs tf.nn.conv2d_transpose (TF's Conv2DBackpropInput op) and no LargeConv op."""
  x = tf.constant(rng.standard_normal((2, 16, 16, 64)), tf.float32)
  w = tf.constant(rng.standard_normal((3, 3, 64, 64)), tf.float32)
  assert lc.plan_transpose(x.shape, w.shape, (2, 32, 32, 64), 2).forward.algorithm == "tf"

  def ops(algorithm):
    fn = tf.function(lambda a: lc.conv2d_transpose(a, w, [2, 32, 32, 64], 2, algorithm=algorithm))
    return {n.op for n in fn.get_concrete_function(x).graph.as_graph_def().node}

  assert "Conv2DBackpropInput" in ops("auto") and "LargeConv>Conv2DBackpropInput" not in ops("auto")
  assert "LargeConv>Conv2DBackpropInput" in ops("direct")


# Keras 3


LAYER_CASES = [
  dict(filters=4, kernel_size=(5, 3), strides=2, padding="same"),
  dict(filters=4, kernel_size=(5, 3), strides=2, padding="valid", output_padding=1),
  dict(filters=3, kernel_size=4, strides=(3, 2), padding="same", output_padding=(2, 1)),
  dict(
    filters=2,
    kernel_size=15,
    strides=2,
    padding="valid",
    output_padding=(0, 1),
    use_bias=False,
    activation="relu",
  ),
]


def _same_weights(rng, ref, ours):
  """Gives both layers the same random weights; returns an input and ref's output."""
  x = rng.standard_normal((2, 7, 6, 3)).astype(np.float32)
  ref.build(x.shape)
  ours.build(x.shape)
  ours.set_weights([rng.standard_normal(v.shape).astype(np.float32) for v in ref.get_weights()])
  ref.set_weights(ours.get_weights())
  return x, ref(x).numpy()


@pytest.mark.parametrize("config", LAYER_CASES)
def test_keras_layer_equals_conv2d_transpose(rng, config):
  ref = keras.layers.Conv2DTranspose(**config)
  ours = LargeConv2DTranspose(**config)
  x, want = _same_weights(rng, ref, ours)
  got = ours(x)
  assert got.shape == want.shape == tuple(ref.compute_output_shape(x.shape))
  np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
  # Channels first and an unknown height and width: the same result, transposed.
  first = LargeConv2DTranspose(**config, data_format="channels_first")
  first.build((None, 3, None, None))
  first.set_weights(ours.get_weights())
  run = tf.function(first, input_signature=[tf.TensorSpec((None, 3, None, None))])
  np.testing.assert_allclose(
    np.transpose(run(_nchw(x)).numpy(), (0, 2, 3, 1)),
    want,
    rtol=1e-5,
    atol=1e-5 * np.abs(want).max(),
  )


def test_keras_layer_with_dilations_matches_oracle(rng):
  """Keras's own Conv2DTranspose cannot run dilations on a CPU; the oracle can."""
  layer = LargeConv2DTranspose(2, 3, padding="same", dilation_rate=2)
  x = rng.standard_normal((1, 7, 6, 2)).astype(np.float32)
  y = layer(x).numpy()
  kernel, bias = (v.numpy() for v in (layer.kernel, layer.bias))
  want = (
    reference_transpose.conv2d_transpose(x, kernel, (1, 7, 6, 2), (1, 1), "SAME", (2, 2)) + bias
  )
  np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_keras_layer_serialises_and_converts(rng, tmp_path):
  model = keras.Sequential(
    [
      keras.Input((16, 16, 3)),
      keras.layers.Conv2DTranspose(4, 15, strides=2, padding="same", output_padding=1),
      keras.layers.Conv2DTranspose(2, 3, padding="same"),
    ]
  )
  converted = convert(model, min_kernel_size=15, algorithm="fft")
  assert [type(layer).__name__ for layer in converted.layers] == [
    "LargeConv2DTranspose",
    "Conv2DTranspose",
  ]
  assert converted.layers[0].algorithm == "fft" and converted.layers[0].output_padding == (1, 1)
  x = rng.standard_normal((2, 16, 16, 3)).astype(np.float32)
  want = model(x).numpy()
  np.testing.assert_allclose(converted(x).numpy(), want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
  config = converted.layers[0].get_config()
  assert config["algorithm"] == "fft" and config["output_padding"] == (1, 1)
  again = LargeConv2DTranspose.from_config(config)
  assert again.get_config() == config
  path = str(tmp_path / "model.keras")
  converted.save(path)
  loaded = keras.models.load_model(path)
  assert type(loaded.layers[0]) is LargeConv2DTranspose
  np.testing.assert_array_equal(loaded(x).numpy(), converted(x).numpy())


def test_keras_layer_trains(rng):
  """One training step: the gradients of kernel and bias equal Conv2DTranspose's."""
  config = dict(filters=3, kernel_size=7, strides=2, padding="same", output_padding=1)
  ref, ours = keras.layers.Conv2DTranspose(**config), LargeConv2DTranspose(**config)
  x = tf.constant(rng.standard_normal((2, 9, 8, 2)), tf.float32)
  ref.build(x.shape)
  ours.build(x.shape)
  ours.set_weights(ref.get_weights())
  grads = []
  for layer in (ref, ours):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(tf.square(layer(x)))
    grads.append(tape.gradient(loss, layer.trainable_variables))
  for g, r in zip(grads[1], grads[0]):
    np.testing.assert_allclose(g.numpy(), r.numpy(), rtol=1e-4, atol=1e-5 * np.abs(r.numpy()).max())


def test_keras_layer_differentiates_under_jit_compile(rng):
  """Under XLA 'auto' runs the portable path, which needs a constant output_shape: the
  layer passes height and width only, so an unknown batch is fine. The gradients of a
  jit-compiled step with an unknown batch equal the plain ones."""
  layer = LargeConv2DTranspose(3, 15, strides=2, padding="same")
  x = tf.constant(rng.standard_normal((4, 8, 8, 2)), tf.float32)
  layer.build(x.shape)

  def step(inputs):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(tf.square(layer(inputs)))
    return tape.gradient(loss, layer.trainable_variables)

  spec = [tf.TensorSpec((None, 8, 8, 2))]
  want = tf.function(step, input_signature=spec)(x)
  got = tf.function(step, input_signature=spec, jit_compile=True)(x)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-4, atol=1e-5 * np.abs(w.numpy()).max())


# tf_keras (Keras 2)


def test_tf_keras_layer_equals_conv2d_transpose_and_serialises(rng):
  tf_keras = pytest.importorskip("tf_keras")
  from tf_largeconv import tf_keras as lc_tf_keras

  for config in LAYER_CASES:
    ref = tf_keras.layers.Conv2DTranspose(**config)
    ours = lc_tf_keras.LargeConv2DTranspose(**config, algorithm="direct")
    x, want = _same_weights(rng, ref, ours)
    np.testing.assert_allclose(ours(x).numpy(), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    copy = tf_keras.layers.deserialize(tf_keras.layers.serialize(ours))
    assert type(copy) is lc_tf_keras.LargeConv2DTranspose
    assert copy.get_config() == ours.get_config() and copy.algorithm == "direct"
