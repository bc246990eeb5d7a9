"""tf_largeconv.stream.StreamingModel: training with the trunk streamed tile by tile.

The oracle is the same model untiled, `head(trunk(x))`, differentiated by one gradient
tape. Tolerances, relative to each gradient's largest magnitude: float64 1e-9, float32 1e-4.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from test_stream import _image
from test_stream import _randomize
from test_stream import dilated
from test_stream import floatx
from test_stream import replk_block
from test_stream import resnet
from test_stream import unet

from tf_largeconv import stream

L = keras.layers
TOL = {"float64": 1e-9, "float32": 1e-4}


def frozen(model):
  for layer in model.layers:
    if isinstance(layer, L.BatchNormalization):
      layer.trainable = False
  return model


def plain_trunk():
  inp = keras.Input((None, None, 3))
  x = L.Conv2D(6, 5, padding="same", activation="relu")(inp)
  x = L.Conv2D(8, 3, strides=2, padding="same")(x)
  x = L.BatchNormalization()(x)
  x = L.ReLU()(x)
  y = L.DepthwiseConv2D(9, padding="same", dilation_rate=2)(x)
  x = L.Add()([x, y])
  x = L.AveragePooling2D(3, strides=2, padding="same")(x)
  return frozen(_randomize(keras.Model(inp, L.Conv2D(8, 3, padding="valid")(x))))


def classifier_head(channels=8, classes=3):
  inp = keras.Input((None, None, channels))
  x = L.GlobalAveragePooling2D()(inp)
  return _randomize(keras.Model(inp, L.Dense(classes)(x)), seed=7)


def pixel_head(channels):
  inp = keras.Input((None, None, channels))
  return _randomize(keras.Model(inp, L.Conv2D(2, 1)(inp)), seed=8)


def _untiled(trunk, head, x, y, loss_fn):
  variables = trunk.trainable_variables + head.trainable_variables
  with tf.GradientTape() as tape:
    loss = loss_fn(y, head(trunk(x, training=True), training=True))
  return loss, tape.gradient(loss, variables)


def _compare(grads, want, dtype):
  assert len(grads) == len(want)
  for g, w in zip(grads, want):
    g, w = np.asarray(g), np.asarray(w)
    scale = np.abs(w).max()
    assert scale > 0
    assert np.abs(g - w).max() <= TOL[dtype] * scale


CASES = {
  "plain": (plain_trunk, lambda: classifier_head(8), (2, 61, 50, 3), "class", (17, 40)),
  # Nearest upsampling: TensorFlow's bilinear resize computes in float32 whatever the
  # dtype, so its gradient sums differ in float32 rounding between tilings.
  "unet": (lambda: unet(bilinear=False), lambda: pixel_head(3), (1, 40, 48, 2), "pixel", (9, 24)),
  "resnet": (lambda: frozen(resnet()), lambda: classifier_head(16), (2, 50, 41, 3), "class", (23,)),
  "dilated": (dilated, lambda: pixel_head(4), (1, 37, 33, 3), "pixel", (10,)),
  "replknet": (
    lambda: frozen(replk_block()),
    lambda: classifier_head(4),
    (1, 45, 39, 4),
    "class",
    (13,),
  ),
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_gradients_equal_the_untiled_model(name, dtype):
  make_trunk, make_head, shape, kind, tiles = CASES[name]
  with floatx(dtype):
    trunk, head = make_trunk(), make_head()
  x = _image(shape, dtype)
  z_shape = trunk(x).shape
  if kind == "class":
    y = np.random.default_rng(3).integers(0, 3, shape[0])
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  else:
    y = _image(tuple(z_shape[:-1]) + (2,), dtype, seed=4)
    loss_fn = keras.losses.MeanSquaredError()
  want_loss, want = _untiled(trunk, head, x, y, loss_fn)
  for tile in tiles + (10_000,):  # the last: one tile, run once under the tape
    model = stream.StreamingModel(trunk, head, tile=tile)
    model.compile(optimizer="sgd", loss=loss_fn)
    assert (model.plan(shape).tiles > 1) == (tile < 10_000)
    loss, _, grads, variables = model.streamed_gradients(x, y)
    assert [v.path for v in variables] == [
      v.path for v in trunk.trainable_variables + head.trainable_variables
    ]
    assert abs(float(loss) - float(want_loss)) <= TOL[dtype] * abs(float(want_loss))
    _compare(grads, want, dtype)


def test_fit_steps_follow_untiled_training():
  """Three SGD steps streamed and untiled, from the same weights, stay together."""
  x = _image((2, 48, 44, 3), "float32")
  y = np.array([0, 2])
  loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  trunk, head = plain_trunk(), classifier_head(8)
  weights = trunk.get_weights(), head.get_weights()
  model = stream.StreamingModel(trunk, head, tile=20)
  model.compile(optimizer=keras.optimizers.SGD(0.05), loss=loss_fn, metrics=["accuracy"])
  history = model.fit(x, y, batch_size=2, epochs=3, verbose=0)
  streamed = [w.copy() for w in trunk.get_weights() + head.get_weights()]
  trunk.set_weights(weights[0])
  head.set_weights(weights[1])
  inp = keras.Input((None, None, 3))
  plain = keras.Model(inp, head(trunk(inp)))
  plain.compile(optimizer=keras.optimizers.SGD(0.05), loss=loss_fn, metrics=["accuracy"])
  plain_history = plain.fit(x, y, batch_size=2, epochs=3, verbose=0)
  np.testing.assert_allclose(history.history["loss"], plain_history.history["loss"], rtol=1e-4)
  for a, b in zip(streamed, trunk.get_weights() + head.get_weights()):
    assert np.abs(a - b).max() <= 1e-4 * max(np.abs(b).max(), 1e-6)
  assert set(history.history) == {"loss", "accuracy"}


def test_keras_workflow(tmp_path):
  """fit on a tf.data pipeline, evaluate, predict, and a .keras round trip."""
  trunk, head = plain_trunk(), classifier_head(8)
  model = stream.StreamingModel(trunk, head, memory_limit=1_000_000)
  model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(True))
  images = _image((4, 64, 60, 3), "float32")
  labels = np.array([0, 1, 2, 1])
  data = tf.data.Dataset.from_tensor_slices((images, labels)).batch(2)
  model.fit(data, epochs=1, verbose=0)
  assert model.plan((2, 64, 60, 3)).tiles > 1
  ref = head(trunk(images)).numpy()
  np.testing.assert_allclose(model.predict(images, batch_size=2, verbose=0), ref, atol=1e-5)
  assert np.isfinite(model.evaluate(data, verbose=0))
  model.save(tmp_path / "m.keras")
  loaded = keras.saving.load_model(tmp_path / "m.keras")
  assert isinstance(loaded, stream.StreamingModel)
  assert loaded.memory_limit == 1_000_000
  np.testing.assert_allclose(loaded.predict(images, batch_size=2, verbose=0), ref, atol=1e-5)


def test_refused_trunks():
  inp = keras.Input((None, None, 3))
  bn = keras.Model(inp, L.BatchNormalization(name="bn")(L.Conv2D(2, 3)(inp)))
  with pytest.raises(ValueError, match="BatchNormalization 'bn' is trainable"):
    stream.StreamingModel(bn, classifier_head(2))
  drop = keras.Model(inp, L.Dropout(0.2, name="drop")(L.Conv2D(2, 3)(inp)))
  with pytest.raises(ValueError, match="Dropout 'drop' draws random masks"):
    stream.StreamingModel(drop, classifier_head(2))
  pooled = keras.Model(inp, L.GlobalAveragePooling2D()(L.Conv2D(2, 3)(inp)))
  with pytest.raises(ValueError, match="ends in a global pooling"):
    stream.StreamingModel(pooled, L.Dense(2))
  with pytest.raises(ValueError, match="tile must be a positive int"):
    stream.StreamingModel(plain_trunk(), classifier_head(8), tile=0)
  model = stream.StreamingModel(plain_trunk(), classifier_head(8))
  with pytest.raises(ValueError, match="runs its steps eagerly"):
    model.compile(optimizer="sgd", loss="mse", run_eagerly=False)
  # A BatchNormalization unfrozen after the model was made is refused at the next step.
  model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(True))
  next(
    layer for layer in model.trunk.layers if isinstance(layer, L.BatchNormalization)
  ).trainable = True
  with pytest.raises(ValueError, match="is trainable"):
    model.train_on_batch(_image((1, 32, 32, 3), "float32"), np.array([1]))


def test_example_script_trains():
  import os
  import subprocess
  import sys

  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  run = subprocess.run(
    [
      sys.executable,
      os.path.join(root, "examples", "train_streamed.py"),
      "--size",
      "256",
      "--images",
      "2",
      "--epochs",
      "2",
      "--memory-limit-mib",
      "8",
    ],
    capture_output=True,
    text=True,
    timeout=300,
    env=dict(os.environ, PYTHONPATH=root, TF_CPP_MIN_LOG_LEVEL="3"),
  )
  assert run.returncode == 0, run.stderr[-2000:]
  assert "16 tiles (4 x 4)" in run.stdout
  assert "epoch 2: loss" in run.stdout and "4 steps on 256^2 images" in run.stdout


def test_mixed_precision_policy():
  """A mixed_float16 trunk and head train streamed; evaluation equals the plain model's."""
  keras.config.set_dtype_policy("mixed_float16")
  try:
    trunk, head = plain_trunk(), classifier_head(8)
  finally:
    keras.config.set_dtype_policy("float32")
  assert trunk.layers[1].compute_dtype == "float16"
  model = stream.StreamingModel(trunk, head, tile=20)
  loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=loss_fn)
  x, y = _image((2, 48, 44, 3), "float32"), np.array([0, 2])
  losses = [float(model.train_on_batch(x, y)) for _ in range(4)]
  assert losses[-1] < losses[0]
  inp = keras.Input((None, None, 3))
  plain = keras.Model(inp, head(trunk(inp)))
  plain.compile(loss=loss_fn)
  assert abs(model.evaluate(x, y, verbose=0) - plain.evaluate(x, y, verbose=0)) <= 1e-2


def test_streamed_forward_runs_outside_the_gradient_tape(monkeypatch):
  """The first forward keeps nothing of its tiles: it runs while no tape records, else
  the step would hold every tile's activations."""
  from tf_largeconv.stream import _run

  depth, seen = [0], []
  enter, leave, run = tf.GradientTape.__enter__, tf.GradientTape.__exit__, _run.run

  def entered(self):
    depth[0] += 1
    return enter(self)

  def left(self, *args):
    depth[0] -= 1
    return leave(self, *args)

  def recorded_run(*args, **kwargs):
    seen.append(depth[0])
    return run(*args, **kwargs)

  monkeypatch.setattr(tf.GradientTape, "__enter__", entered)
  monkeypatch.setattr(tf.GradientTape, "__exit__", left)
  monkeypatch.setattr(_run, "run", recorded_run)
  model = stream.StreamingModel(plain_trunk(), classifier_head(8), tile=16)
  model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(True))
  model.streamed_gradients(_image((1, 40, 40, 3), "float32"), np.array([1]))
  assert seen == [0]
