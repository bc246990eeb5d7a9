"""The planner: workspace is a hard limit and exactly what the kernels take (as TF's step
stats count it), impossible limits fail clearly, and choices are stable."""

import json
import os
import platform
import re
import sys

import numpy as np
import pytest
import subproc
import tensorflow as tf
from cpuinfo import cpu_flags
from hypothesis import HealthCheck
from hypothesis import assume
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

import tf_largeconv as lc
from tf_largeconv import _loader

MiB = 2**20
POOL_ENV = "LARGECONV_WORKSPACE_POOL_MIB"

_OP_OF_PASS = {
  "forward": "LargeConv>Conv2D",
  "backprop_input": "LargeConv>Conv2DBackpropInput",
  "backprop_filter": "LargeConv>Conv2DBackpropFilter",
}


def _traced_run(build, *arrays):
  """Runs a graph once in a `tf.compat.v1.Session` with a full trace.

  TF's step stats give each node's temporary memory (what it took through allocate_temp
  and gave back) to the byte; the allocator's own counters round to chunks and count
  nothing under 256 KiB.

  Args:
    build: makes the fetches from placeholders standing for `arrays`. Placeholders, not
      constants, so that graph optimization cannot fold the ops away.
    *arrays: float32 numpy arrays to feed.

  Returns:
    (the fetched values, {op type: [temp_memory_size of each of its nodes that ran]}).
  """
  graph = tf.Graph()
  with graph.as_default():
    inputs = [tf.compat.v1.placeholder(tf.float32, a.shape) for a in arrays]
    fetches = build(*inputs)
  options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
  metadata = tf.compat.v1.RunMetadata()
  # A workspace kept from an earlier call (the pool, LARGECONV_WORKSPACE_POOL_MIB) would be
  # reused rather than taken through allocate_temp: off for the traced run.
  saved = os.environ.get(POOL_ENV)
  os.environ[POOL_ENV] = "0"
  try:
    with tf.compat.v1.Session(graph=graph) as session:
      values = session.run(
        fetches, dict(zip(inputs, arrays)), options=options, run_metadata=metadata
      )
  finally:
    if saved is None:
      os.environ.pop(POOL_ENV)
    else:
      os.environ[POOL_ENV] = saved
  op_types = {op.name: op.type for op in graph.get_operations()}
  temps = {}
  for device in metadata.step_stats.dev_stats:
    for node in device.node_stats:
      temps.setdefault(op_types.get(node.node_name), []).append(node.memory_stats.temp_memory_size)
  return values, temps


def _check_passes(plan, x_shape, w_shape, strides, padding, rng, **kwargs):
  """Runs the three passes of `plan` on random operands, checking that each takes exactly
  its planned workspace, within the plan's limit.

  Returns:
    (x, w, dy, {pass name: its result}).
  """
  x = rng.standard_normal(x_shape).astype(np.float32)
  w = rng.standard_normal(w_shape).astype(np.float32)
  dy = rng.standard_normal(plan.output_shape).astype(np.float32)
  values, temps = _traced_run(
    lambda x, w, dy: {
      "forward": lc.conv2d(x, w, strides, padding, **kwargs),
      "backprop_input": lc.conv2d_backprop_input(x_shape, w, dy, strides, padding, **kwargs),
      "backprop_filter": lc.conv2d_backprop_filter(x, w_shape, dy, strides, padding, **kwargs),
    },
    x,
    w,
    dy,
  )
  for pass_plan in plan.passes:
    assert temps[_OP_OF_PASS[pass_plan.name]] == [pass_plan.workspace_bytes], (pass_plan, temps)
    assert pass_plan.workspace_bytes <= plan.workspace_limit
    if pass_plan.algorithm == "fft":
      assert pass_plan.workspace_bytes > 0
  return x, w, dy, values


def _assert_binds(plan, unconstrained):
  """Both plans go FFT in every pass, and every pass of `plan` uses a different transform
  than without a limit: its limit changed the plan. Transform sizes do not depend on the
  thread count (slots do), so this holds on any machine."""
  for limited, free in zip(plan.passes, unconstrained.passes):
    assert limited.algorithm == free.algorithm == "fft", (limited, free)
    assert limited.fft_size != free.fft_size, (limited, free)


# Each case goes FFT at each of its limits, each of which binds; `None` (the 64 MiB default)
# is the unconstrained reference, the largest workspace of each case.
CASES = [
  (((2, 100, 90, 3), (31, 31, 3, 4), 1, "SAME"), [MiB // 4, MiB // 2, 7 * MiB // 8]),
  (((1, 150, 140, 2), (41, 35, 2, 4), (2, 1), "VALID"), [MiB // 2, 7 * MiB // 8]),
  (((1, 200, 210, 1), (61, 61, 1, 2), 1, "SAME"), [MiB // 2, MiB]),
]


@pytest.mark.parametrize(
  "case,limit",
  [
    pytest.param(case, limit, id=f"{'x'.join(map(str, case[0]))}-{limit or 'none'}")
    for case, limits in CASES
    for limit in limits + [None]
  ],
)
def test_each_pass_takes_exactly_the_planned_workspace(rng, case, limit):
  p = lc.plan(*case, workspace_limit=limit)
  assert all(pp.algorithm == "fft" for pp in p.passes), p
  if limit is not None:
    _assert_binds(p, lc.plan(*case))
  _check_passes(p, *case, rng, workspace_limit=limit)


def test_gradient_step_stays_within_limit(rng):
  # Without the limit each pass plans 0.8 to 1.4 MB (1 or 2 threads; more with more), so a
  # step that lost the limit on the way to its gradient ops would show.
  limit = MiB // 2
  x_shape, w_shape = (2, 120, 130, 2), (41, 41, 2, 3)
  p = lc.plan(x_shape, w_shape, 1, "SAME", workspace_limit=limit)
  unconstrained = lc.plan(x_shape, w_shape, 1, "SAME")
  _assert_binds(p, unconstrained)
  assert all(pp.workspace_bytes > limit for pp in unconstrained.passes), unconstrained

  def step(x, w):
    with tf.GradientTape() as tape:
      tape.watch([x, w])
      y = lc.conv2d(x, w, 1, "SAME", workspace_limit=limit)
    # y is fetched too: nothing else needs its value, so the session would not run it.
    return y, tape.gradient(y, [x, w], output_gradients=tf.ones_like(y))

  _, temps = _traced_run(
    step,
    rng.standard_normal(x_shape).astype(np.float32),
    rng.standard_normal(w_shape).astype(np.float32),
  )
  # Each pass ran once and took exactly its planned workspace; no node of the step took
  # more than the limit.
  for pass_plan in p.passes:
    assert temps[_OP_OF_PASS[pass_plan.name]] == [pass_plan.workspace_bytes], (pass_plan, temps)
  assert max(max(t) for t in temps.values()) <= limit, temps


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


def test_a_small_pass_runs_on_one_slot():
  # Waking a second thread costs a pass kSlotStartSeconds (plan.cc): a pass
  # the model prices below that gain keeps one slot on two threads, a larger one takes
  # both. Slots do not change the arithmetic, so the transform stays the same.
  small = ((1, 64, 64, 1), (7, 7, 1, 1), 1, "SAME")
  large = ((1, 128, 128, 1), (11, 11, 1, 1), 1, "SAME")
  for case, slots in ((small, 1), (large, 2)):
    two = lc.plan(*case, algorithm="fft", num_threads=2).forward
    one = lc.plan(*case, algorithm="fft", num_threads=1).forward
    assert two.slots == slots and one.slots == 1, (case, two)
    assert (two.fft_size, two.tile, two.tiles) == (one.fft_size, one.tile, one.tiles)
    assert two.tiles[0] * two.tiles[1] >= 2  # items enough for two slots


def test_impossible_limit_names_the_minimum():
  with pytest.raises(
    ValueError,
    match=r"workspace_limit 1000 bytes is too small for the FFT "
    r"algorithm: it needs at least \d+ bytes",
  ):
    lc.plan((1, 100, 100, 1), (31, 31, 1, 1), 1, "SAME", algorithm="fft", workspace_limit=1000)
  with pytest.raises(tf.errors.InvalidArgumentError, match="needs at least"):
    lc.conv2d(
      tf.ones((1, 100, 100, 1)),
      tf.ones((31, 31, 1, 1)),
      1,
      "SAME",
      algorithm="fft",
      workspace_limit=1000,
    )
  # With algorithm='auto' the planner falls back to the direct path, which needs none.
  p = lc.plan((1, 100, 100, 1), (31, 31, 1, 1), 1, "SAME", workspace_limit=1000)
  assert p.forward.algorithm == "direct" and p.workspace_bytes == 0


def test_minimum_reported_is_sufficient(rng):
  case = ((1, 100, 100, 1), (31, 31, 1, 1), 1, "SAME")
  with pytest.raises(ValueError, match=r"needs at least \d+ bytes for this forward pass") as e:
    lc.plan(*case, algorithm="fft", workspace_limit=1000)
  minimum = int(re.search(r"needs at least (\d+) bytes", str(e.value)).group(1))
  p = lc.plan(*case, algorithm="fft", workspace_limit=minimum)
  assert all(pp.algorithm == "fft" and pp.workspace_bytes <= minimum for pp in p.passes), p
  assert p.forward.workspace_bytes == minimum, p  # the smallest plan of the pass named
  # The op runs every pass at exactly that limit, each taking its planned workspace, and
  # agrees with the direct path.
  x, w, dy, got = _check_passes(p, *case, rng, algorithm="fft", workspace_limit=minimum)
  _, w_shape, strides, padding = case
  want = {
    "forward": lc.conv2d(x, w, strides, padding, algorithm="direct"),
    "backprop_input": lc.conv2d_backprop_input(
      x.shape, w, dy, strides, padding, algorithm="direct"
    ),
    "backprop_filter": lc.conv2d_backprop_filter(
      x, w_shape, dy, strides, padding, algorithm="direct"
    ),
  }
  for name, value in want.items():
    value = value.numpy()
    assert got[name].shape == value.shape
    assert np.abs(got[name] - value).max() < 1e-4 * np.abs(value).max(), name
  # One byte less is too little, for the planner and for the op alike.
  with pytest.raises(ValueError, match=f"needs at least {minimum} bytes"):
    lc.plan(*case, algorithm="fft", workspace_limit=minimum - 1)
  with pytest.raises(tf.errors.InvalidArgumentError, match=f"needs at least {minimum} bytes"):
    lc.conv2d(x, w, strides, padding, algorithm="fft", workspace_limit=minimum - 1)


@pytest.mark.parametrize(
  "x_shape,w_shape,padding,expected",
  [
    # The seed case: one transform covers a whole frame.
    ((10, 321, 481, 1), (135, 135, 1, 3), "VALID", ("fft", (324, 486), (1, 1))),
    ((4, 128, 128, 16), (63, 63, 16, 16), "SAME", ("fft", None, None)),
    # A 1x1 filter is a matrix product: nothing for an FFT to save, and TensorFlow's own
    # kernel does it best.
    ((2, 32, 32, 8), (1, 1, 8, 8), "SAME", ("tf", None, None)),
    ((4, 32, 32, 32), (3, 3, 32, 64), "SAME", ("tf", None, None)),
  ],
)
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


BUDGETS = [int(256 * 1024 * 2 ** (k / 2)) for k in range(21)]  # 256 KiB .. 256 MiB


def _planned_seconds(pass_plan):
  return pass_plan.estimated_seconds[pass_plan.algorithm]


@pytest.mark.parametrize(
  "case",
  [
    ((4, 321, 481, 1), (135, 135, 1, 3), 1, "VALID"),  # the seed case
    ((1, 128, 128, 16), (63, 63, 16, 16), 1, "SAME"),
    ((4, 64, 64, 32), (31, 31, 8, 32), 1, "SAME"),  # grouped
    ((8, 56, 56, 128), (31, 31, 1, 128), 1, "SAME"),  # depthwise, RepLKNet's layer
    ((1, 150, 140, 2), (41, 35, 2, 4), (2, 1), "VALID"),
    ((2, 90, 100, 3), (21, 21, 3, 5), 1, "SAME", "NHWC", 2),  # dilated
    ((16, 64, 64, 32), (3, 3, 32, 64), 1, "SAME"),
  ],
  ids=lambda case: "x".join(map(str, case[1])),
)
def test_more_workspace_never_plans_slower(case):
  """Over budgets from 256 KiB to 256 MiB, every pass's planned cost never increases with
  the budget, under auto and under algorithm="fft" (from the first budget the FFT fits):
  a larger limit only adds configurations to choose from."""
  for algorithm in ("auto", "fft"):
    previous = None
    for limit in BUDGETS:
      try:
        p = lc.plan(*case, workspace_limit=limit, algorithm=algorithm)
      except ValueError:  # algorithm="fft" below its minimum
        assert algorithm == "fft" and previous is None, (limit, algorithm)
        continue
      seconds = [_planned_seconds(pp) for pp in p.passes]
      if previous is not None:
        for pp, now, before in zip(p.passes, seconds, previous):
          assert now <= before, (algorithm, limit, pp, now, before)
      previous = seconds
    assert previous is not None


def test_plan_prints_a_table():
  text = str(lc.plan((2, 64, 64, 3), (31, 31, 3, 8), 1, "SAME"))
  lines = text.splitlines()
  assert lines[1].split()[:2] == ["pass", "algorithm"]
  assert [line.split()[0] for line in lines[2:]] == ["forward", "backprop_input", "backprop_filter"]


_TF_KERNELS_CHILD = """
import json
import tf_largeconv as lc
from tf_largeconv import _loader
p = lc.plan((1, 512, 512, 8), (3, 3, 8, 8), 1, "SAME")
print(json.dumps({"kernels": _loader.core().tf_kernels(), "header": str(p).splitlines()[0],
                  "algorithms": [pp.algorithm for pp in p.passes],
                  "tf": [pp.estimated_seconds["tf"] for pp in p.passes]}))
"""

# The CPU features (as /proc/cpuinfo names them) for which TF turns oneDNN on by default on
# Linux.
_ONEDNN_CPU_FLAGS = {"avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16"}


def _planned_in_child(setting):
  env = subproc.child_env()
  env.pop("TF_ENABLE_ONEDNN_OPTS", None)
  if setting is not None:
    env["TF_ENABLE_ONEDNN_OPTS"] = setting
  return json.loads(subproc.run(_TF_KERNELS_CHILD, timeout=300, env=env).stdout)


@pytest.mark.skipif(
  not sys.platform.startswith("linux") or platform.machine() != "x86_64",
  reason="TF's default oneDNN policy checked here is Linux x86's",
)
def test_tf_passes_are_priced_as_the_kernels_tf_runs():
  """TF runs oneDNN's kernels or Eigen's, which are several times apart on small filters
  (most of all in the gradients), so the planner prices TF's passes with the fit of the set
  TF runs (plan.cc's kTfCoefficients), decided as TF decides it."""
  plans = {s: _planned_in_child(s) for s in (None, "0", "false", "TRUE")}
  default = "onednn" if cpu_flags() & _ONEDNN_CPU_FLAGS else "eigen"
  expected = {None: default, "0": "eigen", "false": "eigen", "TRUE": "onednn"}
  assert {s: p["kernels"] for s, p in plans.items()} == expected
  names = {"onednn": "oneDNN's", "eigen": "Eigen's"}
  for p in plans.values():
    assert p["header"].endswith(f"TF priced as {names[p['kernels']]} kernels"), p["header"]
  eigen, onednn = plans["0"], plans["TRUE"]
  # Eigen's gradients of a 3x3 8->8 filter on a large image are slow: the op's FFT runs
  # them; oneDNN's are as fast as its forward kernel, which is faster than the op's.
  assert eigen["algorithms"] == ["tf", "fft", "fft"]
  assert onednn["algorithms"] == ["tf", "tf", "tf"]
  for e, o in zip(eigen["tf"], onednn["tf"]):
    assert o < e


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
  algos = {
    op.type: op.get_attr("algorithm")
    for op in graph.get_operations()
    if op.type.startswith("LargeConv>")
  }
  assert algos == {
    "LargeConv>Conv2D": b"direct",
    "LargeConv>Conv2DBackpropInput": b"direct",
    "LargeConv>Conv2DBackpropFilter": b"direct",
  }
  assert _loader.ops() is _loader.ops()


def _grads(x, w):
  with tf.GradientTape() as tape:
    y = lc.conv2d(x, w, 1, "SAME", algorithm="direct")
  return tape.gradient(y, [x, w])


@settings(
  max_examples=int(os.environ.get("FUZZ_EXAMPLES", "12")),
  deadline=None,
  derandomize=True,
  suppress_health_check=list(HealthCheck),
)
@given(
  st.integers(1, 2),
  st.integers(20, 90),
  st.integers(20, 90),
  st.integers(1, 3),
  st.integers(5, 41),
  st.integers(1, 4),
  st.sampled_from(["SAME", "VALID"]),
  st.sampled_from([MiB // 4, MiB, 4 * MiB, 16 * MiB]),
)
def test_random_shapes_and_limits_stay_within_the_limit(n, h, w, c, k, cout, padding, limit):
  assume(padding == "SAME" or (h >= k and w >= k))
  x_shape, w_shape = (n, h, w, c), (k, k, c, cout)
  p = lc.plan(x_shape, w_shape, 1, padding, workspace_limit=limit, algorithm="fft")
  assert p.workspace_limit == limit  # the limit _check_passes holds the passes to
  # Every draw is an FFT plan, so each pass takes a workspace > 0, checked to the byte.
  _check_passes(
    p,
    x_shape,
    w_shape,
    1,
    padding,
    np.random.default_rng(h * w + k),
    workspace_limit=limit,
    algorithm="fft",
  )


# Runs the forward pass and both gradients of a 2000x2000 input and a 101x101 filter under
# the workspace limit argv[1]; prints the peak RSS growth and the largest planned workspace.
_RSS_CHILD = """
    import sys
    import tensorflow as tf, tf_largeconv as lc
    from benchmarks import measure
    limit = int(sys.argv[1])
    x = tf.random.uniform((1, 2000, 2000, 1)); w = tf.random.uniform((101, 101, 1, 1))
    lc.conv2d(tf.ones((1, 8, 8, 1)), tf.ones((3, 3, 1, 1)), 1, "SAME")  # load, warm up
    p = lc.plan(x.shape, w.shape, 1, "SAME", workspace_limit=limit)
    base = measure.reset_peak_rss()
    with tf.GradientTape() as tape:
      tape.watch([x, w])
      y = lc.conv2d(x, w, 1, "SAME", workspace_limit=limit)
    dx, dw = tape.gradient(y, [x, w])
    print(measure.peak_rss() - base, p.workspace_bytes)
    """


def test_process_memory_does_not_scale_with_input_times_filter():
  # An im2col would need 2000*2000*101*101*4 B = 163 GB.
  case = ((1, 2000, 2000, 1), (101, 101, 1, 1), 1, "SAME")
  limit = 2 * MiB
  p = lc.plan(*case, workspace_limit=limit)
  unconstrained = lc.plan(*case)
  _assert_binds(p, unconstrained)
  out = subproc.run(_RSS_CHILD, limit, timeout=600)
  growth, workspace = map(int, out.stdout.split()[-2:])
  assert workspace == p.workspace_bytes  # the child planned what this process did
  # Live at once: y, its gradient seed and dx (16 MB each; dw is 40 KB) and one workspace.
  # The slack (thread and transform scratch: under 1 MiB on 2 threads) is less than the
  # workspace the limit saves (15 MB on 2 threads; the whole step then grows 62 MiB, over
  # this bound's 53 MiB), so a run that ignored the limit fails.
  outputs = 3 * 2000 * 2000 * 4
  slack = 6 * MiB
  assert slack < unconstrained.workspace_bytes - workspace
  assert growth <= outputs + workspace + slack, (growth, workspace)


def test_flops_count_what_the_algorithm_runs():
  # 4 x 160x240x1 * 63x63x1x3 VALID: the direct sum is 2 flops per multiply-add over every
  # output and tap; the FFT's count, from its transforms and spectral products, is far less.
  direct_sum = 2 * 4 * (160 - 62) * (240 - 62) * 63 * 63 * 1 * 3
  direct = lc.plan((4, 160, 240, 1), (63, 63, 1, 3), 1, "VALID", algorithm="direct")
  assert [p.flops for p in direct.passes] == [direct_sum] * 3
  fft = lc.plan((4, 160, 240, 1), (63, 63, 1, 3), 1, "VALID", algorithm="fft")
  assert all(p.algorithm == "fft" and 0 < p.flops < direct_sum / 10 for p in fft.passes)
