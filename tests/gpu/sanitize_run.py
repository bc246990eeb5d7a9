"""Runs every pass of the CUDA kernels over a reduced set of cases, synchronising after each,
with no oracle and no torch convolution: the driver for compute-sanitizer (memcheck,
racecheck, synccheck), where anything else would be instrumented too.

  compute-sanitizer --tool memcheck python tests/gpu/sanitize_run.py [--cases 2 3 5 6]

Cases are indices into tests/cases.py CASES (grouped, depthwise, explicit padding, ...),
plus "seed" (a 135x135 filter, where the FFT path runs several rounds) and "nonfinite" (an
Inf in the input and a NaN in out_backprop, so the FFT path's exact redo runs). Each runs
in both layouts, float32 and bfloat16, both algorithms, all three passes. Prints one line
per launch and exits non-zero on the first error.
"""

import argparse
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]
from cases import CASES  # noqa: E402
from cases import attrs  # noqa: E402
from conftest import load_extension  # noqa: E402
from reference import Conv  # noqa: E402

EXTRA = {
  "seed": ((1, 150, 170, 1), (135, 135, 1, 3), (1, 1), "VALID", (1, 1)),
  # The seed filter over a 2x6 output: the same filter rounds through shared memory with
  # little else, so racecheck (which slows every shared-memory access) finishes.
  "seed_small": ((1, 136, 140, 1), (135, 135, 1, 3), (1, 1), "VALID", (1, 1)),
  "nonfinite": ((2, 40, 40, 1), (9, 9, 1, 2), (1, 1), "VALID", (1, 1)),
}


def _tensors(case, fmt, dtype, rng):
  x_shape, w_shape, strides, padding, dilations = case
  x = rng.standard_normal(x_shape)
  w = rng.standard_normal(w_shape)
  dy = rng.standard_normal(Conv(x_shape, w_shape, strides, padding, dilations).output_shape())
  if case is EXTRA["nonfinite"]:
    x[1, 20, 7, 0] = np.inf
    dy[0, 3, 3, 1] = np.nan
  if fmt == "NCHW":
    x, dy = (np.ascontiguousarray(np.transpose(a, (0, 3, 1, 2))) for a in (x, dy))
  dev = [torch.as_tensor(a).to("cuda", getattr(torch, dtype)) for a in (x, w, dy)]
  return [t.view(torch.int16) if t.dtype == torch.bfloat16 else t for t in dev]


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--cases", nargs="*", default=["2", "3", "5", "6", "seed", "nonfinite"])
  parser.add_argument("--dtypes", nargs="*", default=["float32", "bfloat16"])
  parser.add_argument("--algorithms", nargs="*", default=["direct", "fft"])
  parser.add_argument("--formats", nargs="*", default=["NHWC", "NCHW"])
  args = parser.parse_args(argv)
  ext = load_extension("_cuda")
  rng = np.random.default_rng(0)
  stream = torch.cuda.current_stream().cuda_stream
  for name in args.cases:
    case = EXTRA[name] if name in EXTRA else CASES[int(name)]
    for fmt in args.formats:
      for dtype in args.dtypes:
        x, w, dy = _tensors(case, fmt, dtype, rng)
        s, pad, ex, d = attrs(case[2], case[3], case[4], fmt)
        for algorithm in args.algorithms:
          kw = dict(
            explicit_paddings=ex,
            data_format=fmt,
            dilations=d,
            algorithm=algorithm,
            stream=stream,
            dtype="bfloat16" if dtype == "bfloat16" else "",
          )
          y, dx, dw = torch.empty_like(dy), torch.empty_like(x), torch.empty_like(w)
          for pass_name, fn, operands in (
            ("forward", ext.conv2d, (x, w, y)),
            ("backprop_input", ext.conv2d_backprop_input, (w, dy, dx)),
            ("backprop_filter", ext.conv2d_backprop_filter, (x, dy, dw)),
          ):
            print(f"case {name} {fmt} {dtype} {algorithm} {pass_name}", flush=True)
            fn(*operands, s, pad, **kw)
            torch.cuda.synchronize()
  print("all launches completed")


if __name__ == "__main__":
  main()
