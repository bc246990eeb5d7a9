"""The 3-D core kernels through tf_largeconv._core: the three passes of both algorithms
against the float64 numpy oracle of tests/reference3d.py (written from the definition of
TF's Conv3D, no code shared with the package), grouped and depthwise, strided, dilated,
SAME and VALID, both data formats; a workspace limit that makes the FFT tile; int32 summed
exactly; bad input. Then the TF op, tf_largeconv.conv3d: against tf.nn.conv3d (forward,
gradients, second order, traced shapes, shape errors) and, where TF's CPU kernels do not go
(groups, NCDHW, dilations), against the oracle; every dtype; the workspace limit; bad
arguments."""

import numpy as np
import pytest
import tensorflow as tf
from reference3d import CASES
from reference3d import PASSES
from reference3d import Oracle3d
from reference3d import check as _check
from reference3d import operands as _operands
from reference3d import problem as _problem
from reference3d import run_pass

import tf_largeconv as lc
from tf_largeconv import _core


def _run(pass_name, x, w, dy, attrs, **kwargs):
  """One pass through _core; attrs: strides, padding, data_format, dilations."""
  return run_pass(_core, pass_name, x, w, dy, attrs, **kwargs)


def _fft_sizes(x, w, attrs, dtype, **kwargs):
  """{pass: transform size, or None where the plan sums directly}."""
  plans = _core.plan3d(list(x.shape), list(w.shape), **attrs, dtype=dtype, **kwargs)
  return {p["pass"]: (p["fft"] if p["algorithm"] == "fft" else None) for p in plans}


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("algorithm", ["direct", "fft"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_passes_match_oracle(case, algorithm, dtype, rng):
  oracle, x, w, dy, attrs = _problem(case, rng, dtype)
  fft = _fft_sizes(x, w, attrs, dtype, algorithm=algorithm)
  for pass_name in PASSES:
    assert (fft[pass_name] is not None) == (algorithm == "fft")
    got = _run(pass_name, x, w, dy, attrs, algorithm=algorithm)
    assert got.dtype == np.dtype(dtype)
    _check(oracle, pass_name, got, x, w, dy, dtype, fft[pass_name])


@pytest.mark.parametrize("case", sorted(CASES))
def test_geometry_matches_oracle(case, rng):
  oracle, x, w, _, attrs = _problem(case, rng, "float64")
  geometry = _core.geometry3d(list(x.shape), list(w.shape), **attrs)
  assert geometry["output_shape"] == oracle.output_shape()
  assert geometry["pad_before"] == tuple(oracle.before)
  assert geometry["pad_after"] == tuple(oracle.after)
  assert geometry["groups"] == oracle.groups


def test_workspace_limit_binds_and_fft_tiles(rng):
  """Under a limit far below one transform of the whole volume the FFT cuts it into
  several tiles per pass, takes no more than the limit, and is still exact."""
  x = rng.standard_normal((2, 30, 28, 26, 3))
  w = rng.standard_normal((5, 6, 4, 3, 4))
  attrs = dict(
    strides=[1, 1, 1, 1, 1], padding="SAME", data_format="NDHWC", dilations=[1, 1, 1, 1, 1]
  )
  oracle = Oracle3d(x.shape, w.shape, (1, 1, 1), "SAME", (1, 1, 1), "NDHWC")
  dy = rng.standard_normal(oracle.output_shape())
  # A quarter of one transform covering the padded volume (34 x 33 x 29 points) in float64.
  limit = (30 + 5 - 1) * (28 + 6 - 1) * (26 + 4 - 1) * 8 // 4
  plans = _core.plan3d(
    list(x.shape), list(w.shape), **attrs, algorithm="fft", dtype="float64", workspace_limit=limit
  )
  for plan in plans:
    assert plan["algorithm"] == "fft"
    assert plan["workspace_bytes"] <= limit
    assert np.prod(plan["tiles"]) > 1, plan
  fft = {p["pass"]: p["fft"] for p in plans}
  for pass_name in PASSES:
    got = _run(pass_name, x, w, dy, attrs, algorithm="fft", workspace_limit=limit)
    _check(oracle, pass_name, got, x, w, dy, "float64", fft[pass_name])


def test_auto_chooses_by_filter_size():
  """'auto' takes the cheaper algorithm by the cost model: direct for a 2x2x2 filter, the
  FFT for a 15^3 one; TF's kernels are not priced unless allowed."""
  attrs = dict(strides=[1] * 5, padding="SAME")
  small = _core.plan3d([1, 32, 32, 32, 1], [2, 2, 2, 1, 1], **attrs)
  large = _core.plan3d([1, 32, 32, 32, 1], [15, 15, 15, 1, 1], **attrs)
  assert [p["algorithm"] for p in small] == ["direct"] * 3
  assert [p["algorithm"] for p in large] == ["fft"] * 3
  for p in small + large:
    assert p["cost_direct"] > 0 and p["cost_fft"] > 0 and p["cost_tf"] < 0
    cheaper = "direct" if p["cost_direct"] <= p["cost_fft"] else "fft"
    assert p["algorithm"] == cheaper, p


def test_int32_is_exact(rng):
  """int32 is summed exactly (modulo 2^32, as TensorFlow's int32 kernels), by the direct
  kernels, under 'auto'; 'fft' is refused."""
  oracle, x, w, dy, attrs = _problem("grouped_ncdhw", rng, "float64")
  x, w, dy = (rng.integers(-50, 50, a.shape).astype(np.int32) for a in (x, w, dy))
  for pass_name in PASSES:
    got = _run(pass_name, x, w, dy, attrs)
    a, b = _operands(oracle, x, w, dy, pass_name)
    want = getattr(oracle, pass_name)(a.astype(np.float64), b.astype(np.float64))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want.astype(np.int64))
  with pytest.raises(ValueError, match="integer"):
    _core.conv3d(x, w, **attrs, algorithm="fft")


def test_empty_batch():
  x = np.zeros((0, 4, 4, 4, 2))
  w = np.ones((2, 2, 2, 2, 3))
  attrs = dict(strides=[1] * 5, padding="VALID")
  assert _core.conv3d(x, w, **attrs).shape == (0, 3, 3, 3, 3)
  dy = np.zeros((0, 3, 3, 3, 3))
  np.testing.assert_array_equal(
    _core.conv3d_backprop_filter(x, list(w.shape), dy, **attrs, algorithm="fft"), np.zeros(w.shape)
  )
  assert _core.conv3d_backprop_input(list(x.shape), w, dy, **attrs).shape == x.shape


BAD = [
  (dict(strides=[1, 1, 1, 1]), ValueError, "5 entries"),
  (dict(strides=[2, 1, 1, 1, 1]), NotImplementedError, "batch and depth"),
  (dict(strides=[1, 1, 0, 1, 1]), ValueError, "positive"),
  (dict(dilations=[1, 1, 1, 1, 2]), NotImplementedError, "batch and depth"),
  (dict(padding="EXPLICIT"), ValueError, "SAME or VALID"),
  (dict(padding="FULL"), ValueError, "padding"),
  (dict(data_format="NHWC"), ValueError, "NDHWC or NCDHW"),
  (dict(filter_shape=(7, 2, 2, 2, 3)), ValueError, "depth"),
  (dict(filter_shape=(2, 2, 2, 3, 3)), ValueError, "multiple of filters in-depth"),
  (dict(filter_shape=(2, 2, 2, 1, 3)), ValueError, "divisible by the number of groups"),
  (dict(algorithm="fast"), ValueError, "algorithm"),
  (dict(algorithm="fft", workspace_limit=100), ValueError, "needs at least"),
  (dict(algorithm="tf"), ValueError, "not available"),
]


@pytest.mark.parametrize("change,error,match", BAD, ids=[b[2] for b in BAD])
def test_bad_input(change, error, match):
  args = dict(
    strides=[1] * 5, padding="VALID", data_format="NDHWC", dilations=[1] * 5, algorithm="auto"
  )
  filter_shape = change.pop("filter_shape", (2, 2, 2, 2, 3))
  args.update(change)
  x = np.ones((1, 5, 4, 4, 2))
  with pytest.raises(error, match=match):
    _core.conv3d(x, np.ones(filter_shape), **args)


def test_bad_arrays():
  x = np.ones((1, 5, 4, 4, 2))
  w = np.ones((2, 2, 2, 2, 3))
  attrs = dict(strides=[1] * 5, padding="VALID")
  with pytest.raises(ValueError, match="5-D"):
    _core.conv3d(x[0], w, **attrs)
  with pytest.raises(ValueError, match="out_backprop"):
    _core.conv3d_backprop_input(list(x.shape), w, np.ones((1, 4, 3, 4, 3)), **attrs)
  with pytest.raises(ValueError, match="out_backprop"):
    _core.conv3d_backprop_filter(x, list(w.shape), np.ones((1, 4, 3, 3, 2)), **attrs)


# --- The TF op: tf_largeconv.conv3d ------------------------------------------------------


def _tape_passes(conv, x, w, dy):
  """(y, dx, dw) of conv(x, w) with upstream gradient dy."""
  x, w = tf.constant(x), tf.constant(w)
  with tf.GradientTape() as tape:
    tape.watch([x, w])
    y = conv(x, w)
  dx, dw = tape.gradient(y, [x, w], output_gradients=tf.constant(dy))
  return y.numpy(), dx.numpy(), dw.numpy()


@pytest.mark.parametrize("algorithm", ["direct", "fft"])
@pytest.mark.parametrize("case", ["valid", "same_strided", "many_channels", "filter_fills_input"])
def test_op_matches_tf_conv3d(case, algorithm, rng):
  """Forward and both gradients against TensorFlow's own conv3d (float64), and the result
  shape TF infers while tracing with an unknown batch."""
  _, x, w, dy, attrs = _problem(case, rng, "float64")
  mine = _tape_passes(lambda a, b: lc.conv3d(a, b, **attrs, algorithm=algorithm), x, w, dy)
  theirs = _tape_passes(lambda a, b: tf.nn.conv3d(a, b, **attrs), x, w, dy)
  for got, want, what in zip(mine, theirs, ("y", "dx", "dw")):
    assert got.shape == want.shape, what
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9 * np.abs(want).max(), err_msg=what)
  spec = tf.TensorSpec([None, *x.shape[1:]], tf.float64)
  traced = tf.function(lambda a: lc.conv3d(a, w, **attrs)).get_concrete_function(spec)
  assert traced.structured_outputs.shape.as_list() == [None, *theirs[0].shape[1:]]


@pytest.mark.parametrize("algorithm", ["direct", "fft"])
@pytest.mark.parametrize("case", ["grouped_ncdhw", "depthwise", "dilated", "strided_dilated_ncdhw"])
def test_op_gradients_match_oracle(case, algorithm, rng):
  """What TF's CPU conv3d does not compute (groups, NCDHW, dilations): the op and its
  registered gradients against the oracle."""
  oracle, x, w, dy, attrs = _problem(case, rng, "float64")
  y, dx, dw = _tape_passes(lambda a, b: lc.conv3d(a, b, **attrs, algorithm=algorithm), x, w, dy)
  fft = _fft_sizes(x, w, attrs, "float64", algorithm=algorithm)
  for pass_name, got in zip(PASSES, (y, dx, dw)):
    _check(oracle, pass_name, got, x, w, dy, "float64", fft[pass_name])


@pytest.mark.parametrize("algorithm", ["direct", "fft"])
def test_second_order_gradients_match_tf(algorithm, rng):
  """The backprop ops' registered gradients: d/dw of sum(dx * v) and d/dx of sum(dw * v),
  against TensorFlow's conv3d."""
  _, x, w, dy, attrs = _problem("same_strided", rng, "float64")

  def second(conv):
    xt, wt, dyt = tf.constant(x), tf.constant(w), tf.constant(dy)
    with tf.GradientTape(persistent=True) as outer:
      outer.watch([xt, wt])
      with tf.GradientTape() as inner:
        inner.watch([xt, wt])
        y = conv(xt, wt)
      dx, dw = inner.gradient(y, [xt, wt], output_gradients=dyt)
      dx_sum = tf.reduce_sum(dx * tf.sin(xt))
      dw_sum = tf.reduce_sum(dw * tf.cos(wt))
    return [outer.gradient(dx_sum, wt).numpy(), outer.gradient(dw_sum, xt).numpy()]

  mine = second(lambda a, b: lc.conv3d(a, b, **attrs, algorithm=algorithm))
  theirs = second(lambda a, b: tf.nn.conv3d(a, b, **attrs))
  for got, want in zip(mine, theirs):
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9 * np.abs(want).max())


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("algorithm", ["direct", "fft"])
def test_op_dtypes(dtype, algorithm, rng):
  """Every floating dtype through the op, computed in float32 and rounded once."""
  oracle, x, w, dy, attrs = _problem("grouped_ncdhw", rng, "float64")
  x, w, dy = (tf.cast(a, dtype) for a in (x, w, dy))
  y, dx, dw = _tape_passes(lambda a, b: lc.conv3d(a, b, **attrs, algorithm=algorithm), x, w, dy)
  fft = _fft_sizes(x.numpy(), w.numpy(), attrs, "float32", algorithm=algorithm)
  as64 = [tf.cast(a, tf.float64).numpy() for a in (x, w, dy)]
  for pass_name, got in zip(PASSES, (y, dx, dw)):
    assert got.dtype == tf.as_dtype(dtype).as_numpy_dtype
    _check(oracle, pass_name, tf.cast(got, tf.float64).numpy(), *as64, dtype, fft[pass_name])


def test_op_int32_is_exact(rng):
  oracle, x, w, _, attrs = _problem("depthwise", rng, "float64")
  x, w = (rng.integers(-40, 40, a.shape).astype(np.int32) for a in (x, w))
  got = lc.conv3d(x, w, **attrs).numpy()
  np.testing.assert_array_equal(got, oracle.forward(x, w).astype(np.int64))
  with pytest.raises(ValueError, match="int32 exactly"):
    lc.conv3d(x, w, **attrs, algorithm="fft")


def test_op_workspace_limit_is_a_hard_bound(rng):
  x = rng.standard_normal((1, 20, 18, 16, 2)).astype(np.float32)
  w = rng.standard_normal((7, 7, 7, 2, 3)).astype(np.float32)
  attrs = dict(strides=[1] * 5, padding="SAME")
  want = tf.nn.conv3d(x, w, **attrs).numpy()
  got = lc.conv3d(x, w, **attrs, algorithm="fft", workspace_limit=100_000).numpy()
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
  with pytest.raises(tf.errors.InvalidArgumentError, match="needs at least"):
    lc.conv3d(x, w, **attrs, algorithm="fft", workspace_limit=1000)


@pytest.mark.parametrize(
  "change,error",
  [
    (dict(strides=[1, 1, 1, 1]), ValueError),
    (dict(strides=[2, 1, 1, 1, 1]), tf.errors.UnimplementedError),
    (dict(padding="EXPLICIT"), ValueError),
    (dict(padding="same"), ValueError),
    (dict(data_format="NHWC"), ValueError),
    (dict(algorithm="fast"), ValueError),
    (dict(workspace_limit=-5), ValueError),
  ],
)
def test_op_bad_arguments(change, error):
  args = dict(strides=[1] * 5, padding="VALID")
  args.update(change)
  with pytest.raises(error):
    lc.conv3d(np.ones((1, 5, 4, 4, 2), np.float32), np.ones((2, 2, 2, 2, 3), np.float32), **args)


def test_op_shape_errors_match_tf():
  """Shapes that do not fit: ValueError while tracing, as TensorFlow's conv3d (its shape
  inference), and InvalidArgumentError eagerly. (TF's eager kernel returns an empty result
  for a filter larger than the input; the op keeps its shape function's rule, as conv2d
  does.)"""
  x = np.ones((1, 5, 4, 4, 2), np.float32)
  for w in (np.ones((6, 2, 2, 2, 3), np.float32), np.ones((2, 2, 2, 3, 3), np.float32)):
    for conv in (lc.conv3d, tf.nn.conv3d):
      with pytest.raises(ValueError):
        tf.function(lambda a, w=w, conv=conv: conv(a, w, strides=[1] * 5, padding="VALID"))(x)
    with pytest.raises(tf.errors.InvalidArgumentError):
      lc.conv3d(x, w, strides=[1] * 5, padding="VALID")
