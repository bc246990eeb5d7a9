"""Models saved by an earlier layout of the package load and compute as they did.

tests/data/premove/ holds a .keras file of every Keras 3 layer kind, a tf_keras .keras file
and a SavedModel of every public op (a filter gradient included), written by the package
before its modules moved into subpackages (tests/data/premove/make.py), with the inputs and
the outputs they gave then. Loading resolves the layers by their registered names and the
ops by their op names, neither of which may change with a move.

tests/data/prekeyword/ holds every layer kind of both flavours with settings other than the
defaults, saved before the layers shared one base per family and took `algorithm` and
`workspace_limit` as keyword-only arguments (tests/data/prekeyword/make.py): a Keras 3
.keras file, a tf_keras .keras, .h5 and SavedModel, and each layer's serialised config.
They load as the same classes with the same settings and compute what they did.
"""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_largeconv  # noqa: F401  (registers the ops and layers)
from tf_largeconv._options import OPTIONS

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "premove")
PREKEYWORD = os.path.join(os.path.dirname(DATA), "prekeyword")
KINDS = "FoldedBlock LargeConv1D LargeConv2D LargeConv2DTranspose LargeConv3D LargeDepthwiseConv2D"
KINDS = KINDS.split()


def _close(got, want, name):
  """Equal to the saved output up to float32 rounding of a possibly other algorithm."""
  got = np.asarray(got)
  assert got.shape == want.shape, name
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max(), err_msg=name)


def _arrays(name, folder=DATA):
  with np.load(os.path.join(folder, name)) as f:
    return {k: f[k] for k in f.files}


def test_keras3_file_loads_and_matches():
  m = keras.saving.load_model(os.path.join(DATA, "keras3.keras"))
  kinds = sorted(
    type(layer).__name__ for layer in m.layers if type(layer).__module__.startswith("tf_largeconv")
  )
  assert kinds == KINDS
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


def _saved_configs(flavour):
  """{class name: serialised layer} as saved before the change (see the module docstring)."""
  with open(os.path.join(PREKEYWORD, "configs.json")) as f:
    return json.load(f)[flavour]


def _check_prekeyword_model(m, flavour):
  """m (loaded from a prekeyword file) holds every kind, each with its saved settings, and
  computes the saved outputs."""
  saved = _saved_configs(flavour)
  large = [layer for layer in m.layers if type(layer).__module__.startswith("tf_largeconv")]
  assert sorted(type(layer).__name__ for layer in large) == KINDS
  for layer in large:
    config = saved[type(layer).__name__]["config"]
    assert (layer.algorithm, layer.workspace_limit) == (
      config["algorithm"],
      config["workspace_limit"],
    ), layer.name
    assert config["algorithm"] != "auto", layer.name  # the files hold settings, not defaults
  io = _arrays({"keras": "keras3_io.npz", "tf_keras": "tf_keras_io.npz"}[flavour], PREKEYWORD)
  n = len(m.inputs)
  xs = [io[f"arr_{i}"] for i in range(n)]
  for i, y in enumerate(m(xs)):
    _close(y, io[f"arr_{n + i}"], f"{flavour} output {i}")


def test_prekeyword_keras3_file_loads_and_matches():
  m = keras.saving.load_model(os.path.join(PREKEYWORD, "keras3.keras"))
  _check_prekeyword_model(m, "keras")


@pytest.mark.parametrize("name", ["tf_keras.keras", "tf_keras.h5", "tf_keras_savedmodel"])
def test_prekeyword_tf_keras_files_load_and_match(name):
  tf_keras = pytest.importorskip("tf_keras")
  from tf_largeconv import tf_keras as ltk  # noqa: F401  (registers the tf_keras layers)

  m = tf_keras.models.load_model(os.path.join(PREKEYWORD, name))
  _check_prekeyword_model(m, "tf_keras")


@pytest.mark.parametrize("flavour", ["keras", "tf_keras"])
def test_prekeyword_configs_round_trip(flavour):
  """Each saved config makes the same registered class with the same settings, whose
  get_config is the saved one, through from_config and through deserialisation."""
  if flavour == "tf_keras":
    tf_keras = pytest.importorskip("tf_keras")
    from tf_largeconv import tf_keras as module

    deserialize, registered = tf_keras.layers.deserialize, tf_keras.utils.get_registered_name
  else:
    from tf_largeconv import keras as module

    deserialize = keras.saving.deserialize_keras_object
    registered = keras.saving.get_registered_name
  for name, saved in _saved_configs(flavour).items():
    cls = getattr(module, name)
    assert registered(cls) == f"tf_largeconv>{name}" == saved["registered_name"]
    config = saved["config"]
    for layer in (cls.from_config(dict(config)), deserialize(json.loads(json.dumps(saved)))):
      assert type(layer) is cls, name
      assert (layer.algorithm, layer.workspace_limit) == (
        config["algorithm"],
        config["workspace_limit"],
      ), name
      # Tuples as lists; an option newer than the file at its default.
      want = dict({o.name: o.default for o in OPTIONS}, **config)
      assert json.loads(json.dumps(layer.get_config())) == want, name
