"""tf_largeconv.conv1d against the float64 oracle (reference_conv1d.py) and tf.nn.conv1d:
shapes, layouts, strides, dilations, groups, paddings, dtypes, both gradients and the
second order, a 65,536-tap filter, the planner's single-row FFT plans, the emulated CUDA
kernels, and the LargeConv1D layers (Keras 3 and tf_keras)."""

import itertools

import keras
import numpy as np
import pytest
import subproc
import tensorflow as tf
from reference_conv1d import Conv1D
from reference_conv1d import assert_close
from reference_conv1d import check_passes

import tf_largeconv as lc
from tf_largeconv import _core
from tf_largeconv.keras import LargeConv1D

MiB = 2**20

# (input NWC, filter [K, C / G, O], stride, padding, dilation)
CASES = [
  ((2, 37, 3), (5, 3, 4), 1, "SAME", 1),
  ((2, 40, 4), (7, 2, 6), 2, "VALID", 1),  # two groups
  ((1, 50, 2), (9, 2, 3), 1, "SAME", 3),
  ((3, 31, 6), (4, 3, 4), 3, "SAME", 2),  # stride with dilation, two groups
  ((2, 300, 2), (101, 2, 2), 1, "VALID", 1),
  ((1, 12, 1), (3, 1, 2), 1, [[4, 0]], 2),  # Keras's causal padding, explicit
]


def _to(fmt, a):
  """An NWC array in `fmt`."""
  return a if fmt == "NWC" else np.swapaxes(a, -1, -2)


def _passes(x, w, dy, stride, padding, fmt, dilation, algorithm):
  """conv1d's output and both gradients (dy given in NWC), all returned in NWC."""
  xt, wt = tf.constant(_to(fmt, x)), tf.constant(w)
  with tf.GradientTape() as tape:
    tape.watch([xt, wt])
    y = lc.conv1d(xt, wt, stride, padding, data_format=fmt, dilations=dilation, algorithm=algorithm)
  dx, dw = tape.gradient(y, [xt, wt], output_gradients=tf.constant(_to(fmt, dy)))
  return _to(fmt, y.numpy()), _to(fmt, dx.numpy()), dw.numpy()


@pytest.mark.parametrize(
  "case,fmt,algorithm", list(itertools.product(CASES, ["NWC", "NCW"], ["direct", "fft"]))
)
def test_passes_match_oracle(rng, case, fmt, algorithm):
  x_shape, w_shape, stride, padding, dilation = case
  ref = Conv1D(x_shape, w_shape, stride, padding if padding != [[4, 0]] else (4, 0), dilation)
  x, w = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
  dy = rng.standard_normal(ref.output_shape())
  y, dx, dw = _passes(x, w, dy, stride, padding, fmt, dilation, algorithm)
  check_passes(ref, "float64", x, w, dy, y, dx, dw, f"{fmt} {algorithm}")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_dtypes_match_oracle(rng, dtype):
  ref = Conv1D((2, 64, 4), (15, 2, 4), 2, "SAME", 1)
  tfd = tf.as_dtype(dtype)
  # The oracle gets exactly the values the op gets (rounded to the dtype under test).
  x = tf.cast(rng.standard_normal((2, 64, 4)), tfd)
  w = tf.cast(rng.standard_normal((15, 2, 4)), tfd)
  dy = tf.cast(rng.standard_normal(ref.output_shape()), tfd)
  for algorithm in ("direct", "fft"):
    with tf.GradientTape() as tape:
      tape.watch([x, w])
      y = lc.conv1d(x, w, 2, "SAME", algorithm=algorithm)
    assert y.dtype == tfd
    dx, dw = tape.gradient(y, [x, w], output_gradients=dy)
    as64 = [tf.cast(t, tf.float64).numpy() for t in (x, w, dy, y, dx, dw)]
    check_passes(ref, dtype, *as64, f"{dtype} {algorithm}")


def test_int32_is_exact(rng):
  x = rng.integers(-50, 50, (2, 40, 3)).astype(np.int32)
  w = rng.integers(-50, 50, (6, 3, 2)).astype(np.int32)
  got = lc.conv1d(x, w, 2, "SAME").numpy()
  want = Conv1D(x.shape, w.shape, 2, "SAME").forward(x, w)
  np.testing.assert_array_equal(got, want.astype(np.int64))


@pytest.mark.parametrize(
  "x_shape,w_shape,stride,padding,dilation",
  [
    ((2, 100, 3), (11, 3, 5), 1, "SAME", 1),
    ((3, 64, 4), (8, 4, 2), 3, "VALID", 1),
    ((1, 80, 2), (5, 2, 3), 1, "VALID", 4),
    ((2, 3, 50, 2), (7, 2, 2), 2, "SAME", 1),  # extra batch dimension
    ((2, 20, 1), (40, 1, 1), 1, "SAME", 1),  # filter longer than the input
  ],
)
def test_matches_tf_conv1d(rng, x_shape, w_shape, stride, padding, dilation):
  x = tf.constant(rng.standard_normal(x_shape), tf.float32)
  w = tf.constant(rng.standard_normal(w_shape), tf.float32)
  dy = tf.constant(
    rng.standard_normal(tf.nn.conv1d(x, w, stride, padding, dilations=dilation).shape), tf.float32
  )
  results = []
  for conv in (lc.conv1d, tf.nn.conv1d):
    with tf.GradientTape() as tape:
      tape.watch([x, w])
      y = conv(x, w, stride, padding, dilations=dilation)
    # TF's CPU backprop kernels refuse dilations (the oracle checks ours there).
    grads = tape.gradient(y, [x, w], output_gradients=dy) if dilation == 1 else []
    results.append([y.numpy()] + [g.numpy() for g in grads])
  for name, ours, theirs in zip(("forward", "dx", "dw"), *results):
    assert ours.shape == theirs.shape, name
    np.testing.assert_allclose(
      ours, theirs, rtol=1e-4, atol=1e-4 * np.abs(theirs).max(), err_msg=name
    )


def test_extra_batch_dims_and_ncw(rng):
  x = rng.standard_normal((2, 3, 5, 40))  # batch_shape (2, 3), NCW
  w = rng.standard_normal((9, 5, 4))
  got = lc.conv1d(x, w, [1, 1, 2], "SAME", data_format="NCW").numpy()
  assert got.shape == (2, 3, 4, 20)
  flat = np.swapaxes(x.reshape(6, 5, 40), 1, 2)
  want = Conv1D(flat.shape, w.shape, 2, "SAME").forward(flat, w)
  np.testing.assert_allclose(np.swapaxes(got.reshape(6, 4, 20), 1, 2), want, rtol=1e-10, atol=1e-10)


def test_traced_with_unknown_batch_and_width(rng):
  w = tf.constant(rng.standard_normal((7, 2, 3)))
  f = tf.function(
    lambda x: lc.conv1d(x, w, 1, "SAME"),
    input_signature=[tf.TensorSpec([None, None, 2], tf.float64)],
  )
  x = rng.standard_normal((2, 30, 2))
  np.testing.assert_allclose(
    f(x).numpy(), Conv1D(x.shape, w.shape, 1, "SAME").forward(x, w.numpy()), rtol=1e-10, atol=1e-10
  )


@pytest.mark.parametrize("algorithm", ["direct", "fft"])
def test_second_order_matches_oracle(rng, algorithm):
  """g = d<conv(x, w), v>/dx is linear in (w, v); d<g, u>/dw = backprop_filter(u, v) and
  d<g, u>/dv = forward(u, w) by the oracle."""
  ref = Conv1D((2, 33, 4), (6, 2, 4), 2, "SAME", 2)
  x, w = tf.constant(rng.standard_normal((2, 33, 4))), tf.constant(rng.standard_normal((6, 2, 4)))
  v = tf.constant(rng.standard_normal(ref.output_shape()))
  u = rng.standard_normal((2, 33, 4))
  with tf.GradientTape(persistent=True) as outer:
    outer.watch([w, v])
    with tf.GradientTape() as inner:
      inner.watch(x)
      y = lc.conv1d(x, w, 2, "SAME", dilations=2, algorithm=algorithm)
    g = inner.gradient(y, x, output_gradients=v)
    s = tf.reduce_sum(g * u)
  dw, dv = outer.gradient(s, [w, v])
  mag_w = ref.backprop_filter(np.abs(u), np.abs(v.numpy()))
  assert_close(
    dw.numpy(),
    ref.backprop_filter(u, v.numpy()),
    mag_w,
    "float64",
    ref.terms("backprop_filter"),
    "d2/dw dx",
  )
  mag_v = ref.forward(np.abs(u), np.abs(w.numpy()))
  assert_close(
    dv.numpy(), ref.forward(u, w.numpy()), mag_v, "float64", ref.terms("forward"), "d2/dv dx"
  )


@pytest.mark.parametrize(
  "kwargs,message",
  [
    (dict(stride=[1, 2]), "stride"),
    (dict(stride="2"), "stride"),
    (dict(dilations=[1, 2, 3, 4]), "dilations"),
    (dict(data_format="NHW"), "data_format"),
    (dict(padding="FULL"), "padding"),
    (dict(padding=[[1, 1], [0, 0]]), "padding"),
    (dict(algorithm="fast"), "algorithm"),
    (dict(workspace_limit=-1), "workspace_limit"),
  ],
)
def test_bad_arguments_raise_value_error_naming_them(kwargs, message):
  args = dict(stride=1, padding="SAME")
  args.update(kwargs)
  with pytest.raises(ValueError, match=message):
    lc.conv1d(tf.ones((1, 10, 2)), tf.ones((3, 2, 2)), **args)


def test_bad_shapes_raise_naming_the_tensor():
  with pytest.raises(ValueError, match="input must have rank >= 3"):
    lc.conv1d(tf.ones((10, 2)), tf.ones((3, 2, 2)), 1, "SAME")
  with pytest.raises(ValueError, match="filters must be 3-D"):
    lc.conv1d(tf.ones((1, 10, 2)), tf.ones((1, 3, 2, 2)), 1, "SAME")
  with pytest.raises(tf.errors.InvalidArgumentError):  # 3 channels, filter in-depth 2
    lc.conv1d(tf.ones((1, 10, 3)), tf.ones((3, 2, 2)), 1, "SAME")
  with pytest.raises(tf.errors.UnimplementedError, match="strides"):  # as TF: batch stride
    lc.conv1d(tf.ones((1, 10, 2)), tf.ones((3, 2, 2)), [2, 1, 1], "SAME")


# The bench geometry: 4095 taps over 65,536 samples, 16 -> 16 channels.
BENCH = ((8, 65536, 16), (4095, 16, 16), 1, "SAME")


@pytest.mark.parametrize("limit", [None, 16 * MiB, 4 * MiB])
def test_1d_plans_single_row_transforms_with_large_tiles(limit):
  p = lc.plan_conv1d(*BENCH, algorithm="fft", workspace_limit=limit)
  assert p.output_shape == (8, 65536, 16)
  for pp in p.passes:
    assert pp.fft_size[0] == 1 and pp.tile[0] == 1, pp
    # 4096-point transforms left 2 outputs each; these give thousands.
    assert pp.tile[1] >= 2048, pp
    assert pp.workspace_bytes <= (limit or 64 * MiB), pp
  auto = lc.plan_conv1d(*BENCH, workspace_limit=limit)
  assert [pp.algorithm for pp in auto.passes] == ["fft"] * 3, auto


@pytest.mark.parametrize(
  "case",
  [
    ((3, 5000, 2), (301, 2, 3), 1, "SAME", 1),
    ((3, 5000, 2), (301, 2, 3), 2, "VALID", 2),
    ((3, 6000, 2), (257, 2, 3), 2, "SAME", 1),
  ],
)
def test_fft_batches_runs_of_tiles_across_images(rng, case):
  """Rows of height 1 are transformed several tiles per call (vec_block), runs that cross
  from one image into the next and a shorter last run included (9 tiles in runs of 8),
  for the forward and input-gradient passes, against the oracle."""
  x_shape, w_shape, stride, padding, dilation = case
  plan = lc.plan_conv1d(x_shape, w_shape, stride, padding, dilations=dilation)
  for pp in plan.passes[:2]:
    tiles = x_shape[0] * pp.tiles[1]
    assert pp.algorithm == "fft" and pp.vec_block > 1, pp
    assert pp.tiles[1] % pp.vec_block and tiles % pp.vec_block, (pp, tiles)
  ref = Conv1D(x_shape, w_shape, stride, padding, dilation)
  x, w = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
  dy = rng.standard_normal(ref.output_shape())
  y, dx, dw = _passes(x, w, dy, stride, padding, "NWC", dilation, "fft")
  check_passes(ref, "float64", x, w, dy, y, dx, dw, "tile runs")


def _plan_summary(p):
  return [
    (a.name, a.algorithm, a.workspace_bytes, a.flops, a.fft_size, a.tile, a.tiles) for a in p.passes
  ]


@pytest.mark.parametrize("fmt", ["NWC", "NCW"])
@pytest.mark.parametrize(
  "stride,padding,dilation", [(1, "VALID", 3), (2, "VALID", 4), (1, "SAME", 5), (1, [[8, 0]], 4)]
)
def test_plan_conv1d_plans_the_dilated_conv(rng, fmt, stride, padding, dilation):
  """With dilation > 1, plan_conv1d reports the shape conv1d returns and the passes of
  `plan` of the dilated height-1 conv2d."""
  x_shape, w_shape = (2, 700, 3), (41, 3, 4)
  shape = x_shape if fmt == "NWC" else (2, 3, 700)
  p = lc.plan_conv1d(shape, w_shape, stride, padding, data_format=fmt, dilations=dilation)
  y = lc.conv1d(
    tf.constant(rng.standard_normal(shape)),
    tf.constant(rng.standard_normal(w_shape)),
    stride,
    padding,
    data_format=fmt,
    dilations=dilation,
  )
  assert p.output_shape == tuple(y.shape)
  # The height-1 conv2d, built here: height inserted before the width, dilation and
  # stride on the width only.
  fmt_2d = {"NWC": "NHWC", "NCW": "NCHW"}[fmt]
  shape_2d = (2, 1, 700, 3) if fmt == "NWC" else (2, 3, 1, 700)
  pads = padding
  if not isinstance(padding, str):
    pads = (
      [[0, 0], [0, 0], padding[0], [0, 0]] if fmt == "NWC" else [[0, 0], [0, 0], [0, 0], padding[0]]
    )
  q = lc.plan(
    shape_2d, (1,) + w_shape, (1, stride), pads, data_format=fmt_2d, dilations=(1, dilation)
  )
  assert _plan_summary(p) == _plan_summary(q)
  assert p.output_shape == tuple(
    s for i, s in enumerate(q.output_shape) if i != (1 if fmt == "NWC" else 2)
  )


def test_1d_fft_refuses_a_limit_below_its_smallest_plan():
  with pytest.raises(ValueError, match="workspace_limit"):
    lc.plan_conv1d(*BENCH, algorithm="fft", workspace_limit=100_000)


def test_gpu_planner_plans_single_rows_for_1d():
  """The GPU planner gives 1-D geometries long single rows too (rank-1 cuFFT plans), and
  keeps sides >= 2 where the geometry is 2-D, even with a filter of height 1."""
  plans = _core.cuda_plan([8, 1, 65536, 16], [1, 4095, 16, 16], [1, 1, 1, 1], "SAME")
  for p in plans:
    assert p["algorithm"] == "fft" and p["fft"][0] == 1 and p["fft"][1] > 8192, p
  for p in _core.cuda_plan([2, 40, 300, 2], [1, 101, 2, 2], [1, 1, 1, 1], "SAME", algorithm="fft"):
    assert min(p["fft"]) >= 2, p


def _spot_dots(xp, w, positions, stride=1):
  """Exact float64 correlation outputs at `positions` of a padded single-channel row."""
  k = len(w)
  return np.array([np.dot(xp[o * stride : o * stride + k], w) for o in positions])


def test_65536_tap_filter_plans_fft_and_matches_oracle(rng):
  n, width, taps = 2, 65536, 65536
  p = lc.plan_conv1d((n, width, 1), (taps, 1, 1), 1, "SAME")
  for pp in p.passes:
    assert pp.algorithm == "fft" and pp.fft_size[0] == 1, p
  x = rng.standard_normal((n, width, 1)).astype(np.float32)
  w = rng.standard_normal((taps, 1, 1)).astype(np.float32)
  dy = rng.standard_normal((n, width, 1)).astype(np.float32)
  xt, wt = tf.constant(x), tf.constant(w)
  with tf.GradientTape() as tape:
    tape.watch([xt, wt])
    y = lc.conv1d(xt, wt, 1, "SAME")
  dx, dw = tape.gradient(y, [xt, wt], output_gradients=tf.constant(dy))
  before = (taps - 1) // 2
  pos = np.concatenate([[0, 1, width - 1], rng.integers(0, width, 40)])
  w64, terms = w[:, 0, 0].astype(np.float64), taps
  for b in range(n):
    xp = np.pad(x[b, :, 0].astype(np.float64), (before, taps - 1 - before))
    want = _spot_dots(xp, w64, pos)
    mag = _spot_dots(np.abs(xp), np.abs(w64), pos)
    assert_close(y.numpy()[b, pos, 0], want, mag, "float32", terms, f"forward image {b}")
    # dx[i] = sum_o dy[o] w[i + before - o]: the correlation of padded dy with the
    # reversed filter.
    dyp = np.pad(dy[b, :, 0].astype(np.float64), (taps - 1 - before, before))
    want = _spot_dots(dyp, w64[::-1], pos)
    mag = _spot_dots(np.abs(dyp), np.abs(w64[::-1]), pos)
    assert_close(dx.numpy()[b, pos, 0], want, mag, "float32", terms, f"dx image {b}")
  # dw[k] = sum_b sum_o xp[o + k] dy[o]
  taps_at = np.concatenate([[0, taps - 1], rng.integers(0, taps, 40)])
  xps = [np.pad(x[b, :, 0].astype(np.float64), (before, taps - 1 - before)) for b in range(n)]
  want = sum(
    np.array([np.dot(xps[b][k : k + width], dy[b, :, 0]) for k in taps_at]) for b in range(n)
  )
  mag = sum(
    np.array([np.dot(np.abs(xps[b][k : k + width]), np.abs(dy[b, :, 0])) for k in taps_at])
    for b in range(n)
  )
  assert_close(dw.numpy()[taps_at, 0, 0], want, mag, "float32", n * width, "dw")


@pytest.mark.parametrize("algorithm", ["direct", "fft"])
@pytest.mark.parametrize("case", [CASES[0], CASES[3], ((1, 3000, 2), (1500, 2, 2), 1, "SAME", 1)])
def test_emulated_cuda_kernels_compute_conv1d(rng, case, algorithm):
  """The CUDA kernels (host emulation) on conv1d's height-1 geometry."""
  x_shape, w_shape, stride, padding, dilation = case
  ref = Conv1D(x_shape, w_shape, stride, padding, dilation)
  x, w = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
  dy = rng.standard_normal(ref.output_shape())
  x4, w4, dy4 = x[:, None], w[None], dy[:, None]
  s, d = [1, 1, stride, 1], [1, 1, dilation, 1]
  emu = _core.cuda_emulation
  kw = dict(dilations=d, algorithm=algorithm)
  y = emu.conv2d(x4, w4, s, padding, **kw)[:, 0]
  dx = emu.conv2d_backprop_input(list(x4.shape), w4, dy4, s, padding, **kw)[:, 0]
  dw = emu.conv2d_backprop_filter(x4, list(w4.shape), dy4, s, padding, **kw)[0]
  check_passes(ref, "float64", x, w, dy, y, dx, dw, f"emulated {algorithm}")


# Keras


def _keras_pair(rng, **kwargs):
  ours = LargeConv1D(**kwargs)
  theirs = keras.layers.Conv1D(**{k: v for k, v in kwargs.items() if k != "algorithm"})
  return ours, theirs


@pytest.mark.parametrize(
  "kwargs,shape",
  [
    (dict(filters=4, kernel_size=9, padding="causal", dilation_rate=2), (2, 40, 3)),
    (dict(filters=6, kernel_size=5, padding="causal", groups=3), (2, 30, 6)),
    (
      dict(
        filters=4,
        kernel_size=7,
        strides=2,
        padding="same",
        groups=2,
        data_format="channels_first",
        activation="relu",
      ),
      (2, 4, 33),
    ),
    (dict(filters=2, kernel_size=31, padding="valid", algorithm="fft"), (3, 64, 2)),
  ],
)
def test_large_conv1d_equals_keras_conv1d(rng, kwargs, shape):
  ours, theirs = _keras_pair(rng, **kwargs)
  x = rng.standard_normal(shape).astype(np.float32)
  theirs(x)
  ours(x)
  weights = [rng.standard_normal(v.shape).astype(np.float32) for v in theirs.weights]
  theirs.set_weights(weights)
  ours.set_weights(weights)
  want = theirs(x).numpy()
  got = ours(x).numpy()
  assert got.shape == want.shape == tuple(ours.compute_output_shape(shape))
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_large_conv1d_channels_first_bias(rng):
  """channels_first with the output width equal to `filters`, against the channels_last
  layer (keras.layers.Conv1D adds the bias along the width there; see _conv_call)."""
  x = rng.standard_normal((2, 3, 6)).astype(np.float32)  # NCW
  ours = LargeConv1D(4, 3, data_format="channels_first", bias_initializer="random_normal")
  ours(x)
  theirs = keras.layers.Conv1D(4, 3)
  theirs.build((2, 6, 3))
  theirs.set_weights(ours.get_weights())
  want = theirs(np.transpose(x, (0, 2, 1))).numpy()
  np.testing.assert_allclose(
    np.transpose(ours(x).numpy(), (0, 2, 1)), want, rtol=1e-4, atol=1e-4 * np.abs(want).max()
  )


def test_large_conv1d_round_trips(rng, tmp_path):
  layer = LargeConv1D(
    3,
    21,
    padding="causal",
    dilation_rate=2,
    groups=1,
    algorithm="fft",
    workspace_limit=1 << 20,
    name="big",
  )
  config = layer.get_config()
  assert config["algorithm"] == "fft" and config["workspace_limit"] == 1 << 20
  assert set(keras.layers.Conv1D(3, 21).get_config()) <= set(config)
  assert LargeConv1D.from_config(config).get_config() == config
  assert keras.saving.serialize_keras_object(layer)["registered_name"] == (
    "tf_largeconv>LargeConv1D"
  )
  inp = keras.Input((50, 2))
  model = keras.Model(inp, layer(inp))
  x = rng.standard_normal((2, 50, 2)).astype(np.float32)
  want = model(x).numpy()
  model.save(tmp_path / "m.keras")
  loaded = keras.models.load_model(tmp_path / "m.keras")
  assert type(loaded.layers[1]) is LargeConv1D
  np.testing.assert_array_equal(loaded(x).numpy(), want)


def test_convert_swaps_large_conv1d(rng):
  inp = keras.Input((100, 3))
  h = keras.layers.Conv1D(4, 3, padding="same")(inp)
  h = keras.layers.Conv1D(4, 25, padding="causal", dilation_rate=2, groups=2)(h)
  model = keras.Model(inp, h)
  converted = lc.keras.convert(model, min_kernel_size=15)
  assert [type(l).__name__ for l in converted.layers[1:]] == ["Conv1D", "LargeConv1D"]
  x = rng.standard_normal((2, 100, 3)).astype(np.float32)
  want = model(x).numpy()
  np.testing.assert_allclose(converted(x).numpy(), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_tf_keras_large_conv1d_equals_tf_keras_conv1d():
  subproc.run(
    """
      import numpy as np
      import tensorflow as tf
      import tf_keras
      import tf_largeconv
      from tf_largeconv.tf_keras import LargeConv1D
      rng = np.random.default_rng(0)
      for kwargs, shape in [
          (dict(filters=4, kernel_size=9, padding="causal", dilation_rate=2), (2, 40, 3)),
          (dict(filters=4, kernel_size=7, strides=2, padding="same", groups=2),
           (2, 33, 4))]:
        theirs, ours = tf_keras.layers.Conv1D(**kwargs), LargeConv1D(**kwargs)
        x = rng.standard_normal(shape).astype(np.float32)
        theirs(x)
        ours(x)
        ours.set_weights(theirs.get_weights())
        want = theirs(x).numpy()
        np.testing.assert_allclose(ours(x).numpy(), want, rtol=1e-4,
                                   atol=1e-4 * np.abs(want).max())
      layer = LargeConv1D(3, 21, padding="causal", algorithm="fft")
      config = layer.get_config()
      assert config["algorithm"] == "fft" and config["padding"] == "causal"
      assert LargeConv1D.from_config(config).get_config() == config
      assert tf_keras.utils.get_registered_name(LargeConv1D) == "tf_largeconv>LargeConv1D"
      """,
    timeout=300,
    env=subproc.child_env(TF_USE_LEGACY_KERAS=1),
  )
