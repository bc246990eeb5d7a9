"""Writes the saved models that tests/test_saved_compat.py loads: a .keras file per layer
flavour and a SavedModel of the ops, with their inputs and outputs.

The files in this folder were written by the package as it was before its modules moved
into subpackages (commit 0335734), so the test shows that models saved by an earlier
release still load. Rerun only to add a case: `python tests/data/premove/make.py`.
"""

import os
import sys

import numpy as np
import tensorflow as tf

import tf_largeconv as lc

OUT = os.path.dirname(os.path.abspath(__file__))


def keras3_model():
  import keras

  from tf_largeconv import keras as lk

  keras.utils.set_random_seed(1)
  x2 = keras.Input((12, 10, 2), name="x2")
  y = lk.LargeConv2D(3, 5, padding="same")(x2)
  y = lk.LargeDepthwiseConv2D(3, padding="same", depth_multiplier=2)(y)
  y = lk.LargeConv2DTranspose(2, 3, strides=2, padding="same")(y)
  block_in = keras.Input((None, None, 2))
  block = keras.Model(block_in, keras.layers.Conv2D(2, 3, padding="same")(block_in))
  y = lk.FoldedBlock(block)(y)
  x1 = keras.Input((16, 2), name="x1")
  y1 = lk.LargeConv1D(3, 7, padding="causal", dilation_rate=2)(x1)
  x3 = keras.Input((6, 6, 6, 1), name="x3")
  y3 = lk.LargeConv3D(2, 3, padding="valid", groups=1)(x3)
  return keras.Model([x2, x1, x3], [y, y1, y3])


def tf_keras_model():
  import tf_keras

  from tf_largeconv import tf_keras as ltk

  tf_keras.utils.set_random_seed(2)
  x = tf_keras.Input((12, 10, 2))
  y = ltk.LargeConv2D(3, 5, padding="same")(x)
  y = ltk.LargeDepthwiseConv2D(3, padding="valid")(y)
  return tf_keras.Model(x, y)


class Ops(tf.Module):
  """Every public op in one traced function, as a SavedModel holds them."""

  def __init__(self, rng):
    super().__init__()
    self.w2 = tf.Variable(rng.standard_normal((9, 9, 2, 3)).astype(np.float32))
    self.wd = tf.Variable(rng.standard_normal((5, 5, 2, 2)).astype(np.float32))
    self.w1 = tf.Variable(rng.standard_normal((11, 2, 3)).astype(np.float32))
    self.w3 = tf.Variable(rng.standard_normal((3, 3, 3, 2, 2)).astype(np.float32))

  @tf.function(input_signature=[tf.TensorSpec([2, 20, 18, 2], tf.float32)])
  def __call__(self, x):
    with tf.GradientTape() as tape:
      y = lc.conv2d(x, self.w2, 1, "SAME")
      loss = tf.reduce_sum(y * y)
    g = tape.gradient(loss, self.w2)
    d = lc.depthwise_conv2d(x, self.wd, [1, 1, 1, 1], "VALID")
    t = lc.conv2d_transpose(y, self.w2, [2, 20, 18, 2], 1, "SAME")
    c1 = lc.conv1d(x[:, 0], self.w1, 1, "SAME")
    c3 = lc.conv3d(
      tf.reshape(x[:, :16, :16, :], [2, 8, 8, 4, 2]), self.w3, [1, 1, 1, 1, 1], "VALID"
    )
    return {
      "conv2d": y,
      "filter_grad": g,
      "depthwise": d,
      "transpose": t,
      "conv1d": c1,
      "conv3d": c3,
    }


def main():
  rng = np.random.default_rng(0)
  m = keras3_model()
  xs = [rng.standard_normal((2,) + tuple(i.shape[1:])).astype(np.float32) for i in m.inputs]
  m.save(os.path.join(OUT, "keras3.keras"))
  np.savez(os.path.join(OUT, "keras3_io.npz"), *xs, *[y.numpy() for y in m(xs)])

  if "--no-tf-keras" not in sys.argv:
    tm = tf_keras_model()
    x = rng.standard_normal((2, 12, 10, 2)).astype(np.float32)
    tm.save(os.path.join(OUT, "tf_keras.keras"))
    np.savez(os.path.join(OUT, "tf_keras_io.npz"), x, tm(x).numpy())

  ops = Ops(rng)
  x = rng.standard_normal((2, 20, 18, 2)).astype(np.float32)
  tf.saved_model.save(ops, os.path.join(OUT, "ops_savedmodel"))
  out = {k: v.numpy() for k, v in ops(x).items()}
  np.savez(os.path.join(OUT, "ops_io.npz"), x=x, **out)


if __name__ == "__main__":
  main()
