"""Planner sweep: does algorithm="auto" pick the fastest path across the space?

  python -m benchmarks.cpu.bench --cases sweep [--out DIR]   # the default cells
  python -m benchmarks.cpu.sweep --full [--out DIR]          # every point of the grid
  python -m benchmarks.cpu.sweep --few-channel [--out DIR]   # the few-channel images only
  python -m benchmarks.cpu.sweep --many-channel [--out DIR]  # channels 16..256, filters 7..63

Over filter sizes, input and output channels, batch and image sizes, forward passes and
training steps (forward + both gradients), with one and with every intra-op thread, it
times "auto" against each algorithm it chooses between ("direct", "fft", and TensorFlow's
own kernel, tf.nn.conv2d, which is also the baseline), float32, SAME, stride 1, warm times
interleaved (min over rounds, each in a seeded random order; each timed call right after
an untimed one of the same algorithm, as a call right after a different kernel's runs
slower). A point that misses a goal (auto more than 10% slower than the fastest, or than
TF) runs its rounds again, every algorithm alike, and each keeps its minimum over both.
Each thread setting runs in a fresh process (TensorFlow fixes its pools at start).

An algorithm whose modelled time (`plan()`'s estimated_seconds, summed over the passes a
step runs; for TF's kernel where the planner does not weigh it, as where TF's CPU kernels
cannot run the configuration, its FLOPs at TF_FLOPS_PER_S) is over SKIP_FACTOR times the
fastest modelled one is not timed (a direct sum of a 63x63 filter over 128 channels would
take hours): the table marks it "-", and
the verdicts count only what ran. Steps modelled under ALWAYS_TIMED_S always run. Points
whose fastest modelled step is over MAX_MODEL_S are left out of the grid.

Besides the square images of `grid`, `few_channel_grid` takes large photographs with one or
a few channels (a grayscale or colour image through a small filter bank): small filters
there are priced close to TensorFlow's kernel, and a choice on a thin margin shows. With
--few-channel the sweep runs those points alone and writes sweep_few_channel.json/.png.

`many_channel_grid` crosses MANY_CHANNELS (16 to 256, in = out) with MANY_CHANNEL_KS (7 to
63) on one batch of images, MANY_CHANNEL_SIZE: with --many-channel the sweep runs those
points alone (up to MANY_CHANNEL_MAX_MODEL_S modelled, so that 63x63 over 256 channels is
in) and writes sweep_many_channel.json/.png, whose heat maps show the fastest algorithm
timed in each cell (its first letter; "a" in the corner where auto chose another).

Until a run completes, DIR/sweep*.rows.jsonl holds each row as it is timed. A child in one
call for over CALL_LIMIT_S (TensorFlow's filter gradient of a 15x15 filter over 256
channels ran for more than 25 minutes) is stopped; a new child resumes at that point with
the algorithm left out there, marked "stopped".

A step that runs out of memory (TF's kernel, on large filters) is marked "oom" and counts
as slower than auto. Prints one row per point (times, auto's choice per pass by its first
letter, "k" where an eager forward pass moves to the FFT with kept spectra, auto /
fastest, auto / TF) and a summary; writes DIR/sweep.json and DIR/sweep.png (heat maps of
the worst auto / fastest and auto / TF per filter size and channel pair, forward and
training step).
"""

import argparse
import itertools
import json
import math
import os
import random
import subprocess
import sys
import time

from benchmarks import measure

KS = (3, 7, 15, 31, 63)
CHANNELS = ((1, 1), (1, 8), (8, 8), (8, 32), (32, 32), (32, 128), (128, 32), (128, 128))
FULL_KS = (3, 5, 7, 9, 11, 15, 21, 31, 45, 63)
FULL_CHANNELS = tuple(itertools.product((1, 8, 32, 128), repeat=2))
SIZES = tuple(itertools.product((1, 8), (64, 128, 256, 512)))  # (batch, image side)
# One- and few-channel photographs: (batch, (height, width)), the first the default's.
FEW_CHANNEL_KS = (3, 5, 7)
FEW_CHANNELS = ((1, 1), (1, 3), (3, 3), (3, 8))
FEW_CHANNEL_SIZES = ((2, (321, 481)), (1, (321, 481)), (4, (321, 481)), (1, (1024, 1024)))
# Many channels: (in = out) x filter sizes, on one batch of images (batch, side).
MANY_CHANNEL_KS = (7, 15, 31, 63)
MANY_CHANNELS = (16, 32, 64, 128, 256)
MANY_CHANNEL_SIZE = (8, 64)
MANY_CHANNEL_MAX_MODEL_S = 16.0
MODES = ("forward", "train")
ALGORITHMS = ("direct", "fft", "tf")
SKIP_FACTOR = 6.0
ALWAYS_TIMED_S = 0.01  # modelled steps this short are timed whatever the others' models
MAX_MODEL_S = 2.0
MAX_INPUT_BYTES = 64 * 2**20
# tf.nn.conv2d's rate on this machine's class of CPU, roughly, for the skip rule where the
# planner does not weigh TF's kernel (configurations TF's CPU kernels cannot run).
TF_FLOPS_PER_S = 5e10
SLOW_S = 0.5  # a call slower than this is timed once more, right after its warm-up
MAX_ROUNDS = 200
ROUND_S = 2.0  # rounds continue while they have taken less than this (timings vary by ±30%)
MISS = 1.10  # auto slower than the fastest, or than TF, by more than this misses the goal
RETRY_ROUND_S = 4.0  # a missing point's rounds run again for this long
CALL_LIMIT_S = 300.0  # a call running longer is stopped, and its algorithm left out there
RUNS_FILE_SUFFIX = ".calling"  # beside the rows file: the call the child is in, and since when


def grid(full=False):
  """The sweep's points: (k, in channels, out channels, batch, side, mode). The default
  takes one (batch, side) per (k, channels) cell and mode, cycling through SIZES so that
  every size appears, and where that size's input or output is over MAX_INPUT_BYTES the
  next in the cycle that is not; --full takes every combination that is not."""
  ks, channels = (FULL_KS, FULL_CHANNELS) if full else (KS, CHANNELS)
  points = []
  for mode in MODES:
    for (a, k), (b, (ci, co)) in itertools.product(enumerate(ks), enumerate(channels)):
      first = a + b + MODES.index(mode)  # each channel pair at a different size per k
      cycle = [SIZES[(first + j) % len(SIZES)] for j in range(len(SIZES))]
      fits = [
        (n, side)
        for n, side in (SIZES if full else cycle)
        if n * side * side * max(ci, co) * 4 <= MAX_INPUT_BYTES
      ]
      points += [(k, ci, co, n, side, mode) for n, side in (fits if full else fits[:1])]
  return points


def few_channel_grid(full=False):
  """The few-channel points: (k, in channels, out channels, batch, (height, width), mode),
  each FEW_CHANNEL_KS x FEW_CHANNELS cell on the first of FEW_CHANNEL_SIZES, or with --full
  on each of them, in every mode; none over MAX_INPUT_BYTES."""
  sizes = FEW_CHANNEL_SIZES if full else FEW_CHANNEL_SIZES[:1]
  return [
    (k, ci, co, n, hw, mode)
    for mode, k, (ci, co), (n, hw) in itertools.product(MODES, FEW_CHANNEL_KS, FEW_CHANNELS, sizes)
    if n * hw[0] * hw[1] * max(ci, co) * 4 <= MAX_INPUT_BYTES
  ]


def many_channel_grid():
  """The many-channel points: (k, channels, channels, batch, side, mode), every
  MANY_CHANNEL_KS x MANY_CHANNELS cell on MANY_CHANNEL_SIZE, in every mode."""
  n, side = MANY_CHANNEL_SIZE
  return [
    (k, c, c, n, side, mode)
    for mode, k, c in itertools.product(MODES, MANY_CHANNEL_KS, MANY_CHANNELS)
  ]


def image_hw(side):
  """(height, width) of a point's images: `side` is a square's side, or the pair."""
  return (side, side) if isinstance(side, int) else tuple(side)


def _modelled(lc, point):
  """{algorithm: modelled seconds of the step, or None where it cannot run}."""
  k, ci, co, n, side, mode = point
  h, w = image_hw(side)
  passes = lc.plan((n, h, w, ci), (k, k, ci, co), 1, "SAME").passes
  passes = passes if mode == "train" else passes[:1]
  out = {}
  for a in ALGORITHMS:
    times = [p.estimated_seconds[a] for p in passes]
    if a == "tf" and None in times:  # the planner does not weigh TF's kernel here
      flops = 2.0 * n * h * w * k * k * ci * co  # a pass's, SAME at stride 1
      times = [flops / TF_FLOPS_PER_S] * len(passes)
    out[a] = None if None in times else sum(times)
  return out


def _step(lc, tf, x, w, mode, algorithm):
  """One call of the step: tf.nn.conv2d for "tf", the op with `algorithm` otherwise."""
  measure.like_training_loop(mode)
  if algorithm == "tf":
    conv = lambda a, b: tf.nn.conv2d(a, b, 1, "SAME")  # noqa: E731
  else:
    conv = lambda a, b: lc.conv2d(a, b, 1, "SAME", algorithm=algorithm)  # noqa: E731
  if mode == "forward":
    return lambda: conv(x, w).numpy()
  dy = tf.ones(x.shape[:3] + w.shape[3:])  # SAME, stride 1: the output's shape

  def train():
    with tf.GradientTape() as tape:
      tape.watch([x, w])
      y = conv(x, w)
    return [g.numpy() for g in tape.gradient(y, [x, w], output_gradients=dy)]

  return train


def _time_point(lc, tf, np, point, rounds=5, stopped=(), calling=None):
  """Times "auto" and every algorithm within SKIP_FACTOR of the fastest modelled one, but
  those in `stopped` (an earlier child was stopped in one of their calls here); `calling`,
  where given, is told (point, algorithm) before each warm-up call and (None, None) after
  the warm-ups."""
  k, ci, co, n, side, mode = point
  shape = (n,) + image_hw(side) + (ci,)
  rng = np.random.default_rng(0)
  x = tf.constant(rng.random(shape, dtype=np.float32))
  w = tf.constant((rng.standard_normal((k, k, ci, co)) / k).astype(np.float32))
  model = _modelled(lc, point)
  best_model = min(t for t in model.values() if t is not None)
  run = ["auto"] + [
    a
    for a in ALGORITHMS
    if model[a] is not None and model[a] <= max(SKIP_FACTOR * best_model, ALWAYS_TIMED_S)
  ]
  failed = {a: f"stopped: a call ran over {CALL_LIMIT_S:.0f} s" for a in run if a in stopped}
  calls = {a: _step(lc, tf, x, w, mode, a) for a in run if a not in stopped}
  # A call right after a different kernel's runs slower than one after its own (a small
  # FFT up to twice as slow, TF's kernel by a third), so each timed call follows a call of
  # the same algorithm: a slow one its warm-up, a fast one an untimed call in each round.
  times = {}
  for a, fn in list(calls.items()):  # warm-up: plans, kernels, allocations
    if calling:
      calling(point, a)
    try:
      times[a] = _once(fn)
      if times[a] >= SLOW_S:
        if calling:
          calling(point, a)  # the limit is on each call
        times[a] = min(times[a], _once(fn))
    except tf.errors.ResourceExhaustedError:  # TF's im2col buffers, mostly
      failed[a] = "out of memory"
      del calls[a]
  if calling:
    calling(None, None)
  fast = [a for a in calls if times[a] < SLOW_S]
  # Interleaved rounds (a slow spell of the machine hits every algorithm alike): at least
  # `rounds`, more while they take under ROUND_S seconds, at most MAX_ROUNDS (calls of a
  # millisecond or less need many for their minimum to settle).
  # Each round in its own order (seeded): the first call of a round still runs in the
  # wake of the round before, whose last kernel would otherwise always be the same.
  order = random.Random(0)

  def run_rounds(seconds):
    start = time.perf_counter()
    for i in range(MAX_ROUNDS):
      if i >= rounds and time.perf_counter() - start > seconds:
        break
      for a in order.sample(fast, len(fast)):
        calls[a]()
        times[a] = min(times[a], _once(calls[a]))

  run_rounds(ROUND_S)
  plan = lc.plan(shape, (k, k, ci, co), 1, "SAME")
  picks = [p.algorithm for p in plan.passes][: 3 if mode == "train" else 1]
  if mode == "forward" and _moves_to_kept_spectra(point, plan):
    picks[0] = "kept"  # the op's FFT with the spectra kept from an earlier call
  row = {"point": list(point), "seconds": times, "failed": failed, "model": model, "picks": picks}
  # A miss may be a slow spell: the point's rounds run again, every algorithm alike, and
  # each keeps its minimum over both (a shared machine's timings swing by tens of percent,
  # even between two algorithms that run the same kernels).
  if len(fast) > 1 and any(r is not None and r > MISS for r in _verdict(row)):
    run_rounds(RETRY_ROUND_S)
    row["retimed"] = True
  return row


def _moves_to_kept_spectra(point, plan):
  """Whether "auto"'s forward pass moves to the op's FFT with kept filter spectra once the
  filter tensor comes back (tf_largeconv.ops._dispatch.KeptSpectraRoute), with the
  spectrum cache's budget as the forward steps run it (the training steps run with it off:
  measure.like_training_loop)."""
  from tf_largeconv import _loader
  from tf_largeconv._passes import PerPass
  from tf_largeconv._problem import ConvProblem
  from tf_largeconv.planning import kept_spectra

  k, ci, co, n, side, _ = point
  key = ConvProblem.conv2d(1, "SAME", "NHWC", None)
  routes = PerPass.of(p.algorithm == "tf" for p in plan.passes)
  kept = kept_spectra.kept_spectra_bytes(
    (n,) + image_hw(side) + (ci,), (k, k, ci, co), key, "float32", routes
  )
  return 0 < kept <= _loader.core().spectrum_cache_budget()


def _once(fn):
  t0 = time.perf_counter()
  fn()
  return time.perf_counter() - t0


def points(full=False, few_channel=False, many_channel=False):
  """The points the sweep runs: `grid`'s and `few_channel_grid`'s, or one of
  `few_channel_grid`'s and `many_channel_grid`'s alone."""
  if many_channel:
    return many_channel_grid()
  return few_channel_grid(full) if few_channel else grid(full) + few_channel_grid(full)


def _key(point):
  """A point as the rows file writes it (tuples as lists), to compare points by."""
  return json.dumps(list(point))


def _rows_of(rows_file, threads):
  """The rows `rows_file` holds for a thread setting, in the order they were timed."""
  if not os.path.exists(rows_file):
    return []
  rows = []
  with open(rows_file, encoding="ascii") as f:
    for line in f:
      try:
        rows.append(json.loads(line))
      except ValueError:  # a line cut short where a child was stopped as it wrote it
        continue
  return [r for r in rows if r["threads"] == threads]


def _child(full, threads, few_channel=False, many_channel=False, rows_file=None, stopped=()):
  """Runs in a fresh process with `threads` intra-op threads: every point of `points` that
  `rows_file` does not hold yet (a child started after one was stopped resumes), and says
  in RUNS_FILE_SUFFIX's file beside `rows_file` which call runs; `stopped` holds the
  [point, algorithm] pairs an earlier child was stopped in (left out of their point)."""
  import numpy as np
  import tensorflow as tf

  tf.config.threading.set_intra_op_parallelism_threads(threads)
  tf.config.threading.set_inter_op_parallelism_threads(1)

  import tf_largeconv as lc

  rows = []
  most = MANY_CHANNEL_MAX_MODEL_S if many_channel else MAX_MODEL_S
  done = {_key(r["point"]) for r in _rows_of(rows_file, threads)} if rows_file else set()
  calling = None
  if rows_file:

    def calling(point, algorithm):
      with open(rows_file + RUNS_FILE_SUFFIX, "w", encoding="ascii") as f:
        json.dump({"point": point, "algorithm": algorithm, "since": time.time()}, f)

  for point in points(full, few_channel, many_channel):
    if _key(point) in done:
      continue
    model = _modelled(lc, point)
    if min(t for t in model.values() if t is not None) > most:
      continue
    left_out = [a for p, a in stopped if p == json.loads(_key(point))]
    row = _time_point(lc, tf, np, point, stopped=left_out, calling=calling)
    row["threads"] = threads
    rows.append(row)
    if rows_file:  # each row as it is timed: a run cut short keeps what it timed
      with open(rows_file, "a", encoding="ascii") as f:
        f.write(json.dumps(row) + "\n")
    print(_format(row), file=sys.stderr, flush=True)
  return rows


def _verdict(row):
  """(auto / fastest timed, auto / tf.nn.conv2d: 0 where TF ran out of memory, None where
  it was not timed)."""
  s = row["seconds"]
  if "auto" not in s:  # stopped in a call: slower than anything timed
    return math.inf, (math.inf if "tf" in s else None)
  others = [t for a, t in s.items() if a != "auto"]
  fastest = min(others) if others else s["auto"]
  if row["failed"].get("tf") == "out of memory":
    return s["auto"] / fastest, 0.0
  return s["auto"] / fastest, s["auto"] / s["tf"] if "tf" in s else None


def _untimed(why):
  """How the table marks an algorithm that was not timed: out of memory, stopped (a row
  whose `failed` says why), or left out by the model (-)."""
  return "-" if why is None else "oom" if why == "out of memory" else "stopped"


def _format(row):
  k, ci, co, n, side, mode = row["point"]
  image = str(side) if isinstance(side, int) else "x".join(map(str, side))
  s = row["seconds"]
  cells = "".join(
    f"{s[a] * 1e3:>10.1f}" if a in s else f"{_untimed(row['failed'].get(a)):>10s}"
    for a in ("auto",) + ALGORITHMS
  )
  best, vs_tf = _verdict(row)
  vs_tf = f"{vs_tf:>8.2f}" if vs_tf is not None else f"{'-':>8s}"
  return (
    f"{k:>4d}{ci:>5d}{co:>5d}{n:>4d}{image:>8s}{mode:>8s}{row['threads']:>3d}{cells}"
    f"{'/'.join(p[0] for p in row['picks']):>7s}{best:>9.2f}{vs_tf}"
  )


HEADER = (
  f"{'k':>4s}{'in':>5s}{'out':>5s}{'n':>4s}{'image':>8s}{'mode':>8s}{'th':>3s}"
  f"{'auto ms':>10s}{'direct':>10s}{'fft':>10s}{'tf':>10s}{'picks':>7s}"
  f"{'a/best':>9s}{'a/tf':>8s}"
)


def _winner(row):
  """The fastest algorithm timed at a point ("tf" never where it ran out of memory)."""
  timed = {a: t for a, t in row["seconds"].items() if a != "auto"} or row["seconds"]
  return min(timed, key=timed.get) if timed else "-"


def _print_winners(rows):
  """Per mode and thread setting, a table of the fastest algorithm per channels x filter
  cell, with auto's time over the fastest's."""
  for mode, threads in sorted({(r["point"][5], r["threads"]) for r in rows}):
    cells = {
      (r["point"][1], r["point"][0]): r
      for r in rows
      if (r["point"][5], r["threads"]) == (mode, threads)
    }
    ks = sorted({k for _, k in cells})
    print(f"\n{mode}, {threads} thread(s): fastest timed (auto / fastest)")
    print(f"{'channels':>9s}" + "".join(f"{k:>14d}" for k in ks))
    for c in sorted({c for c, _ in cells}):
      line = f"{c:>9d}"
      for k in ks:
        r = cells.get((c, k))
        line += f"{_winner(r) + f' ({_verdict(r)[0]:.2f})':>14s}" if r else f"{'-':>14s}"
      print(line)


def _plot_winners(rows, path):
  """Heat maps per mode and thread setting: each channels x filter cell coloured by the
  fastest algorithm timed, with auto's time over it."""
  plt = measure.pyplot()
  if plt is None:
    return
  import numpy as np

  panels = sorted({(r["point"][5], r["threads"]) for r in rows})
  ks = sorted({r["point"][0] for r in rows})
  chans = sorted({r["point"][1] for r in rows})
  colours = {a: i for i, a in enumerate(ALGORITHMS)}
  fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.5), squeeze=False)
  for ax, (mode, threads) in zip(axes[0], panels):
    grid_ = np.full((len(chans), len(ks)), np.nan)
    for r in rows:
      k, c, _, _, _, m = r["point"]
      if (m, r["threads"]) != (mode, threads):
        continue
      i, j = chans.index(c), ks.index(k)
      best = _winner(r)
      grid_[i, j] = colours[best]
      auto = r["picks"][0][0]
      label = f"{best}\n{_verdict(r)[0]:.2f}" + ("" if auto == best[0] else f"\nauto: {auto}")
      ax.text(j, i, label, ha="center", va="center", fontsize=7)
    ax.imshow(grid_, cmap="Pastel1", vmin=0, vmax=8, aspect="auto")
    ax.set_xticks(range(len(ks)), [str(k) for k in ks])
    ax.set_yticks(range(len(chans)), [f"{c}->{c}" for c in chans])
    ax.set_xlabel("filter size")
    ax.set_ylabel("channels")
    n, side = MANY_CHANNEL_SIZE
    ax.set_title(f"{mode}, {threads} thread(s), {n}x{side}x{side}: fastest (auto / it)", fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  print(f"wrote {path}")


def _plot(rows, path):
  plt = measure.pyplot()
  if plt is None:
    return
  import numpy as np

  ks = sorted({r["point"][0] for r in rows})
  chans = sorted({(r["point"][1], r["point"][2]) for r in rows})
  fig, axes = plt.subplots(2, 2, figsize=(11, 8))
  for col, mode in enumerate(MODES):
    for row_i, (title, which) in enumerate((("auto / fastest", 0), ("auto / tf.nn.conv2d", 1))):
      grid_ = np.full((len(chans), len(ks)), np.nan)
      for r in rows:
        k, ci, co, _, _, m = r["point"]
        if m != mode:
          continue
        i, j = chans.index((ci, co)), ks.index(k)
        v = _verdict(r)[which]
        if v is None:
          continue
        grid_[i, j] = v if np.isnan(grid_[i, j]) else max(grid_[i, j], v)
      ax = axes[row_i][col]
      # TF's out-of-memory (ratio 0) shows at the scale's best end.
      im = ax.imshow(
        np.log2(np.maximum(grid_, 0.25)), cmap="RdYlGn_r", vmin=-2, vmax=2, aspect="auto"
      )
      for i, j in itertools.product(range(len(chans)), range(len(ks))):
        if not np.isnan(grid_[i, j]):
          text = f"{grid_[i, j]:.2f}" if grid_[i, j] > 0 else "oom"
          ax.text(j, i, text, ha="center", va="center", fontsize=7)
      ax.set_xticks(range(len(ks)), [str(k) for k in ks])
      ax.set_yticks(range(len(chans)), [f"{a}->{b}" for a, b in chans])
      ax.set_xlabel("filter size")
      ax.set_ylabel("channels")
      ax.set_title(f"{mode}: {title} (worst over sizes, threads)", fontsize=9)
      fig.colorbar(im, ax=ax, label="log2 ratio")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  print(f"wrote {path}")


def _run_children(args, rows_file, limit=CALL_LIMIT_S, timeout=6 * 3600):
  """Runs the child `args` until it has timed every point: a child in one call for over
  `limit` seconds (TensorFlow's filter gradient takes minutes to hours on some large
  filters) is stopped, and a new one resumes from that point without that algorithm.
  Returns None, or why the children stopped short (a failure, or `timeout` in all)."""
  calls = rows_file + RUNS_FILE_SUFFIX
  stopped = []
  start = time.time()
  while True:
    if os.path.exists(calls):
      os.remove(calls)
    child = subprocess.Popen(
      [sys.executable] + args + ["--stopped", json.dumps(stopped)],
      stdout=subprocess.DEVNULL,
      env=measure.child_env(TF_CPP_MIN_LOG_LEVEL="3", OPENBLAS_NUM_THREADS="1"),
    )
    try:
      while child.poll() is None:
        time.sleep(1.0)
        if time.time() - start > timeout:
          return f"timed out after {timeout} s"
        try:
          with open(calls, encoding="ascii") as f:
            call = json.load(f)
        except (OSError, ValueError):  # not written yet, or being written
          continue
        if call["point"] is not None and time.time() - call["since"] > limit:
          stopped.append([call["point"], call["algorithm"]])
          print(f"stopped {call['algorithm']} at {call['point']}: one call ran over {limit} s")
          break
      else:
        return None if child.returncode == 0 else f"the child failed (exit {child.returncode})"
    finally:  # stopped, timed out, or this process interrupted: the child goes too
      if child.poll() is None:
        child.kill()
        child.wait()


def main(out_dir, full=False, threads=None, few_channel=False, many_channel=False):
  """Runs the sweep with each thread setting (default: one thread and every core)."""
  rows = []
  print(HEADER)
  suffix = "_few_channel" if few_channel else "_many_channel" if many_channel else ""
  name = os.path.join(out_dir, "sweep" + suffix)
  os.makedirs(out_dir, exist_ok=True)
  partial = name + ".rows.jsonl"  # each row as it is timed, until the run completes
  for stale in (partial, partial + RUNS_FILE_SUFFIX):
    if os.path.exists(stale):
      os.remove(stale)
  for n in threads or sorted({1, len(os.sched_getaffinity(0))}):
    args = (
      ["-m", "benchmarks.cpu.sweep", "--child", str(n)]
      + (["--full"] if full else [])
      + (["--few-channel"] if few_channel else [])
      + (["--many-channel"] if many_channel else [])
      + ["--rows-file", partial]
    )
    error = _run_children(args, partial)
    if error:
      print(f"{n} thread(s): {error}")
    got = _rows_of(partial, n)
    for row in got:
      print(_format(row))
    rows += got
  if not rows:
    return 1
  verdicts = [_verdict(r) for r in rows]
  vs_tf = [t for _, t in verdicts if t is not None]
  print(
    f"\n{len(rows)} points: auto within 10% of the fastest timed at "
    f"{sum(b <= MISS for b, _ in verdicts)} (worst {max(b for b, _ in verdicts):.2f}); "
    f"TF timed at {len(vs_tf)}, auto no more than 10% slower than it at "
    f"{sum(t <= MISS for t in vs_tf)} (worst {max(vs_tf, default=0):.2f}); "
    f"{sum(r.get('retimed', False) for r in rows)} points timed again after a miss"
  )
  with open(name + ".json", "w", encoding="ascii") as f:
    json.dump(rows, f, indent=1)
  print(f"wrote {name}.json")
  for done in (partial, partial + RUNS_FILE_SUFFIX):
    if os.path.exists(done):
      os.remove(done)
  if many_channel:
    _print_winners(rows)
  (_plot_winners if many_channel else _plot)(rows, name + ".png")
  return 0


if __name__ == "__main__":
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--full", action="store_true", help="every point of the grid")
  parser.add_argument(
    "--few-channel",
    action="store_true",
    help="only the one- and few-channel large images (few_channel_grid)",
  )
  parser.add_argument(
    "--many-channel",
    action="store_true",
    help="only the many-channel cells (many_channel_grid)",
  )
  parser.add_argument(
    "--out",
    default=measure.RESULTS_DIR,
    help="where sweep.json and sweep.png (with --few-channel, "
    "sweep_few_channel.json and .png) go (default: benchmarks/results/cpu)",
  )
  parser.add_argument(
    "--threads", type=int, nargs="*", help="intra-op thread settings (default: 1 and every core)"
  )
  parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
  parser.add_argument("--rows-file", help=argparse.SUPPRESS)
  parser.add_argument("--stopped", default="[]", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    rows = _child(
      args.full,
      args.child,
      args.few_channel,
      args.many_channel,
      args.rows_file,
      [(p, a) for p, a in json.loads(args.stopped)],
    )
    print(json.dumps({"rows": rows}))
  else:
    sys.exit(main(args.out, args.full, args.threads, args.few_channel, args.many_channel))
