"""Writes the saved layers that tests/test_saved_compat.py loads as saved before the Keras 3
and tf_keras layers shared one base per family and took `algorithm` and `workspace_limit`
as keyword-only arguments (the package at commit 84d9a9c).

Every layer kind of both flavours, with settings other than the defaults (algorithm,
workspace_limit, strides, padding), as:
- keras3.keras, with keras3_io.npz (its inputs, then its outputs);
- tf_keras.keras, tf_keras.h5 and tf_keras_savedmodel/, with tf_keras_io.npz;
- configs.json: each layer's get_config(), by flavour and class name.

Rerun only to add a case, and only with a package from before that change:
`python tests/data/prekeyword/make.py [output folder]`.
"""

import json
import os
import sys

import numpy as np

import tf_largeconv  # noqa: F401  (registers the ops and layers)

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))


def layers(keras, large, block_size):
  """[(layer, input shape without the batch)] of every kind, for `keras` (Keras 3 or
  tf_keras) and its layers `large` (tf_largeconv.keras or tf_largeconv.tf_keras); the
  FoldedBlock's block takes inputs of `block_size` (height, width)."""
  block_in = keras.Input((*block_size, 2))
  block = keras.Model(block_in, keras.layers.Conv2D(3, 3, padding="valid")(block_in))
  mib = 1 << 20
  return [
    (large.LargeConv1D(3, 7, strides=2, padding="causal", algorithm="fft"), (17, 2)),
    (large.LargeConv2D(3, 5, padding="same", algorithm="direct", workspace_limit=mib), (12, 10, 2)),
    (large.LargeDepthwiseConv2D(3, strides=2, depth_multiplier=2, algorithm="fft"), (12, 10, 2)),
    (large.LargeConv2DTranspose(2, 3, strides=2, padding="same", algorithm="direct"), (6, 5, 2)),
    (large.LargeConv3D(2, 3, padding="same", algorithm="fft", workspace_limit=mib), (6, 5, 4, 1)),
    (large.FoldedBlock(block, algorithm="direct", workspace_limit=mib), (9, 8, 2)),
  ]


def model_of(layers, input_fn, model_fn):
  """One model with an input per layer, each layer on its own input."""
  inputs = [input_fn(shape) for _, shape in layers]
  return model_fn(inputs, [layer(x) for (layer, _), x in zip(layers, inputs)])


def save_io(model, rng, name):
  xs = [rng.standard_normal((2,) + tuple(x.shape[1:])).astype(np.float32) for x in model.inputs]
  ys = [np.asarray(y) for y in model(xs)]
  np.savez(os.path.join(OUT, name), *xs, *ys)


def main():
  import keras
  import tf_keras

  from tf_largeconv import keras as lk
  from tf_largeconv import tf_keras as ltk

  rng = np.random.default_rng(0)
  keras.utils.set_random_seed(1)
  tf_keras.utils.set_random_seed(2)
  configs = {"keras": {}, "tf_keras": {}}

  kinds = layers(keras, lk, (None, None))
  m = model_of(kinds, keras.Input, keras.Model)
  m.save(os.path.join(OUT, "keras3.keras"))
  save_io(m, rng, "keras3_io.npz")
  for layer, _ in kinds:
    configs["keras"][type(layer).__name__] = keras.saving.serialize_keras_object(layer)

  kinds = layers(tf_keras, ltk, (9, 8))
  tm = model_of(kinds, tf_keras.Input, tf_keras.Model)
  tm.save(os.path.join(OUT, "tf_keras.keras"))
  tm.save(os.path.join(OUT, "tf_keras.h5"))
  tm.save(os.path.join(OUT, "tf_keras_savedmodel"), save_format="tf")
  save_io(tm, rng, "tf_keras_io.npz")
  for layer, _ in kinds:
    configs["tf_keras"][type(layer).__name__] = tf_keras.layers.serialize(layer)

  with open(os.path.join(OUT, "configs.json"), "w") as f:
    json.dump(configs, f, indent=1, sort_keys=True)
    f.write("\n")


if __name__ == "__main__":
  main()
