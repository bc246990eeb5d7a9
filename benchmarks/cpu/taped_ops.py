"""Keras's convolutions as a streamed tile runs them under the gradient tape: TensorFlow's
op (tf.nn.conv2d on a padded copy, tf.nn.depthwise_conv2d with explicit padding) against
the package's op as the stream runs it there (explicit padding, the padded window's bytes
as its workspace limit, keep_memory=False), forward and both gradients, per kernel size.
The sizes from which the package's is faster are `stream._windowed.PACKAGE_UNDER_TAPE`.

  python -m benchmarks.cpu.taped_ops [--size 256] [--kernels 3 5 7 9 15 31] [--repeats 3]

Best of `--repeats` after one warm-up call each; a TensorFlow case whose warm-up takes
longer than `--budget` seconds is not repeated.
"""

import argparse
import time


def _best(run, repeats, budget):
  start = time.perf_counter()
  run()
  best = time.perf_counter() - start
  if best > budget:
    return best
  for _ in range(repeats):
    start = time.perf_counter()
    run()
    best = min(best, time.perf_counter() - start)
  return best


def _step(tf, call, x, w, pads):
  """A forward pass of `call` and both gradients, under a tape."""

  def run():
    with tf.GradientTape() as tape:
      tape.watch([x, w])
      y = call(x, w, pads)
    return tape.gradient(y, [x, w])

  return run


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--size", type=int, default=256)
  parser.add_argument("--kernels", type=int, nargs="+", default=[3, 5, 7, 9, 15, 31])
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--budget", type=float, default=20.0)
  args = parser.parse_args(argv)

  import numpy as np
  import tensorflow as tf

  from tf_largeconv import ops
  from tf_largeconv.stream import _windowed

  rng = np.random.default_rng(0)
  families = {
    # op name: (channels, TensorFlow's call as the tape runs it)
    "conv2d": (32, lambda x, w, p: tf.nn.conv2d(tf.pad(x, p), w, 1, "VALID")),
    "depthwise_conv2d": (64, lambda x, w, p: tf.nn.depthwise_conv2d(x, w, [1] * 4, p)),
  }
  for name, (channels, tf_call) in families.items():
    for k in args.kernels:
      x = tf.constant(rng.standard_normal((1, args.size, args.size, channels), np.float32))
      out = channels if name == "conv2d" else 1
      w = tf.constant(rng.standard_normal((k, k, channels, out), np.float32))
      pads = [[0, 0], [k // 2, k - 1 - k // 2], [k // 2, k - 1 - k // 2], [0, 0]]
      package = getattr(ops, name)
      lean = dict(
        workspace_limit=_windowed.padded_bytes(x.shape, pads, x.dtype.size), keep_memory=False
      )

      def package_call(x, w, p, op=package, lean=lean):
        return op(x, w, [1] * 4, p, **lean)

      times = {
        "tensorflow": _best(_step(tf, tf_call, x, w, pads), args.repeats, args.budget),
        "package": _best(_step(tf, package_call, x, w, pads), args.repeats, args.budget),
      }
      ratio = times["tensorflow"] / times["package"]
      used = "package" if k >= _windowed.PACKAGE_UNDER_TAPE[name] else "tensorflow"
      print(
        f"{name} {k}x{k}, {channels} channels, {args.size}^2: TensorFlow "
        f"{times['tensorflow']:.3f} s, package {times['package']:.3f} s ({ratio:.2f}x); "
        f"the stream uses {used}",
        flush=True,
      )


if __name__ == "__main__":
  main()
