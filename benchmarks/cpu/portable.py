"""Benchmark of the portable path (`python -m benchmarks.cpu.bench --cases portable`).

Two tables, every measurement in a fresh process:
- the seed forward case (10 frames of 321x481, 135x135x1x3 VALID) through the op
  (algorithm='auto'), the portable path eagerly, the portable path compiled by XLA
  (tf.function(jit_compile=True) around algorithm='auto'), and tf.nn.conv2d: warm time (min
  over runs) and peak extra memory (VmHWM growth over the first run);
- examples/train_large_kernel.py trained with Keras jit_compile=True and without: loss per
  epoch and seconds per epoch after the first (which traces and compiles).
"""

import json
import os
import re
import subprocess
import sys

from benchmarks import measure

MiB = 2**20
SEED = ((10, 321, 481, 1), (135, 135, 1, 3))
IMPLS = ("op", "portable", "portable_xla", "tf.nn.conv2d")
EXAMPLE = os.path.join(measure.REPO_ROOT, "examples", "train_large_kernel.py")


def _worker(impl):
  """Runs in a fresh process: one implementation of the seed forward case."""
  import numpy as np
  import tensorflow as tf

  import tf_largeconv as lc

  rng = np.random.default_rng(0)
  x = tf.constant(rng.random(SEED[0], dtype=np.float32))
  w = tf.constant((rng.standard_normal(SEED[1]) / 135**2).astype(np.float32))
  if impl == "op":
    conv = lambda: lc.conv2d(x, w, 1, "VALID")  # noqa: E731
  elif impl == "portable":
    conv = lambda: lc.conv2d(x, w, 1, "VALID", algorithm="portable")  # noqa: E731
  elif impl == "portable_xla":
    conv = tf.function(lambda: lc.conv2d(x, w, 1, "VALID"), jit_compile=True)
  else:
    conv = lambda: tf.nn.conv2d(x, w, 1, "VALID")  # noqa: E731
  seconds, extra = measure.measure(
    lambda: conv().numpy(), repeats=2 if impl == "tf.nn.conv2d" else 5
  )
  return {"seconds": seconds, "extra_bytes": extra}


def _example(jit, timeout):
  """examples/train_large_kernel.py in a child: its losses and seconds per epoch."""
  args = [sys.executable, EXAMPLE, "--steps", "20", "--epochs", "3"]
  args += ["--jit-compile"] if jit else []
  env = measure.child_env(TF_CPP_MIN_LOG_LEVEL="3")
  try:
    out = subprocess.run(
      args, capture_output=True, text=True, timeout=timeout, env=env, check=True
    ).stdout
  except (subprocess.TimeoutExpired, subprocess.CalledProcessError) as e:
    return {"error": str(e).splitlines()[0]}

  def numbers(key):
    return [float(v) for v in re.search(key + r": (.*)", out).group(1).split(", ")]

  return {
    "loss": numbers("loss per epoch"),
    "seconds": numbers("seconds per epoch"),
    "jit_compile": "jit_compile: True" in out,
  }


def main(out_dir, timeout=900):
  results = {}
  print("seed forward, 10 frames of 321x481, 135x135x1x3 VALID")
  print(f"{'implementation':16s}{'time':>10s}{'vs TF':>8s}{'vs op':>8s}{'MiB extra':>11s}")
  for impl in IMPLS:
    results[impl] = measure.run_child(
      [
        "-c",
        f"import json; from benchmarks.cpu import portable as b; "
        f"print(json.dumps(b._worker({impl!r})))",
      ],
      timeout,
    )
  tf_s = results["tf.nn.conv2d"].get("seconds")
  op_s = results["op"].get("seconds")
  for impl in IMPLS:
    r = results[impl]
    if "error" in r:
      print(f"{impl:16s}  failed: {r['error']}")
      continue
    vs_tf = f"{tf_s / r['seconds']:.1f}x" if tf_s else "-"
    vs_op = f"{r['seconds'] / op_s:.2f}" if op_s else "-"
    print(
      f"{impl:16s}{r['seconds'] * 1e3:8.1f}ms{vs_tf:>8s}{vs_op:>8s}{r['extra_bytes'] / MiB:11.1f}",
      flush=True,
    )
  print("(vs TF: tf.nn.conv2d's time / this; vs op: this / the op's time)")
  if os.path.exists(EXAMPLE):
    print("\nexamples/train_large_kernel.py (20 steps of 8 per epoch, 3 epochs)")
    for jit in (False, True):
      r = _example(jit, timeout)
      results[f"example_jit_{jit}"] = r
      if "error" in r:
        print(f"jit_compile={jit}: failed: {r['error']}")
        continue
      losses = ", ".join(f"{v:.3f}" for v in r["loss"])
      print(
        f"jit_compile={str(r['jit_compile']):5s} loss {losses}; seconds per epoch "
        f"{', '.join(f'{v:.2f}' for v in r['seconds'])}",
        flush=True,
      )
  else:
    print(f"\n{EXAMPLE} not found (an installed package): the training rows are skipped")
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, "bench_portable.json"), "w", encoding="ascii") as f:
    json.dump(results, f, indent=1)
  print(f"wrote {os.path.join(out_dir, 'bench_portable.json')}")
