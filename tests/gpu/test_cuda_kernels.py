"""The CUDA kernels on a device (the direct tile kernels and the FFT path through cuFFT)
against torch.nn.functional.conv2d (TF32 off), the float64 oracle and the CPU path: forward
and both gradients, every dtype, both layouts, strides, dilations, paddings, groups;
non-finite values; determinism; the planner; bad input. Skipped without a GPU."""

import itertools

import numpy as np
import pytest
from cases import CASES
from cases import attrs
from cases import to_format
from reference import PASSES
from reference import Conv
from reference import assert_close
from reference import planned_fft

# Without torch every test here is skipped, each with its reason (conftest.py); the module
# still imports, so the skips are counted and shown test by test.
try:
  import torch
  import torch_conv
  from torch_conv import to_device
except ImportError:
  torch = torch_conv = to_device = None


def _arg(t):
  """What the extension takes for a tensor: bfloat16 goes as its int16 view."""
  return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


def _run(ext, x, w, dy, case, fmt, algorithm="auto"):
  """Our forward and both gradients for device tensors x (fmt), w (HWIO), dy (fmt)."""
  _, _, strides, padding, dilations = case
  s, pad, ex, d = attrs(strides, padding, dilations, fmt)
  kw = dict(
    explicit_paddings=ex,
    data_format=fmt,
    dilations=d,
    algorithm=algorithm,
    stream=torch.cuda.current_stream().cuda_stream,
    dtype="bfloat16" if x.dtype == torch.bfloat16 else "",
  )
  y, dx, dw = torch.empty_like(dy), torch.empty_like(x), torch.empty_like(w)
  ext.conv2d(_arg(x), _arg(w), _arg(y), s, pad, **kw)
  ext.conv2d_backprop_input(_arg(w), _arg(dy), _arg(dx), s, pad, **kw)
  ext.conv2d_backprop_filter(_arg(x), _arg(dy), _arg(dw), s, pad, **kw)
  torch.cuda.synchronize()
  return y, dx, dw


def _planned_fft(ext, x, w_shape, case, fmt, dtype, algorithm):
  """The transform size of each pass the device planner runs as an FFT (None: direct)."""
  _, _, strides, padding, dilations = case
  s, pad, ex, d = attrs(strides, padding, dilations, fmt)
  return planned_fft(
    ext.plan(
      list(x.shape),
      list(w_shape),
      s,
      pad,
      explicit_paddings=ex,
      data_format=fmt,
      dilations=d,
      algorithm=algorithm,
      dtype=dtype,
    )
  )


def _check_all(got, ref, x, w, dy, name, what, fft=None):
  """got = (y, dx, dw) against the float64 oracle on the (rounded) operands, at the bound
  of the path each pass took (`fft`: see reference.planned_fft; None: all direct)."""
  fft = fft or dict.fromkeys(PASSES)
  ref.check_passes(name, fft, x, w, dy, *(t.double().cpu().numpy() for t in got), what=f"{what} ")


@pytest.mark.parametrize(
  "case,fmt,dtype,algorithm",
  list(
    itertools.product(
      CASES, ["NHWC", "NCHW"], ["float32", "float64", "float16", "bfloat16"], ["direct", "fft"]
    )
  ),
)
def test_kernels_match_oracle_and_torch(cuda_ext, rng, case, fmt, dtype, algorithm):
  x_shape, w_shape, strides, padding, dilations = case
  x = to_format(fmt, rng.standard_normal(x_shape))
  w = rng.standard_normal(w_shape)
  ref = Conv(x.shape, w_shape, strides, padding, dilations, fmt)
  dy = rng.standard_normal(ref.output_shape())
  xt, wt, dyt = to_device(x, dtype), to_device(w, dtype), to_device(dy, dtype)
  # The oracle sees the operands exactly as the device stores them.
  xr, wr, dyr = (t.double().cpu().numpy() for t in (xt, wt, dyt))
  ours = _run(cuda_ext, xt, wt, dyt, case, fmt, algorithm)
  fft = _planned_fft(cuda_ext, x, w_shape, case, fmt, dtype, algorithm)
  # An empty batch has no products to transform: every pass sums (nothing) directly.
  wants_fft = algorithm == "fft" and x_shape[0] > 0
  assert all((f is not None) == wants_fft for f in fft.values()), fft
  _check_all(ours, ref, xr, wr, dyr, dtype, f"ours ({algorithm})", fft)
  if dtype in ("float32", "float64") and x_shape[0] > 0 and algorithm == "direct":
    theirs = torch_conv.conv2d_and_grads(xt, wt, dyt, strides, padding, dilations, fmt)
    _check_all(theirs, ref, xr, wr, dyr, dtype, "torch")  # the oracle agrees with torch
    for a, b in zip(ours, theirs):
      assert a.shape == b.shape


@pytest.mark.parametrize("algorithm", ["direct", "fft", "auto"])
def test_seed_sized_filter_matches_torch(cuda_ext, rng, algorithm):
  """One 321x481 frame, a 135x135x1x3 filter, VALID: the product's own case."""
  case = ((1, 321, 481, 1), (135, 135, 1, 3), (1, 1), "VALID", (1, 1))
  x = rng.random(case[0])
  w = rng.standard_normal(case[1]) / 135
  ref = Conv(x.shape, case[1])
  dy = rng.standard_normal(ref.output_shape())
  xt, wt, dyt = (to_device(a, "float32") for a in (x, w, dy))
  ours = _run(cuda_ext, xt, wt, dyt, case, "NHWC", algorithm)
  theirs = torch_conv.conv2d_and_grads(xt, wt, dyt, (1, 1), "VALID", (1, 1), "NHWC")
  xr, wr, dyr = (t.double().cpu().numpy() for t in (xt, wt, dyt))
  _check_all(
    ours,
    ref,
    xr,
    wr,
    dyr,
    "float32",
    f"ours ({algorithm})",
    _planned_fft(cuda_ext, x, case[1], case, "NHWC", "float32", algorithm),
  )
  for a, b in zip(ours, theirs):
    scale = b.abs().max().item()
    assert (a - b).abs().max().item() <= 1e-4 * scale


@pytest.mark.parametrize(
  "fmt,dtype", [("NHWC", "float32"), ("NCHW", "float64"), ("NHWC", "bfloat16")]
)
def test_1d_geometry_runs_single_row_transforms(cuda_ext, rng, fmt, dtype):
  """conv1d's geometry (every height 1): a 1023-tap filter over rows of 6000, planned as
  rank-1 transforms of height 1, against the oracle and torch."""
  case = ((3, 1, 6000, 2), (1, 1023, 2, 3), (1, 2), "SAME", (1, 1))
  x = to_format(fmt, rng.standard_normal(case[0]))
  w = rng.standard_normal(case[1]) / 32
  ref = Conv(x.shape, case[1], case[2], case[3], case[4], fmt)
  dy = rng.standard_normal(ref.output_shape())
  xt, wt, dyt = to_device(x, dtype), to_device(w, dtype), to_device(dy, dtype)
  xr, wr, dyr = (t.double().cpu().numpy() for t in (xt, wt, dyt))
  fft = _planned_fft(cuda_ext, x, case[1], case, fmt, dtype, "auto")
  assert all(f is not None and f[0] == 1 and f[1] > 2048 for f in fft.values()), fft
  ours = _run(cuda_ext, xt, wt, dyt, case, fmt, "auto")
  _check_all(ours, ref, xr, wr, dyr, dtype, "ours (1-D)", fft)
  if dtype != "bfloat16":
    theirs = torch_conv.conv2d_and_grads(xt, wt, dyt, case[2], case[3], case[4], fmt)
    for a, b in zip(ours, theirs):
      assert (a - b).abs().max().item() <= 1e-4 * b.abs().max().item()


@pytest.mark.parametrize("algorithm", ["direct", "fft"])
@pytest.mark.parametrize(
  "out_hw,padding", [((17, 20), "SAME"), ((16, 16), "SAME"), ((18, 19), "VALID")]
)
def test_transpose_step_matches_torch_conv_transpose2d(cuda_ext, algorithm, out_hw, padding):
  """conv2d_transpose's training step as the op runs it on a GPU (the input-gradient pass
  for the output, the forward pass and the filter-gradient pass for its gradients), stride
  2, against torch's conv_transpose2d and autograd in float64: an oracle that shares no
  code with the conv2d passes. Uneven SAME pads and a VALID remainder (TF's output_shape
  freedom) included."""
  gen = torch.Generator(device="cuda").manual_seed(1)
  (h, wd), s, (kh, kw, cin, cout) = out_hw, 2, (9, 7, 3, 5)
  oh, ow = (
    (-(-h // s), -(-wd // s)) if padding == "SAME" else ((h - kh) // s + 1, (wd - kw) // s + 1)
  )
  f64 = dict(device="cuda", generator=gen, dtype=torch.float64)
  xt, w = torch.randn((2, cout, oh, ow), **f64), torch.randn((kh, kw, cin, cout), **f64)
  dyt = torch.randn((2, cin, h, wd), **f64)
  xg, wg = xt.clone().requires_grad_(True), w.clone().requires_grad_(True)
  yt = torch_conv.conv2d_transpose(xg, wg, out_hw, s, padding)
  yt.backward(dyt)
  refs = (yt.detach(), xg.grad, wg.grad)
  x32, w32, dy32 = (t.float().contiguous() for t in (xt, w, dyt))
  got = (torch.empty_like(dy32), torch.empty_like(x32), torch.empty_like(w32))
  st, kwargs = (
    [1, 1, s, s],
    dict(data_format="NCHW", algorithm=algorithm, stream=torch.cuda.current_stream().cuda_stream),
  )
  cuda_ext.conv2d_backprop_input(w32, x32, got[0], st, padding, **kwargs)
  cuda_ext.conv2d(dy32, w32, got[1], st, padding, **kwargs)
  cuda_ext.conv2d_backprop_filter(dy32, x32, got[2], st, padding, **kwargs)
  torch.cuda.synchronize()
  for name, a, b in zip(("output", "d input", "d filter"), got, refs):
    assert a.shape == b.shape, (name, a.shape, b.shape)
    err = (a.double() - b).abs().max().item() / b.abs().max().item()
    assert err <= 2e-5, (name, algorithm, err)


def test_cufft_is_found_and_planned_for_the_seed_case(cuda_ext):
  info = cuda_ext.cufft()
  assert info["status"] == "", info
  assert info["version"] > 0 and info["path"], info
  plans = cuda_ext.plan([200, 321, 481, 1], [135, 135, 1, 3], [1, 1, 1, 1], "VALID")
  assert [p["algorithm"] for p in plans] == ["fft"] * 3, plans
  for p in plans:
    assert p["workspace_bytes"] <= 64 << 20
    assert p["workspace_bytes"] == cuda_ext.workspace_bytes(
      p["pass"], [200, 321, 481, 1], [135, 135, 1, 3], [1, 1, 1, 1], "VALID"
    )


@pytest.mark.parametrize("algorithm", ["direct", "fft"])
def test_non_finite_values_stay_in_place(cuda_ext, algorithm):
  """An Inf in the input gives Inf/NaN exactly where a direct sum does: the FFT path's flag
  makes the gated direct kernels redo the pass."""
  x = np.ones((2, 40, 40, 1))
  x[1, 20, 7, 0] = np.inf
  w = np.ones((9, 9, 1, 2))
  ref = Conv(x.shape, w.shape)
  dy = np.ones(ref.output_shape())
  dy[0, 3, 3, 1] = np.nan
  case = (x.shape, w.shape, (1, 1), "VALID", (1, 1))
  ours = _run(cuda_ext, *(to_device(a, "float32") for a in (x, w, dy)), case, "NHWC", algorithm)
  with np.errstate(invalid="ignore"):
    wants = (ref.forward(x, w), ref.backprop_input(w, dy), ref.backprop_filter(x, dy))
  for got, want in zip(ours, wants):
    np.testing.assert_array_equal(got.double().cpu().numpy(), want)


def test_matches_cpu_direct_path(cuda_ext, core_ext, rng):
  case = ((2, 30, 28, 4), (9, 7, 2, 6), (1, 2), "SAME", (2, 1))
  x = rng.standard_normal(case[0]).astype(np.float32)
  w = rng.standard_normal(case[1]).astype(np.float32)
  s, pad, ex, d = attrs(case[2], case[3], case[4], "NHWC")
  cpu = core_ext.conv2d(x, w, s, pad, explicit_paddings=ex, dilations=d, algorithm="direct")
  ref = Conv(x.shape, case[1], case[2], case[3], case[4])
  dy = rng.standard_normal(ref.output_shape())
  ours = _run(cuda_ext, *(to_device(a, "float32") for a in (x, w, dy)), case, "NHWC")
  mag = ref.forward(np.abs(x), np.abs(w))
  assert_close(ours[0].cpu().numpy(), cpu.astype(np.float64), "float32", 9 * 7 * 2, 2 * mag)


@pytest.mark.parametrize("algorithm", ["direct", "fft"])
def test_backprop_filter_is_deterministic(cuda_ext, rng, algorithm):
  case = ((16, 64, 64, 8), (31, 31, 8, 8), (1, 1), "SAME", (1, 1))
  x = to_device(rng.standard_normal(case[0]), "float32")
  dy = to_device(rng.standard_normal(case[0][:3] + (8,)), "float32")
  s, pad, ex, d = attrs(case[2], case[3], case[4], "NHWC")
  outs = []
  for _ in range(3):
    dw = torch.empty(case[1], device="cuda")
    cuda_ext.conv2d_backprop_filter(x, dy, dw, s, pad, algorithm=algorithm)
    torch.cuda.synchronize()
    outs.append(dw.cpu().numpy())
  np.testing.assert_array_equal(outs[0], outs[1])
  np.testing.assert_array_equal(outs[0], outs[2])


def test_bad_input_raises_value_error(cuda_ext):
  x = torch.zeros((1, 8, 8, 1), device="cuda")
  w = torch.zeros((3, 3, 1, 1), device="cuda")
  with pytest.raises(ValueError, match="__cuda_array_interface__"):
    cuda_ext.conv2d(
      np.zeros((1, 8, 8, 1), np.float32), w, torch.zeros((1, 6, 6, 1)).cuda(), [1, 1, 1, 1], "VALID"
    )
  with pytest.raises(ValueError, match="output"):
    cuda_ext.conv2d(x, w, torch.zeros((1, 7, 6, 1), device="cuda"), [1, 1, 1, 1], "VALID")
  with pytest.raises(ValueError, match="same dtype"):
    cuda_ext.conv2d(x, w.double(), torch.zeros((1, 6, 6, 1), device="cuda"), [1, 1, 1, 1], "VALID")
  with pytest.raises(ValueError, match="contiguous"):
    cuda_ext.conv2d(
      x.permute(0, 2, 1, 3), w, torch.zeros((1, 6, 6, 1), device="cuda"), [1, 1, 1, 1], "VALID"
    )
  with pytest.raises(ValueError, match="strides"):
    cuda_ext.conv2d(x, w, torch.zeros((1, 6, 6, 1), device="cuda"), [1, 1, 1], "VALID")
  with pytest.raises(ValueError, match="algorithm='tf' is not available on the GPU"):
    cuda_ext.conv2d(
      x, w, torch.zeros((1, 6, 6, 1), device="cuda"), [1, 1, 1, 1], "VALID", algorithm="tf"
    )
  with pytest.raises(ValueError, match="workspace_limit 100 bytes is too small"):
    cuda_ext.conv2d(
      x,
      w,
      torch.zeros((1, 6, 6, 1), device="cuda"),
      [1, 1, 1, 1],
      "VALID",
      algorithm="fft",
      workspace_limit=100,
    )
