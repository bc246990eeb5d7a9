"""tf_keras (Keras 2) models, streamed as their Keras 3 twins: the model is saved in the HDF5
format both Keras versions read and loaded back by Keras 3, with its weights, so every
Keras layer of the streamed set streams as it does in Keras 3. Needs h5py, as tf_keras's
HDF5 saving does. tf_largeconv's tf_keras layers are not rebuilt (their configs carry
Keras 2 keys the Keras 3 layers refuse): the error says so."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import keras


def is_tf_keras(model: Any) -> bool:
  """Whether `model` is a tf_keras model (found without importing tf_keras)."""
  return any(c.__module__.split(".")[0] == "tf_keras" for c in type(model).__mro__)


# Keys of tf_keras layer configs that the Keras 3 layer of the same name does not take, with
# the value that means the Keras 3 layer's behaviour (anything else is refused).
KERAS2_ONLY = {"DepthwiseConv2D": {"groups": 1}, "DepthwiseConv1D": {"groups": 1}}


def _lenient(name: str) -> Any:
  """A loader of the Keras 3 layer `name` from a tf_keras config."""
  base = getattr(keras.layers, name)
  extra = KERAS2_ONLY[name]

  class Loader(base):  # type: ignore[misc,valid-type]
    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Any:
      config = dict(config)
      for key, value in extra.items():
        if config.pop(key, value) != value:
          raise ValueError(
            f"layer '{config.get('name')}': {key}={config[key]!r} has no Keras 3 form"
          )
      return base.from_config(config)

  return Loader


def load_h5(path: str) -> Any:
  """The Keras 3 model in the HDF5 file at `path`, saved by Keras 3 or by tf_keras."""
  loaders = {name: _lenient(name) for name in KERAS2_ONLY}
  return keras.saving.load_model(path, compile=False, custom_objects=loaders)


def keras3(model: Any) -> Any:
  """`model` itself, or for a tf_keras model its Keras 3 twin with a copy of its weights."""
  if not is_tf_keras(model):
    return model
  with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "model.h5")
    try:
      model.save(path, save_format="h5")
      return load_h5(path)
    except Exception as e:  # noqa: BLE001 - any layer Keras 3 cannot rebuild
      raise ValueError(
        f"model '{model.name}' is a tf_keras model that Keras 3 cannot rebuild from its "
        f"HDF5 form ({type(e).__name__}: {e}); tf_largeconv.stream streams tf_keras models "
        "of Keras's own layers"
      ) from e
