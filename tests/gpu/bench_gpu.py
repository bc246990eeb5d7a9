"""GPU benchmark: tf_largeconv's CUDA kernels against torch.nn.functional.conv2d (cuDNN with
benchmark mode on, so it picks its fastest algorithm; TF32 off), same device, same run.

  python tests/gpu/bench_gpu.py [--cases NAME ...] [--algorithms auto direct fft]
                                [--repeats N] [--json PATH]

Needs a CUDA device, torch and tf_largeconv/_cuda (`make cuda`); no TensorFlow. Times are
CUDA-event milliseconds (min and median over the repeats, after a warm-up). Memory is the
temporary memory a method takes beyond its operands: for torch, its allocator's peak minus
the operands; for ours, the workspace the kernels allocate (their only temporary, cuFFT's
work area included). With --algorithms, ours runs once per algorithm; "auto" is what the
planner picks (shown per pass: d = direct, f = FFT).
"""

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import load_extension  # noqa: E402  pylint: disable=g-import-not-at-top

MiB = 2**20

# name: (input NCHW, filter HWIO, padding, mode). Depthwise = filter in-depth 1.
CASES = {
    "seed_forward": ((200, 1, 321, 481), (135, 135, 1, 3), "VALID", "forward"),
    "seed_train": ((200, 1, 321, 481), (135, 135, 1, 3), "VALID", "train"),
    "replk31_forward": ((8, 128, 56, 56), (31, 31, 1, 128), "SAME", "forward"),
    "replk31_train": ((8, 128, 56, 56), (31, 31, 1, 128), "SAME", "train"),
}


def _time(fn, repeats):
  fn()
  torch.cuda.synchronize()
  times = []
  for _ in range(repeats):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    times.append(start.elapsed_time(end))
  times.sort()
  return times[0], times[len(times) // 2]


def _case(ext, name, repeats, algorithm):
  x_shape, w_shape, padding, mode = CASES[name]
  gen = torch.Generator(device="cuda").manual_seed(0)
  x = torch.rand(x_shape, device="cuda", generator=gen)
  w = torch.randn(w_shape, device="cuda", generator=gen) / (w_shape[0] * w_shape[1])
  groups = x_shape[1] // w_shape[2]
  kh, kw = w_shape[:2]
  pt, pl = ((kh - 1) // 2, (kw - 1) // 2) if padding == "SAME" else (0, 0)
  pb, pr = ((kh - 1) - pt, (kw - 1) - pl) if padding == "SAME" else (0, 0)
  w_oihw = w.permute(3, 2, 0, 1).contiguous()
  with torch.no_grad():
    y_ref = F.conv2d(F.pad(x, (pl, pr, pt, pb)), w_oihw, groups=groups)
  dy = torch.randn(y_ref.shape, device="cuda", generator=gen)
  stream = torch.cuda.current_stream().cuda_stream
  attrs = ([1, 1, 1, 1], padding)
  kwargs = dict(data_format="NCHW", stream=stream, algorithm=algorithm)
  y, dx, dw = torch.empty_like(y_ref), torch.empty_like(x), torch.empty_like(w)

  def ours():
    ext.conv2d(x, w, y, *attrs, **kwargs)
    if mode == "train":
      ext.conv2d_backprop_input(w, dy, dx, *attrs, **kwargs)
      ext.conv2d_backprop_filter(x, dy, dw, *attrs, **kwargs)

  xg = x.clone().requires_grad_(mode == "train")
  wg = w_oihw.clone().requires_grad_(mode == "train")

  def theirs():
    if mode == "train":
      out = F.conv2d(F.pad(xg, (pl, pr, pt, pb)), wg, groups=groups)
      out.backward(dy)
    else:
      with torch.no_grad():
        F.conv2d(F.pad(xg, (pl, pr, pt, pb)), wg, groups=groups)

  plans = ext.plan(list(x_shape), list(w_shape), *attrs, data_format="NCHW",
                   algorithm=algorithm)[:3 if mode == "train" else 1]
  ours_ws = max(p["workspace_bytes"] for p in plans)
  chosen = "".join(p["algorithm"][0] for p in plans)
  ours_t = _time(ours, repeats)
  ours(); torch.cuda.synchronize()  # noqa: E702
  err = (y - y_ref).abs().max().item() / max(y_ref.abs().max().item(), 1e-30)

  theirs()
  torch.cuda.synchronize()
  operands = torch.cuda.memory_allocated()
  torch.cuda.reset_peak_memory_stats()
  theirs_t = _time(theirs, repeats)
  theirs_ws = torch.cuda.max_memory_allocated() - operands
  return {"case": name, "algorithm": f"{algorithm}:{chosen}", "ours_ms": ours_t,
          "torch_ms": theirs_t, "ours_workspace": ours_ws, "torch_extra": max(theirs_ws, 0),
          "max_rel_error": err}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--cases", nargs="*", default=list(CASES))
  parser.add_argument("--algorithms", nargs="*", default=["auto"],
                      choices=["auto", "direct", "fft"])
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--json", help="also write the results here")
  args = parser.parse_args(argv)
  ext = load_extension("_cuda")
  if ext is None or not torch.cuda.is_available():
    sys.exit("needs a CUDA device and tf_largeconv/_cuda (run `make cuda`)")
  torch.backends.cuda.matmul.allow_tf32 = False
  torch.backends.cudnn.allow_tf32 = False
  torch.backends.cudnn.benchmark = True
  print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
        f"cuDNN {torch.backends.cudnn.version()}")
  print(f"cuFFT: {ext.cufft()}")
  print(f"{'case':18s}{'algorithm':>12s}{'ours min/med ms':>18s}{'torch min/med ms':>19s}"
        f"{'speedup':>9s}{'ours ws MiB':>13s}{'torch MiB':>11s}{'rel err':>10s}")
  results = []
  for name, algorithm in ((n, a) for n in args.cases for a in args.algorithms):
    r = _case(ext, name, args.repeats, algorithm)
    results.append(r)
    o, t = r["ours_ms"], r["torch_ms"]
    print(f"{name:18s}{r['algorithm']:>12s}{o[0]:9.2f}/{o[1]:<8.2f}{t[0]:10.2f}/{t[1]:<8.2f}"
          f"{t[0] / o[0]:8.2f}x{r['ours_workspace'] / MiB:13.1f}{r['torch_extra'] / MiB:11.1f}"
          f"{r['max_rel_error']:10.1e}", flush=True)
    torch.cuda.empty_cache()
  if args.json:
    with open(args.json, "w") as f:
      json.dump(results, f, indent=1)


if __name__ == "__main__":
  main()
