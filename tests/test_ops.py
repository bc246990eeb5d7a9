"""Forward pass of tf_largeconv.conv2d against tf.nn.conv2d and the float64 oracle."""

import numpy as np
import pytest
import tensorflow as tf
from reference import Conv
from reference import PassCheck
from reference import planned_fft
from reference import tolerance

import tf_largeconv as lc

DTYPES = {
  "float16": tf.float16,
  "bfloat16": tf.bfloat16,
  "float32": tf.float32,
  "float64": tf.float64,
}


def _explicit(pairs, data_format):
  (t, b), (l, r) = pairs
  if data_format == "NHWC":
    return [[0, 0], [t, b], [l, r], [0, 0]]
  return [[0, 0], [0, 0], [t, b], [l, r]]


def _run(
  rng, x_shape, w_shape, strides, padding, dilations, data_format, dtype_name, algorithm="auto"
):
  """Runs our op and the oracle on the same (dtype-rounded) data; checks the bound of the
  path the plan says the op took (per-plane norm-wise for the FFT, elementwise otherwise)."""
  ref = Conv(x_shape, w_shape, strides, padding, dilations, data_format)
  dtype = DTYPES[dtype_name]
  x = tf.cast(rng.standard_normal(x_shape), dtype)
  w = tf.cast(rng.standard_normal(w_shape), dtype)
  xd, wd = tf.cast(x, tf.float64).numpy(), tf.cast(w, tf.float64).numpy()
  pad_arg = padding if isinstance(padding, str) else _explicit(padding, data_format)
  kwargs = dict(data_format=data_format, dilations=list(dilations), algorithm=algorithm)
  y = lc.conv2d(x, w, list(strides), pad_arg, **kwargs)
  assert y.dtype == dtype
  fft = planned_fft(
    lc.plan(x_shape, w_shape, list(strides), pad_arg, dtype=dtype, **kwargs).passes
  )["forward"]
  assert (fft is not None) == (algorithm == "fft") or algorithm == "auto"
  check = PassCheck(ref, "forward", xd, wd)
  check.check(y, dtype_name, fft, f"forward ({algorithm})")
  return x, w, y, pad_arg, check, fft


# (input NHWC, filter, strides, padding, dilations)
GRID = [
  ((2, 9, 11, 3), (1, 1, 3, 4), (1, 1), "VALID", (1, 1)),
  ((2, 9, 11, 3), (2, 2, 3, 5), (1, 1), "SAME", (1, 1)),
  ((1, 12, 10, 2), (3, 3, 2, 3), (1, 1), "SAME", (1, 1)),
  ((2, 13, 9, 3), (4, 3, 3, 2), (2, 3), "SAME", (1, 1)),
  ((1, 15, 17, 2), (5, 6, 2, 9), (3, 2), "VALID", (1, 1)),
  ((1, 16, 16, 4), (3, 3, 4, 16), (1, 1), "VALID", (2, 3)),
  ((2, 14, 15, 3), (3, 2, 3, 8), (2, 2), "SAME", (3, 2)),
  ((1, 11, 12, 2), (4, 5, 2, 3), (1, 2), ((2, 1), (0, 3)), (1, 1)),
  ((1, 12, 12, 3), (3, 3, 3, 10), (3, 1), ((0, 4), (5, 1)), (2, 1)),
  ((1, 8, 7, 1), (11, 9, 1, 2), (1, 1), "SAME", (1, 1)),  # filter > input, SAME
  ((1, 6, 5, 2), (13, 12, 2, 9), (2, 3), "SAME", (1, 1)),  # filter > input, strided
  ((1, 20, 18, 1), (20, 18, 1, 3), (1, 1), "VALID", (1, 1)),  # filter == input
  ((1, 40, 44, 1), (31, 31, 1, 3), (1, 1), "VALID", (1, 1)),
  ((1, 36, 33, 2), (41, 41, 2, 2), (1, 1), "SAME", (1, 1)),
  ((1, 30, 34, 1), (21, 20, 1, 1), (2, 2), "SAME", (1, 1)),  # even and non-square
  ((1, 24, 24, 16), (9, 9, 16, 24), (1, 1), "SAME", (1, 1)),  # many channels
  ((3, 10, 9, 32), (3, 3, 32, 70), (1, 1), "SAME", (1, 1)),  # channel tile edge
  ((1, 300, 5, 2), (3, 1, 2, 3), (1, 1), "SAME", (1, 1)),  # position tile edge
  ((1, 5, 300, 2), (1, 3, 2, 9), (1, 1), "VALID", (1, 1)),
]


def _id(case):
  x, w, s, p, d = case
  return f"x{'x'.join(map(str, x))}-k{w[0]}x{w[1]}x{w[2]}x{w[3]}-s{s[0]}{s[1]}-{p}-d{d[0]}{d[1]}"


@pytest.mark.parametrize("algorithm", ["direct", "fft"])
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
@pytest.mark.parametrize("case", GRID, ids=[_id(c) for c in GRID])
def test_forward_float64_matches_oracle(rng, case, data_format, algorithm):
  x_shape, w_shape, s, p, d = case
  if data_format == "NCHW":
    x_shape = (x_shape[0], x_shape[3], x_shape[1], x_shape[2])
  _run(rng, x_shape, w_shape, s, p, d, data_format, "float64", algorithm)


# Forward and input-gradient plans that run several tiles per item (vec_block > 1, one
# group: every filter value read serves the run): runs that cross from one image into the
# next, a shorter last run, strides (the input gradient's zero-stuffed tiles) and NCHW.
RUNS = [
  ((3, 120, 100, 32), (15, 15, 32, 32), (1, 1), "SAME", "NHWC"),  # 9 tiles, runs of 5
  ((2, 16, 128, 128), (31, 31, 16, 32), (2, 2), "SAME", "NCHW"),  # 8 tiles, runs of 4
  ((3, 70, 100, 32), (21, 21, 32, 32), (2, 1), "SAME", "NHWC"),  # 9 tiles, runs of 5
]


@pytest.mark.parametrize("case", RUNS, ids=lambda c: "x".join(map(str, c[1])))
def test_fft_runs_of_tiles_match_oracle(rng, case):
  x_shape, w_shape, strides, padding, fmt = case
  plan = lc.plan(x_shape, w_shape, list(strides), padding, data_format=fmt, algorithm="fft")
  runs = {pp.name: pp.vec_block for pp in plan.passes[:2]}
  # The cases are sized for the two threads of the project's machines; more slots share
  # the tiles out in shorter runs.
  if plan.threads <= 2:
    assert min(runs.values()) > 1, plan.passes
  ref = Conv(x_shape, w_shape, strides, padding, (1, 1), fmt)
  x = rng.standard_normal(x_shape).astype(np.float32)
  w = rng.standard_normal(w_shape).astype(np.float32)
  dy = rng.standard_normal(ref.output_shape()).astype(np.float32)
  kwargs = dict(data_format=fmt, algorithm="fft")
  y = lc.conv2d(x, w, list(strides), padding, **kwargs)
  dx = lc.conv2d_backprop_input(x_shape, w, dy, list(strides), padding, **kwargs)
  ref.check_passes(
    "float32", planned_fft(plan.passes), x, w, dy, y=y.numpy(), dx=dx.numpy(), what=f"runs {runs}: "
  )


@pytest.mark.parametrize("algorithm", ["direct", "fft"])
@pytest.mark.parametrize("case", GRID, ids=[_id(c) for c in GRID])
def test_forward_float32_matches_tf(rng, case, algorithm):
  x_shape, w_shape, s, p, d = case
  x, w, y, pad_arg, check, fft = _run(rng, x_shape, w_shape, s, p, d, "NHWC", "float32", algorithm)
  want = tf.nn.conv2d(x, w, list(s), pad_arg, dilations=list(d))
  # TF sums directly in float32: its own elementwise bound adds to ours.
  check.check(
    y,
    "float32",
    fft,
    "vs tf.nn.conv2d",
    want=want.numpy(),
    want_tolerance=tolerance("float32", check.terms, check.magnitude),
  )


@pytest.mark.parametrize("algorithm", ["direct", "fft"])
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
@pytest.mark.parametrize(
  "case",
  [GRID[3], GRID[6], GRID[8], GRID[12], GRID[15]],
  ids=[_id(c) for c in (GRID[3], GRID[6], GRID[8], GRID[12], GRID[15])],
)
def test_forward_dtypes(rng, case, data_format, dtype_name, algorithm):
  x_shape, w_shape, s, p, d = case
  if data_format == "NCHW":
    x_shape = (x_shape[0], x_shape[3], x_shape[1], x_shape[2])
  _run(rng, x_shape, w_shape, s, p, d, data_format, dtype_name, algorithm)


@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
@pytest.mark.parametrize(
  "shape,padding,expected",
  [
    ((0, 8, 8, 3), "SAME", (0, 8, 8, 4)),
    ((2, 0, 8, 3), "SAME", (2, 0, 8, 4)),
    ((2, 8, 0, 3), "SAME", (2, 8, 0, 4)),
    ((0, 8, 8, 3), "VALID", (0, 6, 6, 4)),
  ],
)
def test_empty_tensors(shape, padding, expected, fmt):
  if fmt == "NCHW":
    shape = (shape[0], shape[3], shape[1], shape[2])
    expected = (expected[0], expected[3], expected[1], expected[2])
  x = tf.zeros(shape)
  w = tf.ones((3, 3, 3, 4))
  y = lc.conv2d(x, w, 1, padding, data_format=fmt)
  assert tuple(y.shape) == expected


def test_zero_output_channels_and_zero_input_channels():
  y = lc.conv2d(tf.ones((1, 5, 5, 2)), tf.ones((3, 3, 2, 0)), 1, "SAME")
  assert tuple(y.shape) == (1, 5, 5, 0)
  y = lc.conv2d(tf.ones((1, 5, 5, 0)), tf.ones((3, 3, 0, 2)), 1, "SAME")
  np.testing.assert_array_equal(y.numpy(), np.zeros((1, 5, 5, 2)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("algorithm", ["direct", "fft"])
def test_nan_and_inf_propagate_like_tf(algorithm, dtype):
  x = np.zeros((1, 7, 7, 1), dtype)
  x[0, 3, 3, 0] = np.nan
  x[0, 0, 6, 0] = np.inf
  w = np.ones((3, 3, 1, 2), dtype)
  # The FFT would smear a non-finite value over its tile; the op then sums directly.
  ours = lc.conv2d(x, w, 1, "SAME", algorithm=algorithm).numpy()
  theirs = tf.nn.conv2d(x, w, 1, "SAME").numpy()
  np.testing.assert_array_equal(np.isnan(ours), np.isnan(theirs))
  np.testing.assert_array_equal(np.isinf(ours), np.isinf(theirs))
  assert np.isnan(ours).sum() == 18 and np.isinf(ours).sum() == 8
  finite = np.isfinite(theirs)
  np.testing.assert_allclose(ours[finite], theirs[finite], rtol=1e-6)
  w_nan = w.copy()
  w_nan[1, 1, 0, 1] = np.nan
  for got in (lc.conv2d(np.ones_like(x), w_nan, 1, "SAME", algorithm=algorithm).numpy(),):
    assert np.isnan(got[..., 1]).all() and np.isfinite(got[..., 0]).all()
  # One infinity among many values, where the finiteness test runs in vector lanes over
  # several chunks, and one at the very end, in its scalar tail.
  big = np.zeros((1, 300, 301, 2), dtype)
  for where in ((0, 150, 7, 1), (0, 299, 300, 1)):
    big[where] = np.inf
    got = lc.conv2d(big, w[:, :, :1].repeat(2, axis=2), 1, "SAME", algorithm=algorithm).numpy()
    assert np.isinf(got).sum() == 9 * 2 - (9 - 4) * 2 * (where[1] == 299), where
    big[where] = 0


def test_argument_forms_match_tf(rng):
  x = rng.standard_normal((2, 12, 14, 3)).astype(np.float32)
  w = rng.standard_normal((3, 3, 3, 4)).astype(np.float32)
  for strides in (2, [2], [2, 1], (1, 2, 1, 1), np.int64(3)):
    for dil in (None, 1, [1, 1]):
      got = lc.conv2d(x, w, strides, "SAME", dilations=dil, algorithm="direct")
      want = tf.nn.conv2d(x, w, strides, "SAME", dilations=dil)
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  got = lc.conv2d(x, w, 1, "same", algorithm="direct")
  np.testing.assert_allclose(got, tf.nn.conv2d(x, w, 1, "SAME"), rtol=1e-5, atol=1e-5)


def test_graph_and_function_modes(rng):
  x = rng.standard_normal((1, 10, 10, 2)).astype(np.float32)
  w = rng.standard_normal((5, 5, 2, 3)).astype(np.float32)
  eager = lc.conv2d(x, w, 2, "SAME", algorithm="direct").numpy()
  fn = tf.function(lambda a, b: lc.conv2d(a, b, 2, "SAME", algorithm="direct"))
  np.testing.assert_array_equal(fn(x, w).numpy(), eager)
  g = tf.Graph()
  with g.as_default():
    xp = tf.compat.v1.placeholder(tf.float32, (None, 10, 10, 2))
    y = lc.conv2d(xp, tf.constant(w), 2, "SAME", algorithm="direct")
    assert y.shape.as_list() == [None, 5, 5, 3]
  with tf.compat.v1.Session(graph=g) as sess:
    np.testing.assert_array_equal(sess.run(y, {xp: x}), eager)


def test_auto_routes_small_filters_to_tensorflow_where_the_plan_says_so(rng):
  x = rng.standard_normal((4, 32, 32, 32)).astype(np.float32)
  w = rng.standard_normal((3, 3, 32, 64)).astype(np.float32)
  p = lc.plan(x.shape, w.shape, 1, "SAME")
  assert [pp.algorithm for pp in p.passes] == ["tf", "tf", "tf"]
  np.testing.assert_array_equal(
    lc.conv2d(x, w, 1, "SAME").numpy(), tf.nn.conv2d(x, w, 1, "SAME").numpy()
  )
  # Where TF's CPU kernels cannot go (NCHW, dilated gradients), auto stays on ours.
  assert lc.plan((4, 32, 32, 32), w.shape, 1, "SAME", data_format="NCHW").forward.algorithm != "tf"
  assert lc.plan(x.shape, w.shape, 1, "SAME", dilations=2).forward.algorithm != "tf"

  # The graph shows which kernel runs: TensorFlow's where auto routes to it, ours (with
  # the requested algorithm) where one is asked for explicitly.
  def kernels(algorithm):
    fn = tf.function(lambda a, b: lc.conv2d(a, b, 1, "SAME", algorithm=algorithm))
    ops = fn.get_concrete_function(x, w).graph.get_operations()
    return sorted(
      (op.type, op.get_attr("algorithm") if op.type.startswith("LargeConv>") else None)
      for op in ops
      if "Conv2D" in op.type
    )

  assert kernels("auto") == [("Conv2D", None)]
  assert kernels("direct") == [("LargeConv>Conv2D", b"direct")]
  with pytest.raises(ValueError, match="algorithm='tf' needs"):
    lc.conv2d(x.transpose(0, 3, 1, 2), w, 1, "SAME", data_format="NCHW", algorithm="tf")


@pytest.mark.parametrize("case", GRID, ids=[_id(c) for c in GRID])
def test_the_oracle_matches_tf_in_float64(rng, case):
  """The oracle every test leans on, checked once against TensorFlow's own kernels: the
  forward pass for every case, both gradients where TF's CPU kernels take the case
  (no dilations)."""
  x_shape, w_shape, s, p, d = case
  ref = Conv(x_shape, w_shape, s, p, d)
  x = tf.constant(rng.standard_normal(x_shape))
  w = tf.constant(rng.standard_normal(w_shape))
  dy = tf.constant(rng.standard_normal(ref.output_shape()))
  pad_arg = p if isinstance(p, str) else _explicit(p, "NHWC")
  with tf.GradientTape() as tape:
    tape.watch([x, w])
    y = tf.nn.conv2d(x, w, list(s), pad_arg, dilations=list(d))
  results = {"forward": (y, x, w)}
  if d == (1, 1):
    dx, dw = tape.gradient(y, [x, w], output_gradients=dy)
    results.update(backprop_input=(dx, w, dy), backprop_filter=(dw, x, dy))
  for name, (got, a, b) in results.items():
    # TF sums directly in float64: the elementwise bound, doubled for the oracle's own.
    check = PassCheck(ref, name, a.numpy(), b.numpy())
    check.check(
      got.numpy(),
      "float64",
      None,
      f"oracle vs TF {name}",
      want_tolerance=tolerance("float64", check.terms, check.magnitude),
    )


def test_backprops_with_algorithm_tf_run_tensorflows_kernels(rng):
  x = tf.constant(rng.standard_normal((2, 17, 19, 3)))
  w = tf.constant(rng.standard_normal((5, 4, 3, 4)))
  pad = [[0, 0], [2, 1], [1, 3], [0, 0]]
  dy = tf.constant(rng.standard_normal(lc.conv2d(x, w, 2, pad).shape))

  def run(algorithm):
    dx = lc.conv2d_backprop_input([17, 19], w, dy, 2, pad, algorithm=algorithm)
    dw = lc.conv2d_backprop_filter(x, w.shape, dy, 2, pad, algorithm=algorithm)
    return dx, dw

  for got, want in zip(run("tf"), run("direct")):
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-10, atol=1e-10)
  fn = tf.function(
    lambda a, b, c: (
      lc.conv2d_backprop_input(tf.shape(a), b, c, 2, pad, algorithm="tf"),
      lc.conv2d_backprop_filter(a, tf.shape(b), c, 2, pad, algorithm="tf"),
    )
  )
  ops = fn.get_concrete_function(x, w, dy).graph.get_operations()
  assert sorted(op.type for op in ops if "Conv2D" in op.type) == [
    "Conv2DBackpropFilter",
    "Conv2DBackpropInput",
  ]
  with pytest.raises(ValueError, match="algorithm='tf' needs"):  # grouped: not TF's
    lc.conv2d_backprop_input([2, 17, 19, 6], w, dy, 2, pad, algorithm="tf")
  with pytest.raises(ValueError, match="algorithm='tf' needs"):  # NCHW on the CPU
    lc.conv2d_backprop_filter(
      tf.transpose(x, [0, 3, 1, 2]),
      w.shape,
      tf.transpose(dy, [0, 3, 1, 2]),
      2,
      "SAME",
      data_format="NCHW",
      algorithm="tf",
    )
