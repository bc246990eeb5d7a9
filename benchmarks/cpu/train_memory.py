"""Memory of one StreamingModel training step on a large image, for two checkouts of the
package (e.g. before and after a change), each case in a fresh process.

  python -m benchmarks.cpu.train_memory [--size 8192] [--memory-limit 32 (MiB)]
      [--checkouts /path/to/main .] [--cases conv flatten resnet unet]

The cases ('--heads' is another name for '--cases'):
- 'conv' and 'flatten': a trunk of 3x3 convolutions (3 -> 16 -> 32 -> 64 -> 64 channels,
  each of stride 2: stride 16 in all, ReLU), and a head that does not read only the trunk
  output's mean: 'conv' (a 3x3 convolution of 64 channels, global average pooling,
  Dense(10)) or 'flatten' (4 x 4 average pooling, Flatten, Dense(10));
- 'resnet': classification by a ResNet-style trunk (`resnet_trunk`: a 3x3 stem of stride 2,
  then residual blocks of stride 2, 16 -> 32 -> 64 channels, frozen BatchNormalization, no
  pooling: stride 16 in all) and a head of global average pooling and Dense(10);
- 'unet': dense (segmentation) training, `StreamingModel(unet, head=None)` (`unet`: a
  2-level U-Net of --unet-channels then twice as many channels, max pooling, upsampling,
  skip by concatenation, one logit per pixel), the labels a --size^2 x 1 float32 `.npy`
  memory map of zeros and ones, the loss binary cross-entropy averaged over pixels.
The image is a --size^2 x 3 float32 `.npy` memory map (written once to --scratch), the
classification label one class.

Each case runs in a child process whose Python path is the checkout's: it imports
TensorFlow, builds and compiles the model, warms it with a step on a 256^2 image, opens the
memory map, then runs one `train_on_batch` on it while a thread samples RssAnon every 2 ms
(`benchmarks.cpu.memory.sampled_growth`). Printed: the growth of anonymous memory over the
warm process, the step's seconds (under load: compare them as ratios only), the plan's tile
peak and, where the checkout's plan has it, where it keeps the trunk output
(`plan.trunk_output`). Written to DIR/train_memory_SIZE.json (or --json): also the plan
as printed and the growth sampled every 5 s through the step (`timeline_mib`).
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np

MiB = 1 << 20
CASES = ("conv", "flatten", "resnet", "unet")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def model(head_kind, memory_limit, size):
  import keras

  from tf_largeconv import stream

  keras.utils.set_random_seed(0)  # the same weights in every process
  L = keras.layers
  inp = keras.Input((None, None, 3))
  x = inp
  for channels in (16, 32, 64, 64):
    x = L.Conv2D(channels, 3, strides=2, padding="same", activation="relu")(x)
  trunk = keras.Model(inp, x)
  side = None if head_kind == "conv" else size // 16  # Flatten needs a fixed shape
  z_in = keras.Input((side, side, 64))
  if head_kind == "conv":
    h = L.Conv2D(64, 3, padding="same", activation="relu")(z_in)
    h = L.GlobalAveragePooling2D()(h)
  else:
    h = L.Flatten()(L.AveragePooling2D(4)(z_in))
  head = keras.Model(z_in, L.Dense(10)(h))
  m = stream.StreamingModel(trunk, head, memory_limit=memory_limit)
  m.compile(
    optimizer=keras.optimizers.SGD(1e-3),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
  )
  return m


def resnet_trunk(keras):
  """3x3 stem of stride 2 (16 channels), then three residual blocks of stride 2 (16, 32,
  64 channels: two 3x3 convolutions with frozen BatchNormalization, a strided 1x1
  projection on the shortcut), ReLU: stride 16, no pooling."""
  L = keras.layers

  def bn(x):
    norm = L.BatchNormalization()
    norm.trainable = False  # a streamed trunk trains with its moving statistics
    return norm(x)

  inp = keras.Input((None, None, 3))
  x = L.ReLU()(bn(L.Conv2D(16, 3, strides=2, padding="same")(inp)))
  for channels in (16, 32, 64):
    y = L.ReLU()(bn(L.Conv2D(channels, 3, strides=2, padding="same")(x)))
    y = bn(L.Conv2D(channels, 3, padding="same")(y))
    x = L.ReLU()(L.Add()([L.Conv2D(channels, 1, strides=2)(x), y]))
  return keras.Model(inp, x)


def unet(keras, channels):
  """A 2-level U-Net: two 3x3 convolutions of `channels`, max pooling, two of 2x
  `channels`, upsampling, concatenation with the first level, two of `channels`, a 1x1
  convolution to one logit per pixel."""
  L = keras.layers

  def conv(x, n):
    return L.Conv2D(n, 3, padding="same", activation="relu")(x)

  inp = keras.Input((None, None, 3))
  a = conv(conv(inp, channels), channels)
  b = conv(conv(L.MaxPooling2D()(a), 2 * channels), 2 * channels)
  c = L.Concatenate()([L.UpSampling2D()(b), a])
  return keras.Model(inp, L.Conv2D(1, 1)(conv(conv(c, channels), channels)))


def case_model(case, memory_limit, size, unet_channels):
  """The compiled StreamingModel of `case`."""
  if case in ("conv", "flatten"):
    return model(case, memory_limit, size)
  import keras

  from tf_largeconv import stream

  keras.utils.set_random_seed(0)
  if case == "unet":
    m = stream.StreamingModel(unet(keras, unet_channels), None, memory_limit=memory_limit)
    loss = keras.losses.BinaryCrossentropy(from_logits=True)
  else:
    layers = [keras.Input((None, None, 64)), keras.layers.GlobalAveragePooling2D()]
    head = keras.Sequential(layers + [keras.layers.Dense(10)])
    m = stream.StreamingModel(resnet_trunk(keras), head, memory_limit=memory_limit)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  m.compile(optimizer=keras.optimizers.SGD(1e-3), loss=loss)
  return m


def _warm(m, case, size):
  """One step on a 256^2 image (the flatten head: its trunk and head called once, as its
  head takes the measured size's output only)."""
  warm = np.random.default_rng(0).standard_normal((1, 256, 256, 3)).astype(np.float32)
  if case == "flatten":
    m.trunk(warm)
    m.head(np.zeros((1, size // 16, size // 16, 64), np.float32))
  elif case == "unet":
    m.train_on_batch(warm, (warm[..., :1] > 0).astype(np.float32))
  else:
    m.train_on_batch(warm, np.array([1]))


def _timeline(every=5.0):
  """(a list, a function stopping it): the growth of RssAnon in MiB over the process as it
  was, sampled every `every` seconds from a thread, until stopped."""
  from benchmarks.cpu.memory import rss_anon

  base, samples, done = rss_anon(), [], threading.Event()

  def sample():
    while not done.wait(every):
      samples.append(round((rss_anon() - base) / MiB))

  thread = threading.Thread(target=sample, daemon=True)
  thread.start()
  return samples, lambda: (done.set(), thread.join())


def _child(image, case, memory_limit, unet_channels=16):
  from benchmarks.cpu.memory import sampled_growth

  x = np.load(image, mmap_mode="r")
  size = x.shape[1]
  y = np.load(_labels(image), mmap_mode="r") if case == "unet" else np.array([1])
  m = case_model(case, memory_limit, size, unet_channels)
  _warm(m, case, size)
  plan = m.plan(x.shape)
  timeline, stop = _timeline()
  t0 = time.perf_counter()
  try:
    loss, growth = sampled_growth(lambda: float(m.train_on_batch(x, y)))
  finally:
    stop()
  seconds = time.perf_counter() - t0
  out = getattr(plan, "trunk_output", None)
  print(
    json.dumps(
      dict(
        size=size,
        head=case,
        unet_channels=unet_channels if case == "unet" else None,
        growth=growth,
        seconds=seconds,
        loss=loss,
        tiles=plan.tiles,
        tile_in=list(plan.tile_in),
        plan_tile_peak=plan.peak_bytes,
        trunk_output=None if out is None else str(out),
        plan_memory=None if out is None else out.memory_bytes,
        plan_disk=None if out is None else out.disk_bytes,
        plan=str(plan),
        timeline_mib=timeline,
      )
    )
  )


def _labels(image):
  return image[: -len(".npy")] + "_labels.npy"


def _write(path, size, channels, fill):
  """A (1, size, size, channels) float32 `.npy` at `path` (kept if there), written 1024 rows
  at a time, each fill(rng, (rows, size, channels))."""
  if not os.path.exists(path):
    x = np.lib.format.open_memmap(path + ".part", "w+", np.float32, (1, size, size, channels))
    rng = np.random.default_rng(3 + channels)
    for a in range(0, size, 1024):
      x[0, a : a + 1024] = fill(rng, (min(1024, size - a), size, channels))
    x.flush()
    del x
    os.replace(path + ".part", path)
  return path


def _image(scratch, size, labels=False):
  """The image's path (and, with `labels`, a mask of zeros and ones beside it)."""
  path = os.path.join(scratch, f"train_memory_{size}.npy")
  _write(path, size, 3, lambda rng, shape: rng.standard_normal(shape, np.float32))
  if labels:
    _write(_labels(path), size, 1, lambda rng, shape: rng.random(shape, np.float32) < 0.5)
  return path


def _run_case(image, case, checkout, args):
  """One case in a fresh process whose Python path is `checkout`: its row."""
  env = dict(os.environ, PYTHONPATH=checkout, TF_CPP_MIN_LOG_LEVEL="3")
  cmd = [sys.executable, os.path.abspath(__file__), "--child", image, case]
  cmd += [str(args.memory_limit * MiB), str(args.unet_channels)]
  done = subprocess.run(
    cmd, cwd=checkout, env=env, capture_output=True, text=True, timeout=args.timeout
  )
  lines = done.stdout.strip().splitlines()
  if done.returncode or not lines:
    row = dict(head=case, error=done.stderr.strip()[-400:])
  else:
    row = json.loads(lines[-1])
  row["checkout"] = checkout
  return row


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--size", type=int, default=8192)
  parser.add_argument("--memory-limit", type=int, default=32, help="MiB")
  parser.add_argument("--checkouts", nargs="*", default=[ROOT])
  parser.add_argument(
    "--cases", "--heads", nargs="*", choices=CASES, default=["conv"], dest="cases"
  )
  parser.add_argument("--unet-channels", type=int, default=16)
  parser.add_argument("--scratch", default=os.path.join(ROOT, "benchmarks", "scratch"))
  parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "cpu"))
  parser.add_argument(
    "--json", help="the results file's name in --out (default train_memory_SIZE.json)"
  )
  parser.add_argument("--timeout", type=int, default=3600)
  parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    image, case, limit, channels = args.child
    return _child(image, case, int(limit), int(channels))
  os.makedirs(args.scratch, exist_ok=True)
  image = _image(args.scratch, args.size, labels="unet" in args.cases)
  rows = []
  for case in args.cases:
    for checkout in args.checkouts:
      rows.append(_run_case(image, case, os.path.abspath(checkout), args))
      print(json.dumps(rows[-1]), flush=True)
  os.makedirs(args.out, exist_ok=True)
  name = args.json or f"train_memory_{args.size}.json"
  with open(os.path.join(args.out, name), "w", encoding="utf-8") as f:
    json.dump(rows, f, indent=1)
  print(f"{'checkout':40s}{'case':>8s}{'RssAnon growth':>16s}{'seconds':>9s}{'tiles':>7s}")
  for r in rows:
    if "error" in r:
      print(f"{r['checkout']:40s}{r['head']:>8s}  failed: {r['error'][-200:]}")
      continue
    print(
      f"{r['checkout']:40s}{r['head']:>8s}{r['growth'] / MiB:12.0f} MiB{r['seconds']:9.1f}"
      f"{r['tiles']:7d}"
    )
    print(f"  plan: tile peak {r['plan_tile_peak'] / MiB:.0f} MiB, tile {r.get('tile_in')}")
    if r.get("trunk_output"):
      print(f"  {r['trunk_output']}")


if __name__ == "__main__":
  sys.exit(main())
