"""tf_largeconv.memory.report against measured memory: for each case, the predicted peak of
one traced inference call or training step beside the measured growth of anonymous resident
memory (RssAnon, sampled every 2 ms by a thread) over the warm process before the call,
each case and mode in a fresh process.

  python -m benchmarks.cpu.memory [--cases NAME ...] [--frame H W] [--out DIR]

The warm process has imported TensorFlow, built the model and its optimizer's slots, made
the input and traced the step (`get_concrete_function`); the first call then runs under the
sampler. Writes DIR/memory.json and DIR/memory.png (predicted against measured).
"""

import argparse
import json
import os
import threading
import time

from benchmarks import measure

MiB = 1 << 20


def rss_anon():
  with open("/proc/self/status", encoding="ascii") as f:
    for line in f:
      if line.startswith("RssAnon:"):
        return int(line.split()[1]) * 1024
  raise RuntimeError("RssAnon not in /proc/self/status")


def sampled_growth(fn):
  """Runs fn() with a thread sampling RssAnon every 2 ms; returns (fn's result, the peak's
  growth over the memory before the call, in bytes)."""
  base = rss_anon()
  peak = [base]
  done = threading.Event()

  def sample():
    while not done.is_set():
      peak[0] = max(peak[0], rss_anon())
      time.sleep(0.002)

  thread = threading.Thread(target=sample, daemon=True)
  thread.start()
  try:
    result = fn()
  finally:
    done.set()
    thread.join()
  return result, max(peak[0], rss_anon()) - base


def _conv_block(x, keras, filters, kernel=3):
  return keras.layers.Conv2D(filters, kernel, padding="same", activation="relu")(x)


def unet(keras, frame, channels=64):
  """The video U-Net: 2 levels, `channels` then twice as many, skips by concatenation."""
  inp = keras.Input((*frame, 6))
  a = _conv_block(_conv_block(inp, keras, channels), keras, channels)
  b = keras.layers.MaxPooling2D()(a)
  b = _conv_block(_conv_block(b, keras, 2 * channels), keras, 2 * channels)
  u = keras.layers.UpSampling2D()(b)
  c = keras.layers.Concatenate()([u, a])
  c = _conv_block(_conv_block(c, keras, channels), keras, channels)
  return keras.Model(inp, keras.layers.Conv2D(3, 1)(c))


def resnet(keras, size=(256, 256), channels=64, blocks=3):
  inp = keras.Input((*size, 3))
  x = keras.layers.Conv2D(channels, 7, padding="same")(inp)
  for _ in range(blocks):
    y = keras.layers.Conv2D(channels, 3, padding="same")(x)
    y = keras.layers.BatchNormalization()(y)
    y = keras.layers.ReLU()(y)
    y = keras.layers.Conv2D(channels, 3, padding="same")(y)
    y = keras.layers.BatchNormalization()(y)
    x = keras.layers.ReLU()(keras.layers.Add()([x, y]))
  return keras.Model(inp, keras.layers.Conv2D(3, 1)(x))


def replknet(keras, size=(56, 56), channels=128, blocks=2):
  inp = keras.Input((*size, channels))
  x = inp
  for _ in range(blocks):
    y = keras.layers.DepthwiseConv2D(31, padding="same")(x)
    y = keras.layers.BatchNormalization()(y)
    y = keras.layers.Conv2D(channels, 1, activation="relu")(y)
    x = keras.layers.Add()([x, y])
  return keras.Model(inp, x)


def seed(keras, large):
  from tf_largeconv.keras import LargeConv2D

  inp = keras.Input((321, 481, 1))
  layer = LargeConv2D if large else keras.layers.Conv2D
  return keras.Model(inp, layer(3, 135, padding="valid")(inp))


# name: (builder(keras, frame), batch, mode): "infer" a traced call, "train" a traced
# training step, "eager" model(x).
CASES = {
  "unet_b1_train": (lambda k, f: unet(k, f), 1, "train"),
  "unet_b2_train": (lambda k, f: unet(k, f), 2, "train"),
  "unet_b1_infer": (lambda k, f: unet(k, f), 1, "infer"),
  "resnet_b4_train": (lambda k, f: resnet(k), 4, "train"),
  "resnet_b4_eager": (lambda k, f: resnet(k), 4, "eager"),
  "unet_b1_eager": (lambda k, f: unet(k, f), 1, "eager"),
  "resnet_b4_infer": (lambda k, f: resnet(k), 4, "infer"),
  "replknet_b8_train": (lambda k, f: replknet(k), 8, "train"),
  "seed_conv2d_b2_infer": (lambda k, f: seed(k, False), 2, "infer"),
  "seed_largeconv2d_b2_infer": (lambda k, f: seed(k, True), 2, "infer"),
  "seed_largeconv2d_b2_train": (lambda k, f: seed(k, True), 2, "train"),
}


def run_case(model, batch, mode):
  """(predicted bytes, measured bytes) of one traced call of `model` in this process."""
  import keras
  import numpy as np
  import tensorflow as tf

  from tf_largeconv import memory

  shape = (batch, *model.inputs[0].shape[1:])
  opt = keras.optimizers.Adam()
  rep = memory.report(model, shape, training=mode == "train", optimizer=opt)
  x = tf.constant(np.ones(shape, np.float32))
  if mode == "infer":
    step = tf.function(lambda x: model(x, training=False)).get_concrete_function(x)
    _, grown = sampled_growth(lambda: step(x))
    return rep, rep.inference_peak, grown
  if mode == "eager":
    _, grown = sampled_growth(lambda: model(x, training=False))
    return rep, rep.eager_inference_peak, grown
  y = tf.constant(np.ones((batch, *model.outputs[0].shape[1:]), np.float32))
  opt.build(model.trainable_variables)

  @tf.function
  def train(x, y):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
    opt.apply_gradients(
      zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
    )
    return loss

  step = train.get_concrete_function(x, y)
  _, grown = sampled_growth(lambda: step(x, y))
  return rep, rep.training_peak, grown


def _child(name, frame):
  import keras

  build, batch, mode = CASES[name]
  rep, predicted, measured = run_case(build(keras, frame), batch, mode)
  print(str(rep))
  print(json.dumps(dict(case=name, predicted=predicted, measured=measured)))


def plot(rows, path, what="memory.report"):
  """Predicted against measured, one point per row (case, predicted, measured), on log
  axes with the 20% band."""
  plt = measure.pyplot()
  if plt is None:
    return
  fig, ax = plt.subplots(figsize=(5, 5))
  xs = [r["measured"] / MiB for r in rows]
  ys = [r["predicted"] / MiB for r in rows]
  ax.loglog(xs, ys, "o")
  for r, x, y in zip(rows, xs, ys):
    ax.annotate(r["case"], (x, y), fontsize=6)
  lo, hi = min(xs + ys) / 1.5, max(xs + ys) * 1.5
  ax.plot([lo, hi], [lo, hi], "k-", lw=0.5)
  ax.fill_between([lo, hi], [lo * 0.8, hi * 0.8], [lo * 1.2, hi * 1.2], alpha=0.15)
  ax.set_xlabel("measured growth (MiB)")
  ax.set_ylabel("predicted peak (MiB)")
  ax.set_title(f"{what}: predicted vs measured (band: 20%)")
  fig.tight_layout()
  fig.savefig(path)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
  parser.add_argument("--frame", type=int, nargs=2, default=(360, 640))
  parser.add_argument("--out", default=measure.RESULTS_DIR)
  parser.add_argument("--timeout", type=int, default=1800)
  parser.add_argument("--child", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    return _child(args.child, tuple(args.frame))
  rows = []
  print(f"{'case':<28}{'predicted':>14}{'measured':>14}{'error':>9}")
  for name in args.cases:
    argv_child = ["-m", "benchmarks.cpu.memory", "--child", name, "--frame", *map(str, args.frame)]
    r = measure.run_child(argv_child, args.timeout)
    if "error" in r:
      print(f"{name:<28}{r['error']}")
      continue
    r["error"] = r["predicted"] / r["measured"] - 1 if r["measured"] else None
    rows.append(r)
    print(
      f"{name:<28}{r['predicted'] / MiB:>10.1f} MiB{r['measured'] / MiB:>10.1f} MiB"
      f"{100 * r['error']:>8.1f}%"
    )
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "memory.json"), "w") as f:
    json.dump(dict(frame=list(args.frame), rows=rows), f, indent=1)
  plot(rows, os.path.join(args.out, "memory.png"))
  return 0


if __name__ == "__main__":
  main()
