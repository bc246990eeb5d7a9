"""Determinism (bitwise, across runs and thread counts) and concurrency (threads calling
the op and its gradient at once give exactly the serial results)."""

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
import tensorflow as tf

import tf_largeconv as lc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
           PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))

# (input, filter, strides, padding, algorithm): FFT and direct, grouped, strided.
CASES = [
    ((3, 60, 70, 2), (21, 21, 2, 3), 1, "SAME", "fft"),
    ((2, 40, 44, 8), (9, 9, 2, 8), 2, "VALID", "fft"),
    ((2, 30, 31, 4), (5, 5, 4, 6), 1, "SAME", "direct"),
    ((4, 56, 56, 16), (31, 31, 1, 16), 1, "SAME", "auto"),
]


def _run_all(seed=0):
  """Forward and both gradients of every case, as numpy arrays."""
  rng = np.random.default_rng(seed)
  results = []
  for x_shape, w_shape, s, p, alg in CASES:
    x = tf.constant(rng.standard_normal(x_shape), tf.float32)
    w = tf.constant(rng.standard_normal(w_shape), tf.float32)
    with tf.GradientTape() as tape:
      tape.watch([x, w])
      y = lc.conv2d(x, w, s, p, algorithm=alg)
    dx, dw = tape.gradient(y, [x, w], output_gradients=tf.sin(y))
    results += [y.numpy(), dx.numpy(), dw.numpy()]
  return results


def test_bitwise_identical_across_runs():
  first, second = _run_all(), _run_all()
  for a, b in zip(first, second):
    assert a.tobytes() == b.tobytes()


def test_bitwise_identical_across_thread_counts(tmp_path):
  code = textwrap.dedent(f"""
      import sys, numpy as np, tensorflow as tf
      tf.config.threading.set_intra_op_parallelism_threads(int(sys.argv[1]))
      sys.path.insert(0, {os.path.join(ROOT, "tests")!r})
      import test_reliability as t
      np.savez(sys.argv[2], *t._run_all())
      """)
  for n in (1, 2):
    subprocess.run([sys.executable, "-c", code, str(n), str(tmp_path / f"r{n}.npz")],
                   env=ENV, check=True, timeout=300, capture_output=True)
  one, two = np.load(tmp_path / "r1.npz"), np.load(tmp_path / "r2.npz")
  assert len(one.files) == len(CASES) * 3
  for k in one.files:
    assert one[k].tobytes() == two[k].tobytes(), k


def test_eight_threads_at_once_match_serial():
  rng = np.random.default_rng(7)
  jobs = []
  for i in range(8):
    x_shape, w_shape, s, p, alg = CASES[i % len(CASES)]
    x = tf.constant(rng.standard_normal(x_shape), tf.float32)
    w = tf.constant(rng.standard_normal(w_shape), tf.float32)
    jobs.append((x, w, s, p, alg))

  def work(job):
    x, w, s, p, alg = job
    with tf.GradientTape() as tape:
      tape.watch([x, w])
      y = lc.conv2d(x, w, s, p, algorithm=alg)
    dx, dw = tape.gradient(y, [x, w])
    return [y.numpy(), dx.numpy(), dw.numpy()]

  serial = [work(j) for j in jobs]
  parallel = [None] * len(jobs)
  errors = []

  def run(i):
    try:
      for _ in range(3):
        parallel[i] = work(jobs[i])
    except Exception as e:  # pylint: disable=broad-except
      errors.append(e)

  threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=600)
  assert not errors, errors
  for got, want in zip(parallel, serial):
    for a, b in zip(got, want):
      assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16])
def test_half_types_do_not_overflow_in_accumulation(dtype):
  # Partial sums of 8 * 30000 exceed float16's range; the result (0) does not.
  x = tf.constant(np.tile([30000.0, -30000.0], 4).reshape(1, 1, 8, 1), dtype)
  w = tf.ones((1, 8, 1, 1), dtype)
  assert float(lc.conv2d(x, w, 1, "VALID", algorithm="direct")[0, 0, 0, 0]) == 0.0
  # The FFT's float32 rounding is norm-wise: |x| |w| * 8 * 2^-24 * log2(8) ~ 0.34 here.
  assert abs(float(lc.conv2d(x, w, 1, "VALID", algorithm="fft")[0, 0, 0, 0])) <= 0.34
