"""StreamingModel's fit, evaluate and predict on a `keras.utils.PyDataset` whose batches are
lazy: zarr arrays on disk, dask arrays, and `tf_largeconv.dask.open_slide` of tiled
pyramidal TIFFs written by tifffile (an image and its mask, read at pyramid level 1).

The oracle is the same StreamingModel trained on the same batches as numpy arrays: after
one epoch the weights agree to 1e-5 of each weight's largest magnitude. Laziness is
watched where the package reads: every zarr `[...]`, every dask `compute` and every window
a slide file gives is recorded (`Reads`), and turning a whole lazy array into numpy
(`__array__`) fails the test; the largest input read is at most a tile's input window
(halo included) and the largest label read a tile's output, never the image.
"""

import keras
import numpy as np
import pytest
from test_stream import _image
from test_stream import _randomize
from test_stream import unet
from test_stream_train import classifier_head
from test_stream_train import max_head
from test_stream_train import plain_trunk
from test_stream_train_disk import conv_pool_head

from tf_largeconv import stream
from tf_largeconv.stream import _plan

zarr = pytest.importorskip("zarr")
da = pytest.importorskip("dask.array")
tifffile = pytest.importorskip("tifffile")
ldask = pytest.importorskip("tf_largeconv.dask")
from tf_largeconv.dask import _slides  # noqa: E402

L = keras.layers
SIZE = (128, 144)  # each image's (the slides' level 1)
IMAGES = 2
CLASSES = 3
TILE = 32
CHUNK = 8  # zarr, dask and slide chunks


class Reads:
  """The elements each read of a lazy array returns, by where it was read ('zarr': an
  array's `[...]`; 'dask': a `compute`; 'file': a window of a slide file) and by the
  number of axes of what it returned. A whole lazy array turned into numpy fails."""

  def __init__(self, monkeypatch):
    self.sizes = {}
    watched = [
      ("zarr", zarr.Array, "__getitem__"),
      ("dask", da.Array, "compute"),
      ("file", _slides.FileArray, "__getitem__"),
    ]
    for kind, cls, name in watched:
      monkeypatch.setattr(cls, name, self._recording(kind, getattr(cls, name)))
    for cls in (zarr.Array, da.Array):
      monkeypatch.setattr(cls, "__array__", self._whole)

  def _recording(self, kind, read):
    def recorded(array, *args, **kwargs):
      part = read(array, *args, **kwargs)
      self.sizes.setdefault((kind, np.ndim(part)), []).append(int(np.size(part)))
      return part

    return recorded

  @staticmethod
  def _whole(array, *args, **kwargs):
    raise AssertionError(f"a lazy array of shape {array.shape} was converted whole")

  def largest(self, kind, ndim):
    sizes = self.sizes.get((kind, ndim), [])
    assert sizes, f"no {kind} read of {ndim} axes: {sorted(self.sizes)}"
    return max(sizes)

  def count(self, kind, ndim):
    return len(self.sizes.get((kind, ndim), []))


class Batches(keras.utils.PyDataset):
  """One image a batch: (x, y) as given, lazy or numpy."""

  def __init__(self, xs, ys):
    super().__init__()
    self.xs, self.ys = xs, ys

  def __len__(self):
    return len(self.xs)

  def __getitem__(self, i):
    return self.xs[i], self.ys[i]


# --- the three sources: each gives (lazy batches of x, of y; the same as numpy) ----------


def _zarr(tmp_path, x, y):
  """Each image, and each mask, its own zarr array (1, H, W[, C]) on disk."""

  def saved(name, a):
    path = str(tmp_path / f"{name}.zarr")
    zarr.create_array(path, data=a, chunks=(1, CHUNK, CHUNK) + a.shape[3:])
    return zarr.open_array(path, mode="r")

  return [saved(f"x{i}", x[i : i + 1]) for i in range(len(x))], [
    saved(f"y{i}", y[i : i + 1]) if y.ndim > 1 else y[i : i + 1] for i in range(len(y))
  ]


def _dask(tmp_path, x, y):
  """Batches sliced from dask arrays of the whole set (nothing computed)."""
  lazy_x = da.from_array(x, chunks=(1, CHUNK, CHUNK, 3))
  lazy_y = da.from_array(y, chunks=(1, CHUNK, CHUNK)) if y.ndim > 1 else y
  return [lazy_x[i : i + 1] for i in range(len(x))], [lazy_y[i : i + 1] for i in range(len(y))]


def _write_pyramid(path, level1, photometric):
  """A tiled TIFF, level 0 twice level 1's size (each pixel repeated) and level 1 in a
  sub-IFD, as tifffile writes pyramids."""
  level0 = np.repeat(np.repeat(level1, 2, axis=0), 2, axis=1)
  layout = dict(tile=(16, 16), photometric=photometric, compression="zlib", metadata=None)
  with tifffile.TiffWriter(path) as tif:
    tif.write(level0, subifds=1, **layout)
    tif.write(level1, subfiletype=1, **layout)


def _slide(tmp_path, x, y):
  """Each image an RGB uint8 slide and each mask a uint8 slide (tiled pyramidal TIFFs),
  opened by open_slide at level 1: the image scaled to [0, 1] in float32 (lazily)."""
  xs, ys = [], []
  for i in range(len(x)):
    _write_pyramid(tmp_path / f"x{i}.tif", x[i], "rgb")
    xs.append(ldask.open_slide(str(tmp_path / f"x{i}.tif"), chunk=CHUNK, level=1))
    xs[-1] = xs[-1][None].astype(np.float32) / np.float32(255)
    if y.ndim > 1:
      _write_pyramid(tmp_path / f"y{i}.tif", y[i], "minisblack")
      ys.append(ldask.open_slide(str(tmp_path / f"y{i}.tif"), chunk=CHUNK, level=1)[None])
    else:
      ys.append(y[i : i + 1])
  return xs, ys


SOURCES = {"zarr": _zarr, "dask": _dask, "slide": _slide}
# Classification: the head each source trains with, and where the trunk output is kept.
HEADS = {
  "zarr": ("mean", classifier_head),
  "dask": ("disk", conv_pool_head),
  "slide": ("memory", max_head),
}


def _data(kind, dense):
  """(x, y) as numpy: uint8 slides for 'slide' (the float32 the model sees: x / 255)."""
  rng = np.random.default_rng(5)
  shape = (IMAGES, *SIZE, 3)
  if kind == "slide":
    x = rng.integers(0, 256, shape, dtype=np.uint8)
  else:
    x = _image(shape, "float32")
  if dense:
    y = rng.integers(0, CLASSES, (IMAGES, *SIZE), dtype=np.uint8 if kind == "slide" else np.int64)
  else:
    y = rng.integers(0, CLASSES, IMAGES)
  return x, y


def _as_model_sees(kind, x):
  return x.astype(np.float32) / np.float32(255) if kind == "slide" else x


def _model(kind, dense):
  """A compiled StreamingModel, the same weights at every call: dense, a U-Net of one
  logit per class and pixel; else plain_trunk and the source's head."""
  keras.utils.set_random_seed(0)
  loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  if dense:
    model = stream.StreamingModel(unet(channels=3, bilinear=False), tile=TILE)
  else:
    where, head = HEADS[kind]
    trunk = plain_trunk()
    z = trunk(np.zeros((1, *SIZE, 3), np.float32))
    # the trunk output on disk: a limit below it and its gradient
    limit = 2 * int(np.prod(z.shape)) * 4 - 1 if where == "disk" else None
    model = stream.StreamingModel(trunk, _randomize(head(), seed=7), tile=TILE, memory_limit=limit)
    assert model.plan((1, *SIZE, 3)).trunk_output.where == where
  model.compile(optimizer=keras.optimizers.SGD(0.05), loss=loss, metrics=["accuracy"])
  return model


def _weights(model):
  return [w.copy() for w in model.get_weights()]


def _window_and_tile(model):
  """Elements of a batch's largest input window (halo included) and of a tile's output."""
  tiling = model.plan((1, *SIZE, 3)).tiling
  assert tiling.count > 1
  return _plan.input_window_bytes(tiling, 1, 1), int(np.prod(tiling.tile_out))


@pytest.mark.parametrize("dense", [False, True], ids=["head", "dense"])
@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_lazy_batches_train_as_numpy_and_stay_lazy(kind, dense, tmp_path, monkeypatch):
  x, y = _data(kind, dense)
  xs, ys = SOURCES[kind](tmp_path, x, y)
  seen = _as_model_sees(kind, x)
  # the oracle: the same model, fit on the same batches as numpy
  eager = _model(kind, dense)
  eager.fit(seen, y, batch_size=1, epochs=1, shuffle=False, verbose=0)
  want = _weights(eager)
  want_eval = eager.evaluate(seen, y, batch_size=1, verbose=0, return_dict=True)
  want_pred = eager.predict(seen, batch_size=1, verbose=0)

  reads = Reads(monkeypatch)
  data = Batches(xs, ys)
  model = _model(kind, dense)
  model.fit(data, epochs=1, shuffle=False, verbose=0)
  for a, b in zip(_weights(model), want):
    assert np.abs(a - b).max() <= 1e-5 * max(np.abs(b).max(), 1e-6)
  got_eval = model.evaluate(data, verbose=0, return_dict=True)
  for name, value in want_eval.items():
    assert got_eval[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name
  got_pred = model.predict(data, verbose=0)
  np.testing.assert_allclose(got_pred, want_pred, rtol=0, atol=1e-5 * np.abs(want_pred).max())

  window, tile_out = _window_and_tile(model)
  where = "dask" if kind in ("dask", "slide") else "zarr"
  image = int(np.prod(SIZE)) * 3
  # x: read window by window (fit: forward and backward; evaluate; predict), never whole
  assert reads.count(where, 4) >= 3 * IMAGES * model.plan((1, *SIZE, 3)).tiles
  assert reads.largest(where, 4) <= window < image
  if dense:  # labels: one output tile at a time
    assert reads.largest(where, 3) <= tile_out < int(np.prod(SIZE))
  if kind == "slide":  # the files: a chunk at a time (level 1's; the mask's)
    assert reads.largest("file", 3) <= CHUNK * CHUNK * 3
    if dense:
      assert reads.largest("file", 2) <= CHUNK * CHUNK
