"""Crash harness: random, mostly malformed calls to the raw LargeConv ops in worker
processes; counts the processes that die (signal or abort) instead of raising, or hang.

  python tests/crash_harness.py --workers 4 --calls 500 [--seed 0] [--timeout 1800]

Prints "deaths: N" and exits non-zero if N > 0. The workers import the tf_largeconv this
Python imports (as the tests' children do, see subproc.py); run as a script where none is
importable (`make fuzz` in a checkout), the checkout's in-place build.
"""

import argparse
import os
import sys

try:
  import subproc
except ModuleNotFoundError as e:
  if e.name != "tf_largeconv":
    raise
  sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  import subproc

WORKER = r"""
import sys, numpy as np, tensorflow as tf
import tf_largeconv as lc
from tf_largeconv import _loader
ops = _loader.ops()
rng = np.random.default_rng(int(sys.argv[1]))
calls = int(sys.argv[2])
DTYPES = [np.float16, np.float32, np.float64, tf.bfloat16.as_numpy_dtype]

def shape():
  rank = rng.choice([4, 4, 4, 3, 5, 0, 2])
  return tuple(int(v) for v in rng.integers(0, 7, size=rank))

def ints(n_choices=(4, 4, 4, 0, 2, 3, 5)):
  n = rng.choice(n_choices)
  vals = rng.integers(-2, 4, size=n)
  if rng.random() < 0.1:
    vals = vals * 2**40
  return [int(v) for v in vals]

ok = errors = 0
for i in range(calls):
  dtype = DTYPES[rng.integers(len(DTYPES))]
  attrs = dict(strides=ints(), dilations=ints() if rng.random() < 0.8 else [1, 1, 1, 1],
               padding=str(rng.choice(["SAME", "VALID", "EXPLICIT"])),
               explicit_paddings=ints((0, 8, 8, 4)),
               data_format=str(rng.choice(["NHWC", "NCHW"])),
               algorithm=str(rng.choice(["auto", "direct", "fft"])),
               workspace_limit=int(rng.choice([-1, 0, 1000, 1 << 20])))
  x = np.asarray(rng.standard_normal(shape()), dtype)
  w = np.asarray(rng.standard_normal(shape()), dtype)
  if rng.random() < 0.5:  # a plausible call, then perhaps one thing off
    n, h, wd, c = (int(v) for v in rng.integers(0, 9, size=4))
    k = int(rng.integers(1, 6))
    x = np.asarray(rng.standard_normal((n, h, wd, c)), dtype)
    w = np.asarray(rng.standard_normal((k, k, c, int(rng.integers(0, 4)))), dtype)
    attrs.update(strides=[1, int(rng.integers(1, 3)), int(rng.integers(1, 3)), 1],
                 dilations=[1, int(rng.integers(1, 3)), 1, 1], data_format="NHWC",
                 padding=str(rng.choice(["SAME", "VALID"])), explicit_paddings=[])
  which = rng.integers(3)
  try:
    if which == 0:
      ops.large_conv_conv2d(x, w, **attrs)
    elif which == 1:
      sizes = list(x.shape) if rng.random() < 0.5 else ints((4, 4, 3, 0))
      dy = lc.conv2d(x, w, attrs["strides"], attrs["padding"], dilations=attrs["dilations"]) \
          if rng.random() < 0.5 else x
      ops.large_conv_conv2d_backprop_input(sizes, w, dy, **attrs)
    else:
      sizes = list(w.shape) if rng.random() < 0.5 else ints((4, 4, 5))
      dy = lc.conv2d(x, w, attrs["strides"], attrs["padding"], dilations=attrs["dilations"]) \
          if rng.random() < 0.5 else w
      ops.large_conv_conv2d_backprop_filter(x, sizes, dy, **attrs)
    ok += 1
  except (tf.errors.OpError, ValueError, TypeError) as e:
    errors += 1
print(f"worker done: {ok} ran, {errors} raised", flush=True)
"""


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workers", type=int, default=4)
  parser.add_argument("--calls", type=int, default=500)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument(
    "--timeout",
    type=float,
    default=1800,
    help="seconds after which a worker counts as hung (killed, a death)",
  )
  args = parser.parse_args(argv)
  print(f"workers import {subproc.PACKAGE_PARENT}", flush=True)
  deaths = 0
  for w in range(args.workers):
    proc = subproc.start(WORKER, args.seed * 1000 + w, args.calls)
    try:
      out, err = subproc.wait(proc, args.timeout, check=False)
    except AssertionError as e:  # hung: killed, the message holds its output
      deaths += 1
      print(f"worker {w} hung:\n{e}", flush=True)
      continue
    if proc.returncode != 0 or "worker done" not in out:
      deaths += 1
      print(f"worker {w} died:\n{subproc.describe(proc, out, err)}", flush=True)
    else:
      print(out.strip(), flush=True)
  print(f"deaths: {deaths}")
  return 1 if deaths else 0


if __name__ == "__main__":
  sys.exit(main())
