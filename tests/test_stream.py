"""tf_largeconv.stream.predict: whole Keras models tile by tile, against the untiled model.

The oracle is the model itself, called on the whole image (`model(image, training=False)`).
Tolerances (relative to the largest output magnitude): float64 1e-10, float32 2e-5.
"""

import contextlib

import keras
import numpy as np
import pytest

from tf_largeconv import keras as lc_keras
from tf_largeconv import stream

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


def unet(channels=2):
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
      x = L.UpSampling2D(2, interpolation="bilinear" if depth == 1 else "nearest")(x)
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
