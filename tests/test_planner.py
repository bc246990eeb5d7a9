"""The planner: workspace is a hard limit and exactly what the kernels take (as TF's
allocator counts it), impossible limits fail clearly, and choices are stable."""

import gc
import os
import subprocess
import sys
import textwrap

from hypothesis import HealthCheck, assume, given, settings, strategies as st
import numpy as np
import pytest
import tensorflow as tf

import tf_largeconv as lc
from tf_largeconv import _loader

MiB = 2**20


def _transient_peak(fn):
  """Peak bytes TF's CPU allocator held during fn() above what is still live after it:
  the temporary memory fn() took and gave back (its results stay live, so they cancel)."""
  gc.collect()  # so no earlier garbage is freed during fn() and skews "current"
  gc.disable()
  try:
    tf.config.experimental.reset_memory_stats("CPU:0")
    result = fn()
    info = tf.config.experimental.get_memory_info("CPU:0")
  finally:
    gc.enable()
  return result, info["peak"] - info["current"]


def _allocator_count(out_bytes, temp_bytes):
  """What TF's CPU allocator counts as transient for "allocate a result of out_bytes, then
  a temporary of temp_bytes, free the temporary" from its current state.

  That allocator (BFC, with oneDNN) counts chunks, not requests: under 256 KiB nothing is
  counted (small-object allocator); above, a request is counted exactly when split off a
  larger free chunk and as the whole chunk (< 2x the request) otherwise, depending on its
  free list. Replaying the op's allocation sequence gives the figure the op must produce.
  """
  def replay():
    out = tf.random.uniform((out_bytes // 4,))
    if temp_bytes:
      temp = tf.random.uniform((temp_bytes // 4,))
      del temp
    return out

  _, count = _transient_peak(replay)
  return count


def _check_passes(plan, x_shape, w_shape, strides, padding, rng, **kwargs):
  """Runs each pass of `plan` alone and checks its temporary memory against the allocator's
  count of one request of the planned workspace (after the pass's result)."""
  x = tf.constant(rng.standard_normal(x_shape), tf.float32)
  w = tf.constant(rng.standard_normal(w_shape), tf.float32)
  dy = tf.constant(rng.standard_normal(plan.output_shape), tf.float32)
  runs = {
      "forward": (lambda: lc.conv2d(x, w, strides, padding, **kwargs), plan.output_shape),
      "backprop_input": (lambda: lc.conv2d_backprop_input(x_shape, w, dy, strides, padding,
                                                          **kwargs), x_shape),
      "backprop_filter": (lambda: lc.conv2d_backprop_filter(x, w_shape, dy, strides, padding,
                                                            **kwargs), w_shape),
  }
  for pass_plan in plan.passes:
    assert pass_plan.workspace_bytes <= plan.workspace_limit
    run, out_shape = runs[pass_plan.name]
    expected = _allocator_count(int(np.prod(out_shape)) * 4, pass_plan.workspace_bytes)
    _, extra = _transient_peak(run)
    assert extra == expected, (pass_plan, extra, expected)
    assert extra < 2 * max(pass_plan.workspace_bytes, 1)


CASES = [
    ((2, 100, 90, 3), (31, 31, 3, 4), 1, "SAME"),
    ((1, 64, 70, 8), (15, 9, 4, 6), (2, 1), "VALID"),
    ((1, 200, 210, 1), (61, 61, 1, 2), 1, "SAME"),
]


@pytest.mark.parametrize("limit", [MiB // 4, MiB // 2, MiB, 8 * MiB, 64 * MiB])
@pytest.mark.parametrize("case", CASES)
def test_each_pass_takes_exactly_the_planned_workspace(rng, case, limit):
  x_shape, w_shape, strides, padding = case
  p = lc.plan(x_shape, w_shape, strides, padding, workspace_limit=limit)
  _check_passes(p, x_shape, w_shape, strides, padding, rng, workspace_limit=limit)


def test_gradient_step_stays_within_limit(rng):
  limit = 3 * MiB
  x = tf.Variable(rng.standard_normal((2, 120, 130, 2)), dtype=tf.float32)
  w = tf.Variable(rng.standard_normal((41, 41, 2, 3)), dtype=tf.float32)
  p = lc.plan(x.shape, w.shape, 1, "SAME", workspace_limit=limit)
  assert all(pp.algorithm == "fft" for pp in p.passes)

  def step():
    with tf.GradientTape() as tape:
      y = lc.conv2d(x, w, 1, "SAME", workspace_limit=limit)
    return tape.gradient(y, [x, w], output_gradients=tf.ones_like(y))

  step()
  _, transient = _transient_peak(step)
  # Freed by the end of the step: y, the ones_like(y) seed, and one workspace at a time,
  # each counted by the allocator as less than twice its size (see _allocator_count).
  y_bytes = 2 * 120 * 130 * 3 * 4
  assert transient < 2 * (2 * y_bytes + p.workspace_bytes)


def test_plan_equals_what_the_op_does(rng):
  x = rng.standard_normal((1, 150, 160, 2)).astype(np.float32)
  w = rng.standard_normal((51, 51, 2, 2)).astype(np.float32)
  p = lc.plan(x.shape, w.shape, 1, "VALID")
  assert p.forward.algorithm == "fft" and p.forward.tile is not None
  want = lc.conv2d(x, w, 1, "VALID", algorithm="direct").numpy()
  got = lc.conv2d(x, w, 1, "VALID").numpy()
  fft = lc.conv2d(x, w, 1, "VALID", algorithm="fft").numpy()
  np.testing.assert_array_equal(got, fft)  # auto did what the plan said: the FFT
  assert np.abs(got - want).max() < 1e-4 * np.abs(want).max()


def test_impossible_limit_names_the_minimum():
  with pytest.raises(ValueError, match=r"workspace_limit 1000 bytes is too small for the FFT "
                     r"algorithm: it needs at least \d+ bytes"):
    lc.plan((1, 100, 100, 1), (31, 31, 1, 1), 1, "SAME", algorithm="fft",
            workspace_limit=1000)
  with pytest.raises(tf.errors.InvalidArgumentError, match="needs at least"):
    lc.conv2d(tf.ones((1, 100, 100, 1)), tf.ones((31, 31, 1, 1)), 1, "SAME",
              algorithm="fft", workspace_limit=1000)
  # With algorithm='auto' the planner falls back to the direct path, which needs none.
  p = lc.plan((1, 100, 100, 1), (31, 31, 1, 1), 1, "SAME", workspace_limit=1000)
  assert p.forward.algorithm == "direct" and p.workspace_bytes == 0


def test_minimum_reported_is_sufficient():
  p = lc.plan((1, 100, 100, 1), (31, 31, 1, 1), 1, "SAME", algorithm="fft",
              workspace_limit=1000000, num_threads=1)
  assert p.forward.workspace_bytes <= 1000000
  try:
    lc.plan((1, 100, 100, 1), (31, 31, 1, 1), 1, "SAME", algorithm="fft",
            workspace_limit=1000)
  except ValueError as e:
    minimum = int(str(e).split("at least ")[1].split()[0])
  p = lc.plan((1, 100, 100, 1), (31, 31, 1, 1), 1, "SAME", algorithm="fft",
              workspace_limit=minimum)
  assert all(pp.algorithm == "fft" and pp.workspace_bytes <= minimum for pp in p.passes)


@pytest.mark.parametrize("x_shape,w_shape,padding,expected", [
    # The seed case: one transform covers a whole frame.
    ((10, 321, 481, 1), (135, 135, 1, 3), "VALID", ("fft", (324, 486), (1, 1))),
    ((4, 128, 128, 16), (63, 63, 16, 16), "SAME", ("fft", None, None)),
    # A 1x1 filter is a matrix product: nothing for an FFT to save, and TensorFlow's own
    # kernel does it best.
    ((2, 32, 32, 8), (1, 1, 8, 8), "SAME", ("tf", None, None)),
    ((4, 32, 32, 32), (3, 3, 32, 64), "SAME", ("tf", None, None)),
])
def test_reference_choices_are_stable(x_shape, w_shape, padding, expected):
  p = lc.plan(x_shape, w_shape, 1, padding)
  algorithm, fft_size, tiles = expected
  assert p.forward.algorithm == algorithm
  if fft_size:
    assert p.forward.fft_size == fft_size
  if tiles:
    assert p.forward.tiles == tiles
  if algorithm == "fft":
    assert p.forward.estimated_seconds["fft"] < p.forward.estimated_seconds["direct"]


def test_plan_prints_a_table():
  text = str(lc.plan((2, 64, 64, 3), (31, 31, 3, 8), 1, "SAME"))
  lines = text.splitlines()
  assert lines[1].split()[:2] == ["pass", "algorithm"]
  assert [l.split()[0] for l in lines[2:]] == ["forward", "backprop_input", "backprop_filter"]


def test_plan_argument_errors():
  with pytest.raises(ValueError, match="algorithm must be one of"):
    lc.plan((1, 8, 8, 1), (3, 3, 1, 1), 1, "SAME", algorithm="winograd")
  with pytest.raises(ValueError, match="workspace_limit must be None or a non-negative"):
    lc.plan((1, 8, 8, 1), (3, 3, 1, 1), 1, "SAME", workspace_limit=-5)
  with pytest.raises(ValueError, match="larger than the padded input"):
    lc.plan((1, 8, 8, 1), (9, 3, 1, 1), 1, "VALID")


def test_gradient_uses_forward_settings(rng):
  x = tf.Variable(rng.standard_normal((1, 40, 40, 1)), dtype=tf.float32)
  w = tf.Variable(rng.standard_normal((21, 21, 1, 1)), dtype=tf.float32)
  fn = tf.function(lambda: _grads(x, w))
  graph = fn.get_concrete_function().graph
  algos = {op.type: op.get_attr("algorithm") for op in graph.get_operations()
           if op.type.startswith("LargeConv>")}
  assert algos == {"LargeConv>Conv2D": b"direct", "LargeConv>Conv2DBackpropInput": b"direct",
                   "LargeConv>Conv2DBackpropFilter": b"direct"}
  assert _loader.ops() is _loader.ops()


def _grads(x, w):
  with tf.GradientTape() as tape:
    y = lc.conv2d(x, w, 1, "SAME", algorithm="direct")
  return tape.gradient(y, [x, w])


@settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", "12")), deadline=None,
          derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.integers(1, 2), st.integers(20, 90), st.integers(20, 90), st.integers(1, 3),
       st.integers(5, 41), st.integers(1, 4), st.sampled_from(["SAME", "VALID"]),
       st.sampled_from([MiB // 4, MiB, 4 * MiB, 16 * MiB]))
def test_random_shapes_and_limits_stay_within_the_limit(n, h, w, c, k, cout, padding, limit):
  assume(padding == "SAME" or (h >= k and w >= k))
  x_shape, w_shape = (n, h, w, c), (k, k, c, cout)
  p = lc.plan(x_shape, w_shape, 1, padding, workspace_limit=limit, algorithm="fft")
  _check_passes(p, x_shape, w_shape, 1, padding, np.random.default_rng(h * w + k),
                workspace_limit=limit, algorithm="fft")


def test_process_memory_does_not_scale_with_input_times_filter():
  # 2000x2000 input, 101x101 filter: an im2col would need 2000*2000*101*101*4 B = 163 GB.
  code = textwrap.dedent("""
      import numpy as np, tensorflow as tf, tf_largeconv as lc
      from tf_largeconv import _measure
      x = tf.random.uniform((1, 2000, 2000, 1)); w = tf.random.uniform((101, 101, 1, 1))
      lc.conv2d(tf.ones((1, 8, 8, 1)), tf.ones((3, 3, 1, 1)), 1, "SAME")  # load, warm up
      limit = 8 << 20
      base = _measure.reset_peak_rss()
      with tf.GradientTape() as tape:
        tape.watch([x, w])
        y = lc.conv2d(x, w, 1, "SAME", workspace_limit=limit)
      dx, dw = tape.gradient(y, [x, w])
      print((_measure.peak_rss() - base) / 2**20)
      """)
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
             PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=600, check=True)
  growth_mib = float(out.stdout.strip().splitlines()[-1])
  # Live at once: y, its gradient seed, dx (16 MB each), one 8 MiB workspace, each
  # possibly held in a chunk up to twice its size by TF's allocator, plus thread and
  # transform scratch.
  assert growth_mib < 2 * (3 * 16 + 8) + 32, growth_mib
