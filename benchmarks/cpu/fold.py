"""Fold case set: the founding user's block (1x1 P; depthwise KxK on P minus P; dense KxK on
P; concatenated), batch 4, 112x112, 64 channels, K = 7 and 31, float32.

  python -m benchmarks.cpu.bench --cases fold [--out DIR]

Training step (forward, loss, gradients for every weight, one SGD update, through
`train_on_batch`): the Keras block as the user wrote it against `FoldedBlock(block)`, and
the same block with its KxK layers on tf_largeconv (`convert`) for reference. Inference:
the Keras block against `fold(block)`. Each measurement runs in a fresh process: time =
min over warm runs (a step slower than SLOW_S seconds is timed once, in its first run);
RSS = process high-water mark (VmHWM) growth over the first run, one-time costs (tracing,
optimizer state) included; tensors = TensorFlow's allocator peak over a warm training step
(a process with TF_CPU_ALLOCATOR_USE_BFC=true, where TF counts it): the memory a GPU would
need. Writes DIR/bench_fold.json.
"""

import json
import os
import sys
import time

from benchmarks import measure

MiB = 2**20
BATCH, SIZE, CHANNELS = 4, 112, 64
KERNELS = (7, 31)
# (implementation, mode): what each fresh process measures.
RUNS = (
  ("keras block", "train"),
  ("block on Large layers", "train"),
  ("FoldedBlock", "train"),
  ("keras block", "infer"),
  ("fold(block)", "infer"),
)
REPEATS = {"train": 2, "infer": 3}
SLOW_S = 60


def founding_block(k, channels=CHANNELS, size=SIZE):
  """The founding user's block, written as they wrote it."""
  import keras

  layers = keras.layers
  x = keras.Input((size, size, channels))
  p = layers.Conv2D(channels, 1, use_bias=False)(x)
  d = layers.DepthwiseConv2D(k, padding="same", use_bias=False)(p) - p
  low = layers.Conv2D(channels, k, padding="same", use_bias=False)(p)
  return keras.Model(x, layers.Concatenate()([d, low]))


def _worker(k, impl, mode, tensors=False):
  """Runs in a fresh process: builds the model, measures one implementation (with
  `tensors`, only the allocator peak of a warm run)."""
  import keras
  import numpy as np
  import tensorflow as tf

  import tf_largeconv.keras as lck

  rng = np.random.default_rng(0)
  block = founding_block(k)
  x = rng.random((BATCH, SIZE, SIZE, CHANNELS), dtype=np.float32)
  if impl == "FoldedBlock":
    model = keras.Sequential([keras.Input(x.shape[1:]), lck.FoldedBlock(block)])
  elif impl == "block on Large layers":
    model = lck.convert(block, min_kernel_size=k)
  elif impl == "fold(block)":
    model = keras.Sequential([keras.Input(x.shape[1:]), lck.fold(block)])
  else:
    model = block
  if mode == "train":
    t = rng.random((BATCH, SIZE, SIZE, 2 * CHANNELS), dtype=np.float32)
    model.compile(optimizer=keras.optimizers.SGD(1e-3), loss="mse", jit_compile=False)

    def run():
      model.train_on_batch(x, t)
  else:
    xt = tf.constant(x)

    def run():
      model(xt).numpy()

  if tensors:
    run()
    tf.config.experimental.reset_memory_stats("CPU:0")
    run()
    return {"tensor_bytes": tf.config.experimental.get_memory_info("CPU:0")["peak"]}
  base = measure.reset_peak_rss()
  start = time.perf_counter()
  run()
  first = time.perf_counter() - start
  extra = max(measure.peak_rss() - base, 0)
  if first > SLOW_S:  # TF's large-kernel gradients: minutes a step
    return {"seconds": first, "extra_bytes": extra, "runs": 1}
  best = float("inf")
  for _ in range(REPEATS[mode]):
    start = time.perf_counter()
    run()
    best = min(best, time.perf_counter() - start)
  return {"seconds": best, "extra_bytes": extra, "runs": REPEATS[mode]}


def _run_one(k, impl, mode, timeout):
  args = ["-m", "benchmarks.cpu.fold", str(k), impl, mode]
  result = measure.run_child(args, timeout)
  if mode == "train" and "error" not in result:
    tensors = measure.run_child(args + ["tensors"], timeout, TF_CPU_ALLOCATOR_USE_BFC="true")
    result["tensor_bytes"] = tensors.get("tensor_bytes")
  return result


def _cell(r, key, scale, unit):
  if r is None or "error" in r or r.get(key) is None:
    return "n/a"
  return f"{r[key] / scale:.1f}{unit}"


def _ratio(a, b, key):
  if not a or not b or "error" in a or "error" in b or not a.get(key) or not b.get(key):
    return "-"
  return f"{a[key] / b[key]:.1f}x"


def main(out_dir, timeout=1800):
  """Runs every case and implementation, prints the tables, writes bench_fold.json."""
  results = {}
  for k in KERNELS:
    results[k] = {f"{impl}/{mode}": _run_one(k, impl, mode, timeout) for impl, mode in RUNS}
    r = results[k]
    block, large, ours = (
      r["keras block/train"],
      r["block on Large layers/train"],
      r["FoldedBlock/train"],
    )
    print(
      f"\nfounding block K={k}, {BATCH}x{SIZE}x{SIZE}x{CHANNELS} -> {2 * CHANNELS} "
      "channels, float32"
    )
    print(f"{'training step':24s}{'time':>12s}{'RSS MiB':>10s}{'tensors MiB':>13s}")
    for name, row in (
      ("Keras block", block),
      ("block on Large layers", large),
      ("FoldedBlock", ours),
    ):
      print(
        f"{name:24s}{_cell(row, 'seconds', 1e-3, ' ms'):>12s}"
        f"{_cell(row, 'extra_bytes', MiB, ''):>10s}"
        f"{_cell(row, 'tensor_bytes', MiB, ''):>13s}"
      )
    for name, row in (("Keras block", block), ("block on Large layers", large)):
      print(
        f"FoldedBlock vs {name}: {_ratio(row, ours, 'seconds')} faster, "
        f"{_ratio(row, ours, 'extra_bytes')} less RSS, "
        f"{_ratio(row, ours, 'tensor_bytes')} less tensor memory"
      )
    infer, folded = r["keras block/infer"], r["fold(block)/infer"]
    print(
      f"inference: Keras block {_cell(infer, 'seconds', 1e-3, ' ms')}, fold(block) "
      f"{_cell(folded, 'seconds', 1e-3, ' ms')} ({_ratio(infer, folded, 'seconds')})"
    )
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, "bench_fold.json")
  with open(path, "w", encoding="ascii") as f:
    json.dump(
      {
        "meta": {
          "cores": len(os.sched_getaffinity(0)),
          "batch": BATCH,
          "size": SIZE,
          "channels": CHANNELS,
        },
        "results": {str(k): v for k, v in results.items()},
      },
      f,
      indent=1,
    )
  print(f"wrote {path}")
  return 0


if __name__ == "__main__":
  print(
    json.dumps(
      _worker(int(sys.argv[1]), sys.argv[2], sys.argv[3], tensors=sys.argv[4:] == ["tensors"])
    )
  )
