"""Two builds of the CPU kernels against each other in one process: each build's
`tf_largeconv._core` is loaded under a name of its own, and one pass of a bench case (its
shapes from bench.py's CASES) runs on each in turn, round after round, so that a shared
machine's load falls on both alike. Prints each build's best time and the ratio per round
and overall.

  python -m benchmarks.cpu.ab_core A_DIR B_DIR CASE [--pass forward] [--rounds 7]
      [--threads 1] [--dtype float32]

A_DIR and B_DIR are package folders holding a built `_core*.so` (e.g. /work/main/tf_largeconv
and ./tf_largeconv). The instruction-set level is LARGECONV_ISA's, as for the package."""

import argparse
import glob
import importlib.util
import os
import time

import numpy as np

from benchmarks.cpu.bench import CASES


def _load(folder, tag):
  """`_core` of the package folder `folder`, as module `tag._core`."""
  path = glob.glob(os.path.join(folder, "_core*.so"))[0]
  spec = importlib.util.spec_from_file_location(f"{tag}._core", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _call(core, name, x, w, dy, threads):
  kw = dict(algorithm="fft", num_threads=threads)
  strides = [1, 1, 1, 1]
  if name == "forward":
    return lambda: core.conv2d(x, w, strides, "SAME", **kw)
  if name == "backprop_input":
    return lambda: core.conv2d_backprop_input(list(x.shape), w, dy, strides, "SAME", **kw)
  return lambda: core.conv2d_backprop_filter(x, list(w.shape), dy, strides, "SAME", **kw)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("a")
  parser.add_argument("b")
  parser.add_argument("case")
  parser.add_argument("--pass", dest="pass_name", default="forward")
  parser.add_argument("--rounds", type=int, default=7)
  parser.add_argument("--threads", type=int, default=1)
  parser.add_argument("--dtype", default="float32")
  args = parser.parse_args()
  x_shape, w_shape, strides, padding = CASES[args.case][:4]
  if strides != 1 or padding != "SAME":
    parser.error(f"{args.case}: only stride-1 SAME cases")
  rng = np.random.default_rng(0)
  x = rng.standard_normal(x_shape).astype(args.dtype)
  w = rng.standard_normal(w_shape).astype(args.dtype)
  dy = rng.standard_normal((*x_shape[:3], w_shape[3])).astype(args.dtype)
  runs = {
    tag: _call(_load(folder, tag), args.pass_name, x, w, dy, args.threads)
    for tag, folder in (("a", args.a), ("b", args.b))
  }
  best = {"a": float("inf"), "b": float("inf")}
  for tag in runs:  # warm-up: plans and kept filter spectra
    runs[tag]()
  for r in range(args.rounds):
    this = {}
    for tag, run in runs.items():
      t0 = time.perf_counter()
      run()
      this[tag] = time.perf_counter() - t0
      best[tag] = min(best[tag], this[tag])
    a, b = this["a"], this["b"]
    print(f"round {r}: a {a * 1e3:.1f} ms, b {b * 1e3:.1f} ms, b/a {b / a:.2f}")
  print(
    f"{args.case} {args.pass_name} x{args.threads} {args.dtype} "
    f"ISA={os.environ.get('LARGECONV_ISA', 'avx')}: best a {best['a'] * 1e3:.1f} ms, "
    f"b {best['b'] * 1e3:.1f} ms, b/a {best['b'] / best['a']:.2f}"
  )


if __name__ == "__main__":
  main()
