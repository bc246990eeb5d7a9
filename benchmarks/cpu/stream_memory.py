"""tf_largeconv.stream.plan's memory figures against measured memory: for each network and
memory limit, `stream.predict` over a 3072^2 x 3 image read from a .npy memory map into a
.npy memory map, and (`train_*` cases) one dense `StreamingModel` training step (head None,
mean squared error, SGD, batch normalization frozen) on a 1536^2 x 3 image and labels of
the output's shape, both .npy memory maps, and (`head_*` cases) one step of a
`StreamingModel` with a head (global average pooling, a dense layer of 10 classes,
cross-entropy) on the same image; in a fresh process per case, after a warm call
on a 32^2 image (its tensors too small for TensorFlow's pool, which so starts empty).
Measured:
the growth of anonymous resident memory (RssAnon, sampled every 2 ms by a thread) over the
warm process. Printed beside the plan's expected figure (`peak_bytes`) and the figure the
tile is sized by (`worst_bytes`), and whether the limit held.

  python -m benchmarks.cpu.stream_memory [--cases NAME ...] [--size N] [--train-size N]
      [--zarr-size N] [--out DIR]

`--cases zarr_unet2` (not run by default: minutes, and 4 GiB of disk): the two-level U-Net
from a 16384^2 x 3 zarr slide into zarr, under the default limit.

The cases resnet50_512 and resnet50_1024 (Keras's ResNet50, which `predict` runs in stages
through disk) run only when named; their `tiles` is the last stage's. So do
train_thin31_256 and train_thin9_256: the dense step of a trunk whose largest tensors feed
one depthwise convolution (31x31, which a streamed step runs on the package's op; 9x9, on
TensorFlow's).

Writes DIR/stream_memory.json and DIR/stream_memory.png (predicted against measured).
"""

import argparse
import json
import os
import tempfile

from benchmarks import measure
from benchmarks.cpu import memory

MiB = 1 << 20


def unet(keras):
  """Three levels, 32-64-128 channels, skips by concatenation."""
  L = keras.layers
  x = inp = keras.Input((None, None, 3))
  skips = []
  for c in (32, 64):
    x = L.Conv2D(c, 3, padding="same", activation="relu")(x)
    x = L.Conv2D(c, 3, padding="same", activation="relu")(x)
    skips.append(x)
    x = L.MaxPooling2D()(x)
  x = L.Conv2D(128, 3, padding="same", activation="relu")(x)
  for c, skip in zip((64, 32), reversed(skips)):
    x = L.Concatenate()([L.UpSampling2D()(x), skip])
    x = L.Conv2D(c, 3, padding="same", activation="relu")(x)
  return keras.Model(inp, L.Conv2D(2, 1)(x))


def depthwise(keras):
  """RepLKNet-style: a 3x3 stem to 32 channels, then two residual blocks of a 31x31
  depthwise convolution, BatchNorm and 1x1 convolutions to 64 and back."""
  L = keras.layers
  x = inp = keras.Input((None, None, 3))
  x = L.Conv2D(32, 3, padding="same")(x)
  for _ in range(2):
    y = L.DepthwiseConv2D(31, padding="same")(x)
    y = L.BatchNormalization()(y)
    y = L.Conv2D(64, 1, activation="relu")(y)
    x = L.Add()([x, L.Conv2D(32, 1)(y)])
  return keras.Model(inp, x)


def resnet(keras):
  """ResNet-style: a 7x7 stride-2 stem, BatchNorm, max pooling, four basic blocks (one
  strided, with a projection)."""
  L = keras.layers
  x = inp = keras.Input((None, None, 3))
  x = L.Conv2D(32, 7, strides=2, padding="same", use_bias=False)(x)
  x = L.MaxPooling2D(3, 2, padding="same")(L.ReLU()(L.BatchNormalization()(x)))
  for c, s in ((32, 1), (32, 1), (64, 2), (64, 1)):
    y = L.Conv2D(c, 3, strides=s, padding="same", use_bias=False)(x)
    y = L.ReLU()(L.BatchNormalization()(y))
    y = L.BatchNormalization()(L.Conv2D(c, 3, padding="same", use_bias=False)(y))
    if s != 1 or x.shape[-1] != c:
      x = L.Conv2D(c, 1, strides=s, use_bias=False)(x)
    x = L.ReLU()(L.Add()([x, y]))
  return keras.Model(inp, x)


def unet2(keras):
  """Two levels, 32-64 channels (the slide command's network in `cli_memory`)."""
  from benchmarks.cpu import cli_memory

  return cli_memory.unet(keras)


def resnet50(keras):
  """Keras's ResNet50 without top: deep enough that `predict` runs it in stages."""
  return keras.applications.ResNet50(weights=None, include_top=False, input_shape=(None, None, 3))


def thin(keras, kernel):
  """A 1x1 convolution to 16 channels, a `kernel` x `kernel` depthwise convolution, a 1x1
  convolution to 2."""
  L = keras.layers
  inp = keras.Input((None, None, 3))
  x = L.DepthwiseConv2D(kernel, padding="same")(L.Conv2D(16, 1)(inp))
  return keras.Model(inp, L.Conv2D(2, 1)(x))


NETWORKS = {"unet": unet, "depthwise": depthwise, "resnet": resnet, "unet2": unet2}
NETWORKS["resnet50"] = resnet50
NETWORKS.update(thin31=lambda keras: thin(keras, 31), thin9=lambda keras: thin(keras, 9))
THREE = ("unet", "depthwise", "resnet")
CASES = {f"{n}_{mib}": (n, mib) for n in THREE for mib in (256, 512, 1024)}
CASES.update({f"train_{n}_{mib}": (n, mib) for n in THREE for mib in (256, 512, 1024)})
# A StreamingModel with a classification head on the ResNet-style trunk.
CASES.update({f"head_resnet_{mib}": ("resnet", mib) for mib in (256, 512, 1024)})
# Staged streams (not run by default): the plan's figures are its largest stage's.
STAGED = {"resnet50_512": ("resnet50", 512), "resnet50_1024": ("resnet50", 1024)}
# Dense steps of the thin trunks (not run by default).
PROBES = {"train_thin31_256": ("thin31", 256), "train_thin9_256": ("thin9", 256)}
# A slide: zarr to zarr at --zarr-size, the default limit (run on its own: --cases zarr_unet2).
ZARR_CASES = {"zarr_unet2": ("unet2", 1024)}


def _memmap(path, shape, seed):
  import numpy as np

  array = np.lib.format.open_memmap(path, "w+", np.float32, shape)
  for row in range(0, shape[1], 512):
    part = array[:, row : row + 512]
    part[...] = np.random.default_rng(seed + row).standard_normal(part.shape, np.float32)
  array.flush()
  del array
  return np.load(path, mmap_mode="r")


def _train_child(name, size, traced=False):
  """One StreamingModel step: (plan, measured growth). Dense (`train_*`: head None, mean
  squared error against labels of the output's shape) or with a head (`head_*`: global
  average pooling and a dense layer of 10 classes, cross-entropy against one label)."""
  import keras
  import numpy as np

  from tf_largeconv import stream

  network, mib = {**CASES, **PROBES}[name]
  trunk = NETWORKS[network](keras)
  for layer in trunk.layers:
    if isinstance(layer, keras.layers.BatchNormalization):
      layer.trainable = False
  if name.startswith("head_"):
    L = keras.layers
    head = keras.Sequential([L.GlobalAveragePooling2D(), L.Dense(10)])
    model = stream.StreamingModel(trunk, head=head, memory_limit=mib * MiB)
    model.compile(optimizer="sgd", loss=keras.losses.CategoricalCrossentropy(from_logits=True))

    def labels(shape, seed):
      return np.eye(10, dtype=np.float32)[[seed % 10]]

  else:
    model = stream.StreamingModel(trunk, head=None, memory_limit=mib * MiB, trace_tiles=traced)
    model.compile(optimizer="sgd", loss="mse")

    def labels(shape, seed):
      return _memmap(os.path.join(tmp, "y.npy"), trunk.compute_output_shape(shape), seed)

  small = np.zeros((1, 32, 32, 3), np.float32)
  with tempfile.TemporaryDirectory() as tmp:
    model.train_on_batch(small, np.zeros_like(labels(small.shape, 0)))
    x = _memmap(os.path.join(tmp, "x.npy"), (1, size, size, 3), 0)
    y = labels(x.shape, 1)
    plan = model.plan(x.shape)
    _, grown = memory.sampled_growth(lambda: model.train_on_batch(x, y))
  return plan, grown


def _zarr_child(name, size):
  """stream.predict from a zarr slide (size^2 x 3, chunks of 1024) into a zarr array."""
  import keras
  import numpy as np
  import zarr

  from tf_largeconv import stream

  network, _ = ZARR_CASES[name]
  model = NETWORKS[network](keras)
  stream.predict(model, np.zeros((32, 32, 3), np.float32))
  with tempfile.TemporaryDirectory() as tmp:
    slide = zarr.open(os.path.join(tmp, "in.zarr"), mode="w", shape=(size, size, 3),
                      chunks=(1024, 1024, 3), dtype="float32")  # fmt: skip
    for row in range(0, size, 1024):
      part = np.random.default_rng(row).random((min(1024, size - row), size, 3), "float32")
      slide[row : row + 1024] = part
    shape = model.compute_output_shape((1, size, size, 3))[1:]
    out = zarr.open(os.path.join(tmp, "out.zarr"), mode="w", shape=shape,
                    chunks=(1024, 1024, shape[-1]), dtype="float32")  # fmt: skip
    plan = stream.plan(model, slide)
    _, grown = memory.sampled_growth(lambda: stream.predict(model, slide, out=out))
  return plan, grown


def _child(name, size, train_size, zarr_size, traced=False):
  if name in ZARR_CASES:
    plan, grown = _zarr_child(name, zarr_size)
  elif name.startswith(("train_", "head_")):
    plan, grown = _train_child(name, train_size, traced)
  else:
    plan, grown = _predict_child(name, size)
  figures = (plan.tile, plan.tiles, len(plan.stages), plan.peak_bytes, plan.worst_bytes, grown)
  keys = ("tile", "tiles", "stages", "predicted", "worst", "measured")
  limit = {**CASES, **STAGED, **ZARR_CASES, **PROBES}[name][1] * MiB
  print(json.dumps({"case": name, "limit": limit, **dict(zip(keys, figures))}))


def _predict_child(name, size):
  import keras
  import numpy as np

  from tf_largeconv import stream

  network, mib = {**CASES, **STAGED}[name]
  model = NETWORKS[network](keras)
  limit = mib * MiB
  # Warm on an image whose tensors all stay under the pool's smallest request, so the
  # pool starts empty, as the plan assumes.
  stream.predict(model, np.zeros((1, 32, 32, 3), np.float32), memory_limit=limit)
  with tempfile.TemporaryDirectory() as tmp:
    image = _memmap(os.path.join(tmp, "image.npy"), (1, size, size, 3), 0)
    plan = stream.plan(model, image, memory_limit=limit)
    shape = model.compute_output_shape((1, size, size, 3))
    out = np.lib.format.open_memmap(os.path.join(tmp, "out.npy"), "w+", np.float32, shape)
    _, grown = memory.sampled_growth(
      lambda: stream.predict(model, image, memory_limit=limit, out=out)
    )
  return plan, grown


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  choices = list(CASES) + list(STAGED) + list(ZARR_CASES) + list(PROBES)
  parser.add_argument("--cases", nargs="*", default=list(CASES), choices=choices)
  parser.add_argument("--size", type=int, default=3072)
  parser.add_argument("--train-size", type=int, default=1536)
  parser.add_argument("--zarr-size", type=int, default=16384)
  parser.add_argument("--out", default=measure.RESULTS_DIR)
  parser.add_argument("--timeout", type=int, default=900)
  parser.add_argument(
    "--trace-tiles", action="store_true", help="dense steps with trace_tiles=True"
  )
  parser.add_argument("--child", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    return _child(args.child, args.size, args.train_size, args.zarr_size, args.trace_tiles)
  rows = []
  print(f"{'case':<16}{'tiles':>6}{'expected':>12}{'worst':>12}{'measured':>12}{'error':>8}  limit")
  for name in args.cases:
    child = ["-m", "benchmarks.cpu.stream_memory", "--child", name, "--size", str(args.size)]
    child += ["--train-size", str(args.train_size), "--zarr-size", str(args.zarr_size)]
    child += ["--trace-tiles"] if args.trace_tiles else []
    r = measure.run_child(child, args.timeout)
    if "error" in r:
      print(f"{name:<16}{r['error']}")
      continue
    r["error"] = r["predicted"] / r["measured"] - 1
    r["held"] = r["measured"] <= r["limit"]
    rows.append(r)
    print(
      f"{name:<16}{r['tiles']:>6}{r['predicted'] / MiB:>8.0f} MiB{r['worst'] / MiB:>8.0f} MiB"
      f"{r['measured'] / MiB:>8.0f} MiB{100 * r['error']:>7.1f}%  "
      f"{'held' if r['held'] else 'EXCEEDED'} ({r['limit'] // MiB} MiB)"
    )
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "stream_memory.json"), "w") as f:
    json.dump(dict(size=args.size, rows=rows), f, indent=1)
  memory.plot(rows, os.path.join(args.out, "stream_memory.png"), "stream.plan")
  return 0


if __name__ == "__main__":
  main()
