"""Global context inside the image part (squeeze-excitation: a value pooled over the whole
image multiplied back into every pixel) streams exactly, as extra passes over the image:
each pass pools what later layers read, across all its tiles, before the next one runs."""

import keras
import numpy as np
import pytest
from test_stream import _image
from test_stream import _randomize
from test_stream import check
from test_stream import floatx

from tf_largeconv import stream

L = keras.layers


def gated(channels=3):
  """Two gates, the second at half resolution and computed from the first's output."""
  inp = keras.Input((None, None, channels))
  x = L.Conv2D(4, 3, padding="same", name="trunk")(inp)
  g = L.Dense(4, activation="sigmoid")(L.GlobalAveragePooling2D(keepdims=True)(x))
  x = L.Multiply(name="gate")([x, g])
  x = L.Conv2D(6, 3, strides=2, padding="same", name="down")(x)
  g = L.Reshape((1, 1, 6))(L.GlobalMaxPooling2D()(x))
  x = L.Multiply(name="gate2")([g, x])
  return _randomize(keras.Model(inp, L.Conv2D(2, 3, padding="same", name="out")(x)))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gates_stream_in_passes(dtype):
  with floatx(dtype):
    model = gated()
  check(model, _image((2, 40, 33, 3), dtype), (8, 64), dtype)


def test_plan_counts_the_passes_and_their_work():
  p = stream.plan(gated(), (2, 40, 33, 3), tile=8)
  assert p.passes == 3 and len(p.tilings) == 3 and p.tiling is p.tilings[-1]
  # Elements (channels x pixels) per pass, untiled: 40 x 33 = 1320 pixels at full
  # resolution, 20 x 17 = 340 after the stride.
  first = (3 + 4) * 1320  # input, trunk
  second = (3 + 4 + 4) * 1320 + 6 * 340  # ... gate, down
  last = (3 + 4 + 4) * 1320 + (6 + 6 + 2) * 340  # ... gate2, out
  assert p.pass_work == pytest.approx((first + second) / last)
  assert "3 passes over the image" in str(p)


def test_one_pass_without_context():
  inp = keras.Input((None, None, 3))
  model = keras.Model(inp, L.Conv2D(2, 3, padding="same")(inp))
  p = stream.plan(model, (1, 20, 20, 3), tile=8)
  assert p.passes == 1 and p.pass_work == 0 and "passes" not in str(p)


def test_context_refused_where_it_is_not_a_gate():
  inp = keras.Input((None, None, 3))
  x = L.Conv2D(4, 3, padding="same")(inp)
  g = L.GlobalAveragePooling2D()(x)  # (batch, 4): not one pixel per image
  model = keras.Model(inp, L.Multiply(name="bad")([x, g]))
  with pytest.raises(ValueError, match="'bad' combines an image-shaped tensor with a globally"):
    stream.predict(model, _image((1, 16, 16, 3), "float32"))


def test_to_dask_and_training_refuse_context():
  da = pytest.importorskip("dask.array")
  model = gated()
  with pytest.raises(ValueError, match="layer 'gate' reads a value pooled over the whole image"):
    stream.to_dask(model, da.zeros((40, 33, 3), chunks=20), tile=8)
  head_in = keras.Input((None, None, 2))
  head = keras.Model(head_in, L.GlobalAveragePooling2D()(head_in))
  with pytest.raises(ValueError, match="pools the image inside"):
    stream.StreamingModel(model, head)


@pytest.mark.parametrize("name", ["MobileNetV3Small", "EfficientNetB0"])
def test_keras_applications_with_squeeze_excitation(name):
  model = getattr(keras.applications, name)(
    include_top=False, weights=None, input_shape=(None, None, 3)
  )
  _randomize(model)
  image = np.random.default_rng(0).uniform(0, 255, (1, 64, 32, 3)).astype("float32")
  assert stream.plan(model, image, tile=32).passes > 5
  check(model, image, (32,), "float32")
