"""A dense StreamingModel step's tiles as traced functions (`stream/_traced.py`): the same
loss and gradients as the tiles run eagerly, one function for each kind of tile."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from test_stream import _image
from test_stream import floatx
from test_stream_train import DENSE
from test_stream_train import _dense_labels
from test_stream_train import _dense_loss

from tf_largeconv import stream
from tf_largeconv.stream import _traced

L = keras.layers


def strided(dtype):
  """Strided convolutions down, a transposed convolution and nearest upsampling back."""
  with floatx(dtype):
    x = i = keras.Input((None, None, 3))
    a = L.Conv2D(4, 3, padding="same", activation="relu")(x)
    b = L.Conv2D(6, 3, strides=2, padding="same", activation="relu")(a)
    c = L.Conv2D(6, 3, strides=2, padding="same")(b)
    c = L.Conv2DTranspose(6, 3, strides=2, padding="same")(c)
    b = L.Concatenate()([b, c])
    b = L.UpSampling2D()(b)
    return keras.Model(i, L.Conv2D(2, 1)(L.Concatenate()([a, b])))


CASES = {
  # model, input shape, labels, tile (a grid of 4 x 4 tiles or more)
  "unet": (DENSE["unet"][0], (2, 128, 136, 2), "sparse", 16),
  "dilated": (DENSE["dilated"][0], (1, 150, 140, 3), "dense", 16),
  "strided": (strided, (1, 64, 68, 3), "dense", 16),
}
TOL = {"float32": 1e-5, "float64": 1e-12}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_traced_tiles_equal_the_eager_tiles(name, dtype):
  """Every tile of a grid of 4 x 4 or more, traced and eager: the same loss and gradients
  (to float rounding: the traced graph fuses a convolution with its bias and activation),
  with fewer traced functions than tiles: tiles that compute alike share one."""
  make, shape, kind, tile = CASES[name]
  model = make(dtype)
  x = _image(shape, dtype)
  y = _dense_labels(kind, tuple(model(x).shape), dtype)
  w = np.random.default_rng(3).uniform(0.0, 2.0, y.shape[: len(shape) - 1]).astype(dtype)
  got = {}
  for traced in (True, False):
    streamed = stream.StreamingModel(model, tile=tile, trace_tiles=traced)
    streamed.compile(optimizer="sgd", loss=_dense_loss(kind, "sum", dtype))
    plan = streamed.plan(shape)
    assert min(len(b) for b in plan.tiling.bounds) >= 4
    got[traced] = streamed.streamed_gradients(x, y, w)
    assert len(streamed._tile_steps) == (0 if not traced else len(_keys(plan.tiling)))
  assert 1 < len(_keys(plan.tiling)) < plan.tiles
  (loss, _, grads, _), (want_loss, _, want, _) = got[True], got[False]
  assert abs(float(loss) - float(want_loss)) <= TOL[dtype] * abs(float(want_loss))
  for g, v in zip(grads, want):
    scale = max(float(tf.reduce_max(tf.abs(v))), 1e-6)
    assert float(tf.reduce_max(tf.abs(g - v))) <= TOL[dtype] * scale


def _keys(tiling):
  return {_traced.tile_key(tiling, index) for index in tiling.tiles()}


def test_a_second_step_traces_nothing_new():
  make, shape, kind, tile = CASES["unet"]
  model = make("float32")
  x = _image(shape, "float32")
  y = _dense_labels(kind, tuple(model(x).shape), "float32")
  streamed = stream.StreamingModel(model, tile=tile, trace_tiles=True)
  streamed.compile(optimizer="sgd", loss=_dense_loss(kind))
  streamed.train_on_batch(x, y)
  functions = dict(streamed._tile_steps._functions)
  streamed.train_on_batch(x, y)
  assert dict(streamed._tile_steps._functions).keys() == functions.keys()
  for key, fn in functions.items():
    assert streamed._tile_steps._functions[key] is fn
    assert len(fn._list_all_concrete_functions()) == 1  # traced once
  streamed.compile(optimizer="adam", loss=_dense_loss(kind))
  assert len(streamed._tile_steps) == 0  # traced with the optimizer compiled before


def test_trace_tiles_is_checked_and_saved():
  model = CASES["unet"][0]("float32")
  with pytest.raises(TypeError, match="trace_tiles must be True or False, got 'yes'"):
    stream.StreamingModel(model, trace_tiles="yes")
  assert stream.StreamingModel(model).trace_tiles is False
  streamed = stream.StreamingModel(model, trace_tiles=True)
  config = streamed.get_config()
  assert config["trace_tiles"] is True
  assert stream.StreamingModel.from_config(config).trace_tiles is True


def test_tiles_run_eagerly_where_they_cannot_be_traced():
  """Under a tf.distribute strategy each replica has variables of its own; a network with
  a squeeze-excitation gate reads a pooled value of an earlier pass."""
  make, shape, _, tile = CASES["unet"]
  streamed = stream.StreamingModel(make("float32"), tile=tile, trace_tiles=True)
  plan = streamed.plan(shape)
  assert _traced.traceable(plan.tiling, 1)
  assert not _traced.traceable(plan.tiling, 2)
  with tf.distribute.MirroredStrategy(["CPU:0"]).scope():
    assert not _traced.traceable(plan.tiling, 1)
