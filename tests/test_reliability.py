"""Determinism (bitwise, across runs and thread counts) and concurrency (threads calling the
op and its gradient at once give exactly the serial results) for conv2d and conv3d, and the
16-bit types' float32 accumulation (no overflow, no stalled sums) in every pass of both
algorithms."""

import json
import math
import threading
import time

import numpy as np
import pytest
import subproc
import tensorflow as tf

import tf_largeconv as lc

# (input, filter, strides, padding, algorithm): FFT and direct, grouped, strided.
CASES = [
  ((3, 60, 70, 2), (21, 21, 2, 3), 1, "SAME", "fft"),
  ((2, 40, 44, 8), (9, 9, 2, 8), 2, "VALID", "fft"),
  ((2, 30, 31, 4), (5, 5, 4, 6), 1, "SAME", "direct"),
  ((4, 56, 56, 16), (31, 31, 1, 16), 1, "SAME", "auto"),
  # Runs of tiles per item in the forward and input-gradient passes, as long as the
  # slots leave them (8, 4, 3 and 1 tiles at 1, 2, 3 and 16 threads).
  ((8, 64, 64, 32), (15, 15, 32, 32), 1, "SAME", "fft"),
  # conv3d: 3-D FFT tiles over several channels, and grouped, strided direct sums.
  ((2, 14, 15, 16, 2), (9, 9, 9, 2, 3), 1, "SAME", "fft"),
  ((2, 12, 13, 11, 4), (3, 3, 3, 2, 4), 2, "VALID", "direct"),
  # A workspace limit small enough that more slots would leave room for fewer source
  # channels per block of products (whose grouping sets the rounding).
  ((2, 64, 64, 8), (15, 15, 8, 8), 1, "SAME", "fft", 1 << 17),
]


def _conv(x, w, s, p, alg, limit=None):
  if len(w.shape) == 5:
    return lc.conv3d(x, w, [1, s, s, s, 1], p, algorithm=alg, workspace_limit=limit)
  return lc.conv2d(x, w, s, p, algorithm=alg, workspace_limit=limit)


# Intra-op thread counts of the determinism children: serial, two, a count that divides
# none of the work evenly, and more threads than the machine has cores.
THREAD_COUNTS = (1, 2, 3, 16)


def _run_all(seed=0):
  """Forward and both gradients of every case, as numpy arrays."""
  rng = np.random.default_rng(seed)
  results = []
  for x_shape, w_shape, s, p, alg, *limit in CASES:
    x = tf.constant(rng.standard_normal(x_shape), tf.float32)
    w = tf.constant(rng.standard_normal(w_shape), tf.float32)
    with tf.GradientTape() as tape:
      tape.watch([x, w])
      y = _conv(x, w, s, p, alg, *limit)
    dx, dw = tape.gradient(y, [x, w], output_gradients=tf.sin(y))
    results += [y.numpy(), dx.numpy(), dw.numpy()]
  return results


def _plans():
  """What the planner makes of every case with the current thread count (slots and blocks
  vary with it; the transform sizes must not)."""
  out = []
  for x_shape, w_shape, s, p, alg, *limit in CASES:
    strides = [1, s, s, s, 1] if len(w_shape) == 5 else s
    plan = lc.plan(
      x_shape, w_shape, strides, p, algorithm=alg, workspace_limit=(limit or [None])[0]
    )
    out.append(
      [plan.threads]
      + [
        [q.algorithm, q.fft_size, q.in_block, q.out_block, q.group_block, q.vec_block, q.slots]
        for q in plan.passes
      ]
    )
  return out


def test_bitwise_identical_across_runs():
  first, second = _run_all(), _run_all()
  for a, b in zip(first, second):
    assert a.tobytes() == b.tobytes()


# A child sets its thread count before TensorFlow starts, checks that TensorFlow and the
# planner took it (else the children would all run with the default and compare equal
# trivially), saves every result and prints its plans.
THREADS_CHILD = """
import json, sys
import numpy as np, tensorflow as tf
n = int(sys.argv[1])
tf.config.threading.set_intra_op_parallelism_threads(n)
import tf_largeconv as lc
import test_reliability as t
results = t._run_all()
got = (tf.config.threading.get_intra_op_parallelism_threads(),
       lc.planning.device.intra_op_threads())
assert got == (n, n), f"asked for {n} intra-op threads; TensorFlow, planner: {got}"
np.savez(sys.argv[2], *results)
print(json.dumps(t._plans()))
"""


def test_bitwise_identical_across_thread_counts(tmp_path):
  # Started together: each child is mostly TensorFlow's start-up, so they overlap well.
  procs = {n: subproc.start(THREADS_CHILD, n, tmp_path / f"r{n}.npz") for n in THREAD_COUNTS}
  plans = {
    n: json.loads(subproc.wait(p, timeout=300)[0].splitlines()[-1]) for n, p in procs.items()
  }
  for n in THREAD_COUNTS:
    assert all(case[0] == n for case in plans[n]), (n, plans[n])
    # The transform sizes change the arithmetic; only slots and blocks may follow threads.
    assert [[q[:2] for q in case[1:]] for case in plans[n]] == [
      [q[:2] for q in case[1:]] for case in plans[1]
    ], (n, plans[n], plans[1])
  # Each count must split the work differently, or the comparison below compares like
  # with like.
  distinct = {json.dumps([case[1:] for case in plans[n]]) for n in THREAD_COUNTS}
  assert len(distinct) == len(THREAD_COUNTS), plans
  first = np.load(tmp_path / f"r{THREAD_COUNTS[0]}.npz")
  assert len(first.files) == len(CASES) * 3
  for n in THREAD_COUNTS[1:]:
    other = np.load(tmp_path / f"r{n}.npz")
    assert other.files == first.files
    for k in first.files:
      assert first[k].tobytes() == other[k].tobytes(), f"{n} threads, result {k}"


# Every thread repeats its job this often; all of them must end within JOIN_SECONDS (a few
# seconds of work; the rest is margin for a loaded machine).
ITERATIONS = 3
JOIN_SECONDS = 300


def test_eight_threads_at_once_match_serial():
  rng = np.random.default_rng(7)
  jobs = []
  for i in range(8):
    x_shape, w_shape, s, p, alg, *limit = CASES[i % len(CASES)]
    x = tf.constant(rng.standard_normal(x_shape), tf.float32)
    w = tf.constant(rng.standard_normal(w_shape), tf.float32)
    jobs.append((x, w, s, p, alg, *limit))

  def work(job):
    x, w, s, p, alg, *limit = job
    with tf.GradientTape() as tape:
      tape.watch([x, w])
      y = _conv(x, w, s, p, alg, *limit)
    dx, dw = tape.gradient(y, [x, w])
    return [y.numpy(), dx.numpy(), dw.numpy()]

  # Every iteration's results: a race that spoils only the first calls (cold caches, all
  # threads starting at once) must show as much as one in the last.
  runs = [[] for _ in jobs]
  errors = []
  start = threading.Barrier(len(jobs))

  def run(i):
    try:
      start.wait(timeout=60)
      for _ in range(ITERATIONS):
        runs[i].append(work(jobs[i]))
    except Exception as e:
      errors.append((i, e))

  # Daemon threads: a hung one fails this test instead of keeping pytest from exiting.
  threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(jobs))]
  for t in threads:
    t.start()
  deadline = time.monotonic() + JOIN_SECONDS
  for t in threads:
    t.join(timeout=max(0.0, deadline - time.monotonic()))
  hung = [i for i, t in enumerate(threads) if t.is_alive()]
  assert not hung, f"threads {hung} still running after {JOIN_SECONDS} s"
  assert not errors, errors
  serial = [work(j) for j in jobs]
  for i, (got, want) in enumerate(zip(runs, serial)):
    assert len(got) == ITERATIONS, (i, len(got))
    for it, results in enumerate(got):
      for name, a, b in zip(("y", "dx", "dw"), results, want):
        assert a.tobytes() == b.tobytes(), f"thread {i}, iteration {it}: {name}"


# ---------------------------------------------------------------------------------------
# 16-bit types accumulate in float32.

PASSES = ("forward", "backprop_input", "backprop_filter")
MANTISSA_BITS = {tf.float16: 10, tf.bfloat16: 7}


def _pass_sums(values, dtype, algorithm):
  """The sum of the 2-D array `values` as each pass of the op computes it, and each pass's
  error bound.

  The values meet ones: the forward pass convolves them with a filter of ones of their
  shape, the input gradient runs ones through them as a filter (the middle input position
  reads every tap), and the filter gradient of a 1x1 filter sums them, laid out in one row,
  times ones over all positions.

  Returns:
    ({pass: sum}, {pass: bound}); the bound is 0 where the pass sums directly, the FFT's
    norm-wise float32 rounding otherwise: 8 u log2(T) |a|_2 |b|_2 for transforms of T
    points, at least 2 (as reference.PassCheck.fft_bound).
  """
  h, w = np.shape(values)
  n = h * w
  block = tf.constant(np.reshape(values, (1, h, w, 1)), dtype)
  row = tf.reshape(block, (1, 1, n, 1))
  attrs = dict(strides=1, padding="VALID", algorithm=algorithm)
  sums = {
    "forward": lc.conv2d(block, tf.ones((h, w, 1, 1), dtype), **attrs)[0, 0, 0, 0],
    "backprop_input": lc.conv2d_backprop_input(
      [1, 2 * h - 1, 2 * w - 1, 1],
      tf.reshape(block, (h, w, 1, 1)),
      tf.ones((1, h, w, 1), dtype),
      **attrs,
    )[0, h - 1, w - 1, 0],
    "backprop_filter": lc.conv2d_backprop_filter(row, [1, 1, 1, 1], tf.ones_like(row), **attrs)[
      0, 0, 0, 0
    ],
  }
  geometry = {
    "forward": ((1, h, w, 1), (h, w, 1, 1)),
    "backprop_input": ((1, 2 * h - 1, 2 * w - 1, 1), (h, w, 1, 1)),
    "backprop_filter": ((1, 1, n, 1), (1, 1, 1, 1)),
  }
  norms = float(np.linalg.norm(tf.cast(block, tf.float64).numpy())) * math.sqrt(n)
  bounds = {}
  for name in PASSES:
    plan = getattr(lc.plan(*geometry[name], 1, "VALID", dtype=dtype, algorithm=algorithm), name)
    assert plan.algorithm == algorithm, (name, plan)
    bounds[name] = (
      8 * 2.0**-24 * math.log2(max(math.prod(plan.fft_size), 2)) * norms
      if algorithm == "fft"
      else 0.0
    )
  return {k: float(v) for k, v in sums.items()}, bounds


@pytest.mark.parametrize("algorithm", ["direct", "fft"])
def test_float16_does_not_overflow_in_accumulation(algorithm):
  # The running sums reach 32 * 30000, far past float16's 65504; the sums (0) do not. 32,
  # not 4, of each sign so that eight interleaved partial sums (the direct filter
  # gradient's) also pass 65504. bfloat16 has float32's range: its accumulator cannot
  # overflow where float32's would not, and its precision is checked below.
  sums, bounds = _pass_sums([[30000.0] * 32 + [-30000.0] * 32], tf.float16, algorithm)
  for name in PASSES:
    assert math.isfinite(sums[name]) and abs(sums[name]) <= bounds[name], (name, sums, bounds)
  if algorithm == "fft":
    assert max(bounds.values()) < 10, bounds  # 8 u log2(T) * 240000 * 8: about 7 here


# Sums of ones that a 16-bit accumulator cannot reach: float16's sum of ones stops at 2048
# and bfloat16's at 256 (x + 1 rounds back to x), eight partial sums at eight times that.
# Both counts (16400 and 2064) are exact in their type. Filters as (height, width): the FFT
# takes filters up to 4096 wide.
SHAPES = {tf.float16: (5, 3280), tf.bfloat16: (1, 2064)}


@pytest.mark.parametrize("algorithm", ["direct", "fft"])
@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16], ids=["float16", "bfloat16"])
def test_half_accumulates_in_float32(dtype, algorithm):
  n = math.prod(SHAPES[dtype])
  assert float(tf.cast(float(n), dtype)) == n
  sums, bounds = _pass_sums(np.ones(SHAPES[dtype]), dtype, algorithm)
  # The FFT's float32 error (under 0.2 here) is far below half the storage spacing at n,
  # so rounding on store gives n exactly on either path.
  half_spacing = 2.0 ** (math.floor(math.log2(n)) - MANTISSA_BITS[dtype]) / 2
  assert max(bounds.values()) < half_spacing / 8, bounds
  assert sums == {name: float(n) for name in PASSES}
