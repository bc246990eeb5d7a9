"""The CUDA kernels' Conv3D passes, run on the host by the emulator (cc/core/cuda/emulate.h),
against the float64 oracle of reference3d.py: the direct tile kernels with a depth dimension
(cc/core/cuda/tiles.h) and the FFT path with rank-3 transforms (cc/core/cuda/fft_pipeline.h,
DUCC standing in for cuFFT with cuFFT's in-place layout), planned by the GPU planner. As in
test_cuda_emulation.py, shared memory is refilled with NaN before every load and the
workspace starts as NaN, so a read of anything not written in that step shows. Covered:
both algorithms, float32 and float64, both layouts, strides, dilations, SAME and VALID
(Conv3D has no explicit padding), groups and depthwise, every pass; workspace limits that
change the plan (FFT rounds and tiles, the direct filter gradient's slices, 'auto' moving
to the direct kernels); passes without products; non-finite operands; the 3-D GPU plans.
Small shapes: these run in CI on two cores."""

import itertools

import numpy as np
import pytest
from reference3d import CASES
from reference3d import PASSES
from reference3d import Oracle3d
from reference3d import check
from reference3d import problem
from reference3d import run_pass

from tf_largeconv import _core

EMULATION = _core.cuda_emulation
LIMIT = _core.DEFAULT_WORKSPACE_LIMIT
ONES = [1, 1, 1, 1, 1]


def _plans(x_shape, w_shape, attrs, **kwargs):
  return _core.cuda_plan3d(list(x_shape), list(w_shape), **attrs, **kwargs)


def _fft_sizes(plans):
  """{pass: transform size, or None where the plan runs the direct kernels}."""
  return {p["pass"]: (p["fft"] if p["algorithm"] == "fft" else None) for p in plans}


def _run_all(x, w, dy, attrs, **kwargs):
  return {p: run_pass(EMULATION, p, x, w, dy, attrs, **kwargs) for p in PASSES}


def _check_all(oracle, got, x, w, dy, dtype, fft):
  for pass_name in PASSES:
    check(oracle, pass_name, got[pass_name], x, w, dy, dtype, fft[pass_name])


@pytest.mark.parametrize(
  "case,algorithm,dtype",
  list(itertools.product(sorted(CASES), ["direct", "fft"], ["float32", "float64"])),
)
def test_emulated_passes_match_oracle(case, algorithm, dtype, rng):
  oracle, x, w, dy, attrs = problem(case, rng, dtype)
  plans = _plans(x.shape, w.shape, attrs, algorithm=algorithm, dtype=dtype)
  assert [p["algorithm"] for p in plans] == [algorithm] * 3, plans
  for p in plans:
    assert p["workspace_bytes"] <= LIMIT
  got = _run_all(x, w, dy, attrs, algorithm=algorithm)
  for pass_name in PASSES:
    assert got[pass_name].dtype == np.dtype(dtype)
  _check_all(oracle, got, x, w, dy, dtype, _fft_sizes(plans))


def _big_problem(rng):
  """A volume the FFT cuts into several tiles per dimension under a small limit."""
  attrs = dict(strides=ONES, padding="SAME", data_format="NDHWC", dilations=ONES)
  x = rng.standard_normal((2, 14, 13, 12, 2))
  w = rng.standard_normal((5, 4, 6, 2, 3))
  oracle = Oracle3d(x.shape, w.shape, (1, 1, 1), "SAME", (1, 1, 1), "NDHWC")
  return oracle, x, w, rng.standard_normal(oracle.output_shape()), attrs


@pytest.mark.parametrize("limit", [150_000, 400_000, -1])
def test_fft_rounds_and_tiles_match_oracle_under_any_limit(rng, limit):
  """The FFT path in one round or many, with one tile per image or many (the limit sets
  both), every pass within the limit and exact."""
  oracle, x, w, dy, attrs = _big_problem(rng)
  plans = _plans(x.shape, w.shape, attrs, algorithm="fft", dtype="float64", workspace_limit=limit)
  for p in plans:
    assert p["algorithm"] == "fft"
    assert p["workspace_bytes"] <= (limit if limit > 0 else LIMIT), p
  if limit == 150_000:
    assert all(p["chunk"] < p["items"] for p in plans), plans
    assert all(np.prod(p["tiles"]) > 1 for p in plans), plans
  got = _run_all(x, w, dy, attrs, algorithm="fft", workspace_limit=limit)
  _check_all(oracle, got, x, w, dy, "float64", _fft_sizes(plans))


def test_fft_filter_gradient_is_the_same_in_any_round_size(rng):
  """Each gradient bin is one thread's sum over the items in order: the round size the
  limit sets (1, 2, 3 or all 6 images, one tile each) does not change a bit of the
  result."""
  attrs = dict(strides=ONES, padding="SAME", data_format="NDHWC", dilations=ONES)
  x = rng.standard_normal((6, 8, 8, 8, 1)).astype(np.float32)
  dy = rng.standard_normal((6, 8, 8, 8, 2)).astype(np.float32)
  w_shape = [5, 5, 5, 1, 2]
  chunks, outs = [], []
  for limit in (60_000, 100_000, 150_000, -1):
    plan = _plans(x.shape, w_shape, attrs, algorithm="fft", workspace_limit=limit)[2]
    assert plan["fft"] == (12, 12, 12), plan
    chunks.append(plan["chunk"])
    outs.append(
      EMULATION.conv3d_backprop_filter(
        x, w_shape, dy, **attrs, algorithm="fft", workspace_limit=limit
      )
    )
  assert chunks == [1, 2, 3, 6]
  for out in outs[1:]:
    np.testing.assert_array_equal(outs[0], out)


@pytest.mark.parametrize("limit", [0, 2000, -1])
def test_direct_filter_gradient_slicing_is_exact_under_any_limit(rng, limit):
  """The direct filter gradient's slices of batch x depth x rows and their fixed-order
  reduction: none (no workspace), a few, the default number."""
  oracle, x, w, dy, attrs = problem("same_strided", rng, "float64")
  plan = _plans(x.shape, w.shape, attrs, algorithm="direct", workspace_limit=limit)[2]
  assert plan["workspace_bytes"] <= (limit if limit >= 0 else LIMIT), plan
  if limit == 0:
    assert plan["workspace_bytes"] == 0
  else:
    assert plan["workspace_bytes"] > 0, plan  # sliced: partial sums in the workspace
  got = EMULATION.conv3d_backprop_filter(
    x, list(w.shape), dy, **attrs, algorithm="direct", workspace_limit=limit
  )
  check(oracle, "backprop_filter", got, x, w, dy, "float64", None)


def test_auto_follows_the_limit(rng):
  """'auto' takes the FFT for a 13^3 filter under the default limit and the direct kernels
  when the limit leaves the FFT no room, and runs what it planned. (At 11^3 on this one
  image the two are within the FFT's launch costs of each other.)"""
  attrs = dict(strides=ONES, padding="SAME", data_format="NDHWC", dilations=ONES)
  x = rng.standard_normal((1, 20, 20, 20, 2)).astype(np.float32)
  w = rng.standard_normal((13, 13, 13, 2, 2)).astype(np.float32)
  roomy = _plans(x.shape, w.shape, attrs)
  assert [p["algorithm"] for p in roomy] == ["fft"] * 3, roomy
  tight = _plans(x.shape, w.shape, attrs, workspace_limit=10_000)
  assert [p["algorithm"] for p in tight] == ["direct"] * 3, tight
  for p in tight:
    assert p["workspace_bytes"] <= 10_000, p
  for limit, algorithm in ((-1, "fft"), (10_000, "direct")):
    np.testing.assert_array_equal(
      EMULATION.conv3d(x, w, **attrs, workspace_limit=limit),
      EMULATION.conv3d(x, w, **attrs, algorithm=algorithm, workspace_limit=limit),
    )


@pytest.mark.parametrize("limit", [0, 50_000, 1 << 20, 16 << 20])
def test_gpu_plans_stay_within_the_limit(limit):
  for shape, filt in (
    ((2, 40, 36, 30, 3), (15, 15, 15, 3, 4)),
    ((1, 32, 32, 32, 16), (7, 7, 7, 1, 16)),
  ):
    for p in _plans(shape, filt, dict(strides=ONES, padding="SAME"), workspace_limit=limit):
      assert p["workspace_bytes"] <= limit, p


def test_gpu_planner_picks_fft_for_large_filters_and_direct_for_small():
  attrs = dict(strides=ONES, padding="SAME")
  large = _plans((1, 128, 128, 128, 1), (31, 31, 31, 1, 8), attrs)
  assert [p["algorithm"] for p in large] == ["fft"] * 3, large
  for p in large:
    assert p["cost_fft"] * 10 < p["cost_direct"], p
    assert p["workspace_bytes"] <= LIMIT
    assert len(p["fft"]) == 3 and min(p["fft"]) >= 31, p
  small = _plans((4, 16, 16, 16, 3), (2, 2, 2, 3, 4), attrs)
  assert [p["algorithm"] for p in small] == ["direct"] * 3, small


def test_gpu_planner_errors_name_the_problem():
  attrs = dict(strides=ONES, padding="VALID")
  with pytest.raises(
    ValueError,
    match=r"workspace_limit 1000 bytes is too small for the FFT "
    r"algorithm: it needs at least \d+ bytes",
  ):
    _plans((1, 20, 20, 20, 1), (9, 9, 9, 1, 1), attrs, algorithm="fft", workspace_limit=1000)
  with pytest.raises(ValueError, match="workspace_limit 1000 bytes"):
    EMULATION.conv3d(
      np.ones((1, 20, 20, 20, 1)),
      np.ones((9, 9, 9, 1, 1)),
      **attrs,
      algorithm="fft",
      workspace_limit=1000,
    )
  with pytest.raises(ValueError, match="algorithm='tf' is not available on the GPU"):
    _plans((1, 20, 20, 20, 1), (9, 9, 9, 1, 1), attrs, algorithm="tf")
  with pytest.raises(ValueError, match="dtype must be"):
    _plans((1, 20, 20, 20, 1), (9, 9, 9, 1, 1), attrs, dtype="int32")
  with pytest.raises(ValueError, match="data_format"):
    _plans((1, 20, 20, 20, 1), (9, 9, 9, 1, 1), attrs, data_format="NHWC")
  with pytest.raises(ValueError, match="input must have 5 dimensions"):
    _plans((20, 20, 20, 1), (9, 9, 9, 1, 1), attrs)
  with pytest.raises(ValueError, match="input must be a 5-D array"):
    EMULATION.conv3d(np.ones((20, 20, 20, 1)), np.ones((9, 9, 9, 1, 1)), **attrs)


# (input, filter, out_backprop, strides) of VALID Conv3Ds whose gradients are zeros or empty:
# an out_backprop emptied by a filter deeper than the input, a filter without taps in depth,
# an empty batch.
DEGENERATE = [
  ((1, 3, 4, 4, 2), (4, 1, 1, 2, 3), (1, 0, 4, 4, 3), ONES),
  ((1, 2, 3, 3, 1), (0, 2, 2, 1, 2), (1, 3, 2, 2, 2), ONES),
  ((0, 4, 5, 5, 2), (3, 3, 3, 2, 2), (0, 2, 3, 3, 2), ONES),
]


@pytest.mark.parametrize("algorithm", ["direct", "fft", "auto"])
@pytest.mark.parametrize("x_shape,w_shape,dy_shape,strides", DEGENERATE)
def test_degenerate_gradients_are_zeros(x_shape, w_shape, dy_shape, strides, algorithm):
  """A pass without products clears its result, whatever the algorithm asked, as the CPU's
  3-D kernels do."""
  x, w, dy = (np.ones(s, np.float32) for s in (x_shape, w_shape, dy_shape))
  attrs = dict(strides=strides, padding="VALID")
  for module in (EMULATION, _core):
    dx = module.conv3d_backprop_input(list(x_shape), w, dy, **attrs, algorithm=algorithm)
    dw = module.conv3d_backprop_filter(x, list(w_shape), dy, **attrs, algorithm=algorithm)
    np.testing.assert_array_equal(dx, np.zeros(x_shape, np.float32))
    np.testing.assert_array_equal(dw, np.zeros(w_shape, np.float32))
  y = EMULATION.conv3d(x, w, **attrs, algorithm=algorithm) if 0 in x_shape else None
  if y is not None:
    assert y.shape == tuple(dy_shape)


@pytest.mark.parametrize("algorithm", ["direct", "fft"])
def test_non_finite_values_stay_in_place(algorithm):
  """Inf and NaN stay where a direct sum puts them: the FFT path's flag makes the gated
  direct kernels redo the pass."""
  attrs = dict(strides=ONES, padding="VALID")
  oracle = Oracle3d((1, 5, 6, 6, 1), (3, 3, 3, 1, 1), (1, 1, 1), "VALID", (1, 1, 1), "NDHWC")
  x = np.ones((1, 5, 6, 6, 1), np.float32)
  x[0, 2, 2, 3, 0] = np.inf
  w = np.ones((3, 3, 3, 1, 1), np.float32)
  y = EMULATION.conv3d(x, w, **attrs, algorithm=algorithm)
  np.testing.assert_array_equal(y, oracle.forward(x, w).astype(np.float32))
  dy = np.ones(oracle.output_shape(), np.float32)
  dy[0, 1, 1, 2, 0] = np.nan
  dx = EMULATION.conv3d_backprop_input([1, 5, 6, 6, 1], w, dy, **attrs, algorithm=algorithm)
  np.testing.assert_array_equal(np.isnan(dx), np.isnan(oracle.backprop_input(w, dy)))


def test_fft_finite_operands_are_not_redone(rng):
  """With finite operands the gated direct kernels do not run: the result is the FFT's own
  (it differs from the direct kernels' in the last bits)."""
  attrs = dict(strides=ONES, padding="VALID")
  x = rng.standard_normal((1, 14, 14, 14, 1)).astype(np.float32)
  w = rng.standard_normal((7, 7, 7, 1, 1)).astype(np.float32)
  fft = EMULATION.conv3d(x, w, **attrs, algorithm="fft")
  direct = EMULATION.conv3d(x, w, **attrs, algorithm="direct")
  np.testing.assert_allclose(fft, direct, rtol=0, atol=1e-4)
  assert not np.array_equal(fft, direct)


def test_3d_of_depth_one_is_the_2d_convolution(rng):
  """A Conv3D of depth 1 runs the direct kernels of the Conv2D it is: equal results to the
  bit, every pass (in 2-D the kernels see depth 1; here the geometry has it)."""
  x = rng.standard_normal((2, 1, 11, 9, 3)).astype(np.float32)
  w = rng.standard_normal((1, 4, 3, 3, 2)).astype(np.float32)
  s3, s2 = [1, 1, 2, 1, 1], [1, 2, 1, 1]
  kw = dict(algorithm="direct")
  y3 = EMULATION.conv3d(x, w, s3, "SAME", **kw)
  np.testing.assert_array_equal(y3[:, 0], EMULATION.conv2d(x[:, 0], w[0], s2, "SAME", **kw))
  dy = rng.standard_normal(y3.shape).astype(np.float32)
  np.testing.assert_array_equal(
    EMULATION.conv3d_backprop_input(list(x.shape), w, dy, s3, "SAME", **kw)[:, 0],
    EMULATION.conv2d_backprop_input(list(x[:, 0].shape), w[0], dy[:, 0], s2, "SAME", **kw),
  )
  np.testing.assert_array_equal(
    EMULATION.conv3d_backprop_filter(x, list(w.shape), dy, s3, "SAME", **kw)[0],
    EMULATION.conv2d_backprop_filter(x[:, 0], list(w[0].shape), dy[:, 0], s2, "SAME", **kw),
  )


def test_tf_gpu_kernels_and_the_cuda_module_run_the_3d_launch():
  """Both adapters reach the Conv3D launch for every GPU dtype: the TF kernels' RunOnGpu<T>
  and the _cuda module's RunArrays3d call RunCudaPass<T> on a Conv3dGeometry
  (test_cuda_emulation checks that nothing else calls the kernels' drivers)."""
  from test_cuda_emulation import _launch_calls

  dtypes = {"float", "double", "largeconv::f16", "largeconv::bf16"}
  for library, adapter in (("_large_conv_ops", "RunOnGpu"), ("_cuda", "RunArrays3d")):
    calls = _launch_calls(library, geometry="largeconv::Conv3dGeometry")
    if library == "_large_conv_ops" and not any("RunOnGpu" in f for f in calls):
      pytest.skip("the op library was built without CUDA")
    runs = set().union(*(c for f, c in calls.items() if adapter in f)) - {"plan"}
    assert runs == dtypes, (library, runs)
