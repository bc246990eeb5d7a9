"""The CUDA kernels, run on the host by the emulator in cc/core/cuda/emulate.h, against the
float64 oracle: the direct tile kernels (cc/core/cuda/tiles.h) and the FFT path
(cc/core/cuda/fft_pipeline.h, DUCC standing in for cuFFT with cuFFT's in-place layout). The
emulator runs each phase of a block for all its threads before the next, as __syncthreads()
does, poisons shared memory with NaN before every load and starts from a NaN-filled
workspace, so these tests check the exact index arithmetic the device runs: tiling, patch
bounds, strides, dilations, paddings, groups, layouts, the backprop-filter slicing, the FFT
rounds and the GPU planner. The same kernels on a real GPU are tested in tests/gpu/."""

import glob
import itertools
import os
import re
import shutil
import subprocess

import numpy as np
import pytest
import reference_transpose
from cases import CASES
from cases import attrs
from cases import to_format
from reference import Conv
from reference import planned_fft

from tf_largeconv import _core

# The CUDA kernels' host emulation: _core's functions, `algorithm` naming the GPU path.
EMULATION = _core.cuda_emulation
EMU, FFT, AUTO = "direct", "fft", "auto"
SEED = ((2, 161, 241, 1), (67, 67, 1, 3))  # the seed case at half size, two frames


@pytest.mark.parametrize(
  "case,fmt,dtype,emu",
  list(itertools.product(CASES, ["NHWC", "NCHW"], [np.float32, np.float64], [EMU, FFT])),
)
def test_emulated_kernels_match_oracle(rng, case, fmt, dtype, emu):
  x_shape, w_shape, strides, padding, dilations = case
  x = rng.standard_normal(x_shape)
  w = rng.standard_normal(w_shape)
  xf = to_format(fmt, x).astype(dtype)
  ref = Conv(xf.shape, w_shape, strides, padding, dilations, fmt)
  dy = rng.standard_normal(ref.output_shape()).astype(dtype)
  s, pad, ex, d = attrs(strides, padding, dilations, fmt)
  name = np.dtype(dtype).name
  kwargs = dict(explicit_paddings=ex, data_format=fmt, dilations=d, algorithm=emu)
  # The oracle gets exactly the values the kernels get (rounded to the dtype under test).
  wf = w.astype(dtype)
  plans = _core.cuda_plan(
    list(xf.shape),
    list(w_shape),
    s,
    pad,
    explicit_paddings=ex,
    data_format=fmt,
    dilations=d,
    algorithm="fft" if emu == FFT else "direct",
    dtype=np.dtype(dtype).name,
  )
  fft = planned_fft(plans)
  # A problem without products (an empty operand) has nothing to transform: direct.
  empty = 0 in x_shape + w_shape + ref.output_shape()
  assert all((f is not None) == (emu == FFT and not empty) for f in fft.values()), plans
  y = EMULATION.conv2d(xf, wf, s, pad, **kwargs)
  dx = EMULATION.conv2d_backprop_input(list(xf.shape), wf, dy, s, pad, **kwargs)
  dw = EMULATION.conv2d_backprop_filter(xf, list(w_shape), dy, s, pad, **kwargs)
  ref.check_passes(name, fft, xf, wf, dy, y, dx, dw)


@pytest.mark.parametrize("limit", [0, 3000, -1])
def test_backprop_filter_slicing_is_exact_under_any_limit(rng, limit):
  """Backprop-filter's batch slices and their fixed-order reduction: one slice (no
  workspace), a few, and the default number all give the oracle's answer."""
  x = rng.standard_normal((4, 19, 17, 2))
  w_shape = (6, 5, 2, 3)
  ref = Conv(x.shape, w_shape, (1, 1), "SAME")
  dy = rng.standard_normal(ref.output_shape())
  dw = EMULATION.conv2d_backprop_filter(
    x, list(w_shape), dy, [1, 1, 1, 1], "SAME", algorithm=EMU, workspace_limit=limit
  )
  ref.check("backprop_filter", dw, x, dy, "float64")


# (input, filter, out_backprop, strides) of VALID convolutions whose gradients TF's backprop
# kernels give as zeros: an out_backprop emptied by a filter larger than the input, a
# filter without taps, an empty batch.
DEGENERATE = [
  ((1, 4, 4, 2), (5, 1, 2, 3), (1, 0, 4, 3), [1, 1, 1, 1]),
  ((1, 2, 4, 2), (5, 1, 2, 3), (1, 0, 4, 3), [1, 2, 1, 1]),
  ((1, 2, 3, 1), (0, 2, 1, 2), (1, 3, 2, 2), [1, 1, 1, 1]),
  ((0, 5, 5, 2), (3, 3, 2, 2), (0, 3, 3, 2), [1, 1, 1, 1]),
]


@pytest.mark.parametrize("emu", [EMU, FFT, AUTO])
@pytest.mark.parametrize("x_shape,w_shape,dy_shape,strides", DEGENERATE)
def test_degenerate_gradients_are_zeros(x_shape, w_shape, dy_shape, strides, emu):
  """The GPU path (emulated) and the CPU's give these gradients as zeros, whatever the
  algorithm asked: a pass without products clears its result (RunCudaPass, RunPass)
  instead of running kernels that assume taps."""
  x, w, dy = (np.ones(s, np.float32) for s in (x_shape, w_shape, dy_shape))
  for module in (EMULATION, _core):
    dx = module.conv2d_backprop_input(list(x_shape), w, dy, strides, "VALID", algorithm=emu)
    dw = module.conv2d_backprop_filter(x, list(w_shape), dy, strides, "VALID", algorithm=emu)
    np.testing.assert_array_equal(dx, np.zeros(x_shape, np.float32))
    np.testing.assert_array_equal(dw, np.zeros(w_shape, np.float32))


def _seed_operands(rng):
  x = rng.random(SEED[0])
  w = rng.standard_normal(SEED[1]) / 67
  ref = Conv(x.shape, SEED[1])
  return x, w, ref, rng.standard_normal(ref.output_shape())


@pytest.mark.parametrize("limit", [1 << 20, 4 << 20, -1])
def test_fft_rounds_match_oracle_under_any_limit(rng, limit):
  """The FFT path in one round or many (the limit sets the round size), every pass."""
  x, w, ref, dy = _seed_operands(rng)
  kw = dict(algorithm=FFT, workspace_limit=limit)
  plans = _core.cuda_plan(
    list(x.shape), list(w.shape), [1, 1, 1, 1], "VALID", algorithm="fft", workspace_limit=limit
  )
  for p in plans:
    assert p["algorithm"] == "fft" and p["workspace_bytes"] <= (limit if limit > 0 else 64 << 20)
  if limit == 1 << 20:
    assert all(p["chunk"] < p["items"] for p in plans), plans
  y = EMULATION.conv2d(x, w, [1, 1, 1, 1], "VALID", **kw)
  dx = EMULATION.conv2d_backprop_input(list(x.shape), w, dy, [1, 1, 1, 1], "VALID", **kw)
  dw = EMULATION.conv2d_backprop_filter(x, list(w.shape), dy, [1, 1, 1, 1], "VALID", **kw)
  ref.check_passes("float64", planned_fft(plans), x, w, dy, y, dx, dw)


def test_fft_filter_gradient_is_the_same_in_any_round_size(rng):
  """Each filter-gradient bin is one thread's sum over the items in order, so the round size
  (set by the limit) does not change a bit of the result."""
  x = rng.standard_normal((6, 40, 36, 2)).astype(np.float32)
  ref = Conv(x.shape, (17, 15, 2, 3), (1, 1), "SAME")
  dy = rng.standard_normal(ref.output_shape()).astype(np.float32)
  outs = []
  for limit in (1 << 18, 400_000, -1):
    plan = _core.cuda_plan(
      list(x.shape), [17, 15, 2, 3], [1, 1, 1, 1], "SAME", algorithm="fft", workspace_limit=limit
    )[2]
    outs.append(
      (
        plan["chunk"],
        EMULATION.conv2d_backprop_filter(
          x, [17, 15, 2, 3], dy, [1, 1, 1, 1], "SAME", algorithm=FFT, workspace_limit=limit
        ),
      )
    )
  assert [c for c, _ in outs] == [2, 4, 6]
  np.testing.assert_array_equal(outs[0][1], outs[1][1])
  np.testing.assert_array_equal(outs[0][1], outs[2][1])


@pytest.mark.parametrize("emu", [EMU, FFT])
def test_emulated_kernels_propagate_non_finite_values(emu):
  """Inf and NaN stay where a direct sum puts them: the FFT path's flag makes the gated
  direct kernels redo the pass."""
  x = np.ones((1, 6, 6, 1), np.float32)
  x[0, 2, 3, 0] = np.inf
  w = np.ones((3, 3, 1, 1), np.float32)
  y = EMULATION.conv2d(x, w, [1, 1, 1, 1], "VALID", algorithm=emu)
  want = Conv(x.shape, (3, 3, 1, 1)).forward(x, np.ones((3, 3, 1, 1)))
  np.testing.assert_array_equal(y, want.astype(np.float32))
  dy = np.ones((1, 4, 4, 1), np.float32)
  dy[0, 1, 1, 0] = np.nan
  dx = EMULATION.conv2d_backprop_input([1, 6, 6, 1], w, dy, [1, 1, 1, 1], "VALID", algorithm=emu)
  np.testing.assert_array_equal(
    np.isnan(dx), np.isnan(Conv(x.shape, (3, 3, 1, 1)).backprop_input(w, dy))
  )
  dw = EMULATION.conv2d_backprop_filter(
    x, [3, 3, 1, 1], np.ones((1, 4, 4, 1), np.float32), [1, 1, 1, 1], "VALID", algorithm=emu
  )
  np.testing.assert_array_equal(
    dw, Conv(x.shape, (3, 3, 1, 1)).backprop_filter(x, np.ones((1, 4, 4, 1))).astype(np.float32)
  )


@pytest.mark.parametrize("value", [np.nan, np.inf])
@pytest.mark.parametrize("operand", ["input", "filter", "out_backprop"])
def test_fft_path_flags_non_finite_values_in_every_operand(operand, value):
  """The FFT path's flag is raised by the loads into planes (PlaceFilters, PackTiles): a
  non-finite value in any operand of any pass, the filter gradient's dy and a filter tap
  included, sends the pass to the direct kernels, so the result's non-finite pattern and
  its finite values are a direct sum's. Strides, SAME padding, 3x4 tiles in rounds of 2."""
  rng = np.random.default_rng(3)
  x = rng.standard_normal((2, 23, 40, 2)).astype(np.float32)
  w = rng.standard_normal((9, 11, 2, 3)).astype(np.float32)
  dy = rng.standard_normal((2, 12, 40, 3)).astype(np.float32)
  tensors = {"input": x, "filter": w, "out_backprop": dy}
  at = {"input": (1, 17, 25, 1), "filter": (4, 6, 1, 2), "out_backprop": (1, 7, 30, 0)}
  tensors[operand][at[operand]] = value
  conv = Conv(x.shape, w.shape, strides=(2, 1), padding="SAME")
  strides, kw = [1, 2, 1, 1], dict(algorithm=FFT, workspace_limit=1 << 15)
  plan = _core.cuda_plan(list(x.shape), list(w.shape), strides, "SAME", **kw)
  assert [(p["algorithm"], p["tiles"], p["chunk"]) for p in plan] == [("fft", (3, 4), 2)] * 3
  runs = {
    "forward": (
      ("input", "filter"),
      lambda: EMULATION.conv2d(x, w, strides, "SAME", **kw),
      lambda: conv.forward(x, w),
    ),
    "backprop_input": (
      ("filter", "out_backprop"),
      lambda: EMULATION.conv2d_backprop_input(list(x.shape), w, dy, strides, "SAME", **kw),
      lambda: conv.backprop_input(w, dy),
    ),
    "backprop_filter": (
      ("input", "out_backprop"),
      lambda: EMULATION.conv2d_backprop_filter(x, list(w.shape), dy, strides, "SAME", **kw),
      lambda: conv.backprop_filter(x, dy),
    ),
  }
  for name, (operands, got_fn, want_fn) in runs.items():
    if operand not in operands:
      continue
    with np.errstate(invalid="ignore", over="ignore"):
      got, want = got_fn(), want_fn()
      kw["algorithm"] = EMU
      np.testing.assert_array_equal(got, got_fn(), err_msg=name)  # the direct kernels' bits
      kw["algorithm"] = FFT
    assert not np.isfinite(want).all(), name
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=name)
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want), err_msg=name)
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-4, atol=1e-4, err_msg=name)


def test_fft_finite_operands_are_not_redone(rng):
  """With finite operands the gated direct kernels must not run: the result is the FFT's
  own (it differs from the direct kernels' in the last bits)."""
  x = rng.standard_normal((1, 40, 40, 1)).astype(np.float32)
  w = rng.standard_normal((21, 21, 1, 1)).astype(np.float32)
  fft = EMULATION.conv2d(x, w, [1, 1, 1, 1], "VALID", algorithm=FFT)
  direct = EMULATION.conv2d(x, w, [1, 1, 1, 1], "VALID", algorithm=EMU)
  np.testing.assert_allclose(fft, direct, rtol=0, atol=1e-4)
  assert not np.array_equal(fft, direct)


def test_gpu_planner_picks_fft_for_large_filters_and_direct_for_small():
  seed = _core.cuda_plan([200, 321, 481, 1], [135, 135, 1, 3], [1, 1, 1, 1], "VALID")
  assert [p["algorithm"] for p in seed] == ["fft"] * 3, seed
  for p in seed:
    assert p["cost_fft"] * 10 < p["cost_direct"]
    assert p["workspace_bytes"] <= _core.DEFAULT_WORKSPACE_LIMIT
  # Few channels: with the rates fitted on an H100 the direct kernels win every pass here
  # (with 16 -> 16 channels the FFT already wins the filter gradient of a 3x3 filter).
  small = _core.cuda_plan([8, 64, 64, 3], [3, 3, 3, 4], [1, 1, 1, 1], "SAME")
  assert [p["algorithm"] for p in small] == ["direct"] * 3, small
  assert all(p["workspace_bytes"] <= _core.DEFAULT_WORKSPACE_LIMIT for p in small)


def test_gpu_planner_auto_runs_its_choice(rng):
  """cuda_auto_emulation runs exactly what the planner picks: the FFT path for eight
  half-size seed frames, the direct kernels for a small filter."""
  for x_shape, w_shape, choice, emu in (
    ((8, 161, 241, 1), (67, 67, 1, 3), "fft", FFT),
    ((2, 20, 20, 3), (3, 3, 3, 4), "direct", EMU),
  ):
    x = rng.random(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    plan = _core.cuda_plan(list(x_shape), list(w_shape), [1, 1, 1, 1], "VALID")
    assert plan[0]["algorithm"] == choice, plan
    np.testing.assert_array_equal(
      EMULATION.conv2d(x, w, [1, 1, 1, 1], "VALID", algorithm=AUTO),
      EMULATION.conv2d(x, w, [1, 1, 1, 1], "VALID", algorithm=emu),
    )


@pytest.mark.parametrize("limit", [0, 100_000, 1 << 20, 16 << 20])
def test_gpu_planner_stays_within_the_limit(limit):
  for shape, filt in (((4, 100, 90, 3), (31, 31, 3, 5)), ((2, 64, 64, 32), (31, 31, 1, 32))):
    for p in _core.cuda_plan(list(shape), list(filt), [1, 1, 1, 1], "SAME", workspace_limit=limit):
      assert p["workspace_bytes"] <= limit, p


@pytest.fixture
def cufft_work_area():
  """Sets a stand-in for cuFFT's work area in the emulated GPU planner; cleared after."""
  yield _core._emulate_cufft_work_area
  _core._emulate_cufft_work_area(None)


def test_gpu_planner_skips_a_size_whose_cufft_work_area_does_not_fit(cufft_work_area):
  # cuFFT can ask for far more than the planner's estimate (on an H100, for the size first
  # chosen here): the planner must take the next size, not give the FFT path up.
  args = ([8, 64, 64, 32], [21, 21, 32, 32], [1, 1, 1, 1], "SAME")
  first = _core.cuda_plan(*args)[0]
  assert first["algorithm"] == "fft"
  refused = tuple(first["fft"])
  asked = []

  def work(fft_h, fft_w, batch, inverse, real_bytes):
    asked.append((fft_h, fft_w, batch, inverse, real_bytes))
    return 1 << 40 if (fft_h, fft_w) == refused else 0

  cufft_work_area(work)
  again = _core.cuda_plan(*args)[0]
  assert again["algorithm"] == "fft" and tuple(again["fft"]) != refused, again
  assert again["cost_fft"] > first["cost_fft"]
  assert (refused[0], refused[1], 32 * 32, False, 4) in asked  # the filter spectra
  # Every size refused: 'auto' runs the direct kernels, 'fft' says why it cannot.
  cufft_work_area(lambda *shape: 1 << 40)
  assert _core.cuda_plan(*args)[0]["algorithm"] == "direct"
  with pytest.raises(ValueError, match="cuFFT's work area does not fit the limit"):
    _core.cuda_plan(*args, algorithm="fft")


def test_gpu_planner_errors_name_the_problem():
  with pytest.raises(
    ValueError,
    match=r"workspace_limit 1000 bytes is too small for the FFT "
    r"algorithm: it needs at least \d+ bytes",
  ):
    _core.cuda_plan(
      [1, 64, 64, 1], [31, 31, 1, 1], [1, 1, 1, 1], "VALID", algorithm="fft", workspace_limit=1000
    )
  with pytest.raises(ValueError, match="algorithm='tf' is not available on the GPU"):
    _core.cuda_plan([1, 64, 64, 1], [31, 31, 1, 1], [1, 1, 1, 1], "VALID", algorithm="tf")
  with pytest.raises(ValueError, match="dtype must be"):
    _core.cuda_plan([1, 64, 64, 1], [31, 31, 1, 1], [1, 1, 1, 1], "VALID", dtype="int8")
  with pytest.raises(ValueError, match="workspace_limit 1000 bytes"):
    EMULATION.conv2d(
      np.ones((1, 64, 64, 1)),
      np.ones((31, 31, 1, 1)),
      [1, 1, 1, 1],
      "VALID",
      algorithm=FFT,
      workspace_limit=1000,
    )


def test_cuda_module_loads_and_plans_without_a_device():
  """_cuda loads on a machine without a GPU (static cudart, cuFFT looked up at run time);
  without a device it plans the direct kernels and refuses an explicit FFT by saying why."""
  _cuda = pytest.importorskip("tf_largeconv._cuda", reason="built only where nvcc is found")
  info = _cuda.cufft()
  if info["status"]:
    assert "LARGECONV_CUFFT" in info["status"] and info["version"] == 0
  else:  # a cuFFT was found: all its entry points bound, and it reports its version
    assert info["version"] > 0 and "libcufft" in info["path"]
  # The CUDA kernels take the floating half of the dtype list only; int32 is the CPU's.
  assert "int32" in _core.DTYPES and set(_cuda.DTYPES) == set(_core.DTYPES) - {"int32"}
  with pytest.raises(ValueError, match="dtype must be one of float16, .*float64, got 'int32'"):
    _core.cuda_plan([1, 9, 9, 1], [3, 3, 1, 1], [1, 1, 1, 1], "SAME", dtype="int32")
  if _cuda.device_count() > 0:
    pytest.skip("a device is present: tests/gpu covers it")
  plans = _cuda.plan([200, 321, 481, 1], [135, 135, 1, 3], [1, 1, 1, 1], "VALID")
  assert [p["algorithm"] for p in plans] == ["direct"] * 3
  # A capability this machine lacks, not a bad argument: NotImplementedError, which is a
  # RuntimeError (TF: UnimplementedError).
  with pytest.raises(NotImplementedError, match="algorithm='fft' is not available: "):
    _cuda.plan([2, 64, 64, 1], [31, 31, 1, 1], [1, 1, 1, 1], "VALID", algorithm="fft")


def _launch_calls(library, geometry="largeconv::Conv"):
  """{function: what it calls} over the machine code of `library`, by disassembly: the
  dtype words of its RunCudaPass<T> calls (of those whose geometry's type name starts with
  `geometry`: by default both ConvGeometry and Conv3dGeometry), "plan" for PlanCudaPass,
  "direct" for DirectPass<T>."""
  if shutil.which("objdump") is None:
    pytest.skip("objdump is not installed")
  pkg = os.path.dirname(_core.__file__)
  paths = glob.glob(os.path.join(pkg, library + "*.so"))
  if not paths:
    pytest.skip(f"{library} is not built (no nvcc)")
  text = subprocess.run(
    ["objdump", "-d", "-C", "--no-show-raw-insn", paths[0]],
    capture_output=True,
    text=True,
    check=True,
  ).stdout
  calls, function = {}, ""
  for line in text.splitlines():
    head = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
    if head:
      function = head.group(1)
      continue
    target = re.search(
      r"call.*<(largeconv::Status largeconv::cuda::RunCudaPass<([\w:]+)>"
      r"\(([\w:]+)|"
      r"largeconv::cuda::PlanCudaPass|"
      r"largeconv::Status largeconv::cuda::DirectPass<)",
      line,
    )
    if target and target.group(2) and not target.group(3).startswith(geometry):
      continue
    if target:
      name = target.group(2) or ("plan" if "PlanCudaPass" in target.group(1) else "direct")
      calls.setdefault(function, set()).add(name)
  return calls


def test_tf_gpu_kernels_and_the_cuda_module_reach_the_same_launch():
  """The TF GPU kernels cannot run where the CUDA kernels were proven (the GPU machines have
  no TensorFlow), so both adapters must stay thin layers over the one launch function: the
  TF kernels' RunOnGpu<T> and the _cuda module each plan with PlanCudaPass and run with
  RunCudaPass<T>, for every GPU dtype, and neither calls the kernels any other way."""
  ops = _launch_calls("_large_conv_ops")
  module = _launch_calls("_cuda")
  if not any("RunOnGpu" in f for f in ops):
    pytest.skip("the op library was built without CUDA")
  dtypes = {"float", "double", "largeconv::f16", "largeconv::bf16"}
  for calls, adapter in ((ops, "RunOnGpu"), (module, "RunArrays")):
    runs = set().union(*(c for f, c in calls.items() if adapter in f)) - {"plan"}
    assert runs == dtypes, (adapter, runs)
    assert any("plan" in c for f, c in calls.items() if adapter in f), adapter
    assert not any("direct" in c for f, c in calls.items() if adapter in f), adapter
    # Nothing else in either library runs a pass: RunCudaPass is called from the adapter
    # only, and the direct kernels' driver from the launch layer only (RunCudaPass, and
    # RunFftPass for the FFT path's exact redo of non-finite operands).
    others = {f for f, c in calls.items() if c - {"plan", "direct"} and adapter not in f}
    assert not others, others
    launch = ("cuda::RunCudaPass<", "cuda::RunFftPass<")
    direct = {f for f, c in calls.items() if "direct" in c and not any(n in f for n in launch)}
    assert not direct, direct


@pytest.mark.parametrize("emu", [EMU, FFT])
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
def test_emulated_kernels_compute_the_transpose(rng, fmt, emu):
  """tf_largeconv.conv2d_transpose runs the backprop_input pass: the emulated kernels give
  the transpose's own oracle (tests/reference_transpose.py), stride 2 SAME to an odd
  output size."""
  x = to_format(fmt, rng.standard_normal((2, 6, 4, 3)))
  w = rng.standard_normal((5, 3, 2, 3))
  out = (2, 11, 7, 2) if fmt == "NHWC" else (2, 2, 11, 7)
  want = reference_transpose.conv2d_transpose(x, w, out, (2, 2), "SAME", data_format=fmt)
  s, pad, ex, d = attrs((2, 2), "SAME", (1, 1), fmt)
  got = EMULATION.conv2d_backprop_input(
    list(out), w, x, s, pad, explicit_paddings=ex, data_format=fmt, dilations=d, algorithm=emu
  )
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * np.abs(want).max())
