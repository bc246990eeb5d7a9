"""Trains a tiny RepLKNet-style network (a 31x31 depthwise block between 1x1 convolutions)
on synthetic data with tf_largeconv's Keras layers, printing the plan of the large-kernel
layer and the memory the run used.

  python examples/train_large_kernel.py [--steps N] [--jit-compile]

With --jit-compile the model trains under XLA (Keras jit_compile=True): the large-kernel
layer then runs tf_largeconv's portable path (stock TF ops), which XLA compiles with the
rest of the model.
"""

import argparse
import time

import keras
import numpy as np

import tf_largeconv as lc
from tf_largeconv.keras import LargeDepthwiseConv2D


def _proc_status_bytes(field):
  with open("/proc/self/status", encoding="ascii") as f:
    return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


def reset_peak_rss():
  """Resets the process's memory high-water mark to its current size (Linux); returns it in
  bytes."""
  with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
    f.write("5")
  return _proc_status_bytes("VmRSS")


def peak_rss():
  """The process's memory high-water mark (VmHWM) in bytes."""
  return _proc_status_bytes("VmHWM")


def build(size, channels):
  inp = keras.Input((size, size, 3))
  h = keras.layers.Conv2D(channels, 1, activation="relu")(inp)
  block = LargeDepthwiseConv2D(31, padding="same", name="large_kernel")(h)
  h = keras.layers.Add()([h, keras.layers.Conv2D(channels, 1)(block)])  # residual
  h = keras.layers.GlobalAveragePooling2D()(h)
  return keras.Model(inp, keras.layers.Dense(10)(h))


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=30)
  parser.add_argument("--size", type=int, default=56)
  parser.add_argument("--channels", type=int, default=32)
  parser.add_argument("--jit-compile", action="store_true", help="train under XLA")
  parser.add_argument("--epochs", type=int, default=2)
  args = parser.parse_args(argv)

  rng = np.random.default_rng(0)
  x = rng.random((args.steps * 8, args.size, args.size, 3), dtype=np.float32)
  labels = (x[:, ::8, ::8, 0].mean(axis=(1, 2)) * 10).astype(np.int64).clip(0, 9)
  model = build(args.size, args.channels)
  model.compile(
    keras.optimizers.Adam(1e-3),
    keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    jit_compile=args.jit_compile,
  )
  print("Plan of the 31x31 depthwise layer for a batch of 8:")
  print(lc.plan((8, args.size, args.size, args.channels), (31, 31, 1, args.channels), 1, "SAME"))
  base = reset_peak_rss()
  times = []
  timer = keras.callbacks.LambdaCallback(
    on_epoch_begin=lambda epoch, logs: times.append(time.perf_counter()),
    on_epoch_end=lambda epoch, logs: times.append(time.perf_counter() - times.pop()),
  )
  hist = model.fit(
    x, labels, batch_size=8, epochs=args.epochs, verbose=0, callbacks=[timer]
  ).history["loss"]
  print(f"jit_compile: {model.jit_compile}")
  print(f"loss per epoch: {', '.join(f'{v:.3f}' for v in hist)}")
  # The first epoch includes tracing (and, under XLA, compiling); the later ones do not.
  print(f"seconds per epoch: {', '.join(f'{t:.2f}' for t in times)}")
  print(f"peak process memory above the start of training: {(peak_rss() - base) / 2**20:.1f} MiB")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
