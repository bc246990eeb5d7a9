"""Fits the CPU planner's cost model (cc/core/plan/cost_model.cc) to measurements on this machine.

  PYTHONPATH=. python tools/calibrate_cpu.py [--seconds S] [--tf | --direct | --model-ratio]

One intra-op thread, float32, warm times (min over repeats). The op's forward pass (two
fits), or with --tf TensorFlow's three kernels (a third):

- FFT: every distinct configuration the planner makes for a grid of problems and workspace
  limits (algorithm="fft") is timed, and the time is fitted, relative error weighted and
  with non-negative coefficients, as
      a * transform points + b * transforms + c * complex multiply-adds
        + e * filter values read from memory
  using the counts the plan itself reports (`PassPlan.fft_work`), so the fit prices exactly
  what the model counts. A further column, transform points x log2(points), tests whether
  the transforms' butterfly work shows at these sizes. Reads equal multiply-adds except in
  plans that run several tiles per item, so c and e separate only where the grid has such
  plans (large channel blocks); elsewhere their sum is what the fit determines.
- Direct (also alone, with --direct): each pass's kernels over a grid of filter sizes and
  channel pairs (grouped and depthwise too), their rate fitted per pass as
      min(peak, base * max(1, lanes / at_base))
  with lanes the destination channels per group, the dimension the kernels' inner loop
  runs over (a grid search for the least squared log error).
- TensorFlow's kernels (`--tf`): tf.nn.conv2d and its two backprop ops, timed over filter
  sizes 1-15, channel pairs 1->1 to 128->128 and batch 1 and 8 (images sized for about
  0.4 GFLOP) and a few larger images with many channels, each pass fitted, relative error
  weighted, non-negative, as
      a * flops + b * P K ci + c * P K co + d * P + e * P K
        + f * P K ci [big] + h * P [small] + g
  with P the output pixels (batch x height x width), K the filter's taps, ci and co the
  channels, [big] 1 where one image's patch matrix (its output pixels x K x ci values)
  exceeds kTfBigPatchBytes: TF's backprop kernels slow down sharply there; and [small] 1
  for a 3x3 or 5x5 filter on fewer than 8 input channels, where TF's forward kernel pays
  a cost per pixel that the other terms miss by several times. g, the
  cost of a call, is printed less the op's own (a 1x1 filter on one pixel, timed alike),
  which both pay; cost_model.cc adds it to each pass TF runs. TF runs one of two
  sets of CPU kernels, oneDNN's or Eigen's (plan.h's TfKernels says which, as TF decides
  it; TF_ENABLE_ONEDNN_OPTS=0 or 1 picks either), and each has its row of
  kTfCoefficients: the fit is of the set this process runs. With oneDNN the filter
  gradient of filters of 15x15 and more takes a slow path on some shapes (orders of
  magnitude slower than 13x13) that no term here describes: those rows are
  printed and left out of that pass's fit.

Prints the fitted constants and each configuration's predicted/measured ratio. Copy the
constants into plan/cost_model.cc, and the machine and the figures into the commit message and the
benchmark results.

With --model-ratio, times the FFT configurations and the direct kernels as above and prints
the shipped model's seconds over the measured (median): a TF fit made on a machine other
than the one the op's constants were fitted on is scaled by it (kOneDnnFitToModelSeconds),
so that the two compare as they ran there.
"""

import argparse
import itertools
import math
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

KiB = 2**10
FFT_PROBLEMS = [  # (input NHWC, filter HWIO, padding)
  ((4, 321, 481, 1), (135, 135, 1, 3), "VALID"),
  ((1, 128, 128, 16), (63, 63, 16, 16), "SAME"),
  ((8, 64, 64, 32), (21, 21, 32, 32), "SAME"),
  ((2, 200, 200, 4), (41, 41, 4, 8), "SAME"),
  ((1, 256, 256, 3), (31, 31, 3, 3), "SAME"),
  ((8, 64, 64, 32), (15, 15, 32, 32), "SAME"),
]
LIMITS = [int(256 * KiB * 2 ** (k / 2)) for k in range(17)]  # 256 KiB .. 64 MiB
# (in channels, out channels, groups) and filter sides of the direct kernels' grid.
DIRECT_CHANNELS = [
  (1, 1, 1),
  (1, 3, 1),
  (3, 3, 1),
  (1, 8, 1),
  (8, 1, 1),
  (1, 16, 1),
  (16, 1, 1),
  (4, 8, 1),
  (8, 8, 1),
  (8, 32, 1),
  (32, 8, 1),
  (16, 16, 1),
  (32, 32, 1),
  (32, 32, 32),
  (32, 32, 4),
  (8, 64, 1),
  (64, 64, 1),
  (128, 128, 1),
]
DIRECT_KS = (3, 7, 15)


def _min_time(fn, seconds):
  fn()
  best, spent = float("inf"), 0.0
  while spent < seconds or best == float("inf"):
    t0 = time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    best, spent = min(best, dt), spent + dt
  return best


def _fft_call(lc, x, w, padding, limit):
  return lambda: lc.conv2d(x, w, 1, padding, workspace_limit=limit, algorithm="fft").numpy()


def fft_rows(seconds):
  import numpy as np
  import tensorflow as tf

  import tf_largeconv as lc

  rng = np.random.default_rng(0)
  rows = []
  for x_shape, w_shape, padding in FFT_PROBLEMS:
    x = tf.constant(rng.random(x_shape, dtype=np.float32))
    w = tf.constant(rng.random(w_shape, dtype=np.float32))
    seen = set()
    for limit in LIMITS:
      try:
        p = lc.plan(x_shape, w_shape, 1, padding, workspace_limit=limit, algorithm="fft").forward
      except ValueError:
        continue
      key = (p.fft_size, p.tiles, p.out_block, p.group_block)
      if key in seen:
        continue
      seen.add(key)
      t = _min_time(_fft_call(lc, x, w, padding, limit), seconds)
      rows.append((x_shape, w_shape, p, t))
      print(
        f"  {x_shape} * {w_shape} limit {limit // KiB} KiB: fft {p.fft_size} tiles "
        f"{p.tiles} out_block {p.out_block}: {t * 1e3:.1f} ms",
        flush=True,
      )
  return rows


def fit_fft(rows):
  import numpy as np
  from scipy.optimize import nnls

  def features(p):
    w = p.fft_work
    n = p.fft_size[0] * p.fft_size[1]
    return [
      w["transform_points"],
      w["transforms"],
      w["complex_macs"],
      w["transform_points"] * math.log2(n),
      w["filter_reads"],
    ]

  x = np.array([features(p) for _, _, p, _ in rows], float)
  y = np.array([t for *_, t in rows])
  coef, _ = nnls(x / y[:, None], np.ones_like(y))
  ratio = x @ coef / y
  print(
    "\nFFT: seconds = a * points + b * transforms + c * complex MACs + d * points log2 N"
    " + e * filter reads"
  )
  print(
    f"  a = {coef[0]:.3g} s/point, b = {coef[1]:.3g} s/transform, c = {coef[2]:.3g} "
    f"s/MAC, d = {coef[3]:.3g}, e = {coef[4]:.3g} s/read"
  )
  err = np.abs(ratio - 1)
  print(
    f"  |predicted/measured - 1|: median {np.median(err):.3f}, 90th percentile "
    f"{np.percentile(err, 90):.3f}, max {err.max():.3f} over {len(rows)} configurations"
  )
  for (x_shape, w_shape, p, t), r in zip(rows, ratio):
    print(
      f"  {'x'.join(map(str, x_shape))} * {'x'.join(map(str, w_shape))} fft "
      f"{p.fft_size} tiles {p.tiles} out_block {p.out_block}: {t * 1e3:.1f} ms, "
      f"predicted/measured {r:.2f}"
    )


def direct_rows(seconds):
  """[(pass, lanes, flops, seconds, modelled seconds)] of the direct kernels, each pass,
  SAME, float32, one image: lanes are the destination channels per group its inner loop
  runs over; the model's seconds are cost_model.cc's for the pass."""
  import numpy as np
  import tensorflow as tf

  import tf_largeconv as lc

  rng = np.random.default_rng(0)
  rows = []
  print("Direct kernels (one thread, SAME), ms per pass and GFLOP/s:")
  for (ci, co, groups), k in itertools.product(DIRECT_CHANNELS, DIRECT_KS):
    icpg, ocpg = ci // groups, co // groups
    side = max(16, min(256, int(math.sqrt(2e8 / (2 * k * k * icpg * co)))))
    x = tf.constant(rng.random((1, side, side, ci), dtype=np.float32))
    w = tf.constant(rng.random((k, k, icpg, co), dtype=np.float32))
    dy = tf.constant(rng.random((1, side, side, co), dtype=np.float32))
    calls = (
      lambda x=x, w=w: lc.conv2d(x, w, 1, "SAME", algorithm="direct").numpy(),
      lambda x=x, w=w, dy=dy: lc.conv2d_backprop_input(
        x.shape, w, dy, 1, "SAME", algorithm="direct"
      ).numpy(),
      lambda x=x, w=w, dy=dy: lc.conv2d_backprop_filter(
        x, w.shape, dy, 1, "SAME", algorithm="direct"
      ).numpy(),
    )
    flops = 2.0 * side * side * k * k * icpg * co
    times = [_min_time(c, seconds) for c in calls]
    modelled = [
      p.estimated_seconds["direct"]
      for p in lc.plan(x.shape, w.shape, 1, "SAME", algorithm="direct").passes
    ]
    for name, lanes, t, m in zip(TF_PASSES, (ocpg, icpg, ocpg), times, modelled):
      rows.append((name, lanes, flops, t, m))
    print(
      f"  {k}x{k} {ci}->{co} groups {groups} {side}x{side}: "
      + ", ".join(f"{t * 1e3:.2f} ({flops / t / 1e9:.1f})" for t in times),
      flush=True,
    )
  return rows


def direct_rate(lanes, base, at_base, peak):
  """cost_model.cc's direct rate (FLOP/s) for `lanes` destination channels per group (an array
  of them)."""
  import numpy as np

  return np.minimum(peak, base * np.maximum(1.0, lanes / at_base))


def fit_direct(rows):
  """Per pass, the (base, at_base, peak) of `direct_rate` with the least squared log
  error over `rows` (a grid search)."""
  import numpy as np

  print("\nDirect: rate = min(peak, base * max(1, lanes / at_base)) per pass")
  for name in TF_PASSES:
    mine = [r for r in rows if r[0] == name]
    lanes = np.array([r[1] for r in mine], float)
    rate = np.array([r[2] / r[3] for r in mine])
    best = None
    for base, at_base, peak in itertools.product(
      np.geomspace(1e9, 40e9, 60),
      (1, 2, 3, 4, 6, 8, 9, 12, 16, 24, 32),
      np.geomspace(5e9, 80e9, 40),
    ):
      err = np.log(direct_rate(lanes, base, at_base, peak) / rate)
      if best is None or (err**2).sum() < best[0]:
        best = ((err**2).sum(), base, at_base, peak, np.abs(err))
    _, base, at_base, peak, err = best
    print(
      f"  {name}: base {base:.3g} FLOP/s, at_base {at_base}, peak {peak:.3g} FLOP/s; "
      f"predicted/measured off by a factor of: median {np.exp(np.median(err)):.2f}, "
      f"90th percentile {np.exp(np.percentile(err, 90)):.2f}, max {np.exp(err.max()):.2f}"
    )


TF_CHANNELS = [
  (1, 1),
  (1, 8),
  (8, 1),
  (3, 16),
  (8, 8),
  (8, 32),
  (32, 8),
  (16, 16),
  (32, 32),
  (32, 128),
  (128, 32),
  (64, 64),
  (128, 128),
]
# Larger images with many channels, whose patch matrices the grid above keeps small.
TF_LARGE_IMAGES = [
  (7, 128, 128, 1, 64),
  (3, 8, 8, 1, 512),
  (7, 32, 32, 1, 128),
  (15, 128, 128, 1, 64),
  (5, 64, 64, 2, 96),
  (7, 32, 32, 8, 64),
  (3, 32, 32, 4, 128),
  (7, 8, 32, 4, 128),
]
# Calls of tens of microseconds, which pin down the cost of a call itself.
TF_SMALL_CALLS = [
  (3, 8, 8, 1, 32),
  (1, 8, 8, 2, 32),
  (3, 32, 32, 1, 16),
  (1, 32, 32, 8, 64),
  (5, 1, 1, 1, 32),
  (1, 1, 1, 1, 16),
]
TF_BIG_PATCH_BYTES = 64 * 2**20  # cost_model.cc's kTfBigPatchBytes
TF_SMALL_FILTER, TF_FEW_CHANNELS = 5, 8  # cost_model.cc's kTfSmallFilter, kTfFewChannels
TF_PASSES = ("forward", "backprop_input", "backprop_filter")
ONEDNN_SLOW_FILTER = 15  # filter side from which oneDNN's filter gradient can run slow


def tf_rows(seconds):
  """[(k, ci, co, batch, side, [seconds of each pass])] for TF's kernels, SAME, float32."""
  import numpy as np
  import tensorflow as tf

  rng = np.random.default_rng(0)
  rows = []
  grid = []
  for k in (1, 3, 5, 7, 11, 15):
    for (ci, co), n in itertools.product(TF_CHANNELS, (1, 8)):
      side = max(24, min(512, int(math.sqrt(4e8 / (2 * k * k * ci * co * n)))))
      if n * side * side * max(ci, co) * 4 <= 64e6:
        grid.append((k, ci, co, n, side))
  for k, ci, co, n, side in grid + TF_LARGE_IMAGES + TF_SMALL_CALLS:
    x = tf.constant(rng.random((n, side, side, ci), dtype=np.float32))
    w = tf.constant(rng.random((k, k, ci, co), dtype=np.float32))
    dy = tf.constant(rng.random((n, side, side, co), dtype=np.float32))
    calls = (
      lambda x=x, w=w: tf.nn.conv2d(x, w, 1, "SAME").numpy(),
      lambda x=x, w=w, dy=dy: tf.raw_ops.Conv2DBackpropInput(
        input_sizes=x.shape, filter=w, out_backprop=dy, strides=[1, 1, 1, 1], padding="SAME"
      ).numpy(),
      lambda x=x, w=w, dy=dy: tf.raw_ops.Conv2DBackpropFilter(
        input=x, filter_sizes=w.shape, out_backprop=dy, strides=[1, 1, 1, 1], padding="SAME"
      ).numpy(),
    )
    rows.append((k, ci, co, n, side, [_min_time(c, seconds) for c in calls]))
    print(
      f"  {k}x{k} {ci}->{co} batch {n} {side}x{side}: "
      + ", ".join(f"{t * 1e3:.2f}" for t in rows[-1][-1])
      + " ms",
      flush=True,
    )
  return rows


def tf_features(k, ci, co, n, side):
  pixels, taps = n * side * side, k * k
  big = side * side * taps * ci * 4 > TF_BIG_PATCH_BYTES
  small = 1 < k <= TF_SMALL_FILTER and ci < TF_FEW_CHANNELS
  flops = 2.0 * pixels * taps * ci * co
  return [
    flops,
    pixels * taps * ci,
    pixels * taps * co,
    pixels,
    pixels * taps,
    pixels * taps * ci * big,
    pixels * small,
    1.0,
  ]


def op_call_seconds(seconds):
  """The op's own cost of a call, per pass, timed as tf_rows times TF's: a 1x1 filter on a
  single pixel (the direct kernels), so that the fit's constant is TF's cost per call beyond
  what the op pays too."""
  import tensorflow as tf

  from tf_largeconv import _loader

  ops = _loader.ops()
  attrs = dict(
    strides=[1, 1, 1, 1],
    padding="SAME",
    explicit_paddings=[],
    data_format="NHWC",
    dilations=[1, 1, 1, 1],
    algorithm="direct",
    workspace_limit=-1,
  )
  x = w = dy = tf.ones((1, 1, 1, 1))
  calls = (
    lambda: ops.large_conv_conv2d(x, w, **attrs).numpy(),
    lambda: ops.large_conv_conv2d_backprop_input([1, 1, 1, 1], w, dy, **attrs).numpy(),
    lambda: ops.large_conv_conv2d_backprop_filter(x, [1, 1, 1, 1], dy, **attrs).numpy(),
  )
  return [_min_time(c, seconds) for c in calls]


def fit_tf(rows, op_calls):
  import numpy as np
  from scipy.optimize import nnls

  from tf_largeconv import _loader

  kernels = _loader.core().tf_kernels()
  x = np.array([tf_features(*r[:5]) for r in rows], float)
  print(
    f"\nTF ({kernels}'s kernels): seconds = a * flops + b * P K ci + c * P K co + d * P"
    " + e * P K + f * P K ci [big] + h * P [small] + g; g is printed less the op's own"
    " cost of a call"
  )
  for i, name in enumerate(TF_PASSES):
    y = np.array([r[5][i] for r in rows])
    fitted = np.array(
      [
        not (kernels == "onednn" and name == "backprop_filter" and r[0] >= ONEDNN_SLOW_FILTER)
        for r in rows
      ]
    )
    coef, _ = nnls(x[fitted] / y[fitted, None], np.ones(fitted.sum()))
    err = np.abs(np.log(x[fitted] @ coef / y[fitted]))
    for r, features, t, kept in zip(rows, x, y, fitted):
      if not kept:
        print(
          f"    left out: {r[0]}x{r[0]} {r[1]}->{r[2]} batch {r[3]} {r[4]}x{r[4]}: "
          f"{t * 1e3:.1f} ms, the fit {features @ coef * 1e3:.1f} ms"
        )
    coef[-1] = max(0.0, coef[-1] - op_calls[i])
    print(
      f"  {name}: "
      + ", ".join(f"{c:.3g}" for c in coef)
      + f"   predicted/measured off by a factor of: median {np.exp(np.median(err)):.2f}, "
      f"90th percentile {np.exp(np.percentile(err, 90)):.2f}, max {np.exp(err.max()):.2f}"
      f" (the op's call: {op_calls[i] * 1e6:.0f} us)"
    )


def model_ratio(fft, direct):
  """Prints how much faster than the shipped model prices them the op's kernels ran here
  (the model's seconds over the measured, median over the FFT configurations and the
  direct passes): cost_model.cc's kOneDnnFitToModelSeconds, on the machine a TF fit is made on."""
  import numpy as np

  ffts = np.array([p.fft_work["seconds"] / t for _, _, p, t in fft])
  directs = np.array([r[4] / r[3] for r in direct])
  print(
    f"\nThe op's model over the measured: FFT median {np.median(ffts):.2f} over "
    f"{len(ffts)} configurations, direct median {np.median(directs):.2f} over "
    f"{len(directs)} passes; together {np.median(np.concatenate([ffts, directs])):.2f}"
  )


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
    "--seconds", type=float, default=1.5, help="time spent repeating each measurement"
  )
  parser.add_argument(
    "--tf", action="store_true", help="fit the model of TensorFlow's kernels only"
  )
  parser.add_argument(
    "--direct", action="store_true", help="fit the model of the direct kernels only"
  )
  parser.add_argument(
    "--model-ratio",
    action="store_true",
    help="time the op's kernels against the shipped model (for the "
    "scale of a TF fit made on this machine)",
  )
  args = parser.parse_args()
  import tensorflow as tf

  tf.config.threading.set_intra_op_parallelism_threads(1)
  if args.tf:
    print("TensorFlow's kernels (one thread), forward, backprop_input, backprop_filter:")
    fit_tf(tf_rows(args.seconds), op_call_seconds(args.seconds))
    return
  if args.direct:
    fit_direct(direct_rows(args.seconds / 3))
    return
  if args.model_ratio:
    model_ratio(fft_rows(args.seconds), direct_rows(args.seconds / 3))
    return
  print("FFT configurations (one thread):")
  fit_fft(fft_rows(args.seconds))
  fit_direct(direct_rows(args.seconds / 3))


if __name__ == "__main__":
  main()
