"""Memory of one StreamingModel training step on a large image, for two checkouts of the
package (e.g. before and after a change), each case in a fresh process.

  python -m benchmarks.cpu.train_memory [--size 8192] [--memory-limit 32 (MiB)]
      [--checkouts /path/to/main .] [--heads conv flatten]

The model: a trunk of 3x3 convolutions (3 -> 16 -> 32 -> 64 -> 64 channels, each of stride
2: stride 16 in all, ReLU), and a head that does not read only the trunk output's mean:
'conv' (a 3x3 convolution of 64 channels, global average pooling, Dense(10)) or 'flatten'
(4 x 4 average pooling, Flatten, Dense(10)). The image is a --size^2 x 3 float32 `.npy`
memory map (written once to --scratch), the label one class.

Each case runs in a child process whose Python path is the checkout's: it imports
TensorFlow, builds and compiles the model, warms it with a step on a 256^2 image, opens the
memory map, then runs one `train_on_batch` on it while a thread samples RssAnon every 2 ms
(`benchmarks.cpu.memory.sampled_growth`). Printed: the growth of anonymous memory over the
warm process, the step's seconds (under load: compare them as ratios only), the plan's tile
peak and, where the checkout's plan has it, where it keeps the trunk output
(`plan.trunk_output`). Writes DIR/train_memory_SIZE.json.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

MiB = 1 << 20
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


def _child(image, head_kind, memory_limit):
  from benchmarks.cpu.memory import sampled_growth

  x = np.load(image, mmap_mode="r")
  size = x.shape[1]
  m = model(head_kind, memory_limit, size)
  warm = np.random.default_rng(0).standard_normal((1, 256, 256, 3)).astype(np.float32)
  if head_kind == "conv":
    m.train_on_batch(warm, np.array([1]))
  else:  # the head takes the measured size's output only: warm each part alone
    m.trunk(warm)
    m.head(np.zeros((1, size // 16, size // 16, 64), np.float32))
  plan = m.plan(x.shape)
  t0 = time.perf_counter()
  loss, growth = sampled_growth(lambda: float(m.train_on_batch(x, np.array([1]))))
  seconds = time.perf_counter() - t0
  out = getattr(plan, "trunk_output", None)
  print(
    json.dumps(
      dict(
        size=size,
        head=head_kind,
        growth=growth,
        seconds=seconds,
        loss=loss,
        tiles=plan.tiles,
        plan_tile_peak=plan.peak_bytes,
        trunk_output=None if out is None else str(out),
        plan_memory=None if out is None else out.memory_bytes,
        plan_disk=None if out is None else out.disk_bytes,
      )
    )
  )


def _image(scratch, size):
  path = os.path.join(scratch, f"train_memory_{size}.npy")
  if not os.path.exists(path):
    x = np.lib.format.open_memmap(path + ".part", "w+", np.float32, (1, size, size, 3))
    rng = np.random.default_rng(3)
    for a in range(0, size, 1024):
      x[0, a : a + 1024] = rng.standard_normal((min(1024, size - a), size, 3))
    x.flush()
    del x
    os.replace(path + ".part", path)
  return path


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--size", type=int, default=8192)
  parser.add_argument("--memory-limit", type=int, default=32, help="MiB")
  parser.add_argument("--checkouts", nargs="*", default=[ROOT])
  parser.add_argument("--heads", nargs="*", choices=("conv", "flatten"), default=["conv"])
  parser.add_argument("--scratch", default=os.path.join(ROOT, "benchmarks", "scratch"))
  parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "cpu"))
  parser.add_argument("--timeout", type=int, default=3600)
  parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    return _child(args.child[0], args.child[1], int(args.child[2]))
  os.makedirs(args.scratch, exist_ok=True)
  image = _image(args.scratch, args.size)
  rows = []
  for head_kind in args.heads:
    for checkout in args.checkouts:
      checkout = os.path.abspath(checkout)
      env = dict(os.environ, PYTHONPATH=checkout, TF_CPP_MIN_LOG_LEVEL="3")
      cmd = [sys.executable, os.path.abspath(__file__), "--child", image, head_kind]
      cmd.append(str(args.memory_limit * MiB))
      done = subprocess.run(
        cmd, cwd=checkout, env=env, capture_output=True, text=True, timeout=args.timeout
      )
      lines = done.stdout.strip().splitlines()
      if done.returncode or not lines:
        row = dict(head=head_kind, error=done.stderr.strip()[-400:])
      else:
        row = json.loads(lines[-1])
      row["checkout"] = checkout
      rows.append(row)
      print(json.dumps(row), flush=True)
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, f"train_memory_{args.size}.json"), "w", encoding="utf-8") as f:
    json.dump(rows, f, indent=1)
  print(f"{'checkout':40s}{'head':>8s}{'RssAnon growth':>16s}{'seconds':>9s}{'tiles':>7s}")
  for r in rows:
    if "error" in r:
      print(f"{r['checkout']:40s}{r['head']:>8s}  failed: {r['error'][-200:]}")
      continue
    print(
      f"{r['checkout']:40s}{r['head']:>8s}{r['growth'] / MiB:12.0f} MiB{r['seconds']:9.1f}"
      f"{r['tiles']:7d}"
    )
    if r.get("trunk_output"):
      print(f"  plan: {r['trunk_output']}; tile peak {r['plan_tile_peak'] / MiB:.0f} MiB")


if __name__ == "__main__":
  sys.exit(main())
