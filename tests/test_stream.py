"""tf_largeconv.stream.predict: whole Keras models tile by tile, against the untiled model.

The oracle is the model itself, called on the whole image (`model(image, training=False)`).
Tolerances (relative to the largest output magnitude): float64 1e-10, float32 2e-5.
"""

import contextlib
import os
import re
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_largeconv import keras as lc_keras
from tf_largeconv import stream
from tf_largeconv.stream import _pool

L = keras.layers
TOL = {"float64": 1e-10, "float32": 2e-5}


@contextlib.contextmanager
def floatx(dtype):
  """Layers made inside compute and keep their weights in `dtype`."""
  old = keras.config.dtype_policy()
  keras.config.set_dtype_policy(dtype)
  try:
    yield
  finally:
    keras.config.set_dtype_policy(old)


def _randomize(model, seed=0):
  """Weights away from their initial values (biases, BN statistics and scales included),
  for every variable of the model, nested models and blocks included."""
  rng = np.random.default_rng(seed)
  for v in model.weights:
    shape = tuple(v.shape)
    if "variance" in v.path:
      value = rng.uniform(0.5, 2.0, shape)
    else:
      value = rng.standard_normal(shape) * (0.5 / np.sqrt(max(np.prod(shape[:-1]), 1)) + 0.1)
    v.assign(value.astype(v.dtype))
  return model


def _image(shape, dtype, seed=1):
  return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def check(model, image, tiles, dtype, **kwargs):
  ref = model(image, training=False).numpy()
  scale = np.abs(ref).max()
  assert scale > 0
  for tile in tiles:
    got = stream.predict(model, image, tile=tile, **kwargs)
    assert got.shape == ref.shape and got.dtype == ref.dtype, tile
    err = np.abs(got - ref).max() / scale
    assert err <= TOL[dtype], f"tile {tile}: relative error {err:.3g}"
  return ref


def plain(channels=3):
  inp = keras.Input((None, None, channels))
  x = L.Conv2D(6, 3, padding="same", activation="relu")(inp)
  x = L.Conv2D(6, 5, padding="valid")(x)
  x = L.Conv2D(6, 4, strides=3, padding="same")(x)
  x = L.SeparableConv2D(5, 3, padding="same", depth_multiplier=2)(x)
  x = L.Conv2D(4, 3, padding="same", groups=1, dilation_rate=2)(x)
  x = L.AveragePooling2D(3, strides=2, padding="same")(x)
  x = L.MaxPooling2D(3, strides=2, padding="same")(x)
  return _randomize(keras.Model(inp, x))


def resnet(channels=3):
  inp = keras.Input((None, None, channels))
  x = L.Conv2D(8, 7, strides=2, padding="same", use_bias=False)(inp)
  x = L.BatchNormalization()(x)
  x = L.ReLU()(x)
  x = L.MaxPooling2D(3, strides=2, padding="same")(x)
  y = L.Conv2D(16, 3, strides=2, padding="same")(x)
  y = L.BatchNormalization()(y)
  y = L.Activation("relu")(y)
  y = L.Conv2D(16, 3, padding="same")(y)
  y = L.BatchNormalization()(y)
  s = L.Conv2D(16, 1, strides=2)(x)
  s = L.BatchNormalization()(s)
  x = L.ReLU()(L.Add()([y, s]))
  return _randomize(keras.Model(inp, x))


def unet(channels=2, bilinear=True):
  inp = keras.Input((None, None, channels))
  skips, x = [], inp
  for depth, width in enumerate((4, 6, 8)):
    x = L.Conv2D(width, 3, padding="same", activation="relu")(x)
    skips.append(x)
    x = (L.MaxPooling2D(2) if depth != 1 else L.AveragePooling2D(2))(x)
  x = L.Conv2D(10, 3, padding="same", activation="relu")(x)
  for depth, width in reversed(list(enumerate((4, 6, 8)))):
    if depth == 2:
      x = L.Conv2DTranspose(width, 2, strides=2)(x)
    else:
      smooth = bilinear and depth == 1
      x = L.UpSampling2D(2, interpolation="bilinear" if smooth else "nearest")(x)
    x = L.Concatenate()([x, skips[depth]])
    x = L.Conv2D(width, 3, padding="same", activation="relu")(x)
  x = L.Conv2D(3, 1)(x)
  return _randomize(keras.Model(inp, x))


def replk_block(channels=4, large=31):
  inp = keras.Input((None, None, channels))
  x = L.BatchNormalization()(inp)
  x = L.Conv2D(channels, 1, activation="relu")(x)
  a = lc_keras.LargeDepthwiseConv2D(large, padding="same", use_bias=False)(x)
  a = L.BatchNormalization()(a)
  b = L.DepthwiseConv2D(5, padding="same", use_bias=False)(x)
  b = L.BatchNormalization()(b)
  x = L.ReLU()(L.Add()([a, b]))
  x = L.Conv2D(channels, 1)(x)
  return _randomize(keras.Model(inp, L.Add()([inp, x])))


def convnext_block(channels=8):
  inp = keras.Input((None, None, channels))
  x = L.DepthwiseConv2D(7, padding="same")(inp)
  x = L.LayerNormalization(epsilon=1e-6)(x)
  x = L.Dense(4 * channels, activation="gelu")(x)
  x = L.Dense(channels)(x)
  return _randomize(keras.Model(inp, inp + x))


def dilated(channels=3):
  inp = keras.Input((None, None, channels))
  x = inp
  for d in (1, 2, 4, 8):
    x = L.Conv2D(5, 3, dilation_rate=d, padding="same", activation="tanh")(x)
  x = lc_keras.LargeConv2D(4, 9, dilation_rate=3, padding="same")(x)
  return _randomize(keras.Model(inp, x))


def edges(channels=3):
  """Every padding and edge rule: asymmetric zero padding and cropping, even kernels, valid
  and same pooling with strides that do not divide, transposed convolutions whose kernel is
  shorter than the stride and with output_padding."""
  inp = keras.Input((None, None, channels))
  x = L.ZeroPadding2D(((2, 0), (1, 3)))(inp)
  x = L.Conv2D(4, (2, 4), padding="same")(x)
  x = L.Cropping2D(((1, 2), (0, 1)))(x)
  x = L.MaxPooling2D((3, 2), strides=(3, 2), padding="same")(x)
  x = L.Conv2DTranspose(4, 2, strides=3, padding="same")(x)
  x = L.AveragePooling2D((2, 3), strides=(2, 3), padding="valid")(x)
  x = L.Conv2DTranspose(3, 3, strides=2, padding="valid", output_padding=1)(x)
  x = L.MaxPooling2D(3, strides=1, padding="valid")(x)
  return _randomize(keras.Model(inp, x))


MODELS = {
  "plain": (plain, (2, 47, 53, 3), (1, 7, 16, 100)),
  "resnet": (resnet, (2, 45, 38, 3), (3, 16, 29)),
  "unet": (unet, (1, 48, 40, 2), (9, 24)),
  "replknet": (replk_block, (1, 50, 43, 4), (11, 20)),
  "convnext": (convnext_block, (2, 29, 31, 8), (5, 13)),
  "dilated": (dilated, (1, 61, 35, 3), (4, 17)),
  "edges": (edges, (2, 40, 35, 3), (1, 5, 11)),
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_streamed_equals_untiled(name, dtype):
  make, shape, tiles = MODELS[name]
  with floatx(dtype):
    model = make()
  assert all(w.dtype == dtype for w in model.weights)
  check(model, _image(shape, dtype), tiles, dtype)


def test_one_output_pixel_per_tile():
  """Tiles of a single output pixel through pooling, upsampling and skips."""
  model = unet()
  image = _image((1, 16, 24, 2), "float32")
  check(model, image, (1,), "float32")
  assert stream.plan(model, image, tile=1).tiles == 16 * 24


def causal1d(channels=2):
  inp = keras.Input((None, channels))
  x = L.Conv1D(4, 3, padding="causal", dilation_rate=2, activation="relu")(inp)
  x = lc_keras.LargeConv1D(4, 17, padding="causal", dilation_rate=3)(x)
  x = L.ZeroPadding1D((3, 1))(x)
  x = L.MaxPooling1D(3, strides=2, padding="same")(x)
  x = L.Conv1D(5, 4, strides=2, padding="valid")(x)
  x = L.Cropping1D((1, 2))(x)
  x = L.UpSampling1D(3)(x)
  x = L.Conv1DTranspose(3, 5, strides=2, padding="same")(x)
  return _randomize(keras.Model(inp, x))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_sequences(dtype):
  with floatx(dtype):
    model = causal1d()
  check(model, _image((3, 301, 2), dtype), (1, 19, 64), dtype)


def classifier(pool, keepdims=False):
  inp = keras.Input((None, None, 3))
  x = L.Conv2D(8, 5, strides=2, padding="same", activation="relu")(inp)
  x = L.DepthwiseConv2D(9, padding="same")(x)
  x = L.BatchNormalization()(x)
  x = pool(keepdims=keepdims)(x)
  if keepdims:
    x = L.Flatten()(x)
  x = L.Dense(6)(x)
  x = L.Dropout(0.5)(x)
  return _randomize(keras.Model(inp, L.Softmax()(x)))


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("pool", [L.GlobalAveragePooling2D, L.GlobalMaxPooling2D])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_global_pooling_head(pool, keepdims, dtype):
  """A global pooling reduced across tiles, then a head run once."""
  with floatx(dtype):
    model = classifier(pool, keepdims)
  ref = check(model, _image((2, 41, 38, 3), dtype), (6, 17), dtype)
  assert ref.shape == (2, 6)


def test_two_poolings_of_one_trunk():
  inp = keras.Input((None, None, 3))
  x = L.Conv2D(5, 3, padding="same")(inp)
  x = L.Concatenate()([L.GlobalAveragePooling2D()(x), L.GlobalMaxPooling2D()(x)])
  model = _randomize(keras.Model(inp, L.Dense(2)(x)))
  check(model, _image((1, 20, 23, 3), "float32"), (4,), "float32")


def _replk_linear(channels=4):
  inp = keras.Input((None, None, channels))
  a = lc_keras.LargeDepthwiseConv2D(31, padding="same", use_bias=False)(inp)
  a = L.BatchNormalization()(a)
  b = L.DepthwiseConv2D(5, padding="same", use_bias=False)(inp)
  b = L.BatchNormalization()(b)
  return _randomize(keras.Model(inp, L.Add()([a, b])), seed=3)


@pytest.mark.parametrize("form", ["folded_block", "reparameterized"])
def test_replknet_folded(form):
  """RepLKNet's 31x31 + 5x5 branches as one FoldedBlock (training form) and folded into one
  large depthwise layer (deployment form)."""
  inp = keras.Input((None, None, 4))
  x = L.Conv2D(4, 1)(inp)
  x = lc_keras.FoldedBlock(_replk_linear())(x)
  x = L.ReLU()(x)
  model = _randomize(keras.Model(inp, L.Conv2D(3, 1)(x)), seed=4)
  if form == "reparameterized":
    model = lc_keras.reparameterize(model)
    assert not any(isinstance(layer, lc_keras.FoldedBlock) for layer in model.layers)
  check(model, _image((1, 45, 52, 4), "float32"), (13, 40), "float32")


def test_nested_models():
  block = resnet(channels=3)
  inp = keras.Input((None, None, 3))
  x = block(inp)
  x = L.Conv2D(3, 3, padding="same")(x)
  x = block(L.Conv2D(3, 1)(L.UpSampling2D(8)(x)))  # the same block twice: shared weights
  model = _randomize(keras.Model(inp, x), seed=5)
  check(model, _image((1, 33, 30, 3), "float32"), (7, 16), "float32")


def _model_with(layer):
  """Layers normalizing over pixels need the spatial size when built: a fixed-size input."""
  inp = keras.Input((16, 16, 3))
  return keras.Model(inp, layer(L.Conv2D(4, 3, padding="same")(inp)))


@pytest.mark.parametrize(
  "layer, words",
  [
    (L.Flatten(name="flat"), "'flat' (Flatten)"),
    (L.Reshape((-1, 4), name="reshape"), "'reshape' (Reshape)"),
    (L.Lambda(lambda t: tf.roll(t, 1, axis=2), name="lam"), "'lam' (Lambda)"),
    (L.LayerNormalization(axis=(1, 2, 3), name="ln"), "its axis is"),
    (L.BatchNormalization(axis=1, name="bn"), "its axis is"),
    (L.Resizing(8, 8, name="resize"), "'resize' (Resizing)"),
    (L.UpSampling2D(2, interpolation="bicubic", name="up"), "interpolation 'bicubic'"),
    (L.Conv2D(3, 3, data_format="channels_first", name="cf"), "channels_first"),
    (L.PReLU(name="prelu"), "differs from pixel to pixel"),
    (L.Softmax(axis=1, name="sm"), "its axis is"),
  ],
)
def test_layers_that_cannot_stream_are_named(layer, words):
  model = _model_with(layer)
  with pytest.raises(ValueError) as e:
    stream.predict(model, _image((1, 16, 16, 3), "float32"), tile=8)
  assert words in str(e.value)
  if "channels_first" not in words:
    assert "up_to=" in str(e.value)


def test_pooled_value_broadcast_over_the_image_streams_in_passes():
  """A squeeze-excitation gate: each pixel depends on the whole image, so the gate is
  pooled over every tile in a first pass (tests/test_stream_context.py has more)."""
  inp = keras.Input((None, None, 3))
  x = L.Conv2D(4, 3, padding="same", name="trunk")(inp)
  gate = L.Dense(4, activation="sigmoid")(L.GlobalAveragePooling2D(keepdims=True)(x))
  model = _randomize(keras.Model(inp, L.Multiply(name="gate")([x, gate])))
  check(model, _image((1, 16, 16, 3), "float32"), (5,), "float32")
  assert stream.plan(model, (1, 16, 16, 3), tile=5).passes == 2
  # Or streamed up to the layer before it:
  part = stream.predict(model, _image((1, 16, 16, 3), "float32"), up_to="trunk", tile=5)
  assert part.shape == (1, 16, 16, 4)


def test_register_pointwise():
  class Scale(L.Layer):
    """Per pixel, through an operation the analysis of traced calls does not know."""

    def call(self, x):
      return tf.einsum("...c,c->...c", x, tf.constant([2.0, -1.0], x.dtype))

  inp = keras.Input((None, None, 3))
  model = keras.Model(inp, Scale(name="scale")(L.Conv2D(2, 3, padding="same")(inp)))
  image = _image((1, 12, 14, 3), "float32")
  with pytest.raises(ValueError, match="register_pointwise"):
    stream.predict(model, image)
  assert stream.register_pointwise(Scale) is Scale
  check(model, image, (5,), "float32")
  with pytest.raises(TypeError, match="layer_class"):
    stream.register_pointwise(int)


def test_bad_arguments():
  model = plain()
  image = _image((1, 20, 20, 3), "float32")
  for tile in (0, -3, 2.5, True, "8"):
    with pytest.raises(ValueError, match="tile must be a positive int"):
      stream.predict(model, image, tile=tile)
  for limit in (0, -1, 1.5, "1G"):
    with pytest.raises(ValueError, match="memory_limit must be a positive int"):
      stream.predict(model, image, memory_limit=limit)
  with pytest.raises(ValueError, match="memory_limit: 10 bytes is less than one output pixel"):
    stream.predict(model, image, memory_limit=10)
  with pytest.raises(ValueError, match="image has 4 channels"):
    stream.predict(model, _image((1, 20, 20, 4), "float32"))
  with pytest.raises(ValueError, match=r"image must be \(batch, size, size, channels\)"):
    stream.predict(model, _image((1, 1, 20, 20, 3), "float32"))
  with pytest.raises(TypeError, match="image must be an array"):
    stream.predict(model, "slide.tif")
  with pytest.raises(TypeError, match="image must hold numbers"):
    stream.predict(model, np.array([[["a"] * 3] * 20] * 20))
  with pytest.raises(TypeError, match="model must be a Keras model"):
    stream.predict(lambda x: x, image)
  with pytest.raises(ValueError, match="up_to: model '.*' has no layer named 'nope'"):
    stream.predict(model, image, up_to="nope")
  with pytest.raises(ValueError, match=r"out must have the result's shape \(1, 2, 2, 4\)"):
    stream.predict(model, image, out=np.zeros((1, 3, 3, 4), np.float32))
  with pytest.raises(ValueError, match="cannot run on its input of spatial size"):
    stream.predict(model, _image((1, 4, 4, 3), "float32"))  # 5x5 valid on 4x4
  with pytest.raises(ValueError, match="has no defined input"):
    stream.predict(keras.Sequential([L.Conv2D(2, 3)]), image)


def test_two_outputs_need_up_to():
  inp = keras.Input((None, None, 3))
  a = L.Conv2D(2, 3, padding="same", name="a")(inp)
  b = L.Conv2D(2, 5, padding="same", name="b")(a)
  model = _randomize(keras.Model(inp, [a, b]))
  image = _image((1, 15, 17, 3), "float32")
  with pytest.raises(ValueError, match="has 2 outputs"):
    stream.predict(model, image)
  got = stream.predict(model, image, up_to="b", tile=4)
  np.testing.assert_allclose(got, model(image)[1].numpy(), rtol=0, atol=2e-5)


def test_plan_numbers():
  """The plan of one 5x5 'same' convolution, 3 -> 4 channels, on 40x40 with tiles of 10:
  the input windows are 12, 14, 14, 12 rows long, so 52 of 40 rows per axis are read."""
  inp = keras.Input((None, None, 3))
  model = keras.Model(inp, L.Conv2D(4, 5, padding="same", name="c")(inp))
  p = stream.plan(model, (2, 40, 40, 3), tile=10)
  assert (p.tiles, p.grid, p.tile_out) == (16, (4, 4), (10, 10))
  assert p.halo == {"c": (0, 0)}
  assert p.receptive_field == (5, 5)
  expected = (3 * 52 * 52 + 4 * 40 * 40) / (3 * 40 * 40 + 4 * 40 * 40) - 1
  assert p.recompute == pytest.approx(expected, rel=1e-12)
  # An interior tile, batch 2, 4 bytes a value: its 14x14x3 input window as a tensor and
  # its 10x10x4 output; with TensorFlow's pool (oneDNN on) the convolution and its bias run
  # as one traced function that makes the output alone, without it as two ops, the
  # convolution's result and the output with the bias added. All under 256 KiB: malloc's,
  # counted at their peak, scaled as every plan's figure is.
  outputs = 1 if _pool.pooled() else 2
  live = 2 * 4 * (14 * 14 * 3 + outputs * 10 * 10 * 4)
  assert p.peak_bytes == int(_pool.EXPECTED * live)
  assert p.worst_bytes == int(_pool.WORST * live)
  assert "16 tiles (4 x 4)" in str(p) and "recomputed in overlaps" in str(p)
  assert stream.plan(model, (1, 40, 40, 3), tile=1000).tiles == 1


def test_plan_prints_the_tile_it_runs():
  """A stride-2 convolution over 64x48 with tile=63 asked for: 31 output pixels would make
  two tiles along the first axis, which the grid evens out to 16 + 16 output pixels, 32
  input pixels each; along the second, the whole 24 (48 input pixels) in one tile. The
  plan prints the tile that runs, not the 63 asked for."""
  inp = keras.Input((None, None, 3))
  model = keras.Model(inp, L.Conv2D(4, 3, strides=2, padding="same", name="c")(inp))
  p = stream.plan(model, (1, 64, 48, 3), tile=63)
  assert (p.tile, p.tile_out, p.tile_in, p.grid) == (63, (16, 24), (32, 48), (2, 1))
  assert "tile (32, 48) input pixels = (16, 24) output pixels; 2 tiles (2 x 1)" in str(p)
  assert "63" not in str(p).splitlines()[1]


def test_memory_limit_picks_the_largest_tile_that_fits():
  """One stage (tests/test_stream_stages.py plans the stages)."""
  model = resnet()
  image = _image((1, 200, 180, 3), "float32")
  limit = 600_000
  p = stream.plan(model, image, memory_limit=limit, stages=False)
  assert p.peak_bytes <= p.worst_bytes <= limit
  assert stream.plan(model, image, tile=p.tile + p.tiling.geometry.align[0] * 8).worst_bytes > limit
  assert p.tiles > 1
  got = stream.predict(model, image, memory_limit=limit)
  ref = model(image, training=False).numpy()
  assert np.abs(got - ref).max() <= 2e-5 * np.abs(ref).max()


def test_a_model_plans_once_per_setting_and_runs_its_current_weights(monkeypatch):
  """`predict` plans a model once for each image shape, tile, memory limit and stage
  setting it is given (the last PLANS_PER_MODEL of them), and runs the weights the model
  has when called: after new weights, the result is the untiled model's again."""
  from tf_largeconv.stream import _stages

  planned = []
  real = _stages.plan
  monkeypatch.setattr(_stages, "plan", lambda *a, **k: planned.append(a[1:]) or real(*a, **k))
  model = resnet()
  small, large = _image((1, 40, 36, 3), "float32"), _image((1, 52, 44, 3), "float32")
  for image, tile in ((small, 16), (small, 16), (large, 16), (small, 16), (small, 20)):
    got = stream.predict(model, image, tile=tile)
    ref = model(image, training=False).numpy()
    assert np.abs(got - ref).max() <= 2e-5 * np.abs(ref).max()
    _randomize(model, seed=len(planned) + 7)
  stream.predict(model, small, tile=16, memory_limit=1 << 20)  # the limit is unused with a tile
  stream.predict(model, small, memory_limit=1 << 20)
  stream.plan(model, small, memory_limit=1 << 20)
  assert [(shape, tile, limit) for shape, tile, limit, _ in planned] == [
    ((1, 40, 36, 3), 16, None),
    ((1, 52, 44, 3), 16, None),
    ((1, 40, 36, 3), 20, None),
    ((1, 40, 36, 3), 16, 1 << 20),
    ((1, 40, 36, 3), None, 1 << 20),
  ]
  for tile in range(21, 21 + stream.PLANS_PER_MODEL):
    stream.predict(model, small, tile=tile)
  count = len(planned)
  stream.predict(model, small, tile=16)  # left out as the oldest
  assert len(planned) == count + 1


def test_threads_share_a_models_plan():
  """`predict` on one model from several threads at once (as dask's threaded scheduler
  runs tasks): every result is the untiled model's, and the model is planned once."""
  import threading

  from tf_largeconv.stream import _stages

  model = resnet()
  image = _image((1, 44, 40, 3), "float32")
  ref = model(image, training=False).numpy()
  planned, results, errors = [], [], []
  real = _stages.plan

  def counted(*a, **k):  # a slow planner, so that the threads' calls overlap
    planned.append(1)
    time.sleep(0.3)
    return real(*a, **k)

  def run():
    try:
      results.append(stream.predict(model, image, tile=17))
    except Exception as e:  # noqa: BLE001 - reported below
      errors.append(e)

  _stages.plan = counted
  try:
    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
      t.start()
    for t in threads:
      t.join(timeout=120)
  finally:
    _stages.plan = real
  assert errors == [] and len(results) == 4 and len(planned) == 1
  for got in results:
    assert np.abs(got - ref).max() <= 2e-5 * np.abs(ref).max()


def test_progress_and_out():
  model = dilated()
  image = _image((2, 30, 26, 3), "float32")
  calls = []
  out = np.full((2, 30, 26, 4), np.nan, np.float32)
  got = stream.predict(model, image, tile=9, out=out, progress=lambda i, n: calls.append((i, n)))
  assert got is out and not np.isnan(out).any()
  assert calls == [(i, 12) for i in range(1, 13)]  # ceil(30 / 9) x ceil(26 / 9) tiles


def test_stride_alignment():
  """Tiles rounded down to a multiple of the network's total stride (8 in the U-Net)."""
  p = stream.plan(unet(), (1, 96, 96, 2), tile=30)
  assert p.tile_out == (24, 24)
  assert stream.plan(unet(), (1, 96, 96, 2), tile=7).tile_out == (7, 7)


def _close(got, ref, tol=2e-5):
  assert got.shape == ref.shape
  assert np.abs(got - ref).max() <= tol * np.abs(ref).max()


def test_slides_in_and_out(tmp_path):
  """One image without a batch axis: from zarr, a dask slide, a memory map or a tensor;
  the result written into a zarr array tile by tile."""
  zarr = pytest.importorskip("zarr")
  slide_dask = pytest.importorskip("tf_largeconv.dask")
  model = resnet()
  image = _image((70, 65, 3), "float32")
  ref = model(image[None], training=False).numpy()[0]
  z = zarr.open_array(tmp_path / "in.zarr", mode="w", shape=image.shape, chunks=(32, 32, 3))
  z[:] = image
  out = zarr.open_array(
    tmp_path / "out.zarr", mode="w", shape=ref.shape, chunks=(3, 3, 16), dtype="float32"
  )
  assert stream.predict(model, z, tile=24, out=out) is out
  _close(out[:], ref)
  _close(stream.predict(model, slide_dask.open_slide(str(tmp_path / "in.zarr"), chunk=16)), ref)
  np.save(tmp_path / "in.npy", image)
  _close(stream.predict(model, np.load(tmp_path / "in.npy", mmap_mode="r"), tile=33), ref)
  _close(stream.predict(model, tf.constant(image[None]), tile=40), ref[None])


def test_grayscale_slide():
  inp = keras.Input((None, None, 1))
  model = _randomize(keras.Model(inp, L.Conv2D(1, 9, padding="same")(inp)))
  image = _image((40, 37), "float32")
  ref = model(image[None, ..., None], training=False).numpy()[0, ..., 0]
  _close(stream.predict(model, image, tile=11), ref)
  _close(
    stream.predict(model, (image * 100).astype(np.uint8), tile=11),
    model((image * 100).astype(np.uint8)[None, ..., None].astype(np.float32)).numpy()[0, ..., 0],
  )


def test_to_dask_local_scheduler():
  da = pytest.importorskip("dask.array")
  model = resnet()
  image = _image((1, 90, 77, 3), "float32")
  x = da.from_array(image, chunks=(1, 20, 33, 3))
  lazy = stream.to_dask(model, x, tile=16)
  assert lazy.chunks[1] == (2, 2, 2, 2, 2, 2) and lazy.chunks[3] == (16,)
  np.testing.assert_array_equal(
    lazy.compute(scheduler="sync"), stream.predict(model, image, tile=16)
  )
  with pytest.raises(ValueError, match="ends in a global pooling"):
    stream.to_dask(classifier(L.GlobalAveragePooling2D), x)
  with pytest.raises(TypeError, match="image must be a dask array"):
    stream.to_dask(model, image)


def test_to_dask_on_a_local_cluster(tmp_path):
  """A zarr slide through a real dask.distributed cluster (2 worker processes on
  127.0.0.1): each task reads its window from the chunks; the result equals the in-process
  stream bit for bit and is written to zarr."""
  distributed = pytest.importorskip("distributed")
  zarr = pytest.importorskip("zarr")
  from tf_largeconv.dask import open_slide

  model = resnet()
  image = _image((300, 260, 3), "float32")
  zarr.create_array(tmp_path / "in.zarr", data=image, chunks=(64, 64, 3))
  slide = open_slide(str(tmp_path / "in.zarr"), chunk=64)
  want = stream.predict(model, image, tile=96)
  start = time.monotonic()
  with (
    distributed.LocalCluster(
      n_workers=2,
      threads_per_worker=1,
      processes=True,
      memory_limit="1.5GiB",
      host="127.0.0.1",
      dashboard_address=None,
    ) as cluster,
    distributed.Client(cluster, timeout=120) as client,
  ):
    lazy = stream.to_dask(model, slide, tile=96)
    lazy.to_zarr(str(tmp_path / "out.zarr"))
    workers = client.run(os.getpid)
    assert len(workers) == 2
  assert time.monotonic() - start < 120
  np.testing.assert_array_equal(zarr.open_array(tmp_path / "out.zarr")[:], want)


def _cli(*args, timeout=180):
  import subprocess
  import sys

  env = dict(
    os.environ,
    TF_CPP_MIN_LOG_LEVEL="3",
    PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
  )
  return subprocess.run(
    [sys.executable, "-m", "tf_largeconv.dask", *map(str, args)],
    capture_output=True,
    text=True,
    timeout=timeout,
    env=env,
  )


def test_cli_runs_a_model_over_a_slide_and_resumes(tmp_path):
  # through `python -m tf_largeconv.dask MODEL.keras`, the alias of `tf-largeconv model`
  # (whose --chunk is --read-chunk)
  zarr = pytest.importorskip("zarr")
  pytest.importorskip("distributed")
  model = resnet()
  model.save(tmp_path / "net.keras")
  image = _image((150, 133, 3), "float32")
  zarr.create_array(tmp_path / "in.zarr", data=image, chunks=(64, 64, 3))
  want = stream.predict(model, image, tile=40)
  out = tmp_path / "out.zarr"
  run = _cli(tmp_path / "net.keras", tmp_path / "in.zarr", out, "--tile", 40, "--chunk", 64)
  assert run.returncode == 0, run.stderr
  assert "16 tiles (4 x 4)" in run.stdout and "16 computed" in run.stdout
  np.testing.assert_array_equal(zarr.open_array(out)[:], want)
  # An interrupted run, as the record sees it: 5 tiles not recorded, their data lost.
  done = sorted((out / ".largeconv-record" / "done").iterdir())
  arr = zarr.open_array(out, mode="r+")
  ch, cw, _ = arr.chunks
  for marker in done[:5]:
    i, j, _ = (int(v) for v in marker.name.split("."))
    arr[i * ch : (i + 1) * ch, j * cw : (j + 1) * cw] = 0
    marker.unlink()
  assert not np.array_equal(arr[:], want)
  run = _cli(tmp_path / "net.keras", tmp_path / "in.zarr", out, "--tile", 40, "--resume")
  assert run.returncode == 0, run.stderr
  assert "5 computed, 11 already done" in run.stdout
  np.testing.assert_array_equal(zarr.open_array(out)[:], want)
  # Without --resume or --overwrite, or against another model: refused, output untouched.
  run = _cli(tmp_path / "net.keras", tmp_path / "in.zarr", out, "--tile", 40)
  assert run.returncode == 2 and "exists; pass --overwrite" in run.stderr
  resnet().save(tmp_path / "other.keras")
  run = _cli(tmp_path / "other.keras", tmp_path / "in.zarr", out, "--tile", 40, "--resume")
  assert run.returncode == 3 and "model_sha256" in run.stderr  # a refused resume
  run = _cli(tmp_path / "missing.keras", tmp_path / "in.zarr", out)
  assert run.returncode == 2 and "MODEL: no such file" in run.stderr
  np.testing.assert_array_equal(zarr.open_array(out)[:], want)


def _folded_model(algorithm, workspace_limit):
  """A FoldedBlock (a strided 5x5 after a 3x3, both with biases: explicit padding that is
  neither 'same' nor 'valid') between pointwise layers."""
  block_in = keras.Input((None, None, 3))
  b = L.Conv2D(4, 3, padding="same")(block_in)
  block = _randomize(keras.Model(block_in, L.Conv2D(5, 5, strides=2, padding="valid")(b)), 6)
  inp = keras.Input((None, None, 3))
  folded = lc_keras.FoldedBlock(
    block, input_size=(32, 32), algorithm=algorithm, workspace_limit=workspace_limit
  )
  x = L.ReLU()(folded(L.Conv2D(3, 1)(inp)))
  return _randomize(keras.Model(inp, L.Conv2D(2, 1)(x)), seed=7), folded


class _ConvSpy:
  """Records (entry, algorithm, workspace_limit) of every 2-D convolution the package runs
  through the public `ops.conv2d` or the op itself (its raw wrapper)."""

  def __init__(self, monkeypatch):
    from tf_largeconv import _loader
    from tf_largeconv import ops

    self.calls = set()
    raw, public = _loader.ops().large_conv_conv2d, ops.conv2d

    def raw_spy(*args, **kwargs):
      self.calls.add(("op", kwargs.get("algorithm"), kwargs.get("workspace_limit")))
      return raw(*args, **kwargs)

    def public_spy(*args, **kwargs):
      self.calls.add(("conv2d", kwargs.get("algorithm"), kwargs.get("workspace_limit")))
      return public(*args, **kwargs)

    monkeypatch.setattr(_loader.ops(), "large_conv_conv2d", raw_spy)
    monkeypatch.setattr(ops, "conv2d", public_spy)

  def take(self):
    calls, self.calls = self.calls, set()
    return calls


@pytest.mark.parametrize("algorithm", ["auto", "direct"])
def test_streamed_folded_block_runs_the_layers_convolution(monkeypatch, algorithm):
  """The streamed FoldedBlock equals the model's own call, through the same entry with the
  same algorithm and workspace limit (with 'auto': the op's planner, never the routing of
  tf_largeconv.conv2d that may hand the pass to TensorFlow's kernel)."""
  model, _ = _folded_model(algorithm, 3 << 20)
  image = _image((1, 32, 29, 3), "float32")
  spy = _ConvSpy(monkeypatch)
  ref = model(image, training=False).numpy()
  own = spy.take()
  want = ("op", "auto") if algorithm == "auto" else ("conv2d", "direct")
  assert (*want, 3 << 20) in own and ("conv2d", "auto", 3 << 20) not in own, own
  for tile in (5, 11):
    got = stream.predict(model, image, tile=tile)
    assert spy.take() == own, tile
    err = np.abs(got - ref).max() / np.abs(ref).max()
    assert err <= TOL["float32"], f"tile {tile}: relative error {err:.3g}"


def test_folded_block_convolve_takes_explicit_padding_only():
  _, folded = _folded_model("auto", None)
  x = tf.zeros((1, 9, 9, 3))
  valid = folded.convolve(x, padding=((0, 0), (0, 0)))
  assert tuple(valid.shape) == (1, 2, 2, 5)  # (9 - 7) // 2 + 1, the folded 7x7 stride 2
  for bad in ("VALID", ((1, 1),), ((1, 1), (0, -1)), ((1, 1), (0, 0.5))):
    with pytest.raises(ValueError, match=r"padding must be None or explicit \(\(top"):
      folded.convolve(x, padding=bad)


def test_nothing_outside_fold_reads_folds_private_names():
  """stream (and every other subpackage) reaches FoldedBlock through its public methods."""
  root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tf_largeconv")
  private = re.compile(
    r"_fold_spec|fold\._\w|tf_largeconv\.fold\._|from tf_largeconv\.fold import _"
  )
  found = []
  for folder, _, files in os.walk(root):
    if os.path.relpath(folder, root).split(os.sep)[0] == "fold":
      continue
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(folder, name)
        with open(path, encoding="utf-8") as f:
          found += [f"{path}:{i}" for i, line in enumerate(f, 1) if private.search(line)]
  assert not found, found
