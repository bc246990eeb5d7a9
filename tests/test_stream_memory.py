"""The streamed plan's memory model against TensorFlow's own allocator statistics.

`stream/_pool.py` models TensorFlow's CPU pool; `_plan.tile_events` lists the tensors a tile
makes. Each check runs in a fresh process, where the pool starts empty as the model's does,
and compares the model with `tf.config.experimental.get_memory_info("CPU:0")`, whose peak is
the pool's own in-use total (chunks, as the pool hands them out)."""

import json
import os
import subprocess
import sys

import pytest

from tf_largeconv.stream import _pool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _fresh(code: str, **env: str) -> dict:
  # oneDNN's operations on, as TensorFlow runs by default (the suite turns them off).
  full = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT, TF_ENABLE_ONEDNN_OPTS="1")
  full.update(env)
  run = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=full
  )
  assert run.returncode == 0, run.stderr[-3000:]
  return json.loads(run.stdout.strip().splitlines()[-1])


POOL_SEQUENCE = """
import json, random
import tensorflow as tf
from tf_largeconv.stream import _pool
rng, pool, live, handles, peaks = random.Random(7), _pool.Pool(), {}, {}, []
for i in range(120):
  if live and rng.random() < 0.45:
    k = rng.choice(sorted(live))
    del live[k]
    pool.free(handles.pop(k))
  else:
    n = rng.choice([rng.randrange(300 << 10, 4 << 20), rng.randrange(4 << 20, 48 << 20)])
    n = n // 4 * 4
    live[i] = tf.fill([n // 4], 1.0)
    handles[i] = pool.alloc(n)
  peaks.append((pool.in_use, tf.config.experimental.get_memory_info("CPU:0")["current"]))
info = tf.config.experimental.get_memory_info("CPU:0")
print(json.dumps({"model": pool.peak_in_use, "tf": info["peak"], "steps": peaks,
                  "touched": pool.touched, "regions": sum(b - a for a, b in pool.regions)}))
"""


def test_pool_model_is_tensorflows_pool():
  """120 allocations and frees of 300 KiB to 48 MiB: after every one, the model's in-use
  bytes equal the allocator's, chunk rounding and splitting included."""
  got = _fresh(POOL_SEQUENCE)
  assert [m for m, _ in got["steps"]] == [t for _, t in got["steps"]]
  assert got["model"] == got["tf"]
  assert 0 < got["touched"] <= got["regions"]


def test_pool_rounding_and_regions():
  """The rules by hand: 256-byte grains; a region of 2 MiB doubled until the request fits;
  a chunk split only when the rest is at least the request or 128 MiB; written bytes are
  the requests', not the chunks', and they are what the process grows by."""
  pool = _pool.Pool()
  assert _pool.Pool("malloc").alloc(1 << 30) < 0  # without the pool: malloc's
  # oneDNN's allocator leaves requests under 256 KiB to malloc; the plain pool takes them.
  assert _pool.Pool("onednn").alloc((256 << 10) - 1) < 0 < _pool.Pool("onednn").alloc(256 << 10)
  bfc = _pool.Pool("bfc")
  assert bfc.alloc(1000) > 0 and bfc.touched == 1000 and bfc.in_use == 1024
  # A buffer written in part: its chunk in use, its written pages resident.
  part = _pool.Pool("bfc")
  h = part.alloc(3 << 20, written=1 << 20)
  # (a 4 MiB region, its 1 MiB rest too small to split off)
  assert part.in_use == 4 << 20 and part.touched == 1 << 20 and part.grown == 1 << 20
  part.free(h)
  malloc = _pool.Pool("malloc")
  malloc.alloc(3 << 20, written=1 << 20)
  assert malloc.grown == 1 << 20
  # An empty tensor takes nothing, and the chunks stay whole.
  empty, c = bfc.alloc(0), bfc.alloc(2000)
  assert empty == 0 and bfc.in_use == 1024 + 2048 and bfc.touched == 3000
  bfc.free(empty)
  bfc.free(c)
  assert bfc.in_use == 1024
  with pytest.raises(ValueError, match="allocator: expected 'onednn', 'bfc' or 'malloc'"):
    _pool.Pool("tcmalloc")
  a = pool.alloc(300_000)  # 300,032 in a 2 MiB region: split
  assert (pool.in_use, pool.touched, pool.regions[0][1] - pool.regions[0][0]) == (
    300_032,
    300_000,
    2 << 20,
  )
  b = pool.alloc(1_500_000)  # fits the 2 MiB region's rest (1,797,120): not split
  assert pool.in_use == 2 << 20 and len(pool.regions) == 1
  # The chunk's unwritten tail is in use, not resident: the process grows by what was written.
  assert pool.peak_in_use == 2 << 20 and pool.grown == pool.touched == 1_800_000
  pool.free(a)
  pool.free(b)
  assert pool.in_use == 0 and pool.touched == 1_800_000
  c = pool.alloc(3 << 20)  # a new region: 4 MiB, the next one 8 MiB
  assert [e - s for s, e in pool.regions] == [2 << 20, 4 << 20] and pool.next_region == 8 << 20
  pool.free(c)
  small = pool.alloc(1000)
  assert pool.small_peak == 1000 and pool.in_use == 0
  pool.free(small)
  assert pool.small == 0 and pool.grown == (4 << 20) + 1000 - (4 << 20) + pool.touched


STREAM_RUN = """
import json
import keras, numpy as np, tensorflow as tf
from tf_largeconv import stream
from tf_largeconv.stream import _plan
L = keras.layers
def depthwise():
  x = i = keras.Input((None, None, 3))
  x = L.Conv2D(16, 3, padding="same")(x)
  y = L.DepthwiseConv2D(15, padding="same")(x)
  y = L.BatchNormalization()(y)
  y = L.Conv2D(32, 1, activation="relu")(y)
  y = L.Conv2D(16, 1)(y)
  return keras.Model(i, L.Add()([x, y]))
def unet():
  x = i = keras.Input((None, None, 3))
  a = L.Conv2D(16, 3, padding="same", activation="relu")(x)
  b = L.MaxPooling2D()(a)
  b = L.Conv2D(32, 3, padding="same", activation="relu")(b)
  b = L.UpSampling2D()(b)
  x = L.Concatenate()([a, b])
  x = L.Conv2D(16, 3, padding="same", activation="relu")(x)
  return keras.Model(i, L.Conv2D(2, 1)(x))
model = {"depthwise": depthwise, "unet": unet}[NAME]()
image = np.random.default_rng(0).standard_normal((1, 900, 900, 3)).astype(np.float32)
p = stream.plan(model, image, tile=TILE)
pool = _plan.simulate(p.tiling, 1, 4)
tf.config.experimental.reset_memory_stats("CPU:0")
before = tf.config.experimental.get_memory_info("CPU:0")["current"]
stream.predict(model, image, tile=TILE)
peak = tf.config.experimental.get_memory_info("CPU:0")["peak"] - before
print(json.dumps({"model": pool.peak_in_use, "tf": peak, "tiles": p.tiles}))
"""


@pytest.mark.parametrize("name,tile", [("depthwise", 320), ("unet", 160)])
def test_plan_counts_the_tensors_tensorflow_makes(name, tile):
  """A streamed run's in-use peak, as TensorFlow's allocator reports it, against the model
  fed `tile_events` for the same tiles: within 15%. The U-Net runs in tiles of 160, where
  TensorFlow's figure was the same in twelve fresh processes; in tiles of 256 it is 28.3 or
  33.5 MB between identical runs, as whole chunks fall. Leaving out the crops fails the
  U-Net; leaving out the convolutions' bias and activation tensors fails the other."""
  got = _fresh(STREAM_RUN.replace("NAME", repr(name)).replace("TILE", str(tile)))
  assert got["tiles"] > 4
  assert got["model"] == pytest.approx(got["tf"], rel=0.15), got


TRAIN_RUN = (
  STREAM_RUN.split("image = np.random")[0]
  + """
from tf_largeconv.stream import _backprop
image = np.random.default_rng(0).standard_normal((1, 900, 900, 3)).astype(np.float32)
for layer in model.layers:
  if isinstance(layer, L.BatchNormalization):
    layer.trainable = False
labels = np.ones(model.compute_output_shape(image.shape), np.float32)
trainer = stream.StreamingModel(model, head=None, tile=TILE)
trainer.compile(optimizer="sgd", loss="mse")
p = trainer.plan(image.shape)
pool = _plan.simulate(p.tiling, 1, 4, _backprop.train_tile_events)
x, y = tf.constant(image), tf.constant(labels)
tf.config.experimental.reset_memory_stats("CPU:0")
before = tf.config.experimental.get_memory_info("CPU:0")["current"]
grads = trainer.streamed_gradients(x, y)[2]
peak = tf.config.experimental.get_memory_info("CPU:0")["peak"] - before
print(json.dumps({"model": pool.peak_in_use, "tf": peak, "tiles": p.tiles}))
"""
)


# TensorFlow's own kernels (oneDNN off) under the plain pool, whose figures they report.
EIGEN = {"TF_ENABLE_ONEDNN_OPTS": "0", "TF_CPU_ALLOCATOR_USE_BFC": "true"}


@pytest.mark.parametrize(
  "name,tile,kernels",
  [
    ("depthwise", 320, "onednn"),
    ("unet", 256, "onednn"),
    ("depthwise", 320, "eigen"),
    ("unet", 256, "eigen"),
  ],
)
def test_training_plan_counts_the_tensors_tensorflow_makes(name, tile, kernels):
  """A dense StreamingModel step's in-use peak, as TensorFlow's allocator reports it,
  against the model fed `_backprop.train_tile_events`: within 15%, with oneDNN's kernels
  and with TensorFlow's own. Each of these fails the U-Net: leaving out the padded copies
  a Keras convolution makes under the tape; keeping a layer's own tensors until its inputs'
  gradients are made; running the convolutions with explicit padding under the tape
  (TensorFlow's gradient then leaves oneDNN for a buffer of taps x channels x pixels);
  with TensorFlow's own kernels, leaving out their gradients' im2col buffers."""
  code = TRAIN_RUN.replace("NAME", repr(name)).replace("TILE", str(tile))
  got = _fresh(code, **(EIGEN if kernels == "eigen" else {}))
  assert got["tiles"] > 4
  assert got["model"] == pytest.approx(got["tf"], rel=0.15), got


KEPT_RUN = """
import json
import keras, numpy as np, tensorflow as tf
from tf_largeconv import stream
from tf_largeconv.stream import _backprop, _plan
L = keras.layers
def rss_anon():
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith("RssAnon:"):
        return int(line.split()[1]) * 1024
x = i = keras.Input((None, None, 3))
x = L.Conv2D(8, 3, padding="same")(x)
x = L.Conv2D(32, 5, strides=2, padding="same")(x)
model = keras.Model(i, L.Conv2D(4, 3, padding="same")(x))
image = np.random.default_rng(0).standard_normal((1, 1200, 1200, 3)).astype(np.float32)
labels = np.ones(model.compute_output_shape(image.shape), np.float32)
trainer = stream.StreamingModel(model, head=None, tile=TILE)
trainer.compile(optimizer="sgd", loss="mse")
p = trainer.plan(image.shape)
pool = _plan.simulate(p.tiling, 1, 4, _backprop.train_tile_events)
small = np.zeros((1, 48, 48, 3), np.float32)
trainer.streamed_gradients(small, np.zeros(model.compute_output_shape(small.shape), np.float32))
big = tf.fill([(256 << 20) // 4], 1.0)  # a region of 256 MiB, written whole: tiles reuse it
del big
held = []
gradient = tf.GradientTape.gradient
def measured(*args, **kwargs):  # what each tile's backward pass leaves held
  before = rss_anon()
  grads = gradient(*args, **kwargs)
  held.append(rss_anon() - before)
  return grads
tf.GradientTape.gradient = measured
trainer.streamed_gradients(image, labels)
print(json.dumps({"model": pool.kept, "held": sum(held), "tiles": p.tiles,
                  "shapes": len(pool.kept_keys), "in_use": pool.peak_in_use}))
"""


@pytest.mark.parametrize("tile", [500])
def test_plan_counts_what_strided_kernel_gradients_keep(tile):
  """The anonymous memory a dense StreamingModel step's backward passes leave held, with
  TensorFlow's pool already holding more than the step's tensors (so only what kernels
  keep outside it grows), against the model's `Pool.kept`: within 15%. oneDNN's gradient
  of a strided convolution's kernel keeps a buffer of its output's size for each shape it
  runs on; the tiles here have four. Counting it once per layer rather than per shape, or
  not at all, fails. What else a gradient call grows only adds (a thread's first stack
  pages, a malloc arena: 2 MB in one of four runs), so the smaller of two fresh processes'
  figures is the one compared."""
  got = min(
    (_fresh(KEPT_RUN.replace("TILE", str(tile))) for _ in range(2)), key=lambda r: r["held"]
  )
  assert got["tiles"] > 4 and got["shapes"] == 4
  assert got["in_use"] < 128 << 20  # inside the pool's written region
  assert got["model"] == pytest.approx(got["held"], rel=0.15), got


def test_kept_buffers_count_once_per_key():
  """`Pool.keep`: once per key, never freed, part of `grown`; nothing without oneDNN's
  kernels."""
  pool = _pool.Pool()
  pool.keep(("kept", 3, (10, 12)), 5 << 20)
  pool.keep(("kept", 3, (10, 12)), 5 << 20)
  pool.keep(("kept", 3, (12, 10)), 5 << 20)
  assert pool.kept == 10 << 20 and pool.grown == 10 << 20
  for plain in (_pool.Pool("malloc"), _pool.Pool("bfc")):
    plain.keep(("kept", 3, (10, 12)), 5 << 20)
    assert plain.kept == 0 and plain.grown == 0
  # oneDNN's kernels under the plain pool (TF_CPU_ALLOCATOR_USE_BFC=true, oneDNN on).
  both = _pool.Pool("bfc", keeps=True)
  both.keep(("kept", 3, (10, 12)), 5 << 20)
  assert both.kept == 5 << 20


LEAN_RUN = """
import json
import keras, numpy as np, tensorflow as tf
from tf_largeconv import _loader, ops, stream
from tf_largeconv.keras import LargeDepthwiseConv2D
L = keras.layers
x = i = keras.Input((None, None, 3))
x = L.Conv2D(16, 3, padding="same")(x)
x = LAYER(x)
model = keras.Model(i, L.Conv2D(4, 1)(x))
image = np.random.default_rng(0).standard_normal((1, 480, 480, 3)).astype(np.float32)
labels = np.ones(model.compute_output_shape(image.shape), np.float32)
trainer = stream.StreamingModel(model, head=None, tile=160)
trainer.compile(optimizer="sgd", loss="mse")
trainer.streamed_gradients(tf.constant(image), tf.constant(labels))
streamed = _loader.workspace_pool_stats()[:2] + _loader.spectrum_cache_stats()
window = tf.constant(image[:, :180, :180].repeat(6, axis=-1)[..., :16])
kernel = tf.convert_to_tensor(model.layers[2].kernel)
for _ in range(3):  # the same op as the tiles run it, keeping memory as by default
  with tf.GradientTape() as tape:
    tape.watch(window)
    y = ops.depthwise_conv2d(window, kernel, [1, 1, 1, 1], [[0, 0], [7, 7], [7, 7], [0, 0]],
                             workspace_limit=4 * 194 * 194 * 16)
  tape.gradient(y, [window, kernel])
kept = _loader.workspace_pool_stats()[:2] + _loader.spectrum_cache_stats()
print(json.dumps({"tiles": trainer.plan(image.shape).tiles, "streamed": streamed, "kept": kept}))
"""


@pytest.mark.parametrize(
  "layer", ['L.DepthwiseConv2D(15, padding="same")', 'LargeDepthwiseConv2D(15, padding="same")']
)
def test_a_streamed_step_keeps_no_workspace_or_spectra_of_the_packages_op(layer):
  """A dense StreamingModel step whose large depthwise convolution runs the package's op
  under the tape (Keras's layer, or the package's, which keeps memory by default) leaves
  the op's pool of idle workspaces and its spectrum cache empty, at their default budgets:
  nothing the plan does not count outlives a tile's call. The same op called as the tiles
  call it but keeping memory fills both."""
  env = {"LARGECONV_WORKSPACE_POOL_MIB": "128", "LARGECONV_SPECTRUM_CACHE_MIB": "64"}
  got = _fresh(LEAN_RUN.replace("LAYER", layer), **env)
  assert got["tiles"] == 9
  assert got["streamed"] == [0, 0, 0, 0], got
  idle, idle_bytes, entries, spectra = got["kept"]
  assert idle >= 1 and idle_bytes >= 256 << 10 and entries >= 1 and spectra > 0, got


def test_a_layer_on_the_packages_op_takes_its_planned_workspace_in_each_pass():
  """A dense step's tensors (`_backprop.train_tile_events`) for a 15x15 depthwise layer that
  runs the package's op under the tape: no padded copy; the workspaces its planner gives
  for the tile's input (39^2 x 4 channels read for a 32^2 output at the image's corner,
  padded by 7 before, limited to the padded window's 46^2 x 4 x 4 bytes): the forward's,
  made and freed with the call (not kept by the tape); then, once the input's gradient is
  allocated, the input gradient's and the filter gradient's, one after the other. The
  package's own LargeDepthwiseConv2D: the same, within its own workspace limit. A 9x9
  Keras one (TensorFlow's op) takes none."""
  import keras

  from tf_largeconv import plan
  from tf_largeconv import stream
  from tf_largeconv.keras import LargeDepthwiseConv2D
  from tf_largeconv.stream import _backprop

  pads = [[0, 0], [7, 0], [7, 0], [0, 0]]
  want = plan((1, 39, 39, 4), (15, 15, 1, 4), [1] * 4, pads, workspace_limit=46 * 46 * 4 * 4)
  fwd, grad_in, grad_w = (p.workspace_bytes for p in (want.forward, want.backprop_input,
                                                      want.backprop_filter))  # fmt: skip
  assert min(fwd, grad_in, grad_w) > 0 and grad_in != fwd
  own = plan((1, 39, 39, 4), (15, 15, 1, 4), [1] * 4, pads, workspace_limit=20000)
  own = tuple(
    p.workspace_bytes if p else 0 for p in (own.forward, own.backprop_input, own.backprop_filter)
  )
  assert own != (fwd, grad_in, grad_w) and max(own) > 0
  L = keras.layers
  layers = {
    "keras15": lambda: L.DepthwiseConv2D(15, padding="same"),
    "keras9": lambda: L.DepthwiseConv2D(9, padding="same"),
    # the package's layer: its own workspace limit
    "package": lambda: LargeDepthwiseConv2D(15, padding="same", workspace_limit=20000),
  }
  for name, make in layers.items():
    routed = name != "keras9"
    if name == "package":
      fwd, grad_in, grad_w = own
    inp = keras.Input((None, None, 3))
    x = make()(L.Conv2D(4, 1)(inp))
    trainer = stream.StreamingModel(keras.Model(inp, L.Conv2D(2, 1)(x)), head=None, tile=32)
    tiling = trainer.plan((1, 64, 64, 3)).tiling
    ev = _backprop.train_tile_events(tiling, (0, 0), 1, 4)
    keys = [e[1] for e in ev]
    ws = [e for e in ev if isinstance(e[1], tuple) and e[1][0] in ("ws", "gws", "pad")]
    if not routed:
      assert ws == [], ws
      continue
    assert ws, "no workspace counted"
    k = ws[0][1][1]
    assert ws == [
      ("a", ("ws", k), fwd),
      ("f", ("ws", k)),
      ("a", ("gws", k, 0), grad_in),
      ("f", ("gws", k, 0)),
      ("a", ("gws", k, 1), grad_w),
      ("f", ("gws", k, 1)),
    ]
    at = keys.index(("ws", k))
    assert ev[at + 1] == ("f", ("ws", k))  # freed as the call returns
    gpart = [i for i, key in enumerate(keys) if isinstance(key, tuple) and key[:2] == ("gpart", k)]
    assert gpart and gpart[0] == keys.index(("gws", k, 0)) - 1  # the input's gradient first
    made = [i for i, key in enumerate(keys) if key == ("tmp", k, 0)]
    assert made and made[0] == at - 1  # right after the op's result


@pytest.mark.parametrize("tile,grid", [(64, 1), (24, 2)])
def test_padded_copies_under_the_tape_are_the_plans(tile, grid, monkeypatch):
  """Under the tape a Keras 3x3 convolution pads a copy of a window with padding to take
  (TensorFlow's gradient of explicit padding is slow), except where 'SAME' gives that
  padding (a tile that spans the image), which it runs without one. The tf.pad calls of a
  dense step are the ('pad', k) events the plan has for its tiles: none for one tile over
  the image, one per convolution per tile of a 2 x 2 grid (every tile touches two edges)."""
  import keras
  import numpy as np
  import tensorflow as tf

  from tf_largeconv import stream
  from tf_largeconv.stream import _backprop

  L = keras.layers
  inp = keras.Input((None, None, 3))
  x = L.Conv2D(4, 3, padding="same", activation="relu")(inp)
  model = keras.Model(inp, L.Conv2D(2, 3, padding="same")(x))
  trainer = stream.StreamingModel(model, head=None, tile=tile)
  trainer.compile(optimizer="sgd", loss="mse")
  image = np.random.default_rng(0).standard_normal((1, 48, 48, 3)).astype(np.float32)
  tiling = trainer.plan(image.shape).tiling
  assert tiling.count == grid * grid
  planned = sum(
    1
    for index in tiling.tiles()
    for e in _backprop.train_tile_events(tiling, index, 1, 4)
    if e[0] == "a" and isinstance(e[1], tuple) and e[1][0] == "pad"
  )
  calls = []
  real = tf.pad
  monkeypatch.setattr(tf, "pad", lambda *a, **k: calls.append(1) or real(*a, **k))
  trainer.streamed_gradients(tf.constant(image), tf.zeros((1, 48, 48, 2)))
  assert planned == len(calls) == (0 if grid == 1 else 2 * grid * grid)


POOLED = """
import json
import tensorflow as tf
from tf_largeconv import _loader
from tf_largeconv.stream import _pool

def in_use():
  try:
    return tf.config.experimental.get_memory_info("CPU:0")["current"]
  except ValueError:  # TensorFlow's word that no pool serves its CPU tensors
    return None

big = tf.random.uniform((512, 512))
before = in_use()
small = tf.random.uniform((1000,))  # 4,000 bytes: under oneDNN's allocator's 256 KiB
after = in_use()
pooled_small = None if before is None else after - before >= small.shape[0] * 4
print(json.dumps([_pool.allocator(), _pool.pooled(), _loader.core().tf_kernels(),
                  before is not None, pooled_small]))
"""


@pytest.mark.parametrize(
  "onednn, bfc",
  [
    ("1", None),
    ("0", None),
    ("False", None),
    (" 0 ", None),
    (None, None),
    ("0", "true"),
    ("0", "TRUE"),
    ("0", "1"),
    ("0", "yes"),
    ("1", "false"),
    (None, "true"),
  ],
)
def test_the_pool_is_modelled_where_tensorflow_has_one(onednn, bfc):
  """`allocator()` names the allocator TensorFlow picked, by its own word: whether
  `get_memory_info` has figures (a pool) and whether a small tensor is in them (the plain
  pool of TF_CPU_ALLOCATOR_USE_BFC, where oneDNN's leaves it to malloc). TensorFlow reads
  TF_ENABLE_ONEDNN_OPTS=" 0 " as no setting, and TF_CPU_ALLOCATOR_USE_BFC only as 0, 1,
  false or true in any case."""
  names = ("TF_ENABLE_ONEDNN_OPTS", "TF_CPU_ALLOCATOR_USE_BFC")
  env = {k: v for k, v in os.environ.items() if k not in names}
  env.update({k: v for k, v in zip(names, (onednn, bfc)) if v is not None})
  env.update(TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
  run = subprocess.run(
    [sys.executable, "-c", POOLED], capture_output=True, text=True, timeout=300, env=env
  )
  assert run.returncode == 0, run.stderr[-3000:]
  got = json.loads(run.stdout.strip().splitlines()[-1])
  allocator, pooled, kernels, has_figures, pooled_small = got
  assert pooled == has_figures == (allocator != "malloc")
  assert (allocator == "bfc") == bool(pooled_small) == (bfc in ("true", "TRUE", "1"))
  assert (allocator == "onednn") == (kernels == "onednn" and allocator != "bfc")
  if onednn in ("1", "0", "False") and bfc is None:
    assert allocator == ("onednn" if onednn == "1" else "malloc")


def test_a_limit_malloc_may_not_hold_is_said(monkeypatch):
  """Where malloc serves TensorFlow's tensors, sizing a tile by `memory_limit` warns, naming
  the setting that makes the limit hold; under a pool, or with a tile given, it is silent."""
  import warnings

  import keras

  from tf_largeconv import stream

  conv = keras.layers.Conv2D(4, 3, padding="same")
  model = keras.Sequential([keras.Input((None, None, 3)), conv])
  monkeypatch.setattr(_pool, "allocator", lambda: "malloc")
  with pytest.warns(RuntimeWarning, match="malloc.*TF_CPU_ALLOCATOR_USE_BFC=true before"):
    stream.plan(model, (1, 256, 256, 3), memory_limit=8 << 20)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    stream.plan(model, (1, 256, 256, 3), tile=64)
    for mib, allocator in ((9, "bfc"), (10, "onednn")):
      monkeypatch.setattr(_pool, "allocator", lambda name=allocator: name)
      stream.plan(model, (1, 256, 256, 3), memory_limit=mib << 20)


EIGEN_GRADS = """
import json
import tensorflow as tf
from tf_largeconv.stream import _layers

def peak(f):
  f()
  tf.config.experimental.reset_memory_stats("CPU:0")
  before = tf.config.experimental.get_memory_info("CPU:0")["current"]
  f()
  return tf.config.experimental.get_memory_info("CPU:0")["peak"] - before

rows = []
for n, c, batch in ((8, 4, 1), (64, 16, 1), (128, 32, 1), (32, 8, 3)):
  w = tf.random.normal((3, 3, c, c))
  x, dy = tf.random.normal((batch, n, n, c)), tf.random.normal((batch, n, n, c))
  one = [1, 1, 1, 1]
  tf_in = peak(lambda: tf.raw_ops.Conv2DBackpropInput(
    input_sizes=x.shape, filter=w, out_backprop=dy, strides=one, padding="SAME"))
  tf_kernel = peak(lambda: tf.raw_ops.Conv2DBackpropFilter(
    input=x, filter_sizes=w.shape, out_backprop=dy, strides=one, padding="SAME"))
  (col_in, _), (col_kernel, _) = _layers.grad_col_bytes((9 * c, c), n * n, batch, 4)
  rows.append([tf_in, tf_kernel, col_in, col_kernel, x.shape.num_elements() * 4, 9 * c * c * 4])
print(json.dumps(rows))
"""


def test_tensorflows_own_convolution_gradients_take_the_planned_im2col():
  """TensorFlow's own CPU gradients of a 3x3 convolution (oneDNN off), by its allocator's
  in-use peak, against `_layers.grad_col_bytes`: each pass holds its result and the
  buffer, which the pool's chunk may round up to at most twice. Small outputs tell the
  cases apart: the kernel's gradient takes a 30 MiB working set of images whatever the
  batch, the input's too but for a batch of one image, where it takes one image's."""
  for tf_in, tf_kernel, col_in, col_kernel, x_bytes, w_bytes in _fresh(EIGEN_GRADS, **EIGEN):
    assert col_in + x_bytes <= tf_in <= 2 * (col_in + x_bytes)
    assert col_kernel <= tf_kernel <= 2 * (col_kernel + w_bytes)


LATE_SETTING = """
import json, os
import tensorflow as tf
tf.constant(1.0) + 1.0  # TensorFlow's runtime starts: malloc, with oneDNN off
os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"  # too late for TensorFlow
from tf_largeconv.planning import device
print(json.dumps(device.allocator()))
"""


def test_the_allocator_is_what_tensorflow_runs_not_a_late_setting():
  """TF_CPU_ALLOCATOR_USE_BFC set after TensorFlow's runtime started changes nothing:
  `allocator()` goes by TensorFlow's own figures, not by the variable alone."""
  assert _fresh(LATE_SETTING, TF_ENABLE_ONEDNN_OPTS="0") == "malloc"
