"""The portable path (tf_largeconv/ops/portable.py): tf.nn.conv2d's results from stock TF ops,
under XLA too, with TF's own gradients, and one loop step within the workspace limit."""

import re

import numpy as np
import pytest
import tensorflow as tf

from tf_largeconv import _loader
from tf_largeconv._problem import ConvProblem
from tf_largeconv.ops import portable as _portable

CASES = [
  # (input NHWC, filter, strides, padding, dilations)
  ((2, 40, 50, 3), (7, 9, 3, 4), 1, "SAME", None),
  ((2, 40, 50, 3), (7, 9, 3, 4), (2, 3), "VALID", None),
  ((1, 40, 50, 4), (5, 5, 2, 6), 1, "SAME", None),  # grouped
  ((2, 40, 50, 3), (7, 9, 3, 4), 1, "SAME", (2, 3)),
  ((2, 40, 50, 3), (7, 9, 3, 4), 1, [[0, 0], [3, 1], [0, 5], [0, 0]], None),
  ((1, 23, 31, 2), (31, 5, 2, 2), (3, 1), "SAME", None),  # filter taller than the image
  ((1, 60, 70, 1), (41, 41, 1, 3), 1, "VALID", None),
  # More input channels per group than _portable sums one by one: the einsum contraction.
  ((1, 30, 34, 24), (9, 7, 12, 6), 1, "SAME", None),
]


def _to_nchw(shape):
  return (shape[0], shape[3], shape[1], shape[2])


def _nchw_padding(padding):
  return padding if isinstance(padding, str) else [padding[0], padding[3], padding[1], padding[2]]


def _run(x, w, strides, padding, data_format, dilations, limit=None):
  a = ConvProblem.conv2d(strides, padding, data_format, dilations)
  return _portable.conv2d(
    x,
    w,
    a.strides,
    a.padding,
    a.explicit_paddings,
    a.data_format,
    a.dilations,
    workspace_limit=limit,
  )


def _public_portable(x, w, strides, padding, data_format, dilations):
  return lc.conv2d(
    x, w, strides, padding, data_format=data_format, dilations=dilations, algorithm="portable"
  )


# The portable module itself, and the public conv2d with algorithm='portable'.
@pytest.mark.parametrize("entry", [_run, _public_portable], ids=["module", "public"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[1])))
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
def test_matches_tf_conv2d_float64(rng, case, data_format, entry):
  x_shape, w_shape, strides, padding, dilations = case
  x = rng.standard_normal(x_shape)
  w = rng.standard_normal(w_shape)
  want = tf.nn.conv2d(x, w, strides, padding, dilations=dilations).numpy()
  if data_format == "NCHW":
    x, padding = np.transpose(x, (0, 3, 1, 2)), _nchw_padding(padding)
  got = entry(tf.constant(x), tf.constant(w), strides, padding, data_format, dilations).numpy()
  _assert_nhwc_close(got, want, data_format)


def _assert_nhwc_close(got, want, data_format):
  """`got` (in data_format) equals the NHWC float64 `want` to float64 FFT rounding."""
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
              g = core.geometry(
                [1, size, 7, 1],
                [k, 1, 1, 1],
                [1, stride, 1, 1],
                padding,
                flat,
                "NHWC",
                [1, dilation, 1, 1],
              )
            except ValueError:
              with pytest.raises(ValueError):
                _portable.axis_geometry(size, k, stride, dilation, padding, explicit)
              continue
            out, before, _ = _portable.axis_geometry(size, k, stride, dilation, padding, explicit)
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
  for fn in (
    lambda x, w: _run(x, w, 2, "SAME", "NHWC", None),
    lambda x, w: tf.nn.conv2d(x, w, 2, "SAME"),
  ):
    with tf.GradientTape() as tape:
      tape.watch([x, w])
      y = fn(x, w)
    grads.append(tape.gradient(y, [x, w], output_gradients=dy))
  for got, want in zip(*grads):
    np.testing.assert_allclose(
      got.numpy(), want.numpy(), rtol=0, atol=1e-11 * np.abs(want.numpy()).max()
    )


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


def test_the_last_step_may_hold_fewer_tiles(rng):
  """Three tiles, two to a step: the last step's spare slot repeats a tile (never reads
  beyond the padded image), and the result is TensorFlow's."""
  limit = 2 << 20
  p = _portable.plan_tiles(1, 1, 2, 3, 3, 300, 307, limit)
  assert (p.tiles_h * p.tiles_w, p.per_step, p.steps) == (3, 2, 2)
  x = rng.standard_normal((1, 302, 309, 1)).astype(np.float32)
  w = rng.standard_normal((3, 3, 1, 2)).astype(np.float32)
  got = lc.conv2d(x, w, 1, "VALID", algorithm="portable", workspace_limit=limit).numpy()
  want = tf.nn.conv2d(x, w, 1, "VALID").numpy()
  np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max())


def _minimum_limit(dtype, **kwargs):
  """The bytes a portable call says it needs at least, from its refusal of a tiny limit."""
  x, w = np.zeros((2, 40, 44, 3)), np.zeros((9, 9, 3, 4))
  with pytest.raises(ValueError, match="too small for the portable path") as e:
    lc.conv2d(
      tf.constant(x, dtype), tf.constant(w, dtype), 1, "SAME", algorithm="portable", **kwargs
    )
  return int(re.search(r"needs at least (\d+) bytes", str(e.value)).group(1))


def test_a_step_counts_every_buffer_in_the_compute_dtype():
  """The smallest step (9x9 transforms, one tile of both images): per image and channel
  (3 in, 4 out) a real tile and its complex spectrum, 4-byte values in float32 (and
  half precision, computed in float32), 8-byte ones in float64; a limit of 0 is refused
  as too small, not read as the default."""
  float32 = 2 * (3 + 4) * (9 * 9 * 4 + 9 * (9 // 2 + 1) * 2 * 4)
  assert _minimum_limit(tf.float32, workspace_limit=1000) == float32
  assert _minimum_limit(tf.float16, workspace_limit=1000) == float32
  assert _minimum_limit(tf.float64, workspace_limit=1000) == 2 * float32
  assert _minimum_limit(tf.float32, workspace_limit=0) == float32


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16])
@pytest.mark.parametrize("entry", [_run, _public_portable], ids=["module", "public"])
def test_half_precision_keeps_its_dtype(rng, dtype, entry):
  """Computed in float32 and returned in the input's dtype, as tf.nn.conv2d does."""
  x = tf.cast(rng.standard_normal((2, 30, 34, 3)), dtype)
  w = tf.cast(rng.standard_normal((9, 7, 3, 4)), dtype)
  got = entry(x, w, 1, "SAME", "NHWC", None)
  assert got.dtype == dtype
  want = tf.nn.conv2d(tf.cast(x, tf.float32), tf.cast(w, tf.float32), 1, "SAME").numpy()
  np.testing.assert_allclose(
    tf.cast(got, tf.float32).numpy(), want, rtol=0, atol=1e-2 * np.abs(want).max()
  )


# Runs a portable forward pass of a 1000x1000 image and a 101x101x1x2 filter under the limit
# argv[1] and prints TensorFlow's allocator peak over it (BFC, so TF counts every buffer),
# then the bytes of one loop step and the padded input and dense output sizes.
_PEAK_CHILD = """
    import sys
    import tensorflow as tf, tf_largeconv as lc
    from tf_largeconv.ops import portable as _portable
    limit = int(sys.argv[1])
    x = tf.random.uniform((1, 1000, 1000, 1)); w = tf.random.uniform((101, 101, 1, 2))
    lc.conv2d(tf.ones((1, 8, 8, 1)), tf.ones((3, 3, 1, 1)), 1, "SAME", algorithm="portable")
    base = tf.config.experimental.get_memory_info("CPU:0")["current"]
    tf.config.experimental.reset_memory_stats("CPU:0")
    y = lc.conv2d(x, w, 1, "SAME", algorithm="portable", workspace_limit=limit)
    peak = tf.config.experimental.get_memory_info("CPU:0")["peak"] - base
    p = _portable.plan_tiles(1, 1, 2, 101, 101, 1000, 1000, limit, 4)
    step = _portable.step_bytes(1, 1, 2, p.fft_h, p.fft_w, p.per_step)
    padded = (p.tiles_h * p.tile_h + 100) * (p.tiles_w * p.tile_w + 100) * 4
    dense = p.tiles_h * p.tile_h * p.tiles_w * p.tile_w * 2 * 4
    print(peak, step, padded, dense)
    """


def test_measured_peak_stays_within_the_stated_bound():
  """What one portable call holds at its peak, as TensorFlow's allocator counts it: the
  padded input twice (padded, transposed), the dense output three times (the loop's
  tile array, its stack, the re-tiled result) and at most three steps' worth of loop
  buffers; a limit that is not honoured breaks the bound."""
  import subproc

  env = subproc.child_env(TF_CPU_ALLOCATOR_USE_BFC="true")
  rows = {}
  for limit in (1_000_000, 4_000_000, 64_000_000):
    out = subproc.run(_PEAK_CHILD, limit, timeout=300, env=env)
    rows[limit] = [int(v) for v in out.stdout.split()[-4:]]
  bound = {
    limit: 2 * padded + 3 * dense + 3 * step + (1 << 20)
    for limit, (_, step, padded, dense) in rows.items()
  }
  for limit in (1_000_000, 4_000_000):
    assert rows[limit][0] <= bound[limit], (limit, rows[limit], bound[limit])
  # The bound binds: with room for the whole image in one step the peak is far above it.
  assert rows[64_000_000][0] > bound[1_000_000], (rows, bound)


# The public ops with algorithm='portable': stock TF ops only, the ops' results and errors.

import reference  # noqa: E402

import tf_largeconv as lc  # noqa: E402


def _op_types(fn, *args):
  return {op.type for op in fn.get_concrete_function(*args).graph.get_operations()}


def test_public_portable_runs_no_largeconv_op(rng):
  """'portable' is routed in Python: the traced graph holds no LargeConv op (forward,
  gradients and backprop functions), while 'direct' does use the op."""
  x = tf.constant(rng.standard_normal((2, 20, 22, 3)), tf.float32)
  w = tf.constant(rng.standard_normal((9, 9, 3, 4)), tf.float32)

  def make(algorithm):
    @tf.function
    def f(x, w):
      with tf.GradientTape() as tape:
        tape.watch([x, w])
        y = lc.conv2d(x, w, 1, "SAME", algorithm=algorithm)
      dy = tf.ones_like(y)
      return (
        y,
        tape.gradient(y, [x, w], output_gradients=dy),
        lc.conv2d_backprop_input(tf.shape(x), w, dy, 1, "SAME", algorithm=algorithm),
        lc.conv2d_backprop_filter(x, tf.shape(w), dy, 1, "SAME", algorithm=algorithm),
      )

    return f

  assert not any(t.startswith("LargeConv") for t in _op_types(make("portable"), x, w))
  assert "LargeConv>Conv2D" in _op_types(make("direct"), x, w)


def test_portable_only_reaches_eager_calls_made_before(rng):
  # An eager call looks its kernel up by its tensors and arguments (ops._dispatch.eager_key); inside
  # portable_only() the same call must run the portable path all the same.
  x = tf.constant(rng.standard_normal((1, 40, 40, 2)), tf.float32)
  w = tf.constant(rng.standard_normal((21, 21, 2, 3)), tf.float32)
  before = lc.conv2d(x, w, 1, "SAME", algorithm="fft").numpy()
  with lc.ops.portable_only():
    inside = lc.conv2d(x, w, 1, "SAME", algorithm="fft").numpy()
  portable = lc.conv2d(x, w, 1, "SAME", algorithm="portable").numpy()
  np.testing.assert_array_equal(inside, portable)
  assert not np.array_equal(before, portable)  # the two paths' bits differ


def test_public_depthwise_portable_matches_tf(rng):
  x = rng.standard_normal((2, 30, 34, 3))
  w = rng.standard_normal((11, 9, 3, 2))
  want = tf.nn.depthwise_conv2d(x, w, [1, 2, 2, 1], "SAME").numpy()
  got = lc.depthwise_conv2d(x, w, 2, "SAME", algorithm="portable").numpy()
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * np.abs(want).max())


@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
@pytest.mark.parametrize("spatial_sizes", [False, True])
def test_public_backprops_portable_match_tf(rng, data_format, spatial_sizes):
  """Against the float64 numpy oracle (tests/reference.py), with strides, dilations and
  explicit padding together."""
  x = rng.standard_normal((2, 25, 27, 3))
  w = rng.standard_normal((7, 9, 3, 4))
  strides, dilations, pads = (2, 3), (1, 2), ((2, 1), (0, 3))
  ref = reference.Conv(x.shape, w.shape, strides, pads, dilations)
  dy = rng.standard_normal((2, ref.oh, ref.ow, 4))
  want_dx, want_dw = ref.backprop_input(w, dy), ref.backprop_filter(x, dy)
  padding = [[0, 0], list(pads[0]), list(pads[1]), [0, 0]]
  sizes = list(x.shape)
  if data_format == "NCHW":
    x, dy = np.transpose(x, (0, 3, 1, 2)), np.transpose(dy, (0, 3, 1, 2))
    padding, sizes = _nchw_padding(padding), [sizes[0], sizes[3], sizes[1], sizes[2]]
  if spatial_sizes:
    sizes = sizes[2:] if data_format == "NCHW" else sizes[1:3]
  kw = dict(data_format=data_format, dilations=dilations, algorithm="portable")
  dx = lc.conv2d_backprop_input(sizes, w, dy, strides, padding, **kw).numpy()
  dw = lc.conv2d_backprop_filter(x, w.shape, dy, strides, padding, **kw).numpy()
  if data_format == "NCHW":
    dx = np.transpose(dx, (0, 2, 3, 1))
  assert dx.shape == want_dx.shape and dw.shape == want_dw.shape
  np.testing.assert_allclose(dx, want_dx, rtol=0, atol=1e-12 * np.abs(want_dx).max())
  np.testing.assert_allclose(dw, want_dw, rtol=0, atol=1e-12 * np.abs(want_dw).max())


def test_public_portable_gradients_match_tf(rng):
  """First and second order: conv2d's gradients, and the gradient of backprop_input with
  respect to its filter, equal tf.nn.conv2d's."""
  x = tf.constant(rng.standard_normal((2, 21, 19, 2)))
  w = tf.constant(rng.standard_normal((8, 5, 2, 3)))
  dy = tf.constant(rng.standard_normal((2, 11, 10, 3)))
  results = []
  for conv, backprop in (
    (
      lambda x, w: lc.conv2d(x, w, 2, "SAME", algorithm="portable"),
      lambda w, dy: lc.conv2d_backprop_input(x.shape, w, dy, 2, "SAME", algorithm="portable"),
    ),
    (
      lambda x, w: tf.nn.conv2d(x, w, 2, "SAME"),
      lambda w, dy: tf.nn.conv2d_transpose(dy, w, x.shape, 2, "SAME"),
    ),
  ):
    with tf.GradientTape(persistent=True) as tape:
      tape.watch([x, w, dy])
      y = conv(x, w)
      dx = backprop(w, dy)
      loss = tf.reduce_sum(dx * dx)
    results.append(tape.gradient(y, [x, w], output_gradients=dy) + tape.gradient(loss, [w, dy]))
  for got, want in zip(*results):
    np.testing.assert_allclose(
      got.numpy(), want.numpy(), rtol=0, atol=1e-11 * np.abs(want.numpy()).max()
    )


def test_public_portable_unknown_batch(rng):
  """An unknown batch size (Keras' traces) runs image by image and gives the same result."""
  x = rng.standard_normal((3, 20, 24, 2)).astype(np.float32)
  w = rng.standard_normal((9, 7, 2, 3)).astype(np.float32)
  f = tf.function(
    lambda x: lc.conv2d(x, w, 1, "VALID", algorithm="portable"),
    input_signature=[tf.TensorSpec([None, 20, 24, 2], tf.float32)],
  )
  got = f(x).numpy()
  want = tf.nn.conv2d(x, w, 1, "VALID").numpy()
  np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max())
  assert f(x[:0]).shape == (0, 12, 18, 3)
  # Extra leading batch dimensions are merged as for the op.
  got5 = lc.conv2d(x.reshape(3, 1, 20, 24, 2), w, 1, "VALID", algorithm="portable").numpy()
  np.testing.assert_allclose(got5.reshape(want.shape), want, rtol=0, atol=2e-5 * np.abs(want).max())


def test_public_portable_backprop_filter_with_an_unknown_input_batch(rng):
  """A traced input of unknown batch with an out_backprop of known batch: the batch the
  geometry is planned with stands for the unknown one, not for a mismatch."""
  x = rng.standard_normal((3, 20, 24, 2))
  dy = rng.standard_normal((3, 12, 18, 3))
  w_shape = (9, 7, 2, 3)
  f = tf.function(
    lambda x, dy: lc.conv2d_backprop_filter(x, w_shape, dy, 1, "VALID", algorithm="portable"),
    input_signature=[
      tf.TensorSpec([None, 20, 24, 2], tf.float64),
      tf.TensorSpec(dy.shape, tf.float64),
    ],
  )
  w = tf.zeros(w_shape, tf.float64)
  with tf.GradientTape() as tape:
    tape.watch(w)
    y = tf.nn.conv2d(x, w, 1, "VALID")
  want = tape.gradient(y, w, output_gradients=dy).numpy()
  got = f(x, dy).numpy()
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * np.abs(want).max())


def test_public_portable_refusals():
  x, w = np.zeros((1, 8, 8, 2), np.int32), np.zeros((3, 3, 2, 1), np.int32)
  with pytest.raises(ValueError, match="algorithm='portable' cannot compute int32 exactly"):
    lc.conv2d(x, w, 1, "SAME", algorithm="portable")
  with pytest.raises(ValueError, match="algorithm='portable' runs stock TensorFlow ops"):
    lc.plan((1, 8, 8, 2), (3, 3, 2, 1), 1, "SAME", algorithm="portable")
  f = tf.function(
    lambda x: lc.conv2d(x, w.astype(np.float32), 1, "SAME", algorithm="portable"),
    input_signature=[tf.TensorSpec([1, None, 8, 2], tf.float32)],
  )
  with pytest.raises(ValueError, match="needs static image and filter shapes"):
    f.get_concrete_function()
  with pytest.raises(ValueError, match="algorithm must be one of"):
    lc.conv2d(x, w, 1, "SAME", algorithm="portabel")


# Under XLA compilation (jit_compile=True) 'auto' takes the portable path.


def _xla_operands(rng):
  x = tf.constant(rng.standard_normal((2, 40, 44, 2)), tf.float32)
  w = tf.constant(rng.standard_normal((21, 17, 2, 3)), tf.float32)
  return x, w


def _close32(got, want):
  got, want = np.asarray(got), np.asarray(want)
  assert got.shape == want.shape
  np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max())


def test_xla_auto_runs_portable(rng):
  """conv2d, depthwise_conv2d, their gradients and the backprop functions with the
  default algorithm compile under jit_compile=True and equal TensorFlow's."""
  x, w = _xla_operands(rng)
  wd = tf.constant(rng.standard_normal((15, 13, 2, 2)), tf.float32)
  dy = tf.constant(rng.standard_normal((2, 20, 22, 3)), tf.float32)

  def run(conv, depthwise, x, w, wd, dy):
    with tf.GradientTape() as tape:
      tape.watch([x, w])
      y = conv(x, w, 2, "SAME")
    dx, dw = tape.gradient(y, [x, w], output_gradients=dy)
    return y, depthwise(x, wd, [1, 1, 1, 1], "VALID"), dx, dw

  def ours(x, w, wd, dy):
    return run(lc.conv2d, lc.depthwise_conv2d, x, w, wd, dy) + (
      lc.conv2d_backprop_input(tf.shape(x), w, dy, 2, "SAME"),
      lc.conv2d_backprop_filter(x, tf.shape(w), dy, 2, "SAME"),
    )

  def tf_algorithm(x, w):
    with tf.GradientTape() as tape:
      tape.watch([x, w])
      y = lc.conv2d(x, w, 2, "SAME", algorithm="tf")
    return (y,) + tuple(tape.gradient(y, [x, w], output_gradients=dy))

  got = tf.function(ours, jit_compile=True)(x, w, wd, dy)
  want = run(tf.nn.conv2d, tf.nn.depthwise_conv2d, x, w, wd, dy)
  want = want + want[2:]
  for g, v in zip(got, want):
    _close32(g, v)
  # algorithm='tf' compiles too (TensorFlow's own convolution and its gradients), also
  # with an unknown batch, where outside XLA an empty batch falls back to the op.
  got = tf.function(
    tf_algorithm,
    jit_compile=True,
    input_signature=[tf.TensorSpec([None, *x.shape[1:]], x.dtype), tf.TensorSpec(w.shape, w.dtype)],
  )(x, w)
  for g, v in zip(got, (want[0],) + want[2:4]):
    _close32(g, v)


def test_plain_function_still_runs_the_op(rng):
  """Outside XLA (a plain tf.function) 'auto' keeps the LargeConv op."""
  x, w = _xla_operands(rng)
  types = _op_types(tf.function(lambda x, w: lc.conv2d(x, w, 1, "SAME")), x, w)
  assert "LargeConv>Conv2D" in types
  assert "RFFT2D" not in types
  xla_types = _op_types(
    tf.function(lambda x, w: lc.conv2d(x, w, 1, "SAME"), jit_compile=True), x, w
  )
  assert not any(t.startswith("LargeConv") for t in xla_types)


@pytest.mark.parametrize("algorithm", ["direct", "fft"])
def test_xla_refuses_op_algorithms(rng, algorithm):
  x, w = _xla_operands(rng)
  for fn in (
    lambda x, w: lc.conv2d(x, w, 1, "SAME", algorithm=algorithm),
    lambda x, w: lc.conv2d_backprop_filter(
      x, tf.shape(w), x[..., :1], 1, "SAME", algorithm=algorithm
    ),
  ):
    with pytest.raises(
      ValueError,
      match=f"algorithm='{algorithm}' needs the LargeConv op "
      r"library.*use algorithm='auto' or 'portable'",
    ):
      tf.function(fn, jit_compile=True)(x, w)
