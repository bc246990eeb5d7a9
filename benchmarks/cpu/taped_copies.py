"""A dense StreamingModel training step with Keras convolutions run, under the tape, on a
padded copy of each window (what the package does) against explicit padding (TensorFlow's
CPU gradient then leaves oneDNN): the best of `--repeats` alternating steps each, in one
process.

  python -m benchmarks.cpu.taped_copies [--network unet] [--size 1024] [--tile 256]
"""

import argparse
import contextlib
import time

from benchmarks.cpu import stream_memory


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--network", default="unet", choices=list(stream_memory.NETWORKS))
  parser.add_argument("--size", type=int, default=1024)
  parser.add_argument("--tile", type=int, default=256)
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args(argv)

  import keras
  import numpy as np

  from tf_largeconv import stream
  from tf_largeconv.stream import _windowed

  trunk = stream_memory.NETWORKS[args.network](keras)
  for layer in trunk.layers:
    if isinstance(layer, keras.layers.BatchNormalization):
      layer.trainable = False
  model = stream.StreamingModel(trunk, head=None, tile=args.tile)
  model.compile(optimizer="sgd", loss="mse")
  x = np.random.default_rng(0).standard_normal((1, args.size, args.size, 3), np.float32)
  y = np.zeros(trunk.compute_output_shape(x.shape), np.float32)
  copies = _windowed.taped
  times: dict[str, list[float]] = {"copy": [], "explicit": []}
  try:
    for r in range(args.repeats + 1):
      for mode in times:
        _windowed.taped = copies if mode == "copy" else contextlib.nullcontext
        start = time.perf_counter()
        model.train_on_batch(x, y)
        if r:  # the first round warms both paths
          times[mode].append(time.perf_counter() - start)
  finally:
    _windowed.taped = copies
  best = {mode: min(t) for mode, t in times.items()}
  print(
    f"{args.network} {args.size}^2, tile {args.tile}: padded copies {best['copy']:.2f} s, "
    f"explicit padding {best['explicit']:.2f} s ({best['explicit'] / best['copy']:.2f}x)"
  )


if __name__ == "__main__":
  main()
