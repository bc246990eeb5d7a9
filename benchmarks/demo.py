"""The seed case: frames of 321x481x1 convolved with a 135x135x1x3 filter, VALID padding.

Runs tf_largeconv.conv2d and tf.nn.conv2d on the same frames, each in a fresh process, and
prints time per call, peak extra memory and the largest difference between the two.

  python -m benchmarks.demo [--frames N]
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

from benchmarks import measure

FRAME = (321, 481, 1)
FILTER = (135, 135, 1, 3)

# What TensorFlow logs at import whatever TF_CPP_MIN_LOG_LEVEL says (absl's notice before its
# logging is set up, then INFO and WARNING lines such as "oneDNN custom operations are on"):
# the demo drops these from its children's stderr and passes every other line on.
_TF_LOG_LINE = re.compile(
  r"^(WARNING: All log messages before absl::InitializeLog\(\) is called"
  r"|[IW]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ \S+:\d+\] )"
)


def quiet_stderr(text):
  """The child's stderr less TensorFlow's import-time INFO and WARNING log lines."""
  return "".join(line for line in text.splitlines(True) if not _TF_LOG_LINE.match(line))


def _data(frames):
  import numpy as np

  rng = np.random.default_rng(0)
  x = rng.random((frames,) + FRAME, dtype=np.float32)
  w = (rng.standard_normal(FILTER) / FILTER[0]).astype(np.float32)
  return x, w


def _worker(which, frames, out_path):
  """Runs one implementation in this (fresh) process and saves result and figures."""
  import numpy as np
  import tensorflow as tf

  import tf_largeconv as lc

  x, w = _data(frames)
  x, w = tf.constant(x), tf.constant(w)
  conv = lc.conv2d if which == "tf_largeconv" else tf.nn.conv2d
  result = {}

  def run():
    result["y"] = conv(x, w, 1, "VALID").numpy()

  seconds, extra = measure.measure(run, repeats=2)
  np.save(out_path + ".npy", result["y"])
  with open(out_path, "w", encoding="ascii") as f:
    json.dump({"seconds": seconds, "extra_bytes": extra}, f)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--frames", type=int, default=2)
  parser.add_argument("--worker", choices=["tf_largeconv", "tf.nn.conv2d"])
  parser.add_argument("--out")
  args = parser.parse_args(argv)
  if args.worker:
    _worker(args.worker, args.frames, args.out)
    return 0

  import numpy as np

  print(
    f"Seed case: {args.frames} frame(s) of {FRAME[0]}x{FRAME[1]}x{FRAME[2]}, filter "
    f"{'x'.join(map(str, FILTER))}, VALID -> output "
    f"{args.frames}x{FRAME[0] - FILTER[0] + 1}x{FRAME[1] - FILTER[1] + 1}x{FILTER[3]}"
  )
  figures, outputs = {}, {}
  env = measure.child_env(TF_CPP_MIN_LOG_LEVEL="2")
  with tempfile.TemporaryDirectory() as tmp:
    for which in ("tf_largeconv", "tf.nn.conv2d"):
      out = os.path.join(tmp, which)
      child = subprocess.run(
        [
          sys.executable,
          "-m",
          "benchmarks.demo",
          "--worker",
          which,
          "--frames",
          str(args.frames),
          "--out",
          out,
        ],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
      )
      sys.stderr.write(child.stderr if child.returncode else quiet_stderr(child.stderr))
      child.check_returncode()
      with open(out, encoding="ascii") as f:
        figures[which] = json.load(f)
      outputs[which] = np.load(out + ".npy")
  print(f"{'':14s}{'seconds/call':>14s}{'s/frame':>10s}{'peak extra MiB':>16s}")
  for which, fig in figures.items():
    print(
      f"{which:14s}{fig['seconds']:14.3f}{fig['seconds'] / args.frames:10.3f}"
      f"{fig['extra_bytes'] / 2**20:16.1f}"
    )
  ours, theirs = outputs["tf_largeconv"], outputs["tf.nn.conv2d"]
  diff = float(np.max(np.abs(ours.astype(np.float64) - theirs)))
  scale = float(np.max(np.abs(theirs)))
  print(
    f"max |difference| = {diff:.3e} (output magnitude {scale:.3e}); speed ratio "
    f"tf.nn.conv2d / tf_largeconv = "
    f"{figures['tf.nn.conv2d']['seconds'] / figures['tf_largeconv']['seconds']:.2f}x"
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
