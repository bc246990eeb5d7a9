"""The CUDA kernels' Conv3D passes on a device (the direct tile kernels with a depth
dimension and the FFT path through rank-3 cuFFT transforms) against
torch.nn.functional.conv3d (cuDNN, TF32 off) and the float64 oracle of reference3d.py:
forward and both gradients, float32 / float64 / float16, both layouts, strides, dilations,
SAME and VALID, groups and depthwise; the planner's workspace on the device; a large filter
through 'auto'; non-finite values; bad input. Skipped without a GPU (conftest.py)."""

import itertools

import numpy as np
import pytest
from reference3d import CASES
from reference3d import PASSES
from reference3d import Oracle3d
from reference3d import check
from reference3d import problem

# Without torch every test here is skipped, each with its reason (conftest.py).
try:
  import torch
  import torch_conv
  from torch_conv import to_device
except ImportError:
  torch = torch_conv = to_device = None


def _host(t):
  return t.double().cpu().numpy()


def _run(ext, x, w, dy, attrs, **kwargs):
  """Our three passes on device tensors x, w (DHWIO), dy, as {pass: tensor}."""
  kw = dict(attrs, stream=torch.cuda.current_stream().cuda_stream, **kwargs)
  y, dx, dw = torch.empty_like(dy), torch.empty_like(x), torch.empty_like(w)
  ext.conv3d(x, w, y, **kw)
  ext.conv3d_backprop_input(w, dy, dx, **kw)
  ext.conv3d_backprop_filter(x, dy, dw, **kw)
  torch.cuda.synchronize()
  return dict(zip(PASSES, (y, dx, dw)))


def _spatial(values, fmt):
  return [values[i] for i in ((1, 2, 3) if fmt == "NDHWC" else (2, 3, 4))]


def _torch(oracle, x, w, dy, attrs):
  fmt = attrs["data_format"]
  pads = tuple(zip(oracle.before, oracle.after))
  out = torch_conv.conv3d_and_grads(
    x, w, dy, _spatial(attrs["strides"], fmt), pads, _spatial(attrs["dilations"], fmt), fmt
  )
  return dict(zip(PASSES, out))


def _fft_sizes(ext, x, w, attrs, dtype, algorithm):
  plans = ext.plan3d(list(x.shape), list(w.shape), **attrs, algorithm=algorithm, dtype=dtype)
  return {p["pass"]: (p["fft"] if p["algorithm"] == "fft" else None) for p in plans}


@pytest.mark.parametrize(
  "case,dtype,algorithm",
  list(itertools.product(sorted(CASES), ["float32", "float64", "float16"], ["direct", "fft"])),
)
def test_kernels_match_oracle_and_torch(cuda_ext, rng, case, dtype, algorithm):
  oracle, x, w, dy, attrs = problem(case, rng, "float64")
  xt, wt, dyt = to_device(x, dtype), to_device(w, dtype), to_device(dy, dtype)
  xr, wr, dyr = _host(xt), _host(wt), _host(dyt)  # the operands exactly as stored
  fft = _fft_sizes(cuda_ext, x, w, attrs, dtype, algorithm)
  assert all((f is not None) == (algorithm == "fft") for f in fft.values()), fft
  ours = _run(cuda_ext, xt, wt, dyt, attrs, algorithm=algorithm)
  for pass_name in PASSES:
    check(oracle, pass_name, _host(ours[pass_name]), xr, wr, dyr, dtype, fft[pass_name])
  if dtype != "float16" and algorithm == "direct":
    theirs = _torch(oracle, xt, wt, dyt, attrs)
    for pass_name in PASSES:  # the oracle agrees with cuDNN
      assert ours[pass_name].shape == theirs[pass_name].shape
      check(oracle, pass_name, _host(theirs[pass_name]), xr, wr, dyr, dtype, None)


@pytest.mark.parametrize("algorithm", ["auto", "direct", "fft"])
def test_large_filter_matches_torch(cuda_ext, rng, algorithm):
  """A 31^3 filter over a 64^3 volume, SAME, 1 -> 4 channels (the CPU benchmark's conv3d31
  cases at an eighth of their volume): 'auto' plans the FFT for every pass."""
  attrs = dict(strides=[1] * 5, padding="SAME", data_format="NDHWC", dilations=[1] * 5)
  oracle = Oracle3d((1, 64, 64, 64, 1), (31, 31, 31, 1, 4), (1, 1, 1), "SAME", (1, 1, 1), "NDHWC")
  x = rng.random((1, 64, 64, 64, 1))
  w = rng.standard_normal((31, 31, 31, 1, 4)) / 31**1.5
  dy = rng.standard_normal(oracle.output_shape())
  if algorithm == "auto":
    plans = cuda_ext.plan3d(list(x.shape), list(w.shape), **attrs)
    assert [p["algorithm"] for p in plans] == ["fft"] * 3, plans
  xt, wt, dyt = (to_device(a, "float32") for a in (x, w, dy))
  ours = _run(cuda_ext, xt, wt, dyt, attrs, algorithm=algorithm)
  theirs = _torch(oracle, xt, wt, dyt, attrs)
  for pass_name in PASSES:
    scale = theirs[pass_name].abs().max().item()
    assert (ours[pass_name] - theirs[pass_name]).abs().max().item() <= 1e-4 * scale, pass_name


@pytest.mark.parametrize("limit", [200_000, 1 << 20, -1])
def test_workspace_is_what_the_plan_says(cuda_ext, rng, limit):
  """Under a limit the FFT runs in rounds within it, cuFFT's actual work area included,
  and gives the oracle's answer."""
  oracle, x, w, dy, attrs = problem("many_channels", rng, "float32")
  plans = cuda_ext.plan3d(
    list(x.shape), list(w.shape), **attrs, algorithm="fft", workspace_limit=limit
  )
  for p in plans:
    assert p["workspace_bytes"] <= (limit if limit > 0 else 64 << 20), p
  xt, wt, dyt = (to_device(a, "float32") for a in (x, w, dy))
  ours = _run(cuda_ext, xt, wt, dyt, attrs, algorithm="fft", workspace_limit=limit)
  fft = {p["pass"]: p["fft"] for p in plans}
  for pass_name in PASSES:
    check(
      oracle,
      pass_name,
      _host(ours[pass_name]),
      *(_host(t) for t in (xt, wt, dyt)),
      "float32",
      fft[pass_name],
    )


@pytest.mark.parametrize("algorithm", ["direct", "fft"])
def test_non_finite_values_stay_in_place(cuda_ext, algorithm):
  attrs = dict(strides=[1] * 5, padding="VALID", data_format="NDHWC", dilations=[1] * 5)
  oracle = Oracle3d((1, 5, 6, 6, 1), (3, 3, 3, 1, 1), (1, 1, 1), "VALID", (1, 1, 1), "NDHWC")
  x = np.ones((1, 5, 6, 6, 1))
  x[0, 2, 2, 3, 0] = np.inf
  w = np.ones((3, 3, 3, 1, 1))
  dy = np.ones(oracle.output_shape())
  ours = _run(cuda_ext, *(to_device(a, "float32") for a in (x, w, dy)), attrs, algorithm=algorithm)
  np.testing.assert_array_equal(_host(ours["forward"]), oracle.forward(x, w))


def test_bad_input_raises_value_error(cuda_ext):
  attrs = dict(strides=[1] * 5, padding="SAME")
  x = torch.zeros((1, 4, 4, 4, 1), device="cuda")
  w = torch.zeros((2, 2, 2, 1, 1), device="cuda")
  with pytest.raises(ValueError, match="input must be 5-D"):
    cuda_ext.conv3d(x[0], w, torch.zeros_like(x), **attrs)
  with pytest.raises(ValueError, match="output does not have the shape"):
    cuda_ext.conv3d(x, w, torch.zeros((1, 3, 4, 4, 1), device="cuda"), **attrs)
  with pytest.raises(ValueError, match="same dtype"):
    cuda_ext.conv3d(x, w.double(), torch.zeros_like(x), **attrs)
  with pytest.raises(ValueError, match="strides"):
    cuda_ext.conv3d(x, w, torch.zeros_like(x), strides=[1, 1, 1, 1], padding="SAME")
  with pytest.raises(ValueError, match="workspace_limit 100 bytes is too small"):
    cuda_ext.conv3d(x, w, torch.zeros_like(x), **attrs, algorithm="fft", workspace_limit=100)
