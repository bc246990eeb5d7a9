"""tf_largeconv.plan_conv3d (and plan() with a 5-D filter): the plan's output shape against
tf.nn.conv3d's shape rule written here and against the op's result; the plan against what
the op does (each pass takes exactly the planned workspace as TF's step stats count it,
within the limit, and 'auto' computes bit for bit what the planned algorithm computes);
the limit binding; a 2048^3 bfloat16 volume (8.6e9 elements) planned with int64 sizes;
bad arguments named in the error."""

import math
import re
import time

import numpy as np
import pytest
import tensorflow as tf
from test_planner import _traced_run

import tf_largeconv as lc
from tf_largeconv import _core

MiB = 2**20
_OP_OF_PASS = {
  "forward": "LargeConv>Conv3D",
  "backprop_input": "LargeConv>Conv3DBackpropInput",
  "backprop_filter": "LargeConv>Conv3DBackpropFilter",
}


def _conv3d_output_shape(x_shape, w_shape, strides, padding, dilations, data_format):
  """tf.nn.conv3d's output shape, from its documented rule (not the package's code)."""
  spatial = (1, 2, 3) if data_format == "NDHWC" else (2, 3, 4)
  out = list(x_shape)
  for i, k in zip(spatial, w_shape[:3]):
    extent = (k - 1) * dilations[i] + 1
    if padding == "SAME":
      out[i] = -(-x_shape[i] // strides[i])
    else:
      out[i] = (x_shape[i] - extent) // strides[i] + 1
  out[4 if data_format == "NDHWC" else 1] = w_shape[4]
  return tuple(out)


# (input shape, filter shape, strides, padding, dilations, data_format)
SHAPE_CASES = {
  "same": ((1, 9, 10, 11, 2), (5, 4, 3, 2, 3), [1] * 5, "SAME", [1] * 5, "NDHWC"),
  "valid_strided": ((2, 12, 9, 10, 3), (3, 4, 5, 3, 2), [1, 2, 1, 3, 1], "VALID", [1] * 5, "NDHWC"),
  "dilated_ncdhw": (
    (1, 2, 11, 9, 10),
    (3, 2, 3, 2, 4),
    [1, 1, 2, 3, 2],
    "VALID",
    [1, 1, 2, 1, 2],
    "NCDHW",
  ),
  "grouped_same_strided": (
    (1, 7, 8, 9, 6),
    (3, 3, 3, 2, 6),
    [1, 3, 2, 1, 1],
    "SAME",
    [1, 1, 1, 2, 1],
    "NDHWC",
  ),
  "depthwise": ((1, 6, 7, 5, 4), (4, 3, 2, 1, 4), [1] * 5, "SAME", [1] * 5, "NDHWC"),
}


@pytest.mark.parametrize("case", sorted(SHAPE_CASES))
def test_output_shape_is_tf_rule_geometry_and_op_result(case, rng):
  x_shape, w_shape, strides, padding, dilations, fmt = SHAPE_CASES[case]
  want = _conv3d_output_shape(x_shape, w_shape, strides, padding, dilations, fmt)
  p = lc.plan_conv3d(x_shape, w_shape, strides, padding, data_format=fmt, dilations=dilations)
  assert p.output_shape == want
  assert (
    _core.geometry3d(list(x_shape), list(w_shape), strides, padding, fmt, dilations)["output_shape"]
    == want
  )
  x = rng.standard_normal(x_shape).astype(np.float32)
  w = rng.standard_normal(w_shape).astype(np.float32)
  got = lc.conv3d(x, w, strides, padding, data_format=fmt, dilations=dilations)
  assert tuple(got.shape) == want
  assert [pp.name for pp in p.passes] == ["forward", "backprop_input", "backprop_filter"]
  for pp in p.passes:
    assert 0 <= pp.workspace_bytes <= p.workspace_limit == _core.DEFAULT_WORKSPACE_LIMIT


def _traced_step(x, w, dy, **kwargs):
  """Runs conv3d's forward pass and both gradients once in a graph under a full trace
  (test_planner's tracer: TF's step stats count what each node took through allocate_temp,
  to the byte).

  Returns:
    ({op type: [temp_memory_size of each of its nodes]}, the three results).
  """

  def build(xp, wp, dyp):
    y = lc.conv3d(xp, wp, [1] * 5, "SAME", **kwargs)
    return [y] + tf.gradients(y, [xp, wp], grad_ys=dyp)

  values, temps = _traced_run(build, x, w, dy)
  return temps, values


def _eager_step(x, w, dy, **kwargs):
  x, w = tf.constant(x), tf.constant(w)
  with tf.GradientTape() as tape:
    tape.watch([x, w])
    y = lc.conv3d(x, w, [1] * 5, "SAME", **kwargs)
  return [y.numpy()] + [g.numpy() for g in tape.gradient(y, [x, w], output_gradients=dy)]


# (input shape, filter shape, workspace limit): where every pass plans the FFT (the limit
# binding: a smaller transform than without it), and where every pass sums directly.
FFT_CASE = ((1, 24, 22, 20, 2), (9, 9, 9, 2, 3), MiB // 2)
DIRECT_CASE = ((1, 10, 9, 8, 3), (2, 2, 2, 3, 2), None)


@pytest.mark.parametrize(
  "case,planned", [(FFT_CASE, "fft"), (DIRECT_CASE, "direct")], ids=["fft", "direct"]
)
def test_plan_is_what_the_op_runs(case, planned, rng):
  x_shape, w_shape, limit = case
  p = lc.plan_conv3d(x_shape, w_shape, [1] * 5, "SAME", workspace_limit=limit)
  assert [pp.algorithm for pp in p.passes] == [planned] * 3, p
  if limit is not None:
    free = lc.plan_conv3d(x_shape, w_shape, [1] * 5, "SAME")
    for limited, unlimited in zip(p.passes, free.passes):
      assert unlimited.algorithm == "fft" and limited.fft_size != unlimited.fft_size
      assert unlimited.workspace_bytes > limit >= limited.workspace_bytes > 0
  x = rng.standard_normal(x_shape).astype(np.float32)
  w = rng.standard_normal(w_shape).astype(np.float32)
  dy = rng.standard_normal(p.output_shape).astype(np.float32)
  # Each pass of the op took exactly its planned workspace, within the limit.
  temps, traced = _traced_step(x, w, dy, workspace_limit=limit)
  for pp in p.passes:
    assert temps[_OP_OF_PASS[pp.name]] == [pp.workspace_bytes], (pp, temps)
    assert pp.workspace_bytes <= p.workspace_limit
  # 'auto' ran the planned algorithm in every pass: bit for bit its result, not the
  # other's (the two round differently).
  other = "direct" if planned == "fft" else "fft"
  auto = _eager_step(x, w, dy, workspace_limit=limit)
  same = _eager_step(x, w, dy, algorithm=planned, workspace_limit=limit)
  different = _eager_step(x, w, dy, algorithm=other, workspace_limit=limit)
  for name, a, t, s, d in zip(("y", "dx", "dw"), auto, traced, same, different):
    np.testing.assert_array_equal(a, s, err_msg=name)
    np.testing.assert_array_equal(t, s, err_msg=name)
    assert not np.array_equal(a, d), name
    np.testing.assert_allclose(a, d, rtol=1e-3, atol=1e-4 * np.abs(d).max(), err_msg=name)


@pytest.mark.parametrize("limit", [MiB // 4, MiB, 8 * MiB, 64 * MiB])
def test_workspace_within_limit_and_fft_tiles_cover_the_output(limit):
  x_shape, w_shape = (2, 40, 36, 30, 2), (13, 11, 9, 2, 4)
  p = lc.plan_conv3d(x_shape, w_shape, [1] * 5, "SAME", algorithm="fft", workspace_limit=limit)
  assert p.workspace_limit == limit
  assert 0 < p.workspace_bytes == max(pp.workspace_bytes for pp in p.passes) <= limit
  for pp in p.passes:
    # Overlap-save: each transform yields fft - (filter - 1) outputs per dimension, and the
    # tiles cover the output (SAME, stride 1: the input's size) with less than one to spare.
    assert pp.tile == tuple(f - k + 1 for f, k in zip(pp.fft_size, w_shape[:3]))
    for tile, tiles, size in zip(pp.tile, pp.tiles, x_shape[1:4]):
      assert tiles == -(-size // tile)
  smaller = lc.plan_conv3d(
    x_shape, w_shape, [1] * 5, "SAME", algorithm="fft", workspace_limit=limit // 2
  )
  assert smaller.workspace_bytes <= limit // 2


def test_impossible_limit_names_the_minimum_and_the_minimum_suffices():
  args = ((1, 30, 30, 30, 1), (15, 15, 15, 1, 1), [1] * 5, "SAME")
  with pytest.raises(
    ValueError,
    match=r"workspace_limit 1000 bytes is too small for the FFT "
    r"algorithm: it needs at least (\d+) bytes",
  ) as e:
    lc.plan_conv3d(*args, algorithm="fft", workspace_limit=1000)
  minimum = int(e.value.args[0].split("at least ")[1].split()[0])
  p = lc.plan_conv3d(*args, algorithm="fft", workspace_limit=minimum)
  assert p.forward.algorithm == "fft" and p.forward.workspace_bytes <= minimum
  # auto under the same impossible limit sums directly instead.
  assert lc.plan_conv3d(*args, workspace_limit=1000).forward.algorithm == "direct"


def test_2048_cubed_bfloat16_volume_plans_in_int64():
  """8.6e9 elements (4 x 2^31): sizes and counts held in int32 would wrap. Nothing runs."""
  n = 2048
  x_shape, w_shape = (1, n, n, n, 1), (31, 31, 31, 1, 1)
  start = time.perf_counter()
  p = lc.plan_conv3d(x_shape, w_shape, [1] * 5, "SAME", dtype=tf.bfloat16)
  seconds = time.perf_counter() - start
  assert seconds < 10, seconds  # planning only: far below this on two cores
  assert p.output_shape == (1, n, n, n, 1) and math.prod(p.output_shape) == 8 * 2**30
  assert _core.geometry3d(list(x_shape), list(w_shape), [1] * 5, "SAME")["macs"] == n**3 * 31**3
  assert 0 < p.workspace_bytes <= p.workspace_limit == 64 * MiB
  for pp in p.passes:
    assert pp.algorithm == "fft", pp
    assert pp.tile == tuple(f - 30 for f in pp.fft_size)
    assert pp.tiles == tuple(-(-n // t) for t in pp.tile)
    # One transform per tile of each operand and one of the filter (forward: input tiles
    # in, output tiles out; filter gradient: input and gradient tiles in, one filter out).
    assert pp.fft_work["transforms"] == 2 * math.prod(pp.tiles) + 1
    # The direct sum's model time: 2 * n^3 * 31^3 flops (5.1e14) at its fitted rate, far
    # beyond int32; the FFT's a small fraction of it.
    assert pp.estimated_seconds["direct"] > 1e4
    assert pp.estimated_seconds["fft"] < 1e-2 * pp.estimated_seconds["direct"]
  # A larger limit plans larger transforms, still within it.
  big = lc.plan_conv3d(
    x_shape, w_shape, [1] * 5, "SAME", dtype=tf.bfloat16, workspace_limit=4 << 30
  )
  assert p.workspace_bytes < big.workspace_bytes <= 4 << 30
  assert all(math.prod(b.fft_size) > math.prod(s.fft_size) for b, s in zip(big.passes, p.passes))


def test_plan_with_a_5d_filter_is_plan_conv3d():
  x_shape, w_shape = (1, 20, 21, 22, 2), (7, 7, 7, 2, 3)
  want = lc.plan_conv3d(x_shape, w_shape, [1, 2, 1, 1, 1], "SAME", workspace_limit=MiB)
  for fmt in ("NHWC", "NDHWC"):
    got = lc.plan(x_shape, w_shape, [1, 2, 1, 1, 1], "SAME", data_format=fmt, workspace_limit=MiB)
    assert str(got) == str(want)
  ncdhw = (1, 2, 20, 21, 22)
  assert lc.plan(ncdhw, w_shape, [1] * 5, "VALID", data_format="NCHW").output_shape == (
    1,
    3,
    14,
    15,
    16,
  )
  # A 5-D input with a 4-D filter stays a 2-D convolution over two batch dimensions.
  assert lc.plan((2, 3, 16, 16, 2), (5, 5, 2, 4), 1, "SAME").output_shape == (2, 3, 16, 16, 4)


def test_plan_prints_a_3d_table():
  p = lc.plan_conv3d((1, 128, 128, 128, 1), (31, 31, 31, 1, 8), [1] * 5, "SAME")
  lines = str(p).splitlines()
  assert lines[0].startswith("output (1, 128, 128, 128, 8), workspace limit 64.0 MiB")
  assert lines[1].split()[:5] == ["pass", "algorithm", "fft", "size", "tile"]
  for line, pp in zip(lines[2:], p.passes):
    fields = line.split()
    assert fields[:5] == [
      pp.name,
      pp.algorithm,
      "x".join(map(str, pp.fft_size)),
      "x".join(map(str, pp.tile)),
      "x".join(map(str, pp.tiles)),
    ]
    assert f"{pp.workspace_bytes / MiB:.2f} MiB" in line
  # Columns line up: every row's workspace ends where the header's does.
  ends = {line.index("MiB", 40) + 3 for line in lines[2:]}
  assert ends == {lines[1].index("workspace") + len("workspace")}


def test_algorithm_tf_plans_tensorflows_kernel_where_it_runs():
  args = ((1, 16, 16, 16, 2), (3, 3, 3, 2, 4), [1] * 5, "SAME")
  p = lc.plan_conv3d(*args, algorithm="tf")
  assert [pp.algorithm for pp in p.passes] == ["tf"] * 3
  with pytest.raises(ValueError, match="tf.nn.conv3d"):
    lc.plan_conv3d((1, 16, 16, 16, 2), (3, 3, 3, 1, 4), [1] * 5, "SAME", algorithm="tf")


def test_algorithm_tf_refuses_what_tensorflows_cpu_kernel_refuses():
  """TensorFlow's Eigen CPU kernel refuses dilations ("only supports dilated rates of 1"),
  NCDHW and groups; the message names the input's channels in either layout."""
  x_shape, w_shape = (1, 16, 16, 16, 2), (3, 3, 3, 2, 4)
  with pytest.raises(ValueError, match=re.escape("dilations=[1, 2, 1, 1, 1]")):
    lc.plan_conv3d(x_shape, w_shape, [1] * 5, "SAME", dilations=[1, 2, 1, 1, 1], algorithm="tf")
  with pytest.raises(
    ValueError, match="data_format='NCDHW'.* input channels 2 and filter in-channels 2"
  ):
    lc.plan_conv3d(
      (1, 2, 16, 16, 16), w_shape, [1] * 5, "SAME", data_format="NCDHW", algorithm="tf"
    )


# A geometry where the FFT's plan changes with each argument of plan_conv3d.
ARGS_CASE = ((1, 24, 22, 20, 2), (5, 5, 5, 2, 3))
ARGS_BASE = dict(
  strides=[1] * 5,
  padding="SAME",
  data_format="NDHWC",
  dilations=[1] * 5,
  dtype=tf.float32,
  algorithm="fft",
  workspace_limit=MiB,
  num_threads=2,
)


def _summary(passes):
  return [
    (p.name, p.algorithm, p.workspace_bytes, p.flops, p.fft_size, p.tile, p.tiles) for p in passes
  ]


@pytest.mark.parametrize(
  "change",
  [
    dict(strides=[1, 2, 2, 1, 1]),
    dict(dilations=[1, 2, 2, 1, 1]),
    dict(padding="VALID"),
    dict(dtype=tf.float64),
    dict(num_threads=1),
    dict(num_threads=8),
    dict(workspace_limit=MiB // 2),
  ],
  ids=lambda c: "-".join(map(str, c.items())),
)
def test_each_argument_reaches_the_planner(change):
  """plan_conv3d is the C++ planner's plan for every argument it is given, and each
  argument changes that plan here (so none can be dropped unnoticed)."""
  x_shape, w_shape = ARGS_CASE
  args = dict(ARGS_BASE, **change)
  p = lc.plan_conv3d(x_shape, w_shape, **args)
  want = _core.plan3d(
    list(x_shape),
    list(w_shape),
    args["strides"],
    args["padding"],
    args["data_format"],
    args["dilations"],
    algorithm=args["algorithm"],
    workspace_limit=args["workspace_limit"],
    num_threads=args["num_threads"],
    dtype=args["dtype"].name,
    allow_tf=False,
  )
  assert _summary(p.passes) == _summary([lc.planning.PassPlan(d) for d in want])
  assert (p.threads, p.workspace_limit) == (args["num_threads"], args["workspace_limit"])
  assert _summary(p.passes) != _summary(lc.plan_conv3d(x_shape, w_shape, **ARGS_BASE).passes)


def test_strided_dilated_float64_plan_is_what_the_op_takes(rng):
  """Each pass of the op, strided and dilated in float64, takes exactly the workspace
  plan_conv3d gives it (TF's step stats)."""
  x_shape, w_shape = ARGS_CASE
  # Here the forward plan differs with each of strides, dilations and dtype.
  kwargs = dict(dilations=[1, 2, 1, 2, 1], algorithm="fft", workspace_limit=MiB // 2)
  strides = [1, 2, 2, 2, 1]
  p = lc.plan_conv3d(x_shape, w_shape, strides, "SAME", dtype=tf.float64, **kwargs)

  def build(xp, wp, dyp):
    xp, wp, dyp = (tf.cast(t, tf.float64) for t in (xp, wp, dyp))
    y = lc.conv3d(xp, wp, strides, "SAME", **kwargs)
    return [y] + tf.gradients(y, [xp, wp], grad_ys=dyp)

  arrays = [rng.standard_normal(s).astype(np.float32) for s in (x_shape, w_shape, p.output_shape)]
  values, temps = _traced_run(build, *arrays)
  assert values[0].shape == p.output_shape
  for pp in p.passes:
    assert pp.algorithm == "fft"
    assert temps[_OP_OF_PASS[pp.name]] == [pp.workspace_bytes], (pp, temps)


def test_a_zero_limit_is_kept_and_plans_direct_sums():
  p = lc.plan_conv3d(*ARGS_CASE, [1] * 5, "SAME", workspace_limit=0)
  assert p.workspace_limit == 0
  assert [(pp.algorithm, pp.workspace_bytes) for pp in p.passes] == [("direct", 0)] * 3


@pytest.mark.parametrize(
  "change,error,match",
  [
    (dict(input_shape=(1, 8, 8, 2)), ValueError, "input_shape must be 5"),
    (dict(input_shape=(1, 8, -8, 8, 2)), ValueError, "input_shape must be 5 non-negative"),
    (dict(filter_shape=(3, 3, 3, 2)), ValueError, "filter_shape must be 5"),
    (dict(filter_shape=(3, 3, 3.5, 2, 1)), ValueError, "filter_shape must be 5"),
    (dict(filter_shape=(3, 3, 3, 3, 1)), ValueError, "input_shape .* filter_shape .*divisible"),
    (dict(filter_shape=(9, 3, 3, 2, 1), padding="VALID"), ValueError, "larger than the padded"),
    (dict(strides=[1, 1, 1, 1]), ValueError, "strides must have 5"),
    (dict(strides=[1, 0, 1, 1, 1]), ValueError, "strides must be positive"),
    (dict(strides=[2, 1, 1, 1, 1]), NotImplementedError, "strides must be 1 in the batch"),
    (dict(dilations=[1, 1, 1]), ValueError, "dilations must have 5"),
    (dict(padding="EXPLICIT"), ValueError, "padding must be"),
    (dict(data_format="NHWC"), ValueError, "data_format must be"),
    (dict(algorithm="winograd"), ValueError, "algorithm must be"),
    (dict(algorithm="portable"), ValueError, "algorithm='portable'"),
    (dict(algorithm="fft", dtype=tf.int32), ValueError, "algorithm='fft' cannot compute"),
    (dict(workspace_limit=-5), ValueError, "workspace_limit must be"),
    (dict(dtype=tf.int8), ValueError, "dtype must be"),
  ],
)
def test_bad_arguments_name_the_argument(change, error, match):
  args = dict(
    input_shape=(1, 8, 8, 8, 2), filter_shape=(3, 3, 3, 2, 1), strides=[1] * 5, padding="SAME"
  )
  args.update(change)
  with pytest.raises(error, match=match):
    lc.plan_conv3d(**args)
