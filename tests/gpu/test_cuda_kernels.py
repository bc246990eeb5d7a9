"""The CUDA direct kernels on a device against torch.nn.functional.conv2d (TF32 off), the
float64 oracle and the CPU path: forward and both gradients, every dtype, both layouts,
strides, dilations, paddings, groups; determinism; bad input. Skipped without a GPU."""

import itertools

import numpy as np
import pytest

from cases import CASES, attrs, to_format
from reference import Conv, assert_close

torch = pytest.importorskip("torch")
import torch_conv  # noqa: E402  pylint: disable=g-import-not-at-top

TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64,
                "float16": torch.float16, "bfloat16": torch.bfloat16}


def _dev(a, dtype_name):
  return torch.as_tensor(np.asarray(a, np.float64)).to("cuda", TORCH_DTYPES[dtype_name])


def _arg(t):
  """What the extension takes for a tensor: bfloat16 goes as its int16 view."""
  return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


def _run(ext, x, w, dy, case, fmt):
  """Our forward and both gradients for device tensors x (fmt), w (HWIO), dy (fmt)."""
  _, _, strides, padding, dilations = case
  s, pad, ex, d = attrs(strides, padding, dilations, fmt)
  kw = dict(explicit_paddings=ex, data_format=fmt, dilations=d,
            stream=torch.cuda.current_stream().cuda_stream,
            dtype="bfloat16" if x.dtype == torch.bfloat16 else "")
  y, dx, dw = torch.empty_like(dy), torch.empty_like(x), torch.empty_like(w)
  ext.conv2d(_arg(x), _arg(w), _arg(y), s, pad, **kw)
  ext.conv2d_backprop_input(_arg(w), _arg(dy), _arg(dx), s, pad, **kw)
  ext.conv2d_backprop_filter(_arg(x), _arg(dy), _arg(dw), s, pad, **kw)
  torch.cuda.synchronize()
  return y, dx, dw


def _check_all(got, ref, x, w, dy, name, what):
  """got = (y, dx, dw) against the float64 oracle on the (rounded) operands."""
  kh, kwid, ci, co = w.shape
  checks = (
      (got[0], ref.forward(x, w), ref.forward(np.abs(x), np.abs(w)), kh * kwid * ci),
      (got[1], ref.backprop_input(w, dy), ref.backprop_input(np.abs(w), np.abs(dy)),
       kh * kwid * co),
      (got[2], ref.backprop_filter(x, dy), ref.backprop_filter(np.abs(x), np.abs(dy)),
       int(np.prod(dy.shape))))
  for (t, want, mag, terms), pass_name in zip(checks, ("forward", "backprop_input",
                                                      "backprop_filter")):
    assert_close(t.double().cpu().numpy(), want, name, terms, mag, f"{what} {pass_name}")


@pytest.mark.parametrize("case,fmt,dtype", list(itertools.product(
    CASES, ["NHWC", "NCHW"], ["float32", "float64", "float16", "bfloat16"])))
def test_kernels_match_oracle_and_torch(cuda_ext, rng, case, fmt, dtype):
  x_shape, w_shape, strides, padding, dilations = case
  x = to_format(fmt, rng.standard_normal(x_shape))
  w = rng.standard_normal(w_shape)
  ref = Conv(x.shape, w_shape, strides, padding, dilations, fmt)
  dy = rng.standard_normal(ref.output_shape())
  xt, wt, dyt = _dev(x, dtype), _dev(w, dtype), _dev(dy, dtype)
  # The oracle sees the operands exactly as the device stores them.
  xr, wr, dyr = (t.double().cpu().numpy() for t in (xt, wt, dyt))
  ours = _run(cuda_ext, xt, wt, dyt, case, fmt)
  _check_all(ours, ref, xr, wr, dyr, dtype, "ours")
  if dtype in ("float32", "float64") and x_shape[0] > 0:
    theirs = torch_conv.conv2d_and_grads(xt, wt, dyt, strides, padding, dilations, fmt)
    _check_all(theirs, ref, xr, wr, dyr, dtype, "torch")  # the oracle agrees with torch
    for a, b in zip(ours, theirs):
      assert a.shape == b.shape


def test_seed_sized_filter_matches_torch(cuda_ext, rng):
  """One 321x481 frame, a 135x135x1x3 filter, VALID: the product's own case."""
  case = ((1, 321, 481, 1), (135, 135, 1, 3), (1, 1), "VALID", (1, 1))
  x = rng.random(case[0])
  w = rng.standard_normal(case[1]) / 135
  ref = Conv(x.shape, case[1])
  dy = rng.standard_normal(ref.output_shape())
  xt, wt, dyt = (_dev(a, "float32") for a in (x, w, dy))
  ours = _run(cuda_ext, xt, wt, dyt, case, "NHWC")
  theirs = torch_conv.conv2d_and_grads(xt, wt, dyt, (1, 1), "VALID", (1, 1), "NHWC")
  xr, wr, dyr = (t.double().cpu().numpy() for t in (xt, wt, dyt))
  _check_all(ours, ref, xr, wr, dyr, "float32", "ours")
  for a, b in zip(ours, theirs):
    scale = b.abs().max().item()
    assert (a - b).abs().max().item() <= 1e-4 * scale


def test_matches_cpu_direct_path(cuda_ext, core_ext, rng):
  case = ((2, 30, 28, 4), (9, 7, 2, 6), (1, 2), "SAME", (2, 1))
  x = rng.standard_normal(case[0]).astype(np.float32)
  w = rng.standard_normal(case[1]).astype(np.float32)
  s, pad, ex, d = attrs(case[2], case[3], case[4], "NHWC")
  cpu = core_ext.conv2d(x, w, s, pad, explicit_paddings=ex, dilations=d, algorithm="direct")
  ref = Conv(x.shape, case[1], case[2], case[3], case[4])
  dy = rng.standard_normal(ref.output_shape())
  ours = _run(cuda_ext, _dev(x, "float32"), _dev(w, "float32"), _dev(dy, "float32"), case,
              "NHWC")
  mag = ref.forward(np.abs(x), np.abs(w))
  assert_close(ours[0].cpu().numpy(), cpu.astype(np.float64), "float32", 9 * 7 * 2, 2 * mag)


def test_backprop_filter_is_deterministic(cuda_ext, rng):
  case = ((16, 64, 64, 8), (31, 31, 8, 8), (1, 1), "SAME", (1, 1))
  x = _dev(rng.standard_normal(case[0]), "float32")
  dy = _dev(rng.standard_normal(case[0][:3] + (8,)), "float32")
  s, pad, ex, d = attrs(case[2], case[3], case[4], "NHWC")
  outs = []
  for _ in range(3):
    dw = torch.empty(case[1], device="cuda")
    cuda_ext.conv2d_backprop_filter(x, dy, dw, s, pad)
    torch.cuda.synchronize()
    outs.append(dw.cpu().numpy())
  np.testing.assert_array_equal(outs[0], outs[1])
  np.testing.assert_array_equal(outs[0], outs[2])


def test_bad_input_raises_value_error(cuda_ext):
  x = torch.zeros((1, 8, 8, 1), device="cuda")
  w = torch.zeros((3, 3, 1, 1), device="cuda")
  with pytest.raises(ValueError, match="__cuda_array_interface__"):
    cuda_ext.conv2d(np.zeros((1, 8, 8, 1), np.float32), w, torch.zeros((1, 6, 6, 1)).cuda(),
                    [1, 1, 1, 1], "VALID")
  with pytest.raises(ValueError, match="output"):
    cuda_ext.conv2d(x, w, torch.zeros((1, 7, 6, 1), device="cuda"), [1, 1, 1, 1], "VALID")
  with pytest.raises(ValueError, match="same dtype"):
    cuda_ext.conv2d(x, w.double(), torch.zeros((1, 6, 6, 1), device="cuda"), [1, 1, 1, 1],
                    "VALID")
  with pytest.raises(ValueError, match="contiguous"):
    cuda_ext.conv2d(x.permute(0, 2, 1, 3), w, torch.zeros((1, 6, 6, 1), device="cuda"),
                    [1, 1, 1, 1], "VALID")
  with pytest.raises(ValueError, match="strides"):
    cuda_ext.conv2d(x, w, torch.zeros((1, 6, 6, 1), device="cuda"), [1, 1, 1], "VALID")
