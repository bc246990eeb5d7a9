"""Every result of the CPU kernels over a fixed set of problems, for telling two builds apart
bit by bit.

The problems are those of tests/cases.py (each in NHWC and NCHW, float32 and float64, every
algorithm the op runs, with the default workspace limit and one small enough to cut the
FFT into blocks), a few larger ones whose FFT plans batch tiles, groups and channels, int32
through the direct kernels, and some 3-D ones. Each gives the three passes (forward and
both gradients) from `tf_largeconv._core` on one thread and on two.

  python tools/core_results.py dump OUT.npz        # every result, by name
  python tools/core_results.py compare A.npz B.npz # exit 1 unless bitwise equal
  python tools/core_results.py digest OUT.json     # one sha256 per result

tests/test_core_results.py compares the digests with tests/data/core_results.json, written
by `digest`, so a change to the kernels' arithmetic shows.
"""

import argparse
import hashlib
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from cases import CASES, attrs, to_format  # noqa: E402, I001

from tf_largeconv import _core  # noqa: E402

# (x NHWC, w HWIO, strides, padding, dilations): FFT plans with runs of tiles, batched
# groups, channel blocks, wrap-around single tiles, height-1 rows and strided spectra.
LARGER = [
  ((2, 64, 64, 8), (15, 15, 8, 8), (1, 1), "SAME", (1, 1)),
  ((1, 48, 40, 16), (9, 9, 1, 16), (2, 2), "SAME", (1, 1)),  # depthwise, strided
  ((3, 1, 300, 4), (1, 31, 4, 4), (1, 1), "SAME", (1, 1)),  # conv1d rows
  ((1, 33, 35, 6), (11, 7, 3, 4), (2, 3), "VALID", (2, 1)),  # grouped, dilated
  ((2, 40, 40, 4), (31, 31, 4, 4), (2, 2), "SAME", (1, 1)),  # transpose-like strides
]
LIMITS = {"default": -1, "small": 1 << 17}
# (x NDHWC, w DHWIO, strides, padding, dilations)
CASES3D = [
  ((1, 6, 7, 8, 2), (3, 3, 3, 2, 3), (1, 1, 1), "SAME", (1, 1, 1)),
  ((2, 9, 8, 7, 4), (5, 3, 4, 2, 4), (2, 1, 2), "VALID", (1, 2, 1)),
  ((1, 12, 12, 12, 1), (7, 7, 7, 1, 2), (1, 1, 1), "SAME", (1, 1, 1)),
]


def _operands(rng, x_shape, w_shape, dtype):
  x = rng.standard_normal(x_shape)
  w = rng.standard_normal(w_shape)
  if dtype == np.int32:
    return rng.integers(-9, 10, x_shape).astype(dtype), rng.integers(-9, 10, w_shape).astype(dtype)
  return x.astype(dtype), w.astype(dtype)


def _passes(ops, x, w, args, kw, period):
  """The forward pass and both gradients through `ops` (forward, backprop-input,
  backprop-filter of one dimensionality), the output gradient cycling over `period` values."""
  forward, backprop_input, backprop_filter = ops
  y = forward(x, w, *args, **kw)
  dy = (np.arange(y.size) % period - period // 2).astype(y.dtype).reshape(y.shape)
  dx = backprop_input(list(x.shape), w, dy, *args, **kw)
  dw = backprop_filter(x, list(w.shape), dy, *args, **kw)
  return {"y": y, "dx": dx, "dw": dw}


OPS2D = (_core.conv2d, _core.conv2d_backprop_input, _core.conv2d_backprop_filter)
OPS3D = (_core.conv3d, _core.conv3d_backprop_input, _core.conv3d_backprop_filter)


def results():
  """Every result, by a name that says its problem, dtype, format, algorithm, limit and
  thread count (an error's message stands in for a refused plan)."""
  out = {}
  rng = np.random.default_rng(52)
  problems = [("case", i, c) for i, c in enumerate(CASES)] + [
    ("larger", i, c) for i, c in enumerate(LARGER)
  ]
  for kind, i, (x_shape, w_shape, strides, padding, dilations) in problems:
    for dtype in (np.float32, np.float64, np.int32):
      x, w = _operands(rng, x_shape, w_shape, dtype)
      for fmt in ("NHWC", "NCHW"):
        s, pad, ex, d = attrs(strides, padding, dilations, fmt)
        xf = to_format(fmt, x)
        algorithms = ("direct",) if dtype == np.int32 else ("direct", "fft", "auto")
        for algorithm in algorithms:
          for limit_name, limit in LIMITS.items():
            for threads in (1, 2):
              name = f"{kind}{i}-{np.dtype(dtype).name}-{fmt}-{algorithm}-{limit_name}-t{threads}"
              kw = dict(algorithm=algorithm, workspace_limit=limit, num_threads=threads)
              try:
                got = _passes(OPS2D, xf, w, (s, pad, ex, fmt, d), kw, 7)
              except ValueError as e:
                out[name + "-error"] = np.frombuffer(str(e).encode(), np.uint8)
                continue
              for k, v in got.items():
                out[f"{name}-{k}"] = v
  for i, (x_shape, w_shape, strides, padding, dilations) in enumerate(CASES3D):
    for dtype in (np.float32, np.float64):
      x, w = _operands(rng, x_shape, w_shape, dtype)
      for algorithm in ("direct", "fft", "auto"):
        for threads in (1, 2):
          name = f"case3d{i}-{np.dtype(dtype).name}-{algorithm}-t{threads}"
          s = [1, *strides, 1]
          d = [1, *dilations, 1]
          kw = dict(algorithm=algorithm, num_threads=threads)
          for k, v in _passes(OPS3D, x, w, (s, padding, "NDHWC", d), kw, 5).items():
            out[f"{name}-{k}"] = v
  return out


def digests(arrays):
  """sha256 of each array's dtype, shape and bytes."""
  return {
    k: hashlib.sha256(f"{v.dtype.str}{v.shape}".encode() + v.tobytes()).hexdigest()
    for k, v in sorted(arrays.items())
  }


def differences(a, b):
  """Names whose arrays differ in dtype, shape or any bit, and names in one only."""
  bad = sorted(set(a) ^ set(b))
  for k in sorted(set(a) & set(b)):
    x, y = a[k], b[k]
    if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
      bad.append(k)
  return bad


def main(argv=None):
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawTextHelpFormatter
  )
  sub = parser.add_subparsers(dest="command", required=True)
  sub.add_parser("dump").add_argument("out")
  cmp = sub.add_parser("compare")
  cmp.add_argument("a")
  cmp.add_argument("b")
  sub.add_parser("digest").add_argument("out")
  args = parser.parse_args(argv)
  if args.command == "dump":
    arrays = results()
    np.savez(args.out, **arrays)
    print(f"{len(arrays)} results in {args.out}")
  elif args.command == "digest":
    with open(args.out, "w") as f:
      json.dump(digests(results()), f, indent=0, sort_keys=True)
      f.write("\n")
  else:
    with np.load(args.a) as fa, np.load(args.b) as fb:
      a, b = dict(fa), dict(fb)
    bad = differences(a, b)
    print(f"{len(a)} and {len(b)} results; {len(bad)} differ")
    for k in bad[:20]:
      print("  ", k)
    return 1 if bad else 0
  return 0


if __name__ == "__main__":
  sys.exit(main())
