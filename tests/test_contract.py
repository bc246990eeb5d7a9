"""tf.nn.conv2d's contract beyond test_ops: int32, inputs with extra batch dimensions, a
spatial input_sizes, degenerate backprops, TensorFlow's error wording, and the behaviours
TensorFlow's own tests pin down (conv_ops_test.py, conv2d_backprop_filter_grad_test.py,
depthwise_conv_op_base.py: their shapes, data and tolerances), checked against TF itself
or the numpy oracle, on both algorithms where both apply."""

import re

import numpy as np
import pytest
import tensorflow as tf
from reference import Conv
from reference import PassCheck
from reference import planned_fft

import tf_largeconv as lc
from tf_largeconv import _loader

ALGORITHMS = ("auto", "direct", "fft")
DTYPES = {
  "float16": tf.float16,
  "bfloat16": tf.bfloat16,
  "float32": tf.float32,
  "float64": tf.float64,
  "int32": tf.int32,
}
# TF's tolerances (atol = rtol) for the values of conv_ops_test.py's _VerifyValues.
TF_TOL = {"float16": 1e-3, "float32": 1e-5, "float64": 1e-5}


def _arange(shape, dtype=np.float64):
  """1, 2, ... in `shape`: the data of TF's conv tests (_CreateNumpyTensor)."""
  return np.arange(1, int(np.prod(shape)) + 1, dtype=dtype).reshape(shape)


def _nchw(a):
  return np.ascontiguousarray(np.transpose(a, (0, 3, 1, 2)))


def _nhwc(a):
  return np.transpose(np.asarray(a), (0, 2, 3, 1))


def _in_format(fmt, shape):
  return shape if fmt == "NHWC" else (shape[0], shape[3], shape[1], shape[2])


def _op_args(strides, padding, dilations, fmt):
  """strides, padding, dilations as conv2d takes them, in `fmt`, from spatial pairs."""
  s = [1, *strides, 1] if fmt == "NHWC" else [1, 1, *strides]
  d = [1, *dilations, 1] if fmt == "NHWC" else [1, 1, *dilations]
  if isinstance(padding, str):
    return s, padding, d
  (t, b), (l, r) = padding
  pad = [[0, 0], [t, b], [l, r], [0, 0]] if fmt == "NHWC" else [[0, 0], [0, 0], [t, b], [l, r]]
  return s, pad, d


def _case_id(c):
  x, w, s, p, d = c
  pad = p if isinstance(p, str) else "x".join(str(v) for pair in p for v in pair)
  return f"x{'x'.join(map(str, x))}-k{'x'.join(map(str, w))}-s{s[0]}{s[1]}-{pad}-d{d[0]}{d[1]}"


def _cast(a, dtype_name):
  return tf.cast(tf.constant(a), DTYPES[dtype_name])


def _graph(f):
  """`f` traced into a graph (autograph off: the lambdas here need none)."""
  return tf.function(f, autograph=False)


def _eager(f):
  return f


def _fft_sizes(ref, w_shape, s, pad, d, dtype_name, algorithm):
  """The transform size of each pass as planned, None where it sums directly. A problem
  with an empty output has nothing to transform (and no forward plan: TF's backprop
  kernels allow filters larger than the padded input only then)."""
  if 0 in ref.output_shape():
    return dict.fromkeys(("forward", "backprop_input", "backprop_filter"))
  x_shape = (ref.n, ref.h, ref.w, ref.c) if ref.fmt == "NHWC" else (ref.n, ref.c, ref.h, ref.w)
  plan = lc.plan(
    x_shape,
    w_shape,
    s,
    pad,
    data_format=ref.fmt,
    dilations=d,
    dtype=DTYPES[dtype_name],
    algorithm=algorithm,
  )
  return planned_fft(plan.passes)


def _check(ref, pass_name, got, a, b, dtype_name, fft, what):
  """TF's tolerance where the pass summed directly; the FFT bound (reference.PassCheck)
  where it ran by transforms (which no small problem of TF's tests is planned onto by 'auto')."""
  want = getattr(ref, pass_name)(np.asarray(a, np.float64), np.asarray(b, np.float64))
  got = np.asarray(tf.cast(got, tf.float64))
  assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
  if fft[pass_name] is None:
    tol = TF_TOL[dtype_name]
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=what)
  else:
    PassCheck(ref, pass_name, a, b).check(got, dtype_name, fft[pass_name], what)


# --- TF's value tests: forward ------------------------------------------------------------

# (input NHWC, filter, strides, padding, dilations): the problems of conv_ops_test.py's
# value tests (1x1 and 2x2 filters, strides, a kernel smaller than its stride, a kernel as
# large as the input, dilations, explicit paddings, an empty batch, an input that is all
# padding, grouped convolution).
FORWARD = [
  ((1, 2, 3, 3), (1, 1, 3, 3), (1, 1), "VALID", (1, 1)),
  ((1, 2, 3, 3), (2, 2, 3, 3), (1, 1), "VALID", (1, 1)),
  ((1, 2, 3, 3), (1, 2, 3, 3), (1, 1), "VALID", (1, 1)),
  ((1, 2, 3, 3), (2, 2, 3, 3), (2, 2), "VALID", (1, 1)),
  ((1, 2, 3, 3), (2, 2, 3, 3), (2, 2), "SAME", (1, 1)),
  ((1, 3, 6, 1), (2, 2, 1, 1), (1, 2), "VALID", (1, 1)),
  ((1, 7, 7, 1), (2, 2, 1, 1), (3, 3), "VALID", (1, 1)),
  ((1, 3, 3, 1), (1, 1, 1, 1), (2, 2), "SAME", (1, 1)),
  ((1, 4, 4, 1), (2, 2, 1, 1), (3, 3), "SAME", (1, 1)),
  ((1, 2, 2, 1), (2, 2, 1, 2), (1, 1), "VALID", (1, 1)),
  ((0, 2, 3, 3), (1, 1, 3, 3), (1, 1), "VALID", (1, 1)),
  ((0, 2, 3, 3), (1, 1, 3, 3), (1, 1), "VALID", (2, 1)),
  ((1, 4, 4, 1), (2, 2, 1, 1), (1, 1), "VALID", (2, 1)),
  ((1, 2, 3, 3), (2, 2, 3, 3), (1, 1), "VALID", (1, 2)),
  ((1, 3, 3, 1), (2, 2, 1, 2), (1, 1), "VALID", (2, 2)),
  ((1, 2, 3, 3), (2, 2, 3, 3), (1, 1), ((0, 0), (0, 0)), (1, 1)),
  ((1, 2, 3, 2), (2, 2, 2, 2), (1, 1), ((1, 1), (1, 1)), (1, 1)),
  ((1, 2, 1, 2), (1, 1, 2, 1), (2, 1), ((2, 2), (2, 2)), (1, 1)),
  ((2, 2, 4, 3), (1, 2, 3, 2), (2, 2), ((0, 3), (0, 0)), (1, 1)),
  ((1, 2, 4, 2), (2, 2, 2, 2), (1, 3), ((1, 0), (0, 2)), (1, 1)),
  ((1, 1, 1, 3), (2, 2, 3, 3), (1, 1), ((3, 4), (4, 2)), (1, 1)),
  ((1, 2, 3, 2), (3, 2, 2, 1), (1, 1), ((2, 1), (1, 2)), (2, 3)),
  ((1, 0, 2, 1), (1, 1, 1, 1), (1, 1), ((1, 1), (1, 1)), (1, 1)),  # all padding: zeros
  ((1, 5, 4, 4), (2, 2, 2, 4), (2, 1), "SAME", (2, 2)),  # 2 groups
]


@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
@pytest.mark.parametrize("case", FORWARD, ids=[_case_id(c) for c in FORWARD])
def test_tf_forward_values(case, fmt):
  """TF's data (1, 2, ...) and tolerances; int32 exactly, as TF tests it. 'auto' plans no
  FFT for these small problems, whose outputs TF checks to 1e-5."""
  x_shape, w_shape, strides, padding, dilations = case
  x, w = _arange(x_shape), _arange(w_shape)
  xf = x if fmt == "NHWC" else _nchw(x)
  s, pad, d = _op_args(strides, padding, dilations, fmt)
  for dtype_name in ("float32", "float16", "float64", "int32"):
    ref = Conv(
      xf.shape,
      w_shape,
      strides,
      padding,
      dilations,
      fmt,
      dtype=np.int64 if dtype_name == "int32" else np.float64,
    )
    for algorithm in ALGORITHMS:
      if dtype_name == "int32" and algorithm == "fft":
        continue
      what = f"{dtype_name} {algorithm}"
      y = lc.conv2d(
        _cast(xf, dtype_name),
        _cast(w, dtype_name),
        s,
        pad,
        data_format=fmt,
        dilations=d,
        algorithm=algorithm,
      )
      assert y.dtype == DTYPES[dtype_name], what
      fft = _fft_sizes(ref, w_shape, s, pad, d, dtype_name, algorithm)
      # 'auto' plans no FFT here; an empty input has nothing to transform.
      assert (fft["forward"] is None) == (algorithm != "fft" or x.size == 0), what
      if dtype_name == "int32":
        np.testing.assert_array_equal(y, ref.forward(xf, w).astype(np.int32), err_msg=what)
      else:
        _check(ref, "forward", y, xf, w, dtype_name, fft, what)
    if fmt == "NHWC" and dtype_name in ("float32", "int32"):
      # TF itself: its CPU kernel computes both in NHWC (and nothing in NCHW).
      want = tf.nn.conv2d(_cast(x, dtype_name), _cast(w, dtype_name), s, pad, dilations=d)
      ours = lc.conv2d(_cast(x, dtype_name), _cast(w, dtype_name), s, pad, dilations=d)
      assert ours.shape == want.shape
      np.testing.assert_allclose(ours, want, rtol=1e-5, atol=1e-5)


# --- TF's value tests: both backprops -----------------------------------------------------

BACKPROP = [
  ((1, 2, 3, 1), (2, 2, 1, 1), (1, 1), "VALID", (1, 1)),
  ((0, 2, 3, 1), (2, 2, 1, 1), (1, 1), "VALID", (1, 1)),  # empty batch
  ((1, 2, 3, 3), (2, 2, 3, 3), (1, 1), "VALID", (1, 1)),
  ((1, 3, 6, 1), (2, 2, 1, 1), (1, 2), "VALID", (1, 1)),
  ((1, 4, 4, 1), (1, 1, 1, 1), (2, 2), "SAME", (1, 1)),
  ((1, 2, 2, 1), (2, 2, 1, 2), (1, 1), "VALID", (1, 1)),
  ((3, 1, 1, 2), (1, 3, 2, 3), (1, 2), "VALID", (1, 1)),  # out_backprop [3, 1, 0, 3]
  ((1, 2, 3, 1), (2, 2, 1, 0), (1, 1), "VALID", (1, 1)),  # no output channels
  ((1, 3, 6, 1), (2, 2, 1, 1), (1, 1), "VALID", (2, 1)),
  ((1, 3, 3, 1), (2, 2, 1, 2), (1, 1), "VALID", (2, 2)),
  ((1, 2, 3, 1), (2, 2, 1, 2), (1, 1), ((1, 1), (1, 1)), (1, 1)),
  ((1, 2, 3, 2), (1, 1, 2, 1), (1, 2), ((1, 1), (1, 1)), (1, 1)),
  ((1, 4, 3, 1), (2, 2, 1, 1), (1, 2), ((1, 1), (1, 1)), (2, 2)),
  ((2, 3, 1, 1), (2, 1, 1, 1), (3, 1), ((2, 2), (2, 2)), (1, 1)),
  ((1, 3, 6, 1), (3, 2, 1, 1), (1, 2), ((2, 2), (2, 2)), (2, 3)),
  ((1, 2, 3, 1), (2, 2, 1, 1), (1, 1), ((1, 8), (4, 2)), (1, 1)),
  ((1, 5, 3, 1), (3, 2, 1, 1), (3, 1), ((1, 8), (4, 2)), (1, 1)),
  ((1, 3, 3, 1), (2, 1, 1, 1), (1, 1), ((5, 0), (2, 2)), (1, 1)),
  ((1, 4, 2, 1), (3, 3, 1, 1), (1, 2), ((5, 0), (2, 2)), (2, 1)),
]


@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
@pytest.mark.parametrize("case", BACKPROP, ids=[_case_id(c) for c in BACKPROP])
def test_tf_backprop_values(case, fmt):
  """Both backprop ops on TF's data and tolerances, int32 exactly; input_sizes given in
  full and by its spatial pair alike."""
  x_shape, w_shape, strides, padding, dilations = case
  s, pad, d = _op_args(strides, padding, dilations, fmt)
  xf = _in_format(fmt, x_shape)
  geometry = Conv(xf, w_shape, strides, padding, dilations, fmt)
  x, w, dy = _arange(xf), _arange(w_shape), _arange(geometry.output_shape())
  spatial = list(xf[1:3] if fmt == "NHWC" else xf[2:])
  for dtype_name in ("float32", "float64", "int32"):
    ref = Conv(
      xf,
      w_shape,
      strides,
      padding,
      dilations,
      fmt,
      dtype=np.int64 if dtype_name == "int32" else np.float64,
    )
    for algorithm in ALGORITHMS:
      if dtype_name == "int32" and algorithm == "fft":
        continue
      what = f"{dtype_name} {algorithm}"
      kw = dict(data_format=fmt, dilations=d, algorithm=algorithm)
      wt, dyt, xt = (_cast(v, dtype_name) for v in (w, dy, x))
      dx = lc.conv2d_backprop_input(list(xf), wt, dyt, s, pad, **kw)
      dw = lc.conv2d_backprop_filter(xt, list(w_shape), dyt, s, pad, **kw)
      # The spatial pair: batch from out_backprop, depth from the filter.
      np.testing.assert_array_equal(
        lc.conv2d_backprop_input(spatial, wt, dyt, s, pad, **kw), dx, err_msg=what
      )
      if dtype_name == "int32":
        np.testing.assert_array_equal(dx, ref.backprop_input(w, dy).astype(np.int32), what)
        np.testing.assert_array_equal(dw, ref.backprop_filter(x, dy).astype(np.int32), what)
        continue
      fft = _fft_sizes(ref, w_shape, s, pad, d, dtype_name, algorithm)
      _check(ref, "backprop_input", dx, w, dy, dtype_name, fft, f"{what} backprop_input")
      _check(ref, "backprop_filter", dw, x, dy, dtype_name, fft, f"{what} backprop_filter")


def _tf_backprop_input(sizes, w, dy, s, pad, d):
  explicit = [v for pair in pad for v in pair] if not isinstance(pad, str) else []
  return tf.raw_ops.Conv2DBackpropInput(
    input_sizes=sizes,
    filter=w,
    out_backprop=dy,
    strides=s,
    padding=pad if isinstance(pad, str) else "EXPLICIT",
    explicit_paddings=explicit,
    dilations=d,
  )


@pytest.mark.parametrize("dtype_name", ["float32", "int32"])
@pytest.mark.parametrize(
  "case",
  [c for c in BACKPROP if c[4] == (1, 1)],
  ids=[_case_id(c) for c in BACKPROP if c[4] == (1, 1)],
)
def test_backprop_input_equals_tf(case, dtype_name):
  """TF's own Conv2DBackpropInput (NHWC, dilation 1 on the CPU; int32 too), with 4 and with
  2 input_sizes."""
  x_shape, w_shape, strides, padding, dilations = case
  s, pad, d = _op_args(strides, padding, dilations, "NHWC")
  dy_shape = Conv(x_shape, w_shape, strides, padding).output_shape()
  w, dy = _cast(_arange(w_shape), dtype_name), _cast(_arange(dy_shape), dtype_name)
  spec = tf.TensorSpec((None,) + tuple(dy_shape[1:]), DTYPES[dtype_name])
  for sizes in (list(x_shape), list(x_shape[1:3])):
    want = _tf_backprop_input(sizes, w, dy, s, pad, d)
    got = lc.conv2d_backprop_input(sizes, w, dy, s, pad, dilations=d)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)
    # Traced with an unknown batch, the static shape is TF's for the spatial pair (the batch
    # unknown) and at least as specific for all 4 sizes (TF leaves the batch unknown too).
    ours = _graph(lambda t, z=sizes: lc.conv2d_backprop_input(z, w, t, s, pad, dilations=d))
    theirs = _graph(lambda t, z=sizes: _tf_backprop_input(z, w, t, s, pad, d))
    ours, theirs = (f.get_concrete_function(spec).structured_outputs.shape for f in (ours, theirs))
    assert ours == theirs if len(sizes) == 2 else ours.as_list() == list(x_shape)
    assert theirs.is_compatible_with(ours)


# --- int32 ----------------------------------------------------------------------------

INT_CASES = [
  ((2, 9, 8, 3), (3, 3, 3, 4), (1, 1), "SAME", (1, 1)),
  ((1, 12, 11, 4), (5, 4, 2, 6), (2, 3), ((1, 2), (0, 3)), (1, 1)),  # grouped, explicit
  ((2, 10, 9, 2), (3, 2, 2, 3), (1, 2), "VALID", (2, 3)),
  ((1, 20, 19, 1), (15, 13, 1, 2), (1, 1), "SAME", (1, 1)),  # large: float32 plans FFT
]


@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
@pytest.mark.parametrize("case", INT_CASES, ids=[_case_id(c) for c in INT_CASES])
def test_int32_wraps_exactly_as_tf(rng, case, fmt):
  """Full-range int32 data: every product and sum overflows, and the result is the exact
  sum modulo 2^32, bit for bit TF's (forward and input gradient; TF has no int32 filter
  gradient, so that one is checked against the exact oracle alone). Gradients of int32
  tensors are None, as with tf.nn.conv2d."""
  x_shape, w_shape, strides, padding, dilations = case
  s, pad, d = _op_args(strides, padding, dilations, fmt)
  xf = _in_format(fmt, x_shape)
  ref = Conv(xf, w_shape, strides, padding, dilations, fmt, dtype=np.int64)
  full = dict(low=-(2**31), high=2**31, dtype=np.int64)
  x = rng.integers(size=xf, **full).astype(np.int32)
  w = rng.integers(size=w_shape, **full).astype(np.int32)
  dy = rng.integers(size=ref.output_shape(), **full).astype(np.int32)
  for algorithm in ("auto", "direct"):
    kw = dict(data_format=fmt, dilations=d, algorithm=algorithm)
    y = lc.conv2d(x, w, s, pad, **kw)
    dx = lc.conv2d_backprop_input(list(xf), w, dy, s, pad, **kw)
    dw = lc.conv2d_backprop_filter(x, list(w_shape), dy, s, pad, **kw)
    assert y.dtype == dx.dtype == dw.dtype == tf.int32
    np.testing.assert_array_equal(y, ref.forward(x, w).astype(np.int32))
    np.testing.assert_array_equal(dx, ref.backprop_input(w, dy).astype(np.int32))
    np.testing.assert_array_equal(dw, ref.backprop_filter(x, dy).astype(np.int32))
  plan = lc.plan(xf, w_shape, s, pad, data_format=fmt, dilations=d, dtype=tf.int32)
  assert all(p.algorithm == "direct" for p in plan.passes), plan
  if fmt == "NHWC" and dilations == (1, 1):
    np.testing.assert_array_equal(y, tf.nn.conv2d(x, w, s, pad))
    if x_shape[3] == w_shape[2]:  # TF's CPU kernel has no grouped input gradient
      np.testing.assert_array_equal(dx, _tf_backprop_input(list(xf), w, dy, s, pad, d))
  xv = tf.Variable(x)
  with tf.GradientTape() as tape:
    out = lc.conv2d(xv, w, s, pad, data_format=fmt, dilations=d)
  assert tape.gradient(out, xv) is None


def test_int32_never_runs_the_fft():
  x_shape, w_shape = (1, 40, 44, 1), (31, 31, 1, 3)
  assert lc.plan(x_shape, w_shape, 1, "SAME").forward.algorithm == "fft"  # float32 would
  assert lc.plan(x_shape, w_shape, 1, "SAME", dtype=tf.int32).forward.algorithm == "direct"
  x = tf.ones(x_shape, tf.int32)
  w = tf.ones(w_shape, tf.int32)
  message = "algorithm='fft' cannot compute int32 exactly"
  with pytest.raises(ValueError, match=message):
    lc.conv2d(x, w, 1, "SAME", algorithm="fft")
  with pytest.raises(ValueError, match=message):
    tf.function(lambda a: lc.conv2d(a, w, 1, "SAME", algorithm="fft"))(x)
  with pytest.raises(ValueError, match=message):
    lc.conv2d_backprop_input(
      x_shape, w, tf.ones((1, 40, 44, 3), tf.int32), 1, "SAME", algorithm="fft"
    )
  with pytest.raises(ValueError, match=message):
    lc.conv2d_backprop_filter(
      x, w_shape, tf.ones((1, 40, 44, 3), tf.int32), 1, "SAME", algorithm="fft"
    )
  with pytest.raises(ValueError, match="algorithm='fft' cannot compute integer dtypes"):
    lc.plan(x_shape, w_shape, 1, "SAME", dtype=tf.int32, algorithm="fft")
  with pytest.raises(
    tf.errors.InvalidArgumentError, match="algorithm='fft' cannot compute integer dtypes"
  ):
    _loader.ops().large_conv_conv2d(x, w, strides=[1, 1, 1, 1], padding="SAME", algorithm="fft")


def test_depthwise_refuses_int32_as_tf_does():
  """tf.nn.depthwise_conv2d takes floating dtypes only; so does ours, in TF's words."""
  x, f = tf.ones((1, 5, 5, 2), tf.int32), tf.ones((3, 3, 2, 1), tf.int32)
  phrase = (
    "Value passed to parameter 'input' has DataType int32 not in list of allowed "
    "values: float16, bfloat16, float32, float64"
  )
  with pytest.raises(TypeError, match=phrase):
    tf.function(lambda: tf.nn.depthwise_conv2d(x, f, [1, 1, 1, 1], "SAME"))()
  for call in (
    lambda: lc.depthwise_conv2d(x, f, 1, "SAME"),
    tf.function(lambda: lc.depthwise_conv2d(x, f, 1, "SAME")),
  ):
    with pytest.raises(TypeError, match=phrase):
      call()


# --- inputs with extra batch dimensions ----------------------------------------------


@pytest.mark.parametrize("algorithm", ["auto", "direct", "fft"])
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
def test_expanded_batch(rng, fmt, algorithm):
  """TF's testConv2DExpandedBatch: batch_shape + [H, W, C] ([C, H, W] in NCHW) gives the
  rank-4 result reshaped, bit for bit, gradients too; the static shape is tf.nn.conv2d's."""
  inner = (2, 3, 3) if fmt == "NHWC" else (3, 2, 3)
  x = tf.constant(rng.standard_normal((2, 5) + inner), tf.float32)
  w = tf.constant(rng.standard_normal((1, 1, 3, 3)), tf.float32)
  flat = tf.reshape(x, (10,) + inner)
  kw = dict(data_format=fmt, algorithm=algorithm)
  with tf.GradientTape(persistent=True) as tape:
    tape.watch([x, w, flat])
    y = lc.conv2d(x, w, 1, "VALID", **kw)
    y4 = lc.conv2d(flat, w, 1, "VALID", **kw)
    loss, loss4 = tf.reduce_sum(y * y), tf.reduce_sum(y4 * y4)
  assert y.shape == (2, 5) + inner
  np.testing.assert_array_equal(tf.reshape(y, y4.shape), y4)
  np.testing.assert_array_equal(
    tf.reshape(tape.gradient(loss, x), flat.shape), tape.gradient(loss4, flat)
  )
  np.testing.assert_array_equal(tape.gradient(loss, w), tape.gradient(loss4, w))
  if fmt == "NHWC":
    np.testing.assert_allclose(y, tf.nn.conv2d(x, w, 1, "VALID"), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
@pytest.mark.parametrize(
  "spec",
  [(None, 5, 6, 7, 3), (2, None, 6, None, 3), (None, None, None, None, 3), (2, 1, 3, 6, 7, 3)],
)
def test_expanded_batch_static_shapes_match_tf(spec, fmt):
  """Traced with unknown batch or image sizes, the static shape is tf.nn.conv2d's (whose
  shape inference holds in NCHW too), and the traced function runs."""
  if fmt == "NCHW":
    spec = spec[:-3] + (spec[-1], spec[-3], spec[-2])
  w = tf.ones((3, 3, 3, 4))
  ours = tf.function(lambda a: lc.conv2d(a, w, [1, 2], "SAME", data_format=fmt))
  theirs = tf.function(lambda a: tf.nn.conv2d(a, w, [1, 2], "SAME", data_format=fmt))
  traced = ours.get_concrete_function(tf.TensorSpec(spec))
  want = theirs.get_concrete_function(tf.TensorSpec(spec)).structured_outputs.shape
  assert traced.structured_outputs.shape.as_list() == want.as_list()
  concrete = tuple(2 if v is None else v for v in spec)
  y = traced(tf.ones(concrete))
  assert y.shape[:-3] == concrete[:-3]
  assert y.shape == lc.plan(concrete, (3, 3, 3, 4), [1, 2], "SAME", data_format=fmt).output_shape


def test_expanded_batch_edge_cases():
  w = tf.ones((3, 3, 3, 4))
  assert lc.conv2d(tf.zeros((2, 0, 5, 5, 3)), w, 1, "SAME").shape == (2, 0, 5, 5, 4)
  assert lc.conv2d(tf.zeros((0, 2, 5, 0, 3)), w, 1, "SAME").shape == (0, 2, 5, 0, 4)
  with pytest.raises(tf.errors.InvalidArgumentError, match="input must be a 4-D tensor"):
    lc.conv2d(tf.zeros((5, 5, 3)), w, 1, "SAME")


@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
def test_expanded_batch_depthwise(rng, fmt):
  """depthwise_conv2d takes batch_shape + 3 dimensions too (tf.nn.depthwise_conv2d does
  not: a difference in the user's favour), its gradient included."""
  inner = (6, 7, 3) if fmt == "NHWC" else (3, 6, 7)
  x = tf.constant(rng.standard_normal((2, 3) + inner))
  f = tf.constant(rng.standard_normal((3, 3, 3, 2)))
  flat = tf.reshape(x, (6,) + inner)
  with tf.GradientTape(persistent=True) as tape:
    tape.watch([x, flat])
    y = lc.depthwise_conv2d(x, f, 1, "SAME", data_format=fmt)
    y4 = lc.depthwise_conv2d(flat, f, 1, "SAME", data_format=fmt)
  assert y.shape[:2] == (2, 3)
  np.testing.assert_array_equal(tf.reshape(y, y4.shape), y4)
  np.testing.assert_array_equal(
    tf.reshape(tape.gradient(y, x), flat.shape), tape.gradient(y4, flat)
  )
  with pytest.raises(ValueError, match="input must be 4-dimensional"):
    lc.depthwise_conv2d(tf.ones(inner, tf.float64), f, 1, "SAME", data_format=fmt)


# --- degenerate backprops ------------------------------------------------------------

# (input height, filter height, stride, padding (before, after)) where TF's backprop
# kernels compute an output height of 0 (rounding towards zero), so out_backprop is empty
# and the gradients are zeros; the width is 4 with a 1-wide filter.
EMPTY_OUTPUT = [
  (4, 5, 1, None),
  (4, 5, 2, None),
  (3, 5, 2, None),
  (2, 5, 2, None),
  (3, 6, 3, None),
  (1, 6, 3, None),
  (0, 1, 1, None),
  (0, 2, 2, None),
  (2, 5, 1, (1, 1)),
]
# ... and where that height would be negative: an error, in TF's words.
NEGATIVE_OUTPUT = [
  (3, 5, 1, None, -1),
  (1, 5, 2, None, -1),
  (0, 3, 1, None, -2),
  (2, 6, 1, (1, 1), -1),
]


def _height_case(h, k, stride, pads):
  s, d = [1, stride, 1, 1], [1, 1, 1, 1]
  pad = "VALID" if pads is None else [[0, 0], list(pads), [0, 0], [0, 0]]
  return (1, h, 4, 2), (k, 1, 2, 3), s, pad, d


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("case", EMPTY_OUTPUT, ids=[str(c) for c in EMPTY_OUTPUT])
def test_empty_out_backprop_gives_zeros(case, algorithm):
  """Where TF's backprop kernels return a result for an empty out_backprop, ours return
  the same zeros, eagerly and traced (TF's Conv2DBackpropInput is the oracle; its
  Conv2DBackpropFilter returns uninitialised memory eagerly and crashes for (4, 5, 2), so
  the filter gradient's oracle is the zeros a sum without terms is)."""
  x_shape, w_shape, s, pad, d = _height_case(*case)
  dy = tf.ones((1, 0, 4, 3))
  w, x = tf.ones(w_shape), tf.ones(x_shape)
  want = _tf_backprop_input(list(x_shape), w, dy, s, pad, d)
  assert want.shape == x_shape and not np.any(want)
  kw = dict(algorithm=algorithm)
  for mode in (_eager, _graph):
    dx = mode(lambda: lc.conv2d_backprop_input(list(x_shape), w, dy, s, pad, **kw))()
    dw = mode(lambda: lc.conv2d_backprop_filter(x, list(w_shape), dy, s, pad, **kw))()
    np.testing.assert_array_equal(dx, want)
    np.testing.assert_array_equal(dw, np.zeros(w_shape))


@pytest.mark.parametrize("case", NEGATIVE_OUTPUT, ids=[str(c) for c in NEGATIVE_OUTPUT])
def test_negative_output_size_is_tf_error(case):
  h, k, stride, pads, size = case
  x_shape, w_shape, s, pad, d = _height_case(h, k, stride, pads)
  phrase = (
    rf"Computed output size would be negative: {size} \[input_size: {h}, "
    rf"effective_filter_size: {k}, stride: {stride}\]"
  )
  dy, w, x = tf.ones((1, 0, 4, 3)), tf.ones(w_shape), tf.ones(x_shape)
  with pytest.raises(tf.errors.InvalidArgumentError, match=phrase):
    _tf_backprop_input(list(x_shape), w, dy, s, pad, d)
  for call in (
    lambda: lc.conv2d_backprop_input(list(x_shape), w, dy, s, pad),
    lambda: lc.conv2d_backprop_filter(x, list(w_shape), dy, s, pad),
  ):
    with pytest.raises(tf.errors.InvalidArgumentError, match=phrase):
      call()
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match=phrase):
      _graph(call)()


@pytest.mark.parametrize("case", EMPTY_OUTPUT, ids=[str(c) for c in EMPTY_OUTPUT])
def test_forward_keeps_refusing_a_filter_larger_than_the_padded_input(case):
  """TF's graph mode refuses these forward convolutions (its eager kernel returns an empty
  result for some): ours refuses in both modes, with TF's graph-mode words."""
  x_shape, w_shape, s, pad, d = _height_case(*case)
  h, k = case[0] + sum(case[3] or (0, 0)), case[1]
  phrase = f"Negative dimension size caused by subtracting {k} from {h}"
  x, w = tf.ones(x_shape), tf.ones(w_shape)
  with pytest.raises(ValueError, match=phrase):
    _graph(lambda: tf.nn.conv2d(x, w, s, pad))()
  with pytest.raises(tf.errors.InvalidArgumentError, match=phrase):
    lc.conv2d(x, w, s, pad)
  with pytest.raises(ValueError, match=phrase):
    _graph(lambda: lc.conv2d(x, w, s, pad))()


OTHER_EMPTY = [  # (input, filter, out_backprop, padding)
  ((0, 2, 3, 1), (2, 2, 1, 1), (0, 1, 2, 1), "VALID"),  # empty batch
  ((1, 2, 3, 1), (2, 2, 1, 0), (1, 1, 2, 0), "VALID"),  # no output channels
  ((1, 0, 3, 1), (2, 2, 1, 1), (1, 0, 3, 1), "SAME"),  # an empty image
  ((1, 2, 3, 1), (0, 2, 1, 2), (1, 3, 2, 2), "VALID"),  # a filter without taps
]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("case", OTHER_EMPTY, ids=[str(c[:3]) for c in OTHER_EMPTY])
def test_other_empty_backprops_match_tf(case, algorithm):
  """TF's backprop kernels give zeros or empty results here, and so do ours."""
  x_shape, w_shape, dy_shape, pad = case
  s = [1, 1, 1, 1]
  x, w, dy = tf.ones(x_shape), tf.ones(w_shape), tf.ones(dy_shape)
  want = _tf_backprop_input(list(x_shape), w, dy, s, pad, s)
  kw = dict(algorithm=algorithm)
  for mode in (_eager, _graph):
    dx = mode(lambda: lc.conv2d_backprop_input(list(x_shape), w, dy, s, pad, **kw))()
    dw = mode(lambda: lc.conv2d_backprop_filter(x, list(w_shape), dy, s, pad, **kw))()
    np.testing.assert_array_equal(dx, want)
    np.testing.assert_array_equal(dw, np.zeros(w_shape))


# --- TensorFlow's words in our errors -------------------------------------------------

X, W, DY = np.zeros((1, 8, 8, 3), np.float32), np.zeros((3, 3, 3, 4), np.float32), None


def _raw(**kw):
  return lambda x, w: tf.raw_ops.Conv2D(
    input=x, filter=w, **{**dict(strides=[1, 1, 1, 1], padding="VALID"), **kw}
  )


def _ours_raw(**kw):
  return lambda x, w: _loader.ops().large_conv_conv2d(
    x, w, **{**dict(strides=[1, 1, 1, 1], padding="VALID"), **kw}
  )


def _ours(**kw):
  return lambda x, w: lc.conv2d(x, w, **{**dict(strides=1, padding="VALID"), **kw})


def _tf(**kw):
  return lambda x, w: tf.nn.conv2d(x, w, **{**dict(strides=1, padding="VALID"), **kw})


def _bpi(api, sizes, dy=(1, 6, 6, 4), **kw):
  call = (
    api.conv2d_backprop_input
    if api is lc
    else (
      lambda s, w, d, **a: tf.raw_ops.Conv2DBackpropInput(
        input_sizes=s, filter=w, out_backprop=d, **a
      )
    )
  )
  args = (
    dict(strides=1, padding="VALID") if api is lc else dict(strides=[1, 1, 1, 1], padding="VALID")
  )
  return lambda x, w: call(sizes, w, np.zeros(dy, np.float32), **{**args, **kw})


def _bpf(api, sizes, dy=(1, 6, 6, 4)):
  if api is lc:
    return lambda x, w: lc.conv2d_backprop_filter(x, sizes, np.zeros(dy, np.float32), 1, "VALID")
  return lambda x, w: tf.raw_ops.Conv2DBackpropFilter(
    input=x,
    filter_sizes=sizes,
    out_backprop=np.zeros(dy, np.float32),
    strides=[1, 1, 1, 1],
    padding="VALID",
  )


# (id, TF's call, ours, input, filter, TF's fixed words, whether TF says them eagerly
# (else only while tracing)[, TF's words while tracing where they differ]). Our call must say
# them in both modes.
WORDING = [
  (
    "batch_stride",
    _raw(strides=[2, 1, 1, 1]),
    _ours(strides=[2, 1, 1, 1]),
    X,
    W,
    "Current implementation does not yet support strides in the batch and depth dimensions.",
    True,
  ),
  (
    "depth_dilation",
    _raw(dilations=[1, 1, 1, 2]),
    _ours(dilations=[1, 1, 1, 2]),
    X,
    W,
    "Current implementation does not yet support dilations in the batch and depth dimensions.",
    True,
  ),
  (
    "zero_stride",
    _raw(strides=[1, 0, 1, 1]),
    _ours(strides=[1, 0, 1, 1]),
    X,
    W,
    "Row and column strides should be larger than 0.",
    True,
  ),
  (
    "zero_dilation",
    _raw(dilations=[1, 0, 1, 1]),
    _ours(dilations=[1, 0, 1, 1]),
    X,
    W,
    "Dilated rates should be larger than 0.",
    True,
  ),
  (
    "stride_entries",
    _raw(strides=[1, 1, 1]),
    _ours_raw(strides=[1, 1, 1]),
    X,
    W,
    "Sliding window strides field must specify 4 dimensions",
    True,
  ),
  (
    "explicit_entries",
    _raw(padding="EXPLICIT", explicit_paddings=[1, 1]),
    _ours_raw(padding="EXPLICIT", explicit_paddings=[1, 1]),
    X,
    W,
    "explicit_paddings attribute must contain 8 values, but got: 2",
    True,
  ),
  (
    "explicit_not_explicit",
    _raw(padding="SAME", explicit_paddings=[0] * 8),
    _ours_raw(padding="SAME", explicit_paddings=[0] * 8),
    X,
    W,
    "explicit_paddings attribute must be empty if the padding attribute is not EXPLICIT",
    True,
  ),
  (
    "explicit_negative",
    _tf(padding=[[0, 0], [-1, 1], [1, 1], [0, 0]]),
    _ours(padding=[[0, 0], [-1, 1], [1, 1], [0, 0]]),
    X,
    W,
    "All elements of explicit_paddings must be nonnegative",
    True,
  ),
  (
    "explicit_batch",
    _tf(padding=[[1, 0], [1, 1], [1, 1], [0, 0]]),
    _ours(padding=[[1, 0], [1, 1], [1, 1], [0, 0]]),
    X,
    W,
    "Nonzero explicit padding in the batch or depth dimensions is not supported",
    True,
  ),
  (
    "stride_length",
    _tf(strides=[1, 1, 1]),
    _ours(strides=[1, 1, 1]),
    X,
    W,
    r"strides should be of length 1, 2 or 4. Received: strides=\[1, 1, 1\] of length 3",
    True,
  ),
  (
    "padding_size",
    _tf(padding=[[0, 0], [1, 1], [1, 1]]),
    _ours(padding=[[0, 0], [1, 1], [1, 1]]),
    X,
    W,
    r"When padding is a list, it must be of size 4. Received: padding=\[\[0, 0\], \[1, 1\], "
    r"\[1, 1\]\] of size 3",
    True,
  ),
  (
    "padding_pairs",
    _tf(padding=[0, 1, 1, 0]),
    _ours(padding=[0, 1, 1, 0]),
    X,
    W,
    "When `padding` is a list, each element of `padding` must be a list/tuple of size 2",
    True,
  ),
  (
    "padding_explicit_word",
    _tf(padding="EXPLICIT"),
    _ours(padding="EXPLICIT"),
    X,
    W,
    "'EXPLICIT' is not a valid value for `padding`. To use explicit padding, `padding` "
    "must be a list.",
    True,
  ),
  (
    "input_depth",
    _raw(),
    _ours(),
    np.zeros((1, 8, 8, 5), np.float32),
    W,
    "input depth must be evenly divisible by filter depth: 5 vs 3",
    True,
  ),
  (
    "groups",
    _raw(),
    _ours(),
    np.zeros((1, 8, 8, 6), np.float32),
    np.zeros((3, 3, 3, 5), np.float32),
    "output depth must be evenly divisible by number of groups: 5 vs 2",
    True,
  ),
  (
    "filter_depth",
    _raw(),
    _ours(),
    X,
    np.zeros((3, 3, 0, 4), np.float32),
    "filter depth must be stricly positive, got 0",
    True,
  ),
  (
    "filter_taps",
    _raw(),
    _ours(),
    X,
    np.zeros((0, 3, 3, 4), np.float32),
    r"filter must not have zero elements \(i.e. all dimensions must be non-zero\)",
    True,
  ),
  (
    "filter_rank",
    _raw(),
    _ours(),
    X,
    np.zeros((3, 3), np.float32),
    r"convolution filter must be 4-dimensional: \[3,3\]",
    True,
  ),
  (
    "filter_larger",
    _raw(),
    _ours(),
    X,
    np.zeros((9, 3, 3, 4), np.float32),
    "Negative dimension size caused by subtracting 9 from 8",
    False,
  ),
  (
    "dtype",
    _tf(),
    _ours(),
    np.zeros((1, 8, 8, 3), np.int8),
    np.zeros((3, 3, 3, 4), np.int8),
    "Value passed to parameter 'input' has DataType int8 not in list of allowed values: "
    "float16, bfloat16, float32, float64, int32",
    False,
  ),
  (
    "out_backprop_height",
    _bpi(tf.raw_ops, [1, 8, 8, 3], dy=(1, 5, 6, 4)),
    _bpi(lc, [1, 8, 8, 3], dy=(1, 5, 6, 4)),
    X,
    W,
    "Size of out_backprop doesn't match computed: actual = 5, computed = 6 spatial_dim: 1 "
    "input: 8 filter: 3 output: 5 stride: 1 dilation: 1",
    True,
  ),
  (
    "out_backprop_depth",
    _bpi(tf.raw_ops, [1, 8, 8, 3], dy=(1, 6, 6, 5)),
    _bpi(lc, [1, 8, 8, 3], dy=(1, 6, 6, 5)),
    X,
    W,
    "filter and out_backprop must have the same out_depth",
    True,
  ),
  (
    "out_backprop_batch",
    _bpi(tf.raw_ops, [1, 8, 8, 3], dy=(2, 6, 6, 4)),
    _bpi(lc, [1, 8, 8, 3], dy=(2, 6, 6, 4)),
    X,
    W,
    "input and out_backprop must have the same batch size. Input batch: 1, outbackprop "
    "batch: 2, batch_dim: 0",
    True,
  ),
  (
    "filter_out_backprop_width",
    _bpf(tf.raw_ops, [3, 3, 3, 4], dy=(1, 6, 5, 4)),
    _bpf(lc, [3, 3, 3, 4], dy=(1, 6, 5, 4)),
    X,
    W,
    "Size of out_backprop doesn't match computed: actual = 5, computed = 6 spatial_dim: 2 "
    "input: 8 filter: 3 output: 5 stride: 1 dilation: 1",
    True,
  ),
  (
    "input_sizes_count",
    _bpi(tf.raw_ops, [8, 8, 3]),
    _bpi(lc, [8, 8, 3]),
    X,
    W,
    "Conv2DBackpropInput requires input_sizes to contain 4 values or 2 values, but got: 3",
    True,
  ),
  (
    "input_sizes_rank",
    _bpi(tf.raw_ops, [[1, 8], [8, 3]]),
    _bpi(lc, [[1, 8], [8, 3]]),
    X,
    W,
    "input_sizes input must be 1-dim, not 2",
    True,
  ),
  (
    "input_sizes_negative",
    _bpi(tf.raw_ops, [1, -8, 8, 3]),
    _bpi(lc, [1, -8, 8, 3]),
    X,
    W,
    "Dimension -8 must be >= 0",
    True,
    "Invalid value in tensor used for shape: -8",
  ),
  (
    "filter_sizes_rank",
    _bpf(tf.raw_ops, [[3, 3], [3, 4]]),
    _bpf(lc, [[3, 3], [3, 4]]),
    X,
    W,
    "filter_sizes input must be 1-dim, not 2",
    True,
  ),
]


def _raises_with(call, x, w, phrase):
  with pytest.raises(Exception) as info:  # any class: the caller checks it
    call(tf.constant(x), tf.constant(w))
  assert re.search(phrase, str(info.value)), str(info.value)
  return info.type


@pytest.mark.parametrize(
  "name,theirs,ours,x,w,phrase,eager,traced",
  [c + (None,) * (8 - len(c)) for c in WORDING],
  ids=[c[0] for c in WORDING],
)
def test_errors_carry_tf_words(name, theirs, ours, x, w, phrase, eager, traced):
  """Our error names the argument in our words and then says TF's fixed sentence for the
  same mistake, so that code and tests matching TF's message keep working; the sentence is
  checked against TF itself. Eagerly our class is TF's (InvalidArgumentError, or
  UnimplementedError for batch/depth strides, ValueError/TypeError from Python)."""
  del name
  tf_class = _raises_with(theirs if eager else _graph(theirs), x, w, phrase)
  our_class = _raises_with(ours, x, w, phrase)
  if eager:
    assert our_class is tf_class
  if traced:
    _raises_with(_graph(theirs), x, w, traced)
  _raises_with(_graph(ours), x, w, traced or phrase)


# --- TF's gradient checks ------------------------------------------------------------

# (batch, rows, cols, filter rows, filter cols, in depth, out depth, groups, strides,
# padding, TF's max error): conv_ops_test.py's ConstructAndTestGradient problems.
GRADIENTS = [
  (2, 5, 4, 3, 3, 2, 3, 1, (1, 1), "VALID", 3e-3),
  (4, 6, 5, 2, 2, 2, 3, 1, (2, 2), "VALID", 3e-3),
  (2, 7, 6, 3, 3, 4, 5, 1, (3, 3), "SAME", 3e-3),
  (2, 4, 3, 4, 3, 2, 3, 1, (1, 1), "VALID", 3e-3),
  (2, 5, 4, 3, 3, 2, 3, 1, (1, 1), [[0, 0], [2, 2], [2, 2], [0, 0]], 5e-3),
  (2, 8, 5, 4, 2, 3, 2, 1, (3, 2), [[0, 0], [1, 2], [3, 4], [0, 0]], 3e-3),
  (3, 5, 7, 3, 2, 1, 2, 1, (2, 1), [[0, 0], [4, 3], [2, 1], [0, 0]], 3e-3),
  (2, 5, 4, 3, 3, 4, 6, 2, (1, 1), "VALID", 5e-3),
]


# TF's gradient checks hold the direct kernels, which is what 'auto' runs for such small
# problems (checked here), to TF's tolerances. A forced FFT is held to the FFT bound
# instead (tests/test_gradients.py: float64 Jacobians to 1e-6): its error can exceed the
# margins of numerical Jacobians (0.0022 against TF's 0.002 for the gradient of the filter
# gradient in float32, 1.1e-12 against 1e-12 for depthwise Jacobians in float64).


def _auto_plans_no_fft(x_shape, w_shape, s, pad, d=None):
  plan = lc.plan(x_shape, w_shape, s, pad, dilations=d)
  assert all(p.algorithm != "fft" for p in plan.passes), plan


@pytest.mark.parametrize("case", GRADIENTS, ids=[str(c[:9]) for c in GRADIENTS])
def test_tf_gradient_checks(case):
  """float32 Jacobians of both inputs against numerical ones, within TF's max error, on
  TF's data (i / size)."""
  n, rows, cols, frows, fcols, cin, cout, groups, strides, padding, max_err = case
  x_shape, w_shape = (n, rows, cols, cin), (frows, fcols, cin // groups, cout)
  _auto_plans_no_fft(x_shape, w_shape, list(strides), padding)
  x = tf.constant(_arange(x_shape) - 1, tf.float32) / np.prod(x_shape)
  w = tf.constant(_arange(w_shape) - 1, tf.float32) / np.prod(w_shape)
  theoretical, numerical = tf.test.compute_gradient(
    lambda a, b: lc.conv2d(a, b, list(strides), padding, algorithm="direct"), [x, w]
  )
  for t, m in zip(theoretical, numerical):
    assert np.abs(t - m).max() < max_err


@pytest.mark.parametrize(
  "padding,stride,dilation",
  [
    ("SAME", 1, 1),
    ([(0, 0), (1, 2), (3, 4), (0, 0)], 2, 1),
    ("VALID", 2, 1),
    ([(0, 0), (3, 5), (2, 1), (0, 0)], 1, 2),
  ],
)
def test_tf_backprop_filter_gradient_check(padding, stride, dilation):
  """conv2d_backprop_filter_grad_test.py: the filter gradient's own gradient with respect
  to the input and out_backprop (second-order machinery), within TF's 2e-3 on the CPU
  (TF checks dilations on GPUs only; ours runs them on the CPU)."""
  rng = np.random.default_rng(1)
  x = tf.constant(2 * rng.random((5, 8, 6, 4)) - 1, tf.float32)
  filter_shape = [3, 3, 4, 6]
  kw = dict(strides=[1, stride, stride, 1], padding=padding, dilations=[1, dilation, dilation, 1])
  dy_shape = lc.conv2d(x, tf.zeros(filter_shape), **kw).shape
  _auto_plans_no_fft(x.shape, filter_shape, kw["strides"], padding, kw["dilations"])
  dy = tf.constant(2 * rng.random(dy_shape) - 1, tf.float32)
  theoretical, numerical = tf.test.compute_gradient(
    lambda a, b: lc.conv2d_backprop_filter(a, filter_shape, b, algorithm="direct", **kw), [x, dy]
  )
  err = max(np.abs(t - m).max() for t, m in zip(theoretical, numerical))
  assert err < 2e-3


# --- TF's depthwise tests ------------------------------------------------------------

# (input, filter [h, w, c, multiplier], TF's output shape, stride, padding, dilations):
# depthwise_conv_op_base.py's ConfigsToTest and ConfigsToTestExplicit.
DEPTHWISE = [
  ((4, 5, 5, 48), (1, 1, 48, 2), (4, 5, 5, 96), 1, "SAME", None),
  ((4, 8, 8, 84), (1, 3, 84, 1), (4, 8, 8, 84), 1, "SAME", None),
  ((4, 17, 17, 48), (3, 1, 48, 4), (4, 17, 17, 192), 1, "SAME", None),
  ((4, 9, 27, 8), (3, 3, 8, 1), (4, 9, 27, 8), 1, "SAME", None),
  ((4, 31, 31, 7), (3, 3, 7, 1), (4, 31, 31, 7), 1, "SAME", None),
  ((4, 35, 35, 2), (5, 5, 2, 1), (4, 35, 35, 2), 1, "SAME", None),
  ((4, 147, 147, 2), (3, 3, 2, 8), (4, 49, 49, 16), 3, "VALID", None),
  ((3, 299, 299, 3), (3, 2, 3, 8), (3, 150, 150, 24), 2, "SAME", None),
  ((5, 183, 183, 1), (5, 5, 1, 2), (5, 92, 92, 2), 2, "SAME", None),
  ((5, 183, 183, 1), (5, 5, 1, 2), (5, 183, 183, 2), 1, "SAME", (2, 2)),
  ((5, 41, 35, 2), (4, 7, 2, 2), (5, 32, 23, 4), 1, "VALID", (3, 2)),
  ((4, 5, 5, 48), (1, 1, 48, 2), (4, 8, 12, 96), 1, ((1, 2), (3, 4)), None),
  ((4, 1, 1, 3), (3, 3, 3, 2), (4, 29, 39, 6), 1, ((10, 20), (15, 25)), None),
  ((4, 9, 27, 8), (3, 3, 8, 1), (4, 14, 31, 8), 1, ((3, 4), (4, 2)), None),
  ((4, 31, 31, 7), (3, 3, 7, 1), (4, 29, 29, 7), 1, ((0, 0), (0, 0)), None),
  ((3, 299, 299, 3), (3, 2, 3, 8), (3, 150, 153, 24), 2, ((1, 2), (3, 5)), None),
  ((5, 183, 183, 1), (5, 5, 1, 2), (5, 62, 60, 2), 3, ((3, 2), (1, 0)), None),
  ((5, 29, 31, 1), (5, 4, 1, 2), (5, 26, 23, 2), 1, ((3, 2), (1, 0)), (2, 3)),
  ((4, 5, 5, 48), (3, 3, 48, 1), (4, 5, 5, 48), 1, ((0, 2), (0, 2)), None),
  ((1, 8, 7, 2), (8, 7, 2, 1), (1, 8, 7, 2), 1, ((0, 7), (3, 3)), None),
  ((2, 4, 3, 2), (3, 2, 2, 1), (2, 4, 3, 2), 1, ((2, 0), (1, 0)), None),
]
# TF's tolerances (atol = rtol) for depthwise values.
DEPTHWISE_TOL = {"float16": 4e-2, "bfloat16": 2e-2, "float32": 1e-5, "float64": 1e-12}


def _depthwise_id(c):
  return f"x{'x'.join(map(str, c[0]))}-k{'x'.join(map(str, c[1]))}-s{c[3]}-{c[4]}-d{c[5]}"


@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
@pytest.mark.parametrize("case", DEPTHWISE, ids=[_depthwise_id(c) for c in DEPTHWISE])
def test_tf_depthwise_values(case, fmt):
  """TF's data (i / size), output shapes and tolerances, every floating dtype; 'auto'
  plans the FFT for none of them but the dilated 183x183 one, whose float32 result still
  meets TF's 1e-5."""
  x_shape, (kh, kw, c, m), out_shape, stride, padding, dilations = case
  d = dilations or (1, 1)
  x = _arange(x_shape) / np.prod(x_shape)
  f = _arange((kh, kw, c, m)) / (kh * kw * c * m)
  grouped = f.reshape(kh, kw, 1, c * m)
  xf = x if fmt == "NHWC" else _nchw(x)
  s, pad, dd = _op_args((stride, stride), padding, d, fmt)
  ref = Conv(xf.shape, grouped.shape, (stride, stride), padding, d, fmt)
  want = ref.forward(xf, grouped)
  assert want.shape == _in_format(fmt, out_shape)
  dtypes = ("float32", "float64") if isinstance(padding, str) else tuple(DEPTHWISE_TOL)
  for dtype_name in dtypes:
    xt, ft = _cast(xf, dtype_name), _cast(f, dtype_name)
    for algorithm in ALGORITHMS:
      what = f"{dtype_name} {algorithm}"
      y = lc.depthwise_conv2d(xt, ft, s, pad, data_format=fmt, dilations=dd, algorithm=algorithm)
      fft = _fft_sizes(ref, grouped.shape, s, pad, dd, dtype_name, algorithm)
      got = np.asarray(tf.cast(y, tf.float64))
      if fft["forward"] is None or algorithm == "auto":
        # TF's check: against the exact result of the unrounded data.
        tol = DEPTHWISE_TOL[dtype_name]
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=what)
      else:  # the FFT bound, on the data as rounded to the dtype
        rounded = [np.asarray(tf.cast(v, tf.float64)) for v in (xt, ft)]
        PassCheck(ref, "forward", rounded[0], rounded[1].reshape(grouped.shape)).check(
          got, dtype_name, fft["forward"], what
        )


# (input, filter, stride, padding, dilations): CheckGradConfigsToTest and ...Explicit.
DEPTHWISE_GRADIENTS = [
  ((2, 5, 8, 1), (4, 4, 1, 2), 1, "SAME", None),
  ((4, 5, 5, 1), (2, 2, 1, 2), 2, "VALID", None),
  ((2, 4, 4, 2), (3, 1, 2, 2), 1, "SAME", None),
  ((1, 15, 15, 2), (1, 3, 2, 1), 1, "SAME", None),
  ((2, 15, 16, 1), (3, 3, 1, 2), 3, "VALID", None),
  ((2, 5, 8, 1), (4, 3, 1, 2), 1, "SAME", (1, 2)),
  ((1, 3, 1, 2), (2, 1, 2, 1), 1, "SAME", None),
  ((2, 2, 3, 1), (2, 2, 1, 1), 1, "SAME", None),
  ((2, 5, 8, 1), (4, 4, 1, 2), 1, ((0, 1), (2, 3)), None),
  ((4, 5, 5, 1), (2, 2, 1, 2), 2, ((3, 1), (5, 0)), None),
  ((2, 4, 4, 2), (3, 1, 2, 2), 1, ((4, 1), (3, 4)), None),
  ((2, 15, 16, 1), (3, 3, 1, 2), 3, ((0, 0), (10, 0)), None),
  ((2, 5, 8, 1), (3, 4, 1, 2), 1, ((3, 1), (2, 3)), (2, 1)),
  ((2, 4, 3, 2), (3, 2, 2, 1), 1, ((2, 0), (1, 0)), None),
]
DEPTHWISE_GRADIENT_TOL = {"float32": 8e-4, "float64": 1e-12}


@pytest.mark.parametrize(
  "case",
  DEPTHWISE_GRADIENTS,
  ids=[_depthwise_id(c[:2] + (None,) + c[2:]) for c in DEPTHWISE_GRADIENTS],
)
def test_tf_depthwise_gradient_checks(case):
  """Jacobians of input and filter within TF's error (float32 8e-4, float64 1e-12), on
  TF's data (i / size)."""
  x_shape, f_shape, stride, padding, dilations = case
  s, pad, d = _op_args((stride, stride), padding, dilations or (1, 1), "NHWC")
  kh, kw, c, m = f_shape
  _auto_plans_no_fft(x_shape, (kh, kw, 1, c * m), s, pad, d)
  for dtype_name, max_err in DEPTHWISE_GRADIENT_TOL.items():
    x = _cast((_arange(x_shape) - 1) / np.prod(x_shape), dtype_name)
    f = _cast((_arange(f_shape) - 1) / np.prod(f_shape), dtype_name)
    theoretical, numerical = tf.test.compute_gradient(
      lambda a, b: lc.depthwise_conv2d(a, b, s, pad, dilations=d, algorithm="direct"), [x, f]
    )
    err = max(np.abs(t - m).max() for t, m in zip(theoretical, numerical))
    assert err < max_err, dtype_name
