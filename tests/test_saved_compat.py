"""Models saved by an earlier layout of the package load and compute as they did.

tests/data/premove/ holds a .keras file of every Keras 3 layer kind, a tf_keras .keras file
and a SavedModel of every public op (a filter gradient included), written by the package
before its modules moved into subpackages (tests/data/premove/make.py), with the inputs and
the outputs they gave then. Loading resolves the layers by their registered names and the
ops by their op names, neither of which may change with a move.
"""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_largeconv  # noqa: F401  (registers the ops and layers)

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "premove")


def _close(got, want, name):
  """Equal to the saved output up to float32 rounding of a possibly other algorithm."""
  got = np.asarray(got)
  assert got.shape == want.shape, name
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max(), err_msg=name)


def _arrays(name):
  with np.load(os.path.join(DATA, name)) as f:
    return {k: f[k] for k in f.files}


def test_keras3_file_loads_and_matches():
  m = keras.saving.load_model(os.path.join(DATA, "keras3.keras"))
  kinds = sorted(
    type(layer).__name__ for layer in m.layers if type(layer).__module__.startswith("tf_largeconv")
  )
  assert kinds == [
    "FoldedBlock",
    "LargeConv1D",
    "LargeConv2D",
    "LargeConv2DTranspose",
    "LargeConv3D",
    "LargeDepthwiseConv2D",
  ]
  io = _arrays("keras3_io.npz")
  n = len(m.inputs)
  xs = [io[f"arr_{i}"] for i in range(n)]
  for i, y in enumerate(m(xs)):
    _close(y, io[f"arr_{n + i}"], m.outputs[i].name)


def test_tf_keras_file_loads_and_matches():
  tf_keras = pytest.importorskip("tf_keras")
  from tf_largeconv import tf_keras as ltk  # noqa: F401  (registers the tf_keras layers)

  m = tf_keras.models.load_model(os.path.join(DATA, "tf_keras.keras"))
  assert [type(layer).__name__ for layer in m.layers[1:]] == ["LargeConv2D", "LargeDepthwiseConv2D"]
  io = _arrays("tf_keras_io.npz")
  _close(m(io["arr_0"]), io["arr_1"], "tf_keras")


def test_ops_savedmodel_loads_and_matches():
  loaded = tf.saved_model.load(os.path.join(DATA, "ops_savedmodel"))
  io = _arrays("ops_io.npz")
  out = loaded(tf.constant(io.pop("x")))
  assert sorted(out) == sorted(io)
  for k, want in io.items():
    _close(out[k], want, k)
