"""Benchmark: tf_largeconv against tf.nn.conv2d / tf.nn.conv1d / tf.nn.conv3d (and scipy's
overlap-add FFT for 2-D forward passes), each case and implementation in a fresh process,
same machine, same run.

  python -m benchmarks.cpu.bench [--cases NAME ...] [--quick] [--out DIR]
  python -m benchmarks.cpu.bench --cases budget    # time against workspace_limit (budget.py)
  python -m benchmarks.cpu.bench --cases fold      # a folded linear block (fold.py)
  python -m benchmarks.cpu.bench --cases portable  # the portable path and XLA (portable.py)
  python -m benchmarks.cpu.bench --cases sweep     # does "auto" pick the fastest? (sweep.py)
  python -m benchmarks.cpu.bench --cases slide     # tf_largeconv.dask on a slide (slide.py)

Prints a table of warm times (min over runs) and peak extra memory (process high-water
mark above the inputs, /proc VmHWM), with ratios TF / tf_largeconv (the TF column is the
TF function of the case's kind: tf.nn.conv2d, conv1d, conv3d, ...), and writes
DIR/bench.json and DIR/bench.png (time and memory against filter size). A measurement that
fails or runs past --timeout shows "n/a" or "timeout", and the reason (TF's own error
message, or "timed out after N s") is printed under its row.
"""

import argparse
import importlib
import json
import os
import sys
import time

from benchmarks import measure

MiB = 2**20

# name: (input NHWC, filter, strides, padding, mode, TF runs[, kind]). mode "forward" times
# the forward pass; "train" a forward pass plus the gradients for input and filter. TF runs:
# timed runs of TF after a warm-up run, 0 where TF is too slow to run twice (its one run is
# then timed, set-up included). kind
# "depthwise" takes a [h, w, channels, multiplier] filter through depthwise_conv2d (TF:
# tf.nn.depthwise_conv2d); kind "transpose" an [h, w, out, in] filter through
# conv2d_transpose (TF: tf.nn.conv2d_transpose), the output sized as SAME makes it (each
# side times the stride); otherwise the filter is HWIO, grouped when its in-depth divides
# the input depth.
CASES = {
  "seed_forward": ((10, 321, 481, 1), (135, 135, 1, 3), 1, "VALID", "forward", 2),
  "seed_train": ((2, 321, 481, 1), (135, 135, 1, 3), 1, "VALID", "train", 1),
  "k63_forward": ((4, 128, 128, 16), (63, 63, 16, 16), 1, "SAME", "forward", 2),
  "k63_train": ((1, 128, 128, 16), (63, 63, 16, 16), 1, "SAME", "train", 1),
  # Many channels: the spectral products (a 64 x 64 complex product per bin) and the filter
  # transforms outweigh the image's.
  "k63c64_forward": ((4, 128, 128, 64), (63, 63, 64, 64), 1, "SAME", "forward", 1),
  "k3_forward": ((16, 64, 64, 32), (3, 3, 32, 64), 1, "SAME", "forward", 5),
  "k3_train": ((16, 64, 64, 32), (3, 3, 32, 64), 1, "SAME", "train", 5),
  "large_image": ((1, 4096, 4096, 3), (101, 101, 3, 8), 1, "SAME", "forward", 1),
  "replk31_forward": ((8, 56, 56, 128), (31, 31, 128, 1), 1, "SAME", "forward", 3, "depthwise"),
  "replk31_train": ((8, 56, 56, 128), (31, 31, 128, 1), 1, "SAME", "train", 1, "depthwise"),
  "slak51_train": ((8, 32, 32, 256), (51, 51, 256, 1), 1, "SAME", "train", 1, "depthwise"),
  "grouped31_train": ((4, 64, 64, 32), (31, 31, 8, 32), 1, "SAME", "train", 1),
  # More than 2^31 elements (4.3 GB of bfloat16) under the default workspace limit. TF's
  # own kernel is not run: ~44 TFLOP of direct convolution would take hours here.
  "gigapixel": ((1, 46500, 46500, 1), (101, 101, 1, 1), 1, "SAME", "forward", 0, "gigapixel"),
  # conv2d_transpose (TF: tf.nn.conv2d_transpose), filter [h, w, out, in]: 4x128x128x32 ->
  # 4x256x256x16 (SAME, stride 2: each side doubles).
  "transpose31_train": ((4, 128, 128, 32), (31, 31, 16, 32), 2, "SAME", "train", 1, "transpose"),
}
# Many channels (64 in, 64 out), SAME: 16 images of 56x56 and 64 of 32x32, for 31x31, 15x15
# and 7x7 filters. Their spectral products run as matrix products (cc/core/cpu/fft_gemm.h).
# TF's direct kernel takes minutes on the 31x31 ones, so it runs once there.
for _k, _tf_runs in ((31, 0), (15, 1), (7, 3)):
  for _n, _hw in ((16, 56), (64, 32)):
    for _mode in ("forward", "train"):
      CASES[f"c64k{_k}_n{_n}_{_mode}"] = (
        (_n, _hw, _hw, 64),
        (_k, _k, 64, 64),
        1,
        "SAME",
        _mode,
        _tf_runs if _mode == "forward" else min(_tf_runs, 1),
      )
# kind "conv1d": an NWC input and a [width, in, out] filter through conv1d (TF: tf.nn.conv1d).
CASES.update(
  {
    "conv1d_forward": ((8, 65536, 16), (4095, 16, 16), 1, "SAME", "forward", 1, "conv1d"),
    "conv1d_train": ((8, 65536, 16), (4095, 16, 16), 1, "SAME", "train", 1, "conv1d"),
  }
)
# kind "conv3d": an NDHWC input and a [d, h, w, in / groups, out] filter through conv3d (TF:
# tf.nn.conv3d, whose CPU kernel takes no groups: the depthwise rows report its refusal).
# TF's CPU conv3d takes minutes on the 31^3 case (~1 TFLOP a pass), so it runs once.
# kind "volume3d": conv3d on a bfloat16 volume of more than 2^31 elements (4.4 GB, and as
# much again for the output), ours only: TF's direct sum (~130 TFLOP) would take hours.
CASES.update(
  {
    "conv3d31_forward": (
      (1, 128, 128, 128, 1),
      (31, 31, 31, 1, 8),
      1,
      "SAME",
      "forward",
      0,
      "conv3d",
    ),
    "conv3d31_train": ((1, 128, 128, 128, 1), (31, 31, 31, 1, 8), 1, "SAME", "train", 0, "conv3d"),
    "dw3d15_forward": ((1, 64, 64, 64, 64), (15, 15, 15, 1, 64), 1, "SAME", "forward", 0, "conv3d"),
    "dw3d15_train": ((1, 64, 64, 64, 64), (15, 15, 15, 1, 64), 1, "SAME", "train", 0, "conv3d"),
    "volume3d": ((1, 1300, 1300, 1300, 1), (31, 31, 31, 1, 1), 1, "SAME", "forward", 0, "volume3d"),
  }
)
SWEEP = (3, 7, 15, 31, 63, 99, 135)
for _k in SWEEP:
  CASES[f"sweep_k{_k}"] = ((2, 321, 481, 1), (_k, _k, 1, 3), 1, "VALID", "forward", 3)
# Timed runs continue past a case's repeats while they have taken less than this (seconds),
# up to 200 runs: the minimum of a few-millisecond call needs many.
REPEAT_SECONDS = 2.0

QUICK = ("seed_forward", "k3_forward", "sweep_k31")
IMPLS = ("tf_largeconv", "tf.nn.conv2d", "scipy")
SCIPY_MAX_CHANNEL_PAIRS = 16  # scipy convolves one channel pair at a time


def _scipy_forward(x, w, padding):
  """Correlation via scipy.signal.oaconvolve, one (image, in, out) channel triple at a
  time; strides 1. Pads like TF for SAME."""
  import numpy as np
  from scipy import signal

  kh, kw, ci, co = w.shape
  if padding == "SAME":
    ph, pw = kh - 1, kw - 1
    x = np.pad(x, ((0, 0), (ph // 2, ph - ph // 2), (pw // 2, pw - pw // 2), (0, 0)))
  out = np.zeros((x.shape[0], x.shape[1] - kh + 1, x.shape[2] - kw + 1, co), x.dtype)
  flipped = w[::-1, ::-1]
  for n in range(x.shape[0]):
    for o in range(co):
      for i in range(ci):
        out[n, :, :, o] += signal.oaconvolve(x[n, :, :, i], flipped[:, :, i, o], mode="valid")
  return out


def _worker(case, impl, repeats):
  """Runs in a fresh process: builds inputs, then measures one implementation."""
  os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
  import numpy as np

  x_shape, w_shape, strides, padding, mode = CASES[case][:5]
  measure.like_training_loop(mode)
  depthwise = _kind(case) == "depthwise"
  rng = np.random.default_rng(0)
  w = (rng.standard_normal(w_shape) / (w_shape[0] * w_shape[1])).astype(np.float32)
  if _kind(case) in BIG_KINDS:  # generated in TF's bfloat16 directly: no float32 copy
    import tensorflow as tf

    x = tf.random.uniform(x_shape, dtype=tf.bfloat16)
    w = tf.cast(w, tf.bfloat16)
  else:
    x = rng.random(x_shape, dtype=np.float32)
  if impl == "scipy":

    def run():
      _scipy_forward(x, w, padding)
  else:
    import tensorflow as tf

    import tf_largeconv as lc

    warm = (tf.ones((1, 8, 8, 1)), tf.ones((3, 3, 1, 1)))
    if depthwise:
      fn = lc.depthwise_conv2d if impl == "tf_largeconv" else tf.nn.depthwise_conv2d
      conv = lambda a, b, s, p: fn(a, b, [1, s, s, 1], p)  # noqa: E731
    elif _kind(case) == "conv1d":
      conv = lc.conv1d if impl == "tf_largeconv" else tf.nn.conv1d
      warm = (tf.ones((1, 8, 1)), tf.ones((3, 1, 1)))
    elif _kind(case) in ("conv3d", "volume3d"):
      fn = lc.conv3d if impl == "tf_largeconv" else tf.nn.conv3d
      conv = lambda a, b, s, p: fn(a, b, [1, s, s, s, 1], p)  # noqa: E731
      warm = (tf.ones((1, 8, 8, 8, 1)), tf.ones((3, 3, 3, 1, 1)))
    elif _kind(case) == "transpose":
      fn = lc.conv2d_transpose if impl == "tf_largeconv" else tf.nn.conv2d_transpose
      out = [x_shape[0], x_shape[1] * strides, x_shape[2] * strides, w_shape[2]]
      conv = lambda a, b, s, p: fn(a, b, out, s, p)  # noqa: E731
      warm_out = [1, 8, 8, 1]  # the warm-up's output shape
    else:
      conv = lc.conv2d if impl == "tf_largeconv" else tf.nn.conv2d
    xt, wt = tf.convert_to_tensor(x), tf.convert_to_tensor(w)
    # Warm the library on a tiny problem so one-time set-up is not counted as the case's.
    if _kind(case) == "transpose":
      fn(*warm, warm_out, 1, "SAME").numpy()
    else:
      conv(*warm, 1, "SAME").numpy()
    if mode == "forward" and _kind(case) in BIG_KINDS:

      def run():  # eager ops run synchronously; .numpy() would copy 4.3 GB of bfloat16
        conv(xt, wt, strides, padding)[(0,) * len(x_shape)].numpy()
    elif mode == "forward":

      def run():
        conv(xt, wt, strides, padding).numpy()
    else:

      def run():
        with tf.GradientTape() as tape:
          tape.watch([xt, wt])
          y = conv(xt, wt, strides, padding)
        for g in tape.gradient(y, [xt, wt]):
          g.numpy()

  seconds, extra = measure.measure(run, repeats=repeats, seconds=REPEAT_SECONDS)
  return {"seconds": seconds, "extra_bytes": extra}


def _kind(case):
  return CASES[case][6] if len(CASES[case]) > 6 else "conv"


# The TF function the TF column runs, by kind (where it is not tf.nn.conv2d).
TF_FUNCTIONS = {
  "depthwise": "tf.nn.depthwise_conv2d",
  "conv1d": "tf.nn.conv1d",
  "transpose": "tf.nn.conv2d_transpose",
  "conv3d": "tf.nn.conv3d",
}

# Kinds with more than 2^31 input elements (bfloat16), run once and by tf_largeconv only.
BIG_KINDS = ("gigapixel", "volume3d")


def _fft_floor(case):
  """Single-thread time of the transforms one image needs (one real forward transform of
  the padded image per input channel, one inverse per output channel, each batch of planes
  in one scipy call, at the FFT size the planner picks), times tiles x images / cores: what
  no FFT method on this machine can beat."""
  import numpy as np
  from scipy import fft

  import tf_largeconv as lc

  x_shape, w_shape, strides, padding = CASES[case][:4]
  if _kind(case) == "gigapixel":
    return None
  if _kind(case) in ("conv3d", "volume3d"):
    return _fft_floor_3d(case)
  if _kind(case) == "depthwise":  # the same convolution as a grouped one, one group a channel
    w_shape = (w_shape[0], w_shape[1], 1, w_shape[2] * w_shape[3])
  if _kind(case) == "conv1d":  # the height-1 conv2d it runs as
    x_shape, w_shape = (x_shape[0], 1) + tuple(x_shape[1:]), (1,) + tuple(w_shape)
  p = lc.plan(x_shape, w_shape, strides, padding).forward
  if p.fft_size is None:
    return None
  tiles = p.tiles[0] * p.tiles[1]
  rng = np.random.default_rng(0)
  planes = rng.random((x_shape[3],) + tuple(p.fft_size), dtype=np.float32)
  spectra = fft.rfft2(rng.random((w_shape[3],) + tuple(p.fft_size), dtype=np.float32))
  best, start, runs = float("inf"), time.perf_counter(), 0
  while runs < 5 or (time.perf_counter() - start < REPEAT_SECONDS and runs < 200):
    t0 = time.perf_counter()
    fft.rfft2(planes, workers=1)
    fft.irfft2(spectra, s=p.fft_size, workers=1)
    best, runs = min(best, time.perf_counter() - t0), runs + 1
  cores = len(os.sched_getaffinity(0))
  return best * tiles * x_shape[0] / cores


def _fft_floor_3d(case):
  """_fft_floor for a conv3d case: per tile, one real 3-D transform per input channel and
  one inverse per output channel, at the planner's transform size."""
  import numpy as np
  from scipy import fft

  import tf_largeconv as lc

  x_shape, w_shape, strides, padding = CASES[case][:4]
  dtype = "bfloat16" if _kind(case) in BIG_KINDS else "float32"
  p = lc.plan_conv3d(
    x_shape, w_shape, [1, strides, strides, strides, 1], padding, dtype=dtype
  ).forward
  if p.fft_size is None:
    return None
  rng = np.random.default_rng(0)
  volumes = rng.random((x_shape[4],) + tuple(p.fft_size), dtype=np.float32)
  spectra = fft.rfftn(
    rng.random((w_shape[4],) + tuple(p.fft_size), dtype=np.float32), axes=(1, 2, 3)
  )
  best = float("inf")
  for _ in range(3):
    t0 = time.perf_counter()
    fft.rfftn(volumes, axes=(1, 2, 3), workers=1)
    fft.irfftn(spectra, s=p.fft_size, axes=(1, 2, 3), workers=1)
    best = min(best, time.perf_counter() - t0)
  cores = len(os.sched_getaffinity(0))
  return best * np.prod(p.tiles) * x_shape[0] / cores


def _run_one(case, impl, timeout):
  repeats = CASES[case][5] if impl == "tf.nn.conv2d" else (1 if _kind(case) in BIG_KINDS else 5)
  return measure.run_child(
    ["-m", "benchmarks.cpu.bench", "--worker", case, impl, str(repeats)], timeout
  )


def _fmt_time(r):
  if r is None:
    return "-"
  if "error" in r:
    return "timeout" if r["error"].startswith("timed out") else "n/a"
  s = r["seconds"]
  return f"{s * 1e3:.1f} ms" if s < 10 else f"{s:.1f} s"


def _fmt_mem(r):
  return "-" if r is None or "error" in r else f"{r['extra_bytes'] / MiB:.1f}"


def _ratio(a, b, key):
  if not a or not b or "error" in a or "error" in b or not b[key]:
    return "-"
  return f"{a[key] / b[key]:.1f}x" if b[key] > 0 else "-"


def _plot(results, path):
  plt = measure.pyplot()
  if plt is None:
    return
  ks = [k for k in SWEEP if f"sweep_k{k}" in results]
  if not ks:
    return
  fig, axes = plt.subplots(1, 2, figsize=(10, 4))
  for impl, style in (("tf_largeconv", "o-"), ("tf.nn.conv2d", "s--"), ("scipy", "^:")):
    pts = [(k, results[f"sweep_k{k}"].get(impl)) for k in ks]
    pts = [(k, r) for k, r in pts if r and "error" not in r]
    if not pts:
      continue
    axes[0].plot([k for k, _ in pts], [r["seconds"] * 1e3 for _, r in pts], style, label=impl)
    axes[1].plot(
      [k for k, _ in pts], [max(r["extra_bytes"], 1) / MiB for _, r in pts], style, label=impl
    )
  x_shape = CASES[f"sweep_k{ks[0]}"][0]
  for ax, label in zip(axes, ("time per call (ms)", "peak extra memory (MiB)")):
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("filter size K (KxKx1x3, VALID)")
    ax.set_ylabel(label)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
  fig.suptitle(
    f"forward pass, input {'x'.join(map(str, x_shape))}, float32, "
    f"{len(os.sched_getaffinity(0))} cores"
  )
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  print(f"wrote {path}")


def main(argv=None):
  argv = sys.argv[1:] if argv is None else list(argv)
  if argv[:2] == ["--cases", "slide"]:  # tf_largeconv.dask on a slide: its own options
    from benchmarks.cpu import slide

    return slide.main(argv[2:])
  if argv[:2] == ["--cases", "stream"]:  # tf_largeconv.stream over a slide: its own options
    from benchmarks.cpu import stream

    return stream.main(argv[2:])
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
    "--cases", nargs="*", help=f"subset of: {', '.join(CASES)}, budget, fold, portable"
  )
  parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
  parser.add_argument(
    "--out",
    default=measure.RESULTS_DIR,
    help="where the tables and plots go (default: benchmarks/results/cpu)",
  )
  parser.add_argument("--timeout", type=int, default=900, help="seconds per measurement")
  parser.add_argument(
    "--impls",
    nargs="*",
    choices=IMPLS,
    default=list(IMPLS),
    help="implementations to time (default: all; tf_largeconv alone "
    "gives its time against the FFT floor without TF's minutes)",
  )
  parser.add_argument(
    "--worker", nargs=3, metavar=("CASE", "IMPL", "REPEATS"), help=argparse.SUPPRESS
  )
  args = parser.parse_args(argv)
  if args.worker:
    case, impl, repeats = args.worker
    print(json.dumps(_worker(case, impl, int(repeats))))
    return 0

  names = args.cases or (list(QUICK) if args.quick else list(CASES))
  # Case sets with their own tables (budget.py, fold.py, portable.py, sweep.py).
  for sweep in ("budget", "fold", "portable", "sweep"):
    if sweep in names:
      importlib.import_module(f"benchmarks.cpu.{sweep}").main(args.out)
      names = [n for n in names if n != sweep]
      if not names:
        return 0
  unknown = [n for n in names if n not in CASES]
  if unknown:
    parser.error(f"unknown case(s) {unknown}; known: {list(CASES)}")
  results = {}
  header = (
    f"{'case':18s}{'tf_largeconv':>13s}{'tf.nn.conv2d':>13s}{'scipy':>10s}"
    f"{'speedup':>9s}{'MiB ours':>10s}{'MiB TF':>9s}{'mem ratio':>10s}{'floor':>9s}"
  )
  print(header)
  for name in names:
    x_shape, w_shape, _, _, mode = CASES[name][:5]
    row = {}
    for impl in IMPLS:
      if impl not in args.impls or (impl != "tf_largeconv" and _kind(name) in BIG_KINDS):
        continue
      if impl == "scipy" and (
        mode != "forward"
        or CASES[name][2] != 1
        or _kind(name) != "conv"
        or w_shape[2] != x_shape[3]
        or x_shape[3] * w_shape[3] > SCIPY_MAX_CHANNEL_PAIRS
      ):
        continue
      row[impl] = _run_one(name, impl, args.timeout)
    floor = _fft_floor(name) if mode == "forward" else None
    row["fft_floor_seconds"] = floor
    results[name] = row
    ours, theirs = row.get("tf_largeconv"), row.get("tf.nn.conv2d")
    floor_ratio = (
      f"{ours['seconds'] / floor:.1f}x" if floor and ours and "error" not in ours else "-"
    )
    print(
      f"{name:18s}{_fmt_time(ours):>13s}{_fmt_time(theirs):>13s}"
      f"{_fmt_time(row.get('scipy')):>10s}{_ratio(theirs, ours, 'seconds'):>9s}"
      f"{_fmt_mem(ours):>10s}{_fmt_mem(theirs):>9s}"
      f"{_ratio(theirs, ours, 'extra_bytes'):>10s}{floor_ratio:>9s}",
      flush=True,
    )
    for impl in IMPLS:  # why a measurement is missing: TF's refusal, the timeout, ...
      if row.get(impl) and "error" in row[impl]:
        label = TF_FUNCTIONS.get(_kind(name), impl) if impl == "tf.nn.conv2d" else impl
        print(f"  {label}: {row[impl]['error']}", flush=True)
  os.makedirs(args.out, exist_ok=True)
  meta = {
    "cores": len(os.sched_getaffinity(0)),
    "cases": {k: CASES[k] for k in names},
    "timing": "min over warm runs (TF: its runs count); memory: VmHWM growth over the first run",
  }
  with open(os.path.join(args.out, "bench.json"), "w", encoding="ascii") as f:
    json.dump({"meta": meta, "results": results}, f, indent=1)
  print(f"wrote {os.path.join(args.out, 'bench.json')}")
  _plot(results, os.path.join(args.out, "bench.png"))
  print("speedup, mem ratio: tf.nn.conv2d / tf_largeconv; floor: tf_largeconv / FFT floor")
  return 0


if __name__ == "__main__":
  sys.exit(main())
