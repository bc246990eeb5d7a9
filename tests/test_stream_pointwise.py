"""Per-pixel layers recognised from what they compute (their traced call), not registered:
the ones that keep pixels apart stream equal to the untiled model; the ones that mix pixels
are refused, each named, with why and where to split the model."""

import keras
import pytest
import tensorflow as tf
from test_stream import _image
from test_stream import _randomize
from test_stream import check

from tf_largeconv import stream

L = keras.layers


class ChannelScale(L.Layer):
  """Each channel times a learned factor, as Keras's ConvNeXt LayerScale does."""

  def build(self, shape):
    self.gamma = self.add_weight(shape=(shape[-1],), initializer="ones")

  def call(self, x):
    return x * self.gamma


class DropPath(L.Layer):
  """Stochastic depth: a random per-image mask in training, the identity at inference."""

  def call(self, x, training=None):
    if training:
      keep = tf.floor(0.9 + tf.random.uniform((tf.shape(x)[0], 1, 1, 1), dtype=x.dtype))
      return x / 0.9 * keep
    return x


class Gate(L.Layer):
  """A user's layer: a smooth gate of the image by itself, normalized over channels."""

  def call(self, x):
    y = x - tf.reduce_mean(x, axis=-1, keepdims=True)
    return tf.nn.softmax(y) * tf.tanh(2.0 * x + 1.0)


class Mix(L.Layer):
  """A user's merge layer of two images, pixel by pixel."""

  def call(self, a, b):
    return tf.maximum(a, 0.5 * b) - tf.square(b)


def test_per_pixel_layers_stream_without_registration():
  inp = keras.Input((None, None, 3))
  x = L.Conv2D(5, 3, padding="same")(inp)
  y = ChannelScale(name="scale")(L.DepthwiseConv2D(7, padding="same")(x))
  y = DropPath(name="drop_path")(y)
  x = L.Add()([x, y])
  x = Gate(name="gate")(L.Conv2D(5, 3, strides=2, padding="same")(x))
  x = Mix(name="mix")(x, L.Conv2D(5, 1)(x))
  model = _randomize(keras.Model(inp, L.Lambda(lambda t: 3.0 * t, name="times3")(x)))
  check(model, _image((2, 37, 30, 3), "float32"), (6, 16), "float32")


def test_convnext_tiny_streams():
  model = keras.applications.ConvNeXtTiny(
    include_top=False, weights=None, input_shape=(None, None, 3)
  )
  _randomize(model)
  check(model, _image((1, 64, 64, 3), "float32"), (32,), "float32")


def _roll(t):
  return tf.roll(t, 1, axis=2)


def _spatial_max(t):
  return t - tf.reduce_max(t, axis=[1, 2], keepdims=True)


def _resize(t):
  return tf.image.resize(t, (2 * tf.shape(t)[1], 2 * tf.shape(t)[2]))


def _shifted(t):
  return t[:, 1:, :, :]


def _noisy(t):
  return t + tf.random.uniform((t.shape[-1],))


@pytest.mark.parametrize(
  "fn, why",
  [
    (_roll, "it computes Roll"),
    (tf.image.per_image_standardization, "it reads its input's shape"),
    (_resize, "it reads its input's shape"),
    (lambda t: tf.image.resize(t, (8, 8)), "it computes ResizeBilinear"),
    (_spatial_max, "its operation Max reduces over axes (1, 2), not the channel axis alone"),
    (lambda t: t - tf.reduce_mean(t, axis=-1), "its operation Mean reduces over axes (3,)"),
    (_shifted, "it computes StridedSlice"),
    (_noisy, "it draws random numbers"),
    (lambda t: t * tf.ones((1, 5, 1, 1)), "its operation Mul combines the image with a value of"),
  ],
)
def test_layers_that_mix_pixels_are_refused(fn, why):
  inp = keras.Input((None, None, 3))
  x = L.Conv2D(4, 3, padding="same")(inp)
  model = keras.Model(inp, L.Conv2D(2, 1)(L.Lambda(fn, name="mixer")(x)))
  with pytest.raises(ValueError) as e:
    stream.predict(model, _image((1, 16, 16, 3), "float32"), tile=8)
  message = str(e.value)
  assert "layer 'mixer' (Lambda)" in message and why in message, message
  assert "up_to=" in message and "register_pointwise" in message
