"""tf_largeconv.stream.plan's memory figures against measured memory: for each network and
memory limit, `stream.predict` over a 3072^2 x 3 image read from a .npy memory map into a
.npy memory map, in a fresh process per case, after a warm call on a small image. Measured:
the growth of anonymous resident memory (RssAnon, sampled every 2 ms by a thread) over the
warm process. Printed beside the plan's expected figure (`peak_bytes`) and the figure the
tile is sized by (`worst_bytes`), and whether the limit held.

  python -m benchmarks.cpu.stream_memory [--cases NAME ...] [--size N] [--out DIR]

The cases resnet50_512 and resnet50_1024 (Keras's ResNet50, which `predict` runs in stages
through disk) run only when named; their `tiles` is the last stage's.

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


def resnet50(keras):
  """Keras's ResNet50 without top: deep enough that `predict` runs it in stages."""
  return keras.applications.ResNet50(weights=None, include_top=False, input_shape=(None, None, 3))


NETWORKS = {"unet": unet, "depthwise": depthwise, "resnet": resnet}
CASES = {f"{n}_{mib}": (n, mib) for n in NETWORKS for mib in (256, 512, 1024)}
# Staged streams (not run by default): the plan's figures are its largest stage's.
STAGED = {"resnet50_512": ("resnet50", 512), "resnet50_1024": ("resnet50", 1024)}
NETWORKS["resnet50"] = resnet50


def _child(name, size):
  import keras
  import numpy as np

  from tf_largeconv import stream

  network, mib = {**CASES, **STAGED}[name]
  model = NETWORKS[network](keras)
  limit = mib * MiB
  stream.predict(model, np.zeros((1, 256, 256, 3), np.float32), memory_limit=limit)
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "image.npy")
    image = np.lib.format.open_memmap(path, "w+", np.float32, (1, size, size, 3))
    for row in range(0, size, 512):
      image[:, row : row + 512] = np.random.default_rng(row).standard_normal(
        image[:, row : row + 512].shape, np.float32
      )
    image.flush()
    del image
    image = np.load(path, mmap_mode="r")
    plan = stream.plan(model, image, memory_limit=limit)
    shape = model.compute_output_shape((1, size, size, 3))
    out = np.lib.format.open_memmap(os.path.join(tmp, "out.npy"), "w+", np.float32, shape)
    _, grown = memory.sampled_growth(
      lambda: stream.predict(model, image, memory_limit=limit, out=out)
    )
  figures = (plan.tile, plan.tiles, len(plan.stages), plan.peak_bytes, plan.worst_bytes, grown)
  keys = ("tile", "tiles", "stages", "predicted", "worst", "measured")
  print(json.dumps({"case": name, "limit": limit, **dict(zip(keys, figures))}))


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES) + list(STAGED))
  parser.add_argument("--size", type=int, default=3072)
  parser.add_argument("--out", default=measure.RESULTS_DIR)
  parser.add_argument("--timeout", type=int, default=900)
  parser.add_argument("--child", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    return _child(args.child, args.size)
  rows = []
  print(f"{'case':<16}{'tiles':>6}{'expected':>12}{'worst':>12}{'measured':>12}{'error':>8}  limit")
  for name in args.cases:
    child = ["-m", "benchmarks.cpu.stream_memory", "--child", name, "--size", str(args.size)]
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
