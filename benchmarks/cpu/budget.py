"""Budget sweep: forward time against `workspace_limit`, for the planner's choice ("auto")
and each algorithm that fits the limit, one process, warm times.

  python -m benchmarks.cpu.bench --cases budget [--out DIR]

A larger limit must never make a plan slower (the planner only gains candidates), and at
every limit "auto" should be as fast as the fastest algorithm that fits it. The direct
kernels take no workspace, so their time is one line across the sweep; TensorFlow's own
kernel counts as fitting from its estimated workspace up (`plan()` reports it). Writes
DIR/budget.json and DIR/budget.png.
"""

import json
import os
import time

from benchmarks import measure

KiB, MiB = 2**10, 2**20
LIMITS = (
  256 * KiB,
  384 * KiB,
  512 * KiB,
  768 * KiB,
  MiB,
  3 * MiB // 2,
  2 * MiB,
  3 * MiB,
  4 * MiB,
  8 * MiB,
  16 * MiB,
  64 * MiB,
  256 * MiB,
)
# name: (input NHWC, filter HWIO, padding)
SWEEP_CASES = {
  "seed 4x321x481x1 * 135x135x1x3 VALID": ((4, 321, 481, 1), (135, 135, 1, 3), "VALID"),
  "k63 1x128x128x16 * 63x63x16x16 SAME": ((1, 128, 128, 16), (63, 63, 16, 16), "SAME"),
}


def _best_time(fn, repeats):
  """Min over `repeats` warm calls."""
  fn()
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - t0)
  return best


def _interleaved_min(calls, seconds, min_rounds=3):
  """Min time of each call over rounds that run every call once, in a new random order each
  round, until `seconds` are spent (at least `min_rounds`): a slow spell of the machine hits
  all calls alike instead of one limit."""
  import random

  for fn in calls.values():  # warm: plans, kernels, allocations
    fn()
  best = dict.fromkeys(calls, float("inf"))
  order, start, rounds = list(calls), time.perf_counter(), 0
  rand = random.Random(0)
  while rounds < min_rounds or time.perf_counter() - start < seconds:
    rand.shuffle(order)
    for key in order:
      t0 = time.perf_counter()
      calls[key]()
      best[key] = min(best[key], time.perf_counter() - t0)
    rounds += 1
  return best


def sweep(seconds_per_case=90):
  """Returns {case: {"limits": [...], "auto": [s], "fft": [s or None], "choice": [...],
  "direct": s, "tf": s, "tf_bytes": bytes}}."""
  import numpy as np
  import tensorflow as tf

  rng = np.random.default_rng(0)
  results = {}
  for name, (x_shape, w_shape, padding) in SWEEP_CASES.items():
    x = tf.constant(rng.random(x_shape, dtype=np.float32))
    w = tf.constant((rng.standard_normal(w_shape) / (w_shape[0] * w_shape[1])).astype(np.float32))
    results[name] = _sweep_case(x, w, padding, seconds_per_case)
    _print_case(name, results[name])
  return results


def _sweep_case(x, w, padding, seconds):
  import tensorflow as tf

  import tf_largeconv as lc

  x_shape, w_shape = tuple(x.shape), tuple(w.shape)

  def conv(limit=None, algorithm="auto"):
    return lambda: lc.conv2d(x, w, 1, padding, workspace_limit=limit, algorithm=algorithm).numpy()

  choice, calls = [], {}
  for limit in LIMITS:
    plan = lc.plan(x_shape, w_shape, 1, padding, workspace_limit=limit).forward
    choice.append(plan.algorithm)
    if plan.algorithm != "direct":  # auto's direct choices are timed once, below
      calls[("auto", limit)] = conv(limit)
    try:  # plan() would refuse the FFT when any pass misses the limit; this is the forward
      conv(limit, "fft")()
    except tf.errors.InvalidArgumentError:  # the FFT does not fit this limit
      continue
    calls[("fft", limit)] = conv(limit, "fft")
  best = _interleaved_min(calls, seconds)
  direct = _best_time(conv(algorithm="direct"), 2)
  return {
    "limits": list(LIMITS),
    "choice": choice,
    "auto": [best.get(("auto", limit), direct) for limit in LIMITS],
    "fft": [best.get(("fft", limit)) for limit in LIMITS],
    "direct": direct,
    "tf": _best_time(lambda: tf.nn.conv2d(x, w, 1, padding).numpy(), 2),
    "tf_bytes": lc.plan(x_shape, w_shape, 1, padding, algorithm="tf").forward.workspace_bytes,
  }


def _fastest_fitting(row, i):
  """Seconds of the fastest algorithm that fits limit i (direct always does)."""
  times = [row["direct"]]
  if row["fft"][i] is not None:
    times.append(row["fft"][i])
  if row["tf_bytes"] <= row["limits"][i]:
    times.append(row["tf"])
  return min(times)


def _print_case(name, row):
  print(
    f"\n{name}: direct {row['direct'] * 1e3:.1f} ms, tf.nn.conv2d "
    f"{row['tf'] * 1e3:.1f} ms (fits from {row['tf_bytes'] / MiB:.1f} MiB)"
  )
  print(
    f"{'limit':>10s}{'auto picks':>11s}{'auto':>11s}{'fft':>11s}{'auto/best':>11s}"
    f"{'vs smaller':>12s}"
  )
  best_so_far = float("inf")
  for i, limit in enumerate(row["limits"]):
    auto, fft = row["auto"][i], row["fft"][i]
    fft_s = f"{fft * 1e3:.1f} ms" if fft is not None else "-"
    slower = auto / best_so_far if best_so_far < float("inf") else 1.0
    print(
      f"{limit / MiB:>8.2f}Mi{row['choice'][i]:>11s}{auto * 1e3:>8.1f} ms{fft_s:>11s}"
      f"{auto / _fastest_fitting(row, i):>10.2f}x{slower:>11.2f}x"
    )
    best_so_far = min(best_so_far, auto)


def _plot(results, path):
  plt = measure.pyplot()
  if plt is None:
    return
  fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 4))
  for ax, (name, row) in zip(list(axes), results.items()):
    mib = [limit / MiB for limit in row["limits"]]
    ax.plot(mib, [t * 1e3 for t in row["auto"]], "o-", label="auto")
    fft = [(m, t * 1e3) for m, t in zip(mib, row["fft"]) if t is not None]
    ax.plot([m for m, _ in fft], [t for _, t in fft], "s--", label='algorithm="fft"')
    ax.axhline(row["direct"] * 1e3, color="gray", ls=":", label='algorithm="direct"')
    tf_from = [m for m in mib if m * MiB >= row["tf_bytes"]]
    if tf_from:
      ax.plot([tf_from[0], mib[-1]], [row["tf"] * 1e3] * 2, "k-.", label="tf.nn.conv2d")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("workspace_limit (MiB)")
    ax.set_ylabel("forward time (ms)")
    ax.set_title(name, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
  fig.suptitle(f"time against workspace_limit, float32, {len(os.sched_getaffinity(0))} cores")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  print(f"wrote {path}")


def main(out_dir):
  results = sweep()
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, "budget.json"), "w", encoding="ascii") as f:
    json.dump(results, f, indent=1)
  print(f"wrote {os.path.join(out_dir, 'budget.json')}")
  _plot(results, os.path.join(out_dir, "budget.png"))
  print(
    "auto/best: auto against the fastest algorithm that fits the limit; vs smaller: auto "
    "against the best auto time at any smaller limit"
  )
  return 0
