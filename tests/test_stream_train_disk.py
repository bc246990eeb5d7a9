"""StreamingModel with its trunk output on disk: gradients against the untiled tape, the
temporary folder's removal, and what the plan counts.

The oracle is the same model untiled, `head(trunk(x))`, differentiated by one gradient
tape. Tolerances, relative to each gradient's largest magnitude: float64 1e-9, float32 1e-4.
"""

import os
import tempfile

import keras
import numpy as np
import pytest
from test_stream import _image
from test_stream import _randomize
from test_stream import floatx
from test_stream_train import TOL
from test_stream_train import _compare
from test_stream_train import _untiled
from test_stream_train import classifier_head
from test_stream_train import loss_floatx
from test_stream_train import max_head
from test_stream_train import plain_trunk

from tf_largeconv import stream

L = keras.layers
SHAPE = (2, 121, 100, 3)  # plain_trunk's output: (2, 29, 23, 8)


def conv_pool_head(channels=8, classes=3):
  """A convolution over the trunk output, then global average pooling: streamed by tile."""
  inp = keras.Input((None, None, channels))
  x = L.Conv2D(6, 3, padding="same", activation="relu")(inp)
  x = L.Conv2D(5, 3, padding="valid")(x)
  x = L.GlobalAveragePooling2D()(x)
  return _randomize(keras.Model(inp, L.Dense(classes)(x)), seed=9)


def flatten_head(z_shape, classes=3):
  """Flatten and Dense: needs the trunk output whole."""
  inp = keras.Input(tuple(z_shape[1:]))
  return _randomize(keras.Model(inp, L.Dense(classes)(L.Flatten()(inp))), seed=10)


HEADS = {
  "conv_pool": (lambda z: conv_pool_head(), "streamed"),
  "flatten": (flatten_head, "whole"),
  "max": (lambda z: max_head(8), "whole"),
}


def _models(head_name, dtype, tile=17):
  with floatx(dtype):
    trunk = plain_trunk()
    z_shape = tuple(trunk(_image(SHAPE, dtype)).shape)
    head = HEADS[head_name][0](z_shape)
  out_bytes = int(np.prod(z_shape)) * np.dtype(dtype).itemsize
  # Below the output and its gradient, so both go to disk; enough for a tile.
  with floatx(dtype):
    model = stream.StreamingModel(trunk, head, tile=tile, memory_limit=2 * out_bytes - 1)
  return trunk, head, model, z_shape, out_bytes


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("head_name", sorted(HEADS))
def test_disk_gradients_equal_the_untiled_model(head_name, dtype):
  with loss_floatx(dtype):
    trunk, head, model, z_shape, out_bytes = _models(head_name, dtype)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer="sgd", loss=loss_fn)
    x, y = _image(SHAPE, dtype), np.array([0, 2])
    plan = model.plan(SHAPE)
    assert plan.tiles > 1
    assert (plan.trunk_output.where, plan.trunk_output.head) == ("disk", HEADS[head_name][1])
    if head_name == "conv_pool":  # the head itself runs in several tiles, with halos
      tiling = model._streamed_head._tiling(np.empty(z_shape, dtype), plan.memory_limit)
      assert tiling.count > 1
    want_loss, want = _untiled(trunk, head, x, y, loss_fn)
    loss, _, grads, variables = model.streamed_gradients(x, y)
  assert [v.path for v in variables] == [
    v.path for v in trunk.trainable_variables + head.trainable_variables
  ]
  assert abs(float(loss) - float(want_loss)) <= TOL[dtype] * abs(float(want_loss))
  _compare(grads, want, dtype)
  # The forward pass keeps the output alone: on disk below its size. (Keras's predict
  # passes float64 input through float32, so call() is compared at float64's tolerance.)
  with floatx(dtype):
    forward = stream.StreamingModel(trunk, head, tile=17, memory_limit=out_bytes - 1)
  assert forward.plan(SHAPE, training=False).trunk_output.where == "disk"
  want_pred = np.asarray(head(trunk(x)))
  for got, tol in ((forward(x), TOL[dtype]), (forward.predict(x, verbose=0), TOL["float32"])):
    assert np.abs(np.asarray(got) - want_pred).max() <= tol * np.abs(want_pred).max()


@pytest.mark.parametrize("head_name", ["conv_pool", "flatten"])
def test_the_temporary_folder_is_removed(monkeypatch, tmp_path, head_name):
  """After a step, and after a step that raises in its backward pass, nothing is left in
  the temporary folders' place; during the step one folder held the output and its
  gradient."""
  trunk, head, model, z_shape, out_bytes = _models(head_name, "float32")
  model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(True))
  x, y = _image(SHAPE, "float32"), np.array([0, 2])
  scratch = tmp_path / "tmp"
  scratch.mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(scratch))
  seen = []
  backward = type(model)._backward

  def held(dz):
    (folder,) = os.listdir(scratch)
    seen.append(sorted(os.listdir(scratch / folder)))
    assert isinstance(dz, np.memmap) and dz.shape == z_shape

  def looking(self, plan, source, dz, variables):
    held(dz)
    return backward(self, plan, source, dz, variables)

  def failing(self, plan, source, dz, variables):
    held(dz)
    raise RuntimeError("failed in the backward pass")

  monkeypatch.setattr(type(model), "_backward", looking)
  model.train_on_batch(x, y)
  assert seen == [["gradient.npy", "output.npy"]]
  assert os.listdir(scratch) == []
  monkeypatch.setattr(type(model), "_backward", failing)
  with pytest.raises(RuntimeError, match="failed in the backward pass"):
    model.streamed_gradients(x, y)
  assert len(seen) == 2 and os.listdir(scratch) == []


def test_the_plan_counts_the_trunk_output_and_the_input_window(monkeypatch):
  """Bytes against what the step holds: the trunk output's array, the largest window the
  trunk reads; where each is kept for each kind of head and limit."""
  x = _image(SHAPE, "float32")
  trunk = plain_trunk()
  z = trunk(x).numpy()
  reads = []
  original = stream._train.Source.read

  def read(self, spans):
    window = original(self, spans)
    reads.append(window.nbytes)
    return window

  monkeypatch.setattr(stream._train.Source, "read", read)
  cases = [
    (classifier_head(8), 1 << 30, ("mean", "mean", 0, 0)),
    (conv_pool_head(), 1 << 30, ("memory", "whole", 2 * z.nbytes, 0)),
    (conv_pool_head(), 2 * z.nbytes - 1, ("disk", "streamed", 0, 2 * z.nbytes)),
    (flatten_head(z.shape), 2 * z.nbytes - 1, ("disk", "whole", 2 * z.nbytes, 2 * z.nbytes)),
  ]
  for head, limit, (where, how, memory, disk) in cases:
    model = stream.StreamingModel(trunk, head, tile=17, memory_limit=limit)
    out = model.plan(SHAPE).trunk_output
    assert (out.where, out.head, out.memory_bytes, out.disk_bytes) == (where, how, memory, disk)
    assert out.output_bytes == z.nbytes
    assert "trunk output" in str(out) and where in str(out)
    reads.clear()
    model.predict(x, verbose=0)
    assert out.input_window_bytes == max(reads)
  forward = stream.StreamingModel(trunk, conv_pool_head(), tile=17, memory_limit=z.nbytes - 1)
  out = forward.plan(SHAPE, training=False).trunk_output
  assert (out.where, out.disk_bytes, out.memory_bytes) == ("disk", z.nbytes, 0)
  assert "on disk" in str(forward.plan(SHAPE, training=False))
  assert stream.StreamingModel(trunk).plan(SHAPE).trunk_output is None  # dense: no head


class Counted:
  """An array read through `[...]` only, counting the elements each read returns: a lazy
  batch (as zarr, dask or a memory map are), which never turns into one array whole."""

  def __init__(self, array, reads):
    self.array, self.reads = array, reads
    self.shape, self.dtype = array.shape, array.dtype

  def __getitem__(self, index):
    part = np.asarray(self.array[index])
    self.reads.append(part.size)
    return part


class Slides(keras.utils.PyDataset):
  """Batches of one image from a memory map, each batch lazy (`Counted`)."""

  def __init__(self, images, labels, reads):
    super().__init__()
    self.images, self.labels, self.reads = images, labels, reads

  def __len__(self):
    return len(self.images)

  def __getitem__(self, i):
    return Counted(self.images[i : i + 1], self.reads), self.labels[i : i + 1]


def test_a_lazy_pydataset_is_read_window_by_window(tmp_path):
  """fit, evaluate and predict on a PyDataset of memory-mapped batches read each batch
  window by window (never whole), and one epoch gives the weights of the same batches as
  numpy."""
  shape = (3, 61, 50, 3)
  images = np.lib.format.open_memmap(tmp_path / "x.npy", "w+", np.float32, shape)
  images[:] = _image(shape, "float32")
  labels = np.array([0, 2, 1])
  reads = []
  data = Slides(np.load(tmp_path / "x.npy", mmap_mode="r"), labels, reads)
  trunk, head = plain_trunk(), max_head(8)
  start = trunk.get_weights(), head.get_weights()
  loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  whole = int(np.prod(shape[1:]))

  def trained(x, **kwargs):
    trunk.set_weights(start[0])
    head.set_weights(start[1])
    model = stream.StreamingModel(trunk, head, tile=17)
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss=loss_fn)
    model.fit(x, epochs=1, verbose=0, shuffle=False, **kwargs)
    return model, [w.copy() for w in trunk.get_weights() + head.get_weights()]

  model, lazy = trained(data, validation_data=data)  # a PyDataset in both places
  tiles = model.plan((1,) + shape[1:]).tiles
  assert tiles > 1
  # Each step: the forward's and the backward's windows, each less than the image; then
  # the validation's forward.
  assert len(reads) >= 3 * tiles * len(labels)
  assert max(reads) < whole
  _, eager = trained(np.asarray(images), y=labels, batch_size=1)
  for a, b in zip(lazy, eager):
    assert np.abs(a - b).max() <= 1e-5 * max(np.abs(b).max(), 1e-6)
  for run in (lambda: model.evaluate(data, verbose=0), lambda: model.predict(data, verbose=0)):
    reads.clear()
    got = run()
    assert len(reads) >= tiles * len(labels) and max(reads) < whole
  want = head(trunk(np.asarray(images))).numpy()
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())
  assert abs(model.evaluate(data, verbose=0) - model.evaluate(images, labels, verbose=0)) < 1e-5
