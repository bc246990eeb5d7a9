"""The cost model's error on the move to kept filter spectra: the evidence for
tf_largeconv.planning.kept_spectra.KEPT_SPECTRA_MARGIN.

  python -m benchmarks.cpu.kept_margin [--out DIR] [--passes N]

An eager forward pass moves to the op's FFT with the filter's spectra kept where the planner
prices that FFT below the pass's route (TF's kernel, or the op's direct kernels) by the
margin. This times the two at every forward point of the planner sweep's full grids
(benchmarks/cpu/sweep.py, `points(full=True)`) where the choice is in play, that is where
the kept FFT is priced below the route at all (`kept_spectra.move_price`): with TF's oneDNN
kernels and with its Eigen ones (TF_ENABLE_ONEDNN_OPTS=1 and 0; the planner prices TF's
passes as the set TF runs), each setting in fresh processes, alternating, --passes times.
Each point interleaves the two calls (each timed call right after an untimed one of its
own) for ROUND_S seconds, and each keeps its minimum over every pass; the FFT's filter
tensor is the same throughout, so its spectra are kept.

A point's error is the measured ratio (kept FFT over route) over the priced one. Prints a
row per point and, per kernel set and over both, the median error (the margin's value) and
what margins around it would move; writes DIR/kept_spectra_margin.json.
"""

import argparse
import functools
import json
import os
import statistics
import sys
import time

from benchmarks import measure
from benchmarks.cpu import sweep

KERNEL_SETS = {"onednn": "1", "eigen": "0"}  # TF_ENABLE_ONEDNN_OPTS
ROUND_S = 1.5
MIN_ROUNDS = 10
MARGINS = (1.0, 1.2, 1.45, 1.6)  # the summary's, with KEPT_SPECTRA_MARGIN's value


def _in_play(point):
  """(priced ratio, "tf" or "direct": the route's forward pass) where the move of this
  sweep point's forward pass is priced below its route, else None."""
  import tensorflow as tf

  from tf_largeconv._problem import ConvProblem
  from tf_largeconv.planning import kept_spectra
  from tf_largeconv.planning import routing

  k, ci, co, n, side, _ = point
  x_shape, f_shape = [n, *sweep.image_hw(side), ci], [k, k, ci, co]
  attrs = ConvProblem.conv2d(1, "SAME", "NHWC", None)
  with tf.device("CPU:0"):
    placed = tf.zeros(())
  routes = routing.at_batch(routing.schedule(x_shape, f_shape, tf.float32, placed, attrs), n)
  price = kept_spectra.move_price(tuple(x_shape), tuple(f_shape), attrs, "float32", routes)
  if price is None or price[0] >= price[1]:
    return None
  return price[0] / price[1], "tf" if routes.forward else "direct"


def _interleaved(convs, x, w):
  """{name: minimum seconds of convs[name](x, w)}, the calls interleaved for ROUND_S
  seconds (MIN_ROUNDS at least), each timed one right after an untimed one of its own."""
  for conv in convs.values():  # plans, kernels, the kept spectra
    for _ in range(3):
      conv(x, w).numpy()
  best = {name: float("inf") for name in convs}
  start, rounds = time.perf_counter(), 0
  while rounds < MIN_ROUNDS or time.perf_counter() - start < ROUND_S:
    for name in sorted(convs, reverse=rounds % 2 == 1):
      convs[name](x, w).numpy()
      t0 = time.perf_counter()
      convs[name](x, w).numpy()
      best[name] = min(best[name], time.perf_counter() - t0)
    rounds += 1
  return best


def _child():
  """Runs in a fresh process (its TF_ENABLE_ONEDNN_OPTS set): every point in play."""
  import numpy as np
  import tensorflow as tf

  import tf_largeconv as lc

  rng = np.random.default_rng(0)
  rows = []
  for point in sweep.points(full=True):
    k, ci, co, n, side, mode = point
    priced = _in_play(point) if mode == "forward" else None
    if priced is None:
      continue
    x = tf.constant(rng.random((n, *sweep.image_hw(side), ci), dtype=np.float32))
    w = tf.constant((rng.standard_normal((k, k, ci, co)) / k).astype(np.float32))
    route = (
      functools.partial(tf.nn.conv2d, strides=1, padding="SAME")
      if priced[1] == "tf"
      else functools.partial(lc.conv2d, strides=1, padding="SAME", algorithm="direct")
    )
    fft = functools.partial(lc.conv2d, strides=1, padding="SAME", algorithm="fft")
    best = _interleaved({"route": route, "fft": fft}, x, w)
    rows.append({"point": point, "priced": priced[0], "route": priced[1], "seconds": best})
    print(f"{point} {priced[0]:.3f} {best['fft'] / best['route']:.3f}", file=sys.stderr, flush=True)
  return rows


def _summary(rows):
  """Lines: the median error and what each of MARGINS and KEPT_SPECTRA_MARGIN would move,
  per kernel set and over both."""
  from tf_largeconv.planning import kept_spectra

  margins = sorted(set(MARGINS) | {kept_spectra.KEPT_SPECTRA_MARGIN})
  lines = []
  for name in list(KERNEL_SETS) + ["both"]:
    some = [r for r in rows if name in (r["kernels"], "both")]
    if not some:
      continue
    lines.append(
      f"{name}: {len(some)} points, median error {statistics.median(r['error'] for r in some):.3f}"
    )
    for m in margins:
      moved = [r for r in some if r["priced"] * m < 1]
      missed = sum(r["measured"] > sweep.MISS for r in moved)
      given_up = sum(r["measured"] < 1 for r in some if r["priced"] * m >= 1)
      lines.append(
        f"  margin {m:.2f}: {len(moved)} move, {missed} of them over "
        f"{sweep.MISS:.2f}x their route; {given_up} that ran faster stay"
      )
  return lines


def main(out_dir, passes=2):
  """Runs the children, --passes times per kernel set, alternating sets."""
  timed = {}
  for _ in range(passes):
    for name, setting in KERNEL_SETS.items():
      got = measure.run_child(
        ["-m", "benchmarks.cpu.kept_margin", "--child"], timeout=3600, TF_ENABLE_ONEDNN_OPTS=setting
      )
      if "error" in got:
        print(f"{name}: {got['error']}")
        return 1
      for r in got["rows"]:
        key = (name, json.dumps(r["point"]))
        if key in timed:
          for a, t in r["seconds"].items():
            timed[key]["seconds"][a] = min(timed[key]["seconds"][a], t)
        else:
          timed[key] = dict(r, kernels=name)
  rows = sorted(timed.values(), key=lambda r: (r["kernels"], r["priced"]))
  print(
    f"{'kernels':>8s}{'k':>4s}{'in':>5s}{'out':>5s}{'n':>4s}{'image':>9s}{'route':>8s}"
    f"{'route ms':>10s}{'fft ms':>9s}{'priced':>8s}{'measured':>10s}{'error':>7s}"
  )
  for r in rows:
    s = r["seconds"]
    r["measured"] = s["fft"] / s["route"]
    r["error"] = r["measured"] / r["priced"]
    k, ci, co, n, side, _ = r["point"]
    image = "x".join(map(str, sweep.image_hw(side)))
    print(
      f"{r['kernels']:>8s}{k:>4d}{ci:>5d}{co:>5d}{n:>4d}{image:>9s}{r['route']:>8s}"
      f"{s['route'] * 1e3:>10.3f}{s['fft'] * 1e3:>9.3f}{r['priced']:>8.3f}"
      f"{r['measured']:>10.3f}{r['error']:>7.2f}"
    )
  summary = _summary(rows)
  print("\n" + "\n".join(summary))
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, "kept_spectra_margin.json")
  with open(path, "w", encoding="ascii") as f:
    json.dump(
      {"threads": len(os.sched_getaffinity(0)), "passes": passes, "summary": summary, "rows": rows},
      f,
      indent=1,
    )
  print(f"wrote {path}")
  return 0


if __name__ == "__main__":
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
    "--out",
    default=measure.RESULTS_DIR,
    help="where kept_spectra_margin.json goes (default: benchmarks/results/cpu)",
  )
  parser.add_argument(
    "--passes", type=int, default=2, help="fresh processes per kernel set, each timing every point"
  )
  parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    print(json.dumps({"rows": _child()}))
  else:
    sys.exit(main(args.out, args.passes))
