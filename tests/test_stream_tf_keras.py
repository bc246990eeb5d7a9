"""tf_keras (Keras 2) models stream as their Keras 3 twins: predict and to_dask give what
the tf_keras model itself gives."""

import numpy as np
import pytest

tf_keras = pytest.importorskip("tf_keras")
pytest.importorskip("h5py")

from tf_largeconv import stream  # noqa: E402

L = tf_keras.layers


def resnet_block():
  """A ResNet stem and block in tf_keras."""
  inp = tf_keras.Input((None, None, 3))
  x = L.Conv2D(8, 7, strides=2, padding="same", use_bias=False)(inp)
  x = L.ReLU()(L.BatchNormalization()(x))
  x = L.MaxPooling2D(3, strides=2, padding="same")(x)
  y = L.Conv2D(16, 3, strides=2, padding="same")(x)
  y = L.Activation("relu")(L.BatchNormalization()(y))
  y = L.DepthwiseConv2D(9, padding="same")(y)
  s = L.Conv2D(16, 1, strides=2)(x)
  model = tf_keras.Model(inp, L.ReLU()(L.Add()([y, s])))
  rng = np.random.default_rng(0)
  for layer in model.layers:  # statistics and scales away from their initial values
    layer.set_weights([rng.uniform(0.5, 1.5, w.shape).astype(w.dtype) for w in layer.get_weights()])
  return model


def test_tf_keras_model_predict_and_to_dask():
  model = resnet_block()
  image = np.random.default_rng(1).standard_normal((2, 45, 38, 3)).astype("float32")
  ref = model(image, training=False).numpy()
  scale = np.abs(ref).max()
  for tile in (8, 24):
    got = stream.predict(model, image, tile=tile)
    assert got.shape == ref.shape and np.abs(got - ref).max() <= 2e-5 * scale, tile
  da = pytest.importorskip("dask.array")
  lazy = stream.to_dask(model, da.from_array(image[0], chunks=(20, 20, 3)), tile=16)
  assert np.abs(lazy.compute(scheduler="sync") - ref[0]).max() <= 2e-5 * scale
  assert stream.plan(model, image, tile=16).tiles == 9  # a 6 x 5 output in tiles of 2


def test_tf_keras_layer_that_cannot_stream_is_named():
  inp = tf_keras.Input((None, None, 3))
  model = tf_keras.Model(inp, L.Flatten(name="flat")(L.Conv2D(2, 3)(inp)))
  with pytest.raises(ValueError, match="'flat'"):
    stream.predict(model, np.zeros((1, 8, 8, 3), "float32"))
