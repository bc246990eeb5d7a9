"""tf_largeconv.stream.StreamingModel: training with the trunk streamed tile by tile.

The oracle is the same model untiled, `head(trunk(x))`, differentiated by one gradient
tape. Tolerances, relative to each gradient's largest magnitude: float64 1e-9, float32 1e-4.
"""

import contextlib

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
from tf_largeconv.stream._train import reads_only_the_mean

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


@contextlib.contextmanager
def loss_floatx(dtype):
  """Losses compute in `dtype`: Keras's compile rebuilds a loss from its config, which
  keeps no dtype, so the losses' default (floatx) is what holds."""
  old = keras.config.floatx()
  keras.config.set_floatx(dtype)
  try:
    yield
  finally:
    keras.config.set_floatx(old)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_gradients_equal_the_untiled_model(name, dtype):
  with loss_floatx(dtype):
    _gradients_equal_the_untiled_model(name, dtype)


def _gradients_equal_the_untiled_model(name, dtype):
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


@pytest.mark.parametrize("conv", [False, True], ids=["mean", "conv"])
def test_a_head_without_an_input_shape_trains(conv):
  """A head made as a Sequential of layers, without an input shape, is built before the
  first step lists its variables: it trains as the same head given its input shape, in a
  step of one tile and then of several."""
  trunk = plain_trunk()
  start = trunk.get_weights()

  def head_layers():  # the same initial weights every time
    seeded = dict(kernel_initializer=keras.initializers.GlorotUniform(seed=1))
    seeded.update(bias_initializer=keras.initializers.RandomNormal(seed=2))
    first = [L.Conv2D(4, 3, **seeded)] if conv else []
    return first + [L.GlobalAveragePooling2D(), L.Dense(3, **seeded)]

  def trained(head):
    trunk.set_weights(start)
    model = stream.StreamingModel(trunk, head, tile=100)
    model.compile(
      optimizer=keras.optimizers.SGD(0.1),
      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    for size, tiles in ((24, 1), (160, 4)):
      assert (model.plan((1, size, size, 3)).tiles > 1) == (tiles > 1)
      model.train_on_batch(_image((1, size, size, 3), "float32"), np.array([2]))
    return [w.copy() for w in trunk.get_weights() + head.get_weights()]

  want = trained(keras.Sequential([keras.Input((None, None, 8)), *head_layers()]))
  got = trained(keras.Sequential(head_layers()))
  assert len(got) == len(want)
  for a, b in zip(got, want):
    assert np.abs(a - b).max() <= 1e-5 * max(np.abs(b).max(), 1e-6)


def test_keras_workflow(tmp_path):
  """fit on a tf.data pipeline, evaluate, predict, and a .keras round trip."""
  trunk, head = plain_trunk(), classifier_head(8)
  model = stream.StreamingModel(trunk, head, tile=32, memory_limit=1_000_000)
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


def _run_example(script, *args, timeout):
  """Runs examples/`script` with `args` in a fresh process; returns its completed run."""
  import os
  import subprocess
  import sys

  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  return subprocess.run(
    [sys.executable, os.path.join(root, "examples", script), *args],
    capture_output=True,
    text=True,
    timeout=timeout,
    env=dict(os.environ, PYTHONPATH=root, TF_CPP_MIN_LOG_LEVEL="3"),
  )


def test_example_script_trains():
  run = _run_example(
    "train_streamed.py", "--size", "256", "--images", "2", "--epochs", "2",
    "--memory-limit-mib", "8", timeout=300,
  )  # fmt: skip
  assert run.returncode == 0, run.stderr[-2000:]
  assert "36 tiles (6 x 6)" in run.stdout
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
  enter, leave, run = tf.GradientTape.__enter__, tf.GradientTape.__exit__, _run.run_tile

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
  monkeypatch.setattr(_run, "run_tile", recorded_run)
  # Both forwards: the mean streamed for a mean-pooling head, the whole output otherwise.
  for head in (classifier_head(8), max_head(8)):
    model = stream.StreamingModel(plain_trunk(), head, tile=16)
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(True))
    tiles = model.plan((1, 40, 40, 3)).tiles
    assert tiles > 1
    seen.clear()
    model.streamed_gradients(_image((1, 40, 40, 3), "float32"), np.array([1]))
    assert seen == [0] * tiles + [1] * tiles  # forward outside any tape, backward inside


# --- dense training: StreamingModel(model, head=None) ------------------------------------


def seg_unet(dtype):
  """A U-Net with a 3-class per-pixel head (nearest upsampling: see CASES)."""
  with floatx(dtype):
    base = unet(bilinear=False)
    out = L.Conv2D(3, 1)(base.output)
    return _randomize(keras.Model(base.input, out), seed=5)


def seg_dilated(dtype):
  with floatx(dtype):
    base = dilated()
    return _randomize(keras.Model(base.input, L.Conv2D(2, 1)(base.output)), seed=6)


DENSE = {
  # model, input shape, labels: 'sparse' class indices or 'dense' values, tiles
  "unet": (seg_unet, (2, 40, 48, 2), "sparse", (9, 24)),
  "dilated": (seg_dilated, (1, 37, 33, 3), "dense", (10, 17)),
}


def _dense_labels(kind, out_shape, dtype):
  if kind == "sparse":
    return np.random.default_rng(9).integers(0, out_shape[-1], out_shape[:-1])
  return _image(out_shape, dtype, seed=9)


def _dense_loss(kind, reduction="sum_over_batch_size", dtype="float32"):
  """The loss, computing in the model's dtype."""
  if kind == "sparse":
    return keras.losses.SparseCategoricalCrossentropy(
      from_logits=True, reduction=reduction, dtype=dtype
    )
  return keras.losses.MeanSquaredError(reduction=reduction, dtype=dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", sorted(DENSE))
def test_dense_gradients_equal_the_untiled_model(name, dtype):
  make, shape, kind, tiles = DENSE[name]
  model = make(dtype)
  x = _image(shape, dtype)
  y = _dense_labels(kind, tuple(model(x).shape), dtype)
  rng = np.random.default_rng(2)
  per_image = rng.uniform(0.5, 2.0, (shape[0],) + (1,) * (len(shape) - 2))
  per_pixel = rng.uniform(0.0, 2.0, y.shape[: len(shape) - 1]).astype(dtype)
  for reduction, sample_weight in (
    ("sum_over_batch_size", None),
    ("sum", per_pixel),
    ("sum_over_batch_size", per_image),
  ):
    loss_fn = _dense_loss(kind, reduction, dtype)
    with tf.GradientTape() as tape:
      want_loss = loss_fn(y, model(x, training=True), sample_weight=sample_weight)
    want = tape.gradient(want_loss, model.trainable_variables)
    for tile in tiles:
      streamed = stream.StreamingModel(model, tile=tile)
      streamed.compile(optimizer="sgd", loss=loss_fn)
      assert streamed.plan(shape).tiles > 1
      # per image: the streamed model takes (batch,), as fit does
      weights = per_image.ravel() if sample_weight is per_image else sample_weight
      loss, y_pred, grads, variables = streamed.streamed_gradients(x, y, weights)
      assert y_pred is None and [v.path for v in variables] == [
        v.path for v in model.trainable_variables
      ]
      assert abs(float(loss) - float(want_loss)) <= TOL[dtype] * abs(float(want_loss))
      _compare(grads, want, dtype)


def test_dense_fit_and_evaluate_follow_untiled_training():
  """Two SGD steps, with a metric, streamed from lazy inputs and untiled, stay together."""
  da = pytest.importorskip("dask.array")
  x = _image((2, 40, 48, 2), "float32")
  model = seg_unet("float32")
  y = _dense_labels("sparse", tuple(model(x).shape), "float32")
  untiled = keras.models.clone_model(model)
  untiled.set_weights(model.get_weights())
  loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  w = np.random.default_rng(4).uniform(0.0, 2.0, y.shape).astype(np.float32)  # per pixel

  def compiled(m):
    # a mean over pixels (accuracy), unweighted and weighted, and a sum (a confusion matrix)
    m.compile(
      optimizer=keras.optimizers.SGD(0.1),
      loss=loss_fn,
      metrics=["accuracy", keras.metrics.MeanIoU(3, sparse_y_pred=False, name="iou")],
      weighted_metrics=["accuracy"],
    )
    return m

  untiled, streamed = compiled(untiled), compiled(stream.StreamingModel(model, tile=16))
  lazy_x, lazy_y = da.from_array(x, chunks=(1, 16, 16, 2)), da.from_array(y, chunks=(1, 8, 8))
  for _ in range(2):
    want = untiled.train_on_batch(x, y, sample_weight=w, return_dict=True)
    got = streamed.train_on_batch(lazy_x, lazy_y, sample_weight=w, return_dict=True)
    assert sorted(got) == sorted(want) == ["accuracy", "iou", "loss", "weighted_accuracy"]
    assert abs(got["loss"] - want["loss"]) <= 1e-4 * abs(want["loss"])
    for name in ("accuracy", "iou", "weighted_accuracy"):
      assert got[name] == pytest.approx(want[name], abs=1e-6), name
  for a, b in zip(streamed.trunk.get_weights(), untiled.get_weights()):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-4 * max(np.abs(b).max(), 1e-3))
  want = untiled.evaluate(x, y, return_dict=True, verbose=0)
  got = streamed.evaluate(lazy_x, lazy_y, batch_size=2, return_dict=True, verbose=0)
  assert abs(got["loss"] - want["loss"]) <= 1e-4 * abs(want["loss"])
  for name in ("accuracy", "iou"):
    assert got[name] == pytest.approx(want[name], abs=1e-6), name
  np.testing.assert_allclose(
    streamed.predict(x, verbose=0), untiled.predict(x, verbose=0), atol=1e-4
  )


def test_dense_bad_labels_and_losses():
  model = seg_dilated("float32")
  x = _image((1, 37, 33, 3), "float32")
  out = tuple(model(x).shape)
  streamed = stream.StreamingModel(model, tile=10)
  streamed.compile(optimizer="sgd", loss="mse")
  with pytest.raises(ValueError, match=r"y has shape \(1, 20, 33, 2\); the model's output over "):
    streamed.streamed_gradients(x, np.zeros((1, 20, 33, 2), np.float32))
  with pytest.raises(ValueError, match="needs labels y"):
    streamed.streamed_gradients(x, None)
  streamed.compile(optimizer="sgd", loss=keras.losses.MeanSquaredError(reduction="none"))
  with pytest.raises(ValueError, match=r"reduction 'none' is not a sum or a mean over pixels"):
    streamed.streamed_gradients(x, np.zeros(out, np.float32))
  streamed.compile(optimizer="sgd", loss=["mse", "mae"])
  with pytest.raises(ValueError, match="one loss"):
    streamed.streamed_gradients(x, np.zeros(out, np.float32))


def test_dense_loss_by_name_and_function():
  """A loss given by name or as a function is reduced as Keras reduces it (a mean)."""
  model = seg_dilated("float32")
  x = _image((1, 37, 33, 3), "float32")
  y = _dense_labels("dense", tuple(model(x).shape), "float32")
  weights = np.array([1.5], np.float32)
  want = keras.losses.MeanSquaredError()(y, model(x), sample_weight=weights)
  for loss in ("mse", keras.losses.mean_squared_error):
    streamed = stream.StreamingModel(model, tile=12)
    streamed.compile(optimizer="sgd", loss=loss)
    got, _, _, _ = streamed.streamed_gradients(x, y, weights)
    assert abs(float(got) - float(want)) <= 1e-5 * float(want)


def max_head(channels=8, classes=3):
  inp = keras.Input((None, None, channels))
  x = L.Concatenate()([L.GlobalAveragePooling2D()(inp), L.GlobalMaxPooling2D()(inp)])
  return _randomize(keras.Model(inp, L.Dense(classes)(x)), seed=7)


def test_a_mean_pooling_head_never_holds_the_trunk_output(monkeypatch):
  """A head that reads only the trunk output's mean gets it streamed: the output is never
  whole, in training and in predict; any other head gets the whole output."""
  x = _image((2, 61, 50, 3), "float64")
  y = np.array([0, 2])
  loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, dtype="float64")
  with loss_floatx("float64"):
    _mean_pooling_head(x, y, loss_fn, monkeypatch)


def _mean_pooling_head(x, y, loss_fn, monkeypatch):
  assert reads_only_the_mean(classifier_head(8))
  assert not reads_only_the_mean(max_head(8)) and not reads_only_the_mean(pixel_head(8))
  with floatx("float64"):
    trunk, mean_head, other_head = plain_trunk(), classifier_head(8), max_head(8)
  want_mean = _untiled(trunk, mean_head, x, y, loss_fn)
  want_other = _untiled(trunk, other_head, x, y, loss_fn)
  calls = []
  original = stream.StreamingModel._trunk_forward
  monkeypatch.setattr(
    stream.StreamingModel,
    "_trunk_forward",
    lambda self, *a: calls.append(1) or original(self, *a),
  )
  for head, (want_loss, want), held in ((mean_head, want_mean, 0), (other_head, want_other, 1)):
    with floatx("float64"):  # so that predict keeps the input's dtype
      model = stream.StreamingModel(trunk, head, tile=17)
    model.compile(optimizer="sgd", loss=loss_fn)
    calls.clear()
    loss, _, grads, _ = model.streamed_gradients(x, y)
    assert len(calls) == held
    assert abs(float(loss) - float(want_loss)) <= 1e-9 * abs(float(want_loss))
    _compare(grads, want, "float64")
    calls.clear()
    np.testing.assert_allclose(model.predict(x, verbose=0), head(trunk(x)), rtol=0, atol=1e-9)
    assert len(calls) == held


def test_segmentation_example_trains_and_writes_ome_zarr(tmp_path):
  """examples/segment_slides.py at a small size: dense training from zarr slides and masks,
  then the command line writes the third slide's mask as OME-Zarr, which reads back."""
  pytest.importorskip("zarr")
  pytest.importorskip("dask")
  import re

  run = _run_example(
    "segment_slides.py", "--size", "512", "--steps", "2", "--memory-limit-mib", "64",
    "--folder", str(tmp_path / "slides"), timeout=600,
  )  # fmt: skip
  assert run.returncode == 0, run.stderr[-3000:]
  assert "9 tiles (3 x 3)" in run.stdout and "step 2, train1: loss" in run.stdout
  accuracy = float(re.search(r"accuracy of the written mask ([0-9.]+)", run.stdout).group(1))
  assert accuracy > 0.95, run.stdout  # disks against noise: a trained U-Net separates them
  assert (tmp_path / "slides" / "test_mask.ome.zarr" / "zarr.json").exists()
