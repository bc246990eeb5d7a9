"""Staged streams: the network cut where few values are alive, each stage tiled with only its
own halo, the values alive at each cut handed on through temporary `.npy` files.

Oracles: the untiled model (`model(image, training=False)`) and the unstaged stream
(`stages=False`). Tolerances relative to the largest output magnitude: float64 1e-9,
float32 1e-5.
"""

import os
import tempfile

import keras
import numpy as np
import pytest
from test_stream import _image
from test_stream import _randomize
from test_stream import floatx

from tf_largeconv import stream
from tf_largeconv.stream import _plan
from tf_largeconv.stream import _pool
from tf_largeconv.stream import _stages

L = keras.layers
TOL = {"float64": 1e-9, "float32": 1e-5}


def resnet_like(channels=3):
  """A stem with strides, two residual blocks (one strided with a projection shortcut),
  and a long skip from the stem past both blocks."""
  inp = keras.Input((None, None, channels))
  x = L.Conv2D(6, 5, strides=2, padding="same", name="stem")(inp)
  x = L.BatchNormalization(name="stem_bn")(x)
  stem = L.ReLU(name="stem_out")(x)
  y = L.Conv2D(6, 3, padding="same", name="b1_conv1")(stem)
  y = L.ReLU(name="b1_relu")(y)
  y = L.Conv2D(6, 3, padding="same", name="b1_conv2")(y)
  x = L.ReLU(name="b1_out")(L.Add(name="b1_add")([stem, y]))
  y = L.Conv2D(8, 3, strides=2, padding="same", name="b2_conv1")(x)
  y = L.BatchNormalization(name="b2_bn")(y)
  y = L.Conv2D(8, 3, padding="same", name="b2_conv2")(y)
  s = L.Conv2D(8, 1, strides=2, name="b2_short")(x)
  x = L.ReLU(name="b2_out")(L.Add(name="b2_add")([y, s]))
  long = L.AveragePooling2D(2, name="long_pool")(stem)
  x = L.Concatenate(name="join")([x, long])
  return _randomize(keras.Model(inp, L.Conv2D(4, 3, padding="same", name="head")(x)))


def chain(channels=2):
  inp = keras.Input((None, None, channels))
  x = inp
  for k, (width, kernel, stride) in enumerate(
    [(4, 5, 1), (5, 3, 2), (5, 7, 1), (6, 3, 1), (3, 5, 2)]
  ):
    x = L.Conv2D(width, kernel, strides=stride, padding="same", activation="tanh", name=f"c{k}")(x)
  return _randomize(keras.Model(inp, x))


MODELS = {"resnet": (resnet_like, (2, 72, 60, 3), 60_000), "chain": (chain, (1, 83, 77, 2), 40_000)}


def _close(got, ref, dtype):
  assert got.shape == ref.shape and got.dtype == ref.dtype
  err = np.abs(got - ref).max() / np.abs(ref).max()
  assert err <= TOL[dtype], f"relative error {err:.3g}"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_staged_equals_untiled_and_unstaged(name, dtype):
  make, shape, limit = MODELS[name]
  with floatx(dtype):
    model = make(shape[-1])
  image = _image(shape, dtype)
  p = stream.plan(model, image, memory_limit=limit, stages=True)
  assert len(p.stages) > 1 and sum(s.tiles for s in p.stages) > len(p.stages)
  got = stream.predict(model, image, memory_limit=limit, stages=True)
  _close(got, model(image, training=False).numpy(), dtype)
  _close(got, stream.predict(model, image, memory_limit=limit, stages=False), dtype)


@pytest.mark.parametrize(
  "cuts",
  [
    # One value alive at the first cut; two at the others: after b1_out the stem's output
    # (the long skip's), which the second stage also reads; after long_pool the two inputs
    # of `join`.
    ("stem_out", "b1_out", "long_pool"),
    ("b1_relu", "long_pool"),  # a block's input and its branch
    ("stem",),
  ],
)
def test_named_cuts(cuts):
  with floatx("float64"):
    model = resnet_like()
  image = _image((1, 56, 48, 3), "float64")
  p = stream.plan(model, image, tile=16, stages=list(cuts))
  assert [s.last for s in p.stages[:-1]] == list(cuts)
  assert p.stages[-1].last == "head" and len(p.stages) == len(cuts) + 1
  got = stream.predict(model, image, tile=16, stages=list(cuts))
  _close(got, model(image, training=False).numpy(), "float64")


def test_plan_reports_the_stages():
  """The chain cut after c1 (5 channels at 42 x 39 pixels, stride 2) and c3 (6 channels, same
  size): the bytes of the temporary files are those two values', float32."""
  model = chain()
  p = stream.plan(model, (1, 83, 77, 2), tile=20, stages=["c1", "c3"])
  assert len(p.stages) == 3
  assert [s.disk_bytes for s in p.stages] == [5 * 42 * 39 * 4, 6 * 42 * 39 * 4, 0]
  assert p.disk_bytes == (5 + 6) * 42 * 39 * 4
  assert [(s.first, s.last) for s in p.stages] == [("c0", "c1"), ("c2", "c3"), ("c4", "c4")]
  single = stream.plan(model, (1, 83, 77, 2), tile=20, stages=False)
  assert len(single.stages) == 1 and single.disk_bytes == 0
  # Each stage tiles with only its own halo: less work recomputed than one stage does.
  assert p.recompute < single.recompute
  done = sum(d for s in p.stages for d, _ in s.work)
  whole = sum(w for s in p.stages for _, w in s.work)
  assert p.recompute == pytest.approx(done / whole - 1)
  assert whole == pytest.approx(sum(w for _, w in single.stages[0].work))
  # The memory figures: one pool serving the stages in turn, at least the largest stage's.
  pool = None
  for tiling in [t for s in p.stages for t in s.tilings]:
    pool = _plan.simulate(tiling, 1, 4, pool=pool)
  base = max([pool.grown] + [s.peak(1, 4) for s in p.stages])
  assert (p.peak_bytes, p.worst_bytes) == (int(_pool.EXPECTED * base), int(_pool.WORST * base))
  text = str(p)
  assert "3 stages" in text and "c2 .. c3" in text and "to disk" in text


def test_automatic_stages_only_where_they_pay():
  model = chain()
  # The whole image in one tile: one stage, the unstaged plan exactly.
  whole = stream.plan(model, (1, 84, 76, 2))
  assert len(whole.stages) == 1 and whole.tiles == 1
  # A tile given: one stage unless asked for.
  assert len(stream.plan(model, (1, 83, 77, 2), tile=10).stages) == 1
  assert len(stream.plan(model, (1, 83, 77, 2), memory_limit=40_000).stages) > 1


def test_resnet50_recompute_falls_to_a_few_percent():
  """Keras's ResNet50 at 2048^2 under the default limit: one stage recomputes 39.7% of the
  work in overlaps; staged, a few percent."""
  model = keras.applications.ResNet50(weights=None, include_top=False, input_shape=(None, None, 3))
  single = stream.plan(model, (1, 2048, 2048, 3), stages=False)
  staged = stream.plan(model, (1, 2048, 2048, 3))
  assert single.recompute > 0.35
  assert len(staged.stages) > 1 and staged.recompute < 0.05
  assert staged.worst_bytes <= staged.memory_limit


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_keras_resnet50(dtype):
  with floatx(dtype):
    model = keras.applications.ResNet50(
      weights=None, include_top=False, input_shape=(None, None, 3)
    )
  _randomize(model)
  image = _image((1, 320, 320, 3), dtype)
  # 24 MiB holds no tile of the whole network (one output pixel's needs 47 MiB), but
  # stages of it, the first in several tiles.
  limit = 24 << 20
  with pytest.raises(ValueError, match="memory_limit"):
    stream.plan(model, image, memory_limit=limit, stages=False)
  p = stream.plan(model, image, memory_limit=limit)
  assert len(p.stages) > 1 and p.stages[0].tiles > 1 and p.worst_bytes <= limit
  got = stream.predict(model, image, memory_limit=limit)
  _close(got, model(image, training=False).numpy(), dtype)
  _close(got, stream.predict(model, image, tile=160, stages=False), dtype)


def test_pooling_and_gates_after_the_cuts():
  """Global context (a squeeze-excitation gate, then a global pooling head) runs in the last
  stage, in passes, as without stages."""
  with floatx("float64"):
    inp = keras.Input((None, None, 3))
    x = L.Conv2D(4, 5, padding="same", name="a")(inp)
    x = L.Conv2D(4, 5, strides=2, padding="same", name="b")(x)
    x = L.Conv2D(6, 3, padding="same", name="c")(x)
    g = L.Dense(6, activation="sigmoid")(L.GlobalAveragePooling2D(keepdims=True)(x))
    x = L.Conv2D(5, 3, padding="same", name="d")(L.Multiply(name="gate")([x, g]))
    gated = _randomize(keras.Model(inp, x))
    pooled = _randomize(keras.Model(inp, L.GlobalMaxPooling2D()(x)))
  image = _image((2, 50, 44, 3), "float64")
  for model in (gated, pooled):
    p = stream.plan(model, image, tile=12, stages=["a", "b"])
    assert len(p.stages) == 3 and p.passes == 2
    got = stream.predict(model, image, tile=12, stages=["a", "b"])
    _close(got, model(image, training=False).numpy(), "float64")
  with pytest.raises(ValueError, match="'gate'.*global pooling"):
    stream.plan(gated, image, tile=12, stages=["gate"])


def test_progress_counts_every_stage():
  model = chain()
  image = _image((1, 83, 77, 2), "float32")
  calls = []
  p = stream.plan(model, image, tile=20, stages=["c1"])
  stream.predict(model, image, tile=20, stages=["c1"], progress=lambda i, n: calls.append((i, n)))
  total = sum(s.tiles for s in p.stages)
  assert calls == [(i, total) for i in range(1, total + 1)]


def test_temporary_files_are_removed(tmp_path, monkeypatch):
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
  model = chain()
  image = _image((1, 83, 77, 2), "float32")
  seen = []
  reader = _stages._Stores.reader

  def watched(self, v):
    read = reader(self, v)

    def look(spans):
      seen.append(sorted(os.listdir(self.folder)))
      return read(spans)

    return look

  monkeypatch.setattr(_stages._Stores, "reader", watched)
  stream.predict(model, image, tile=20, stages=["c1", "c3"])
  assert seen and all(names for names in seen)  # the stages read files in the folder
  assert list(tmp_path.iterdir()) == []

  def failing(self, v):
    def read(spans):
      raise OSError("planted read failure")

    return read

  monkeypatch.setattr(_stages._Stores, "reader", failing)
  with pytest.raises(OSError, match="planted"):
    stream.predict(model, image, tile=20, stages=["c1", "c3"])
  assert list(tmp_path.iterdir()) == []


def test_bad_stages():
  model = chain()
  for bad in ("c1", 3, [], [1]):
    with pytest.raises(ValueError, match="stages must be"):
      stream.plan(model, (1, 40, 40, 2), stages=bad)
  with pytest.raises(ValueError, match="'nope' is not a layer"):
    stream.plan(model, (1, 40, 40, 2), stages=["nope"])
  with pytest.raises(ValueError, match="'c4' is not followed by a cut"):
    stream.plan(model, (1, 40, 40, 2), stages=["c4"])
  # Where the values alive differ in size (a skip across a stride), no cut.
  with pytest.raises(ValueError, match="'b2_conv1' is not followed by a cut"):
    stream.plan(resnet_like(), (1, 40, 40, 3), stages=["b2_conv1"])


def test_to_dask_plans_one_stage():
  """to_dask streams in one stage, as planned with stages=False, where predict stages."""
  da = pytest.importorskip("dask.array")
  model = chain()
  image = _image((1, 83, 77, 2), "float32")
  assert len(stream.plan(model, image, memory_limit=40_000).stages) > 1
  lazy = stream.to_dask(model, da.from_array(image, chunks=(1, 40, 40, 2)), memory_limit=40_000)
  single = stream.plan(model, image, memory_limit=40_000, stages=False)
  assert lazy.numblocks[1:3] == single.grid
  one = stream.predict(model, image, tile=single.tile, stages=False)
  np.testing.assert_array_equal(lazy.compute(), one)
