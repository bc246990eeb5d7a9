"""A dense StreamingModel training step (segmentation: no head, a loss over every output
pixel) against the streamed forward pass over the same image, both under the same
`memory_limit`, in one process: the best of `--repeats` alternating rounds each.

  python -m benchmarks.cpu.dense_step [--networks unet depthwise resnet] [--size 512]
      [--memory-limit 256] [--repeats 3] [--budget 30] [--eager] [--json PATH]

A case that takes longer than `--budget` seconds is timed once after its warm-up. The step
streams the model's forward and backward pass tile by tile (its tiles are planned
for the training step, which holds more per pixel, so they are smaller than the forward's);
the forward is `StreamingModel.predict` on the same batch. The same step with
`trace_tiles=True` (each tile's step one traced function) is timed beside it. The untiled
model's step and forward (`train_on_batch`, `predict_on_batch` of a Keras model with the
same weights) are timed alongside, for what the network's own layers cost. With --eager,
also the untiled model's `GradientTape` step (mean squared error, SGD) and forward call run
eagerly, as the streamed step runs its layers, and the same step under `tf.function`.
"""

import argparse
import json
import time

from benchmarks.cpu import stream_memory


def _eager_runs(keras, plain, x, y):
  """The untiled model's step and forward pass called eagerly, and the step traced."""
  import tensorflow as tf

  optimizer = keras.optimizers.SGD()
  xt, yt = tf.constant(x), tf.constant(y)

  def step():
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(plain(xt) - yt))
    grads = tape.gradient(loss, plain.trainable_variables)
    optimizer.apply_gradients(zip(grads, plain.trainable_variables))

  return {"eager_step": step, "eager_forward": lambda: plain(xt), "traced_step": tf.function(step)}


def _case(keras, network, size, memory_limit, repeats, budget, eager=False):
  import numpy as np

  from tf_largeconv import stream

  trunk = stream_memory.NETWORKS[network](keras)
  for layer in trunk.layers:
    if isinstance(layer, keras.layers.BatchNormalization):
      layer.trainable = False
  model = stream.StreamingModel(trunk, head=None, memory_limit=memory_limit << 20)
  model.compile(optimizer="sgd", loss="mse")
  traced = stream.StreamingModel(
    trunk, head=None, memory_limit=memory_limit << 20, trace_tiles=True
  )
  traced.compile(optimizer="sgd", loss="mse")
  rng = np.random.default_rng(0)
  x = rng.standard_normal((1, size, size, 3), np.float32)
  y = rng.standard_normal(trunk.compute_output_shape(x.shape), np.float32)
  plain = keras.models.clone_model(trunk)  # the untiled model, the same weights
  plain.set_weights(trunk.get_weights())
  plain.compile(optimizer="sgd", loss="mse")
  runs = {
    "step": lambda: model.train_on_batch(x, y),
    "traced_tiles_step": lambda: traced.train_on_batch(x, y),
    "forward": lambda: model.predict_on_batch(x),
    "untiled_step": lambda: plain.train_on_batch(x, y),
    "untiled_forward": lambda: plain.predict_on_batch(x),
  }
  if eager:
    runs.update(_eager_runs(keras, plain, x, y))
  times: dict[str, list[float]] = {name: [] for name in runs}
  for r in range(repeats + 1):
    for name, run in runs.items():
      if r > 1 and times[name][0] > budget:
        continue  # a slow case: timed once after the warm-up
      start = time.perf_counter()
      run()
      if r:  # the first round warms every case
        times[name].append(time.perf_counter() - start)
  best = {name: min(t) for name, t in times.items()}
  extra = {
    f"untiled_{name}_s": best[name]
    for name in runs
    if name in ("eager_step", "eager_forward", "traced_step")
  }
  return {
    **extra,
    "network": network,
    "size": size,
    "memory_limit_mib": memory_limit,
    "step_s": best["step"],
    "forward_s": best["forward"],
    "ratio": best["step"] / best["forward"],
    "traced_tiles_step_s": best["traced_tiles_step"],
    "traced_tiles_ratio": best["traced_tiles_step"] / best["forward"],
    "untiled_step_s": best["untiled_step"],
    "untiled_forward_s": best["untiled_forward"],
    "step_tiles": model.plan(x.shape, training=True).tiles,
    "forward_tiles": model.plan(x.shape, training=False).tiles,
  }


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--networks", nargs="+", default=["unet", "depthwise", "resnet"])
  parser.add_argument("--size", type=int, default=512)
  parser.add_argument("--memory-limit", type=int, default=256, help="MiB")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument(
    "--budget",
    type=float,
    default=30.0,
    help="seconds: a case slower than this once is not repeated",
  )
  parser.add_argument(
    "--eager", action="store_true", help="also time the untiled model's step and forward eagerly"
  )
  parser.add_argument("--json", help="write the rows here")
  args = parser.parse_args(argv)

  import keras

  rows = []
  for network in args.networks:
    row = _case(keras, network, args.size, args.memory_limit, args.repeats, args.budget, args.eager)
    rows.append(row)
    print(
      f"{network} {args.size}^2, {args.memory_limit} MiB: step {row['step_s']:.2f} s "
      f"({row['step_tiles']} tiles), forward {row['forward_s']:.2f} s "
      f"({row['forward_tiles']} tiles): {row['ratio']:.2f}x; tiles traced "
      f"{row['traced_tiles_step_s']:.2f} s, {row['traced_tiles_ratio']:.2f}x; untiled step "
      f"{row['untiled_step_s']:.2f} s, forward {row['untiled_forward_s']:.2f} s",
      flush=True,
    )
    if args.eager:
      print(
        f"  untiled, eager: step {row['untiled_eager_step_s']:.3f} s, forward "
        f"{row['untiled_eager_forward_s']:.3f} s; the step traced "
        f"{row['untiled_traced_step_s']:.3f} s",
        flush=True,
      )
  if args.json:
    with open(args.json, "w") as f:
      json.dump(rows, f, indent=1)


if __name__ == "__main__":
  main()
