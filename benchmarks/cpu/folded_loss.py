"""What TensorFlow's constant folding of the loss gradient costs a traced training step:
the 135x135 LargeConv2D seed step of benchmarks.cpu.memory, its first call traced with a
static batch (the loss gradient's broadcast is folded into a constant) and with an unknown
batch (nothing is folded), each in a fresh process; RssAnon growth as in
benchmarks.cpu.memory. The difference over the constant's bytes is the copies the folding
leaves (tf_largeconv.memory._simulate.FOLDED_COPIES is that figure less the held one).

  python -m benchmarks.cpu.folded_loss [--batches 1 2 4 8]
"""

import argparse
import json

from benchmarks import measure

MiB = 1 << 20


def _child(batch, static):
  import keras
  import numpy as np
  import tensorflow as tf

  from benchmarks.cpu.memory import sampled_growth
  from benchmarks.cpu.memory import seed

  model = seed(keras, True)
  shape = (batch, *model.inputs[0].shape[1:])
  out_shape = (batch, *model.outputs[0].shape[1:])
  x, y = tf.ones(shape), tf.ones(out_shape)
  opt = keras.optimizers.Adam()
  opt.build(model.trainable_variables)

  @tf.function
  def train(x, y):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
    weights = model.trainable_variables
    opt.apply_gradients(zip(tape.gradient(loss, weights), weights))

  if static:
    step = train.get_concrete_function(x, y)
  else:
    specs = [tf.TensorSpec([None, *s[1:]]) for s in (shape, out_shape)]
    step = train.get_concrete_function(*specs)
  _, grown = sampled_growth(lambda: step(x, y))
  print(json.dumps(dict(grown=grown, constant=int(np.prod(out_shape)) * 4)))


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batches", type=int, nargs="*", default=[1, 2, 4, 8])
  parser.add_argument("--child", type=int, nargs=2, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    return _child(*args.child)
  print(f"{'batch':>6}{'static':>12}{'unknown':>12}{'constant':>12}{'copies':>8}")
  for b in args.batches:
    got = [
      measure.run_child(["-m", "benchmarks.cpu.folded_loss", "--child", str(b), str(s)], 600)
      for s in (1, 0)
    ]
    if any("error" in g for g in got):
      print(f"{b:>6}  {got}")
      continue
    static, unknown = got[0]["grown"], got[1]["grown"]
    const = got[0]["constant"]
    print(
      f"{b:>6}{static / MiB:>8.1f} MiB{unknown / MiB:>8.1f} MiB{const / MiB:>8.2f} MiB"
      f"{(static - unknown) / const:>8.2f}"
    )
  return 0


if __name__ == "__main__":
  main()
