"""Trains a classifier on whole synthetic "slides" with tf_largeconv.stream.StreamingModel:
the convolutional trunk (3x3 convolutions, a stride-2 stage and a 31x31 depthwise block)
runs tile by tile, forward and backward, so a training step holds one tile's activations,
not the whole image's.

  python examples/train_streamed.py [--size 2048] [--images 8] [--epochs 2]
      [--memory-limit-mib 256]

Each image is noise with bright disks; its label is whether it has more than three. The
script prints the plan of a training step (tiles, halos, estimated peak per tile), the loss
and accuracy per epoch, and the process's peak memory.
"""

import argparse
import time

import keras
import numpy as np
import tensorflow as tf

from tf_largeconv import stream
from tf_largeconv.keras import LargeDepthwiseConv2D

L = keras.layers


def peak_rss():
  """The process's memory high-water mark (VmHWM, Linux) in bytes."""
  with open("/proc/self/status", encoding="ascii") as f:
    return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def slides(count, size, seed=0):
  """`count` noisy size x size x 3 images with 1 to 6 bright disks; label: more than 3."""
  rng = np.random.default_rng(seed)
  yy, xx = np.mgrid[:size, :size]
  images, labels = [], []
  for _ in range(count):
    image = rng.normal(0.0, 0.3, (size, size, 3)).astype(np.float32)
    disks = int(rng.integers(1, 7))
    for _ in range(disks):
      cy, cx = rng.integers(0, size, 2)
      r = size // 40
      image[(yy - cy) ** 2 + (xx - cx) ** 2 < r * r] += 1.0
    images.append(image)
    labels.append(int(disks > 3))
  return np.stack(images), np.array(labels)


def build():
  inp = keras.Input((None, None, 3))
  x = L.Conv2D(16, 3, padding="same", activation="relu")(inp)
  x = L.Conv2D(16, 3, strides=2, padding="same", activation="relu")(x)
  y = LargeDepthwiseConv2D(31, padding="same")(x)
  y = L.Conv2D(16, 1, activation="relu")(y)
  x = L.Add()([x, y])
  x = L.MaxPooling2D(2)(x)
  x = L.Conv2D(16, 3, padding="same", activation="relu")(x)
  trunk = keras.Model(inp, x, name="trunk")
  features = keras.Input((None, None, 16))
  pooled = L.GlobalMaxPooling2D()(features)
  head = keras.Model(features, L.Dense(2)(L.Dropout(0.2)(pooled)), name="head")
  return trunk, head


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--size", type=int, default=2048, help="image side in pixels")
  parser.add_argument("--images", type=int, default=8)
  parser.add_argument("--epochs", type=int, default=2)
  parser.add_argument("--memory-limit-mib", type=float, default=256)
  args = parser.parse_args(argv)
  keras.utils.set_random_seed(0)
  images, labels = slides(args.images, args.size)
  data = tf.data.Dataset.from_tensor_slices((images, labels)).batch(1)
  trunk, head = build()
  model = stream.StreamingModel(trunk, head, memory_limit=int(args.memory_limit_mib * 2**20))
  model.compile(
    optimizer=keras.optimizers.Adam(1e-3),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=["accuracy"],
  )
  print(model.plan((1, args.size, args.size, 3)))
  start = time.perf_counter()
  history = model.fit(data, epochs=args.epochs, shuffle=False, verbose=0)
  for epoch, (loss, acc) in enumerate(zip(history.history["loss"], history.history["accuracy"])):
    print(f"epoch {epoch + 1}: loss {loss:.4f}, accuracy {acc:.2f}")
  print(
    f"{args.epochs * args.images} steps on {args.size}^2 images in "
    f"{time.perf_counter() - start:.1f} s; peak memory {peak_rss() / 2**30:.2f} GiB"
  )
  return history


if __name__ == "__main__":
  main()
