"""The Keras 2 (tf_keras, `TF_USE_LEGACY_KERAS=1`) twin of `tf_largeconv.keras`.

A Keras 3 layer inside a tf_keras model silently loses its weights, so tf_keras models need
layers built on tf_keras itself. Importing this module requires the tf_keras package.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import tensorflow as tf
import tf_keras

from tf_largeconv import fold as _fold
from tf_largeconv._options import takes_options
from tf_largeconv.keras import _settings as _layer_settings
from tf_largeconv.keras import export as _export

_register = tf_keras.utils.register_keras_serializable(package="tf_largeconv")


class _TfKeras:
  """The tf_keras flavour of the LargeConv layers. tf_keras runs grouped convolutions
  (groups > 1) through an XLA-compiled function (`_jit_compiled_convolution_op`: TF's CPU
  kernels have no groups), where the op would hand 'auto' back to TensorFlow's convolution
  and refuse 'direct' and 'fft'; the op computes groups itself, so the layers run it
  uncompiled."""

  def _jit_compiled_convolution_op(self: Any, inputs: tf.Tensor, kernel: tf.Tensor) -> tf.Tensor:
    return self.convolution_op(inputs, kernel)


@_register
class LargeConv1D(_TfKeras, _layer_settings.Conv1DBase, tf_keras.layers.Conv1D):
  """`tf_keras.layers.Conv1D` computed by `tf_largeconv.conv1d` (causal padding and groups
  included); its arguments, plus the package's options (keyword-only,
  as for `tf_largeconv.keras.LargeConv2D`)."""


@_register
class LargeConv2D(_TfKeras, _layer_settings.Conv2DBase, tf_keras.layers.Conv2D):
  """`tf_keras.layers.Conv2D` computed by `tf_largeconv.conv2d`; its arguments, plus the
  package's options (keyword-only: `algorithm`, `workspace_limit`; see `tf_largeconv.conv2d`)."""


@_register
class LargeDepthwiseConv2D(
  _TfKeras, _layer_settings.DepthwiseConv2DBase, tf_keras.layers.DepthwiseConv2D
):
  """`tf_keras.layers.DepthwiseConv2D` computed by `tf_largeconv.depthwise_conv2d`; its
  arguments, plus the package's options (keyword-only,
  as for `tf_largeconv.keras.LargeConv2D`)."""

  def call(self, inputs: tf.Tensor) -> tf.Tensor:
    return self._bias_and_activation(self.convolution_op(inputs, self.depthwise_kernel))


@_register
class LargeConv2DTranspose(
  _TfKeras, _layer_settings.Conv2DTransposeBase, tf_keras.layers.Conv2DTranspose
):
  """`tf_keras.layers.Conv2DTranspose` computed by `tf_largeconv.conv2d_transpose`
  (output_padding included); its arguments, plus the package's options (keyword-only,
  as for `tf_largeconv.keras.LargeConv2D`)."""


@_register
class LargeConv3D(_TfKeras, _layer_settings.Conv3DBase, tf_keras.layers.Conv3D):
  """`tf_keras.layers.Conv3D` computed by `tf_largeconv.conv3d`; its arguments, plus the
  package's options (keyword-only, as for `tf_largeconv.keras.LargeConv2D`)."""


_FLAVOUR = _fold.Flavour(
  input=tf_keras.Input, model=tf_keras.Model, conv=LargeConv2D, depthwise=LargeDepthwiseConv2D
)
FoldReport = _fold.FoldReport
FoldWarning = _fold.FoldWarning


@takes_options
def fold(
  block: tf_keras.Model,
  exact: bool = True,
  input_size: Sequence[int] | None = None,
  dtype: Any = None,
  *,
  name: str | None = None,
  **options: Any,
) -> LargeConv2D | LargeDepthwiseConv2D:
  """`tf_largeconv.keras.fold` for a tf_keras block; returns tf_keras Large layers."""
  return _fold.fold(block, _FLAVOUR, exact, input_size, dtype, name=name, **options)


@takes_options
def reparameterize(model: tf_keras.Model, **options: Any) -> tf_keras.Model:
  """`tf_largeconv.keras.reparameterize` for a tf_keras model."""
  return _fold.reparameterize(model, _FLAVOUR, **options)


def export_portable(
  model: tf_keras.Model,
  path: str | os.PathLike[str],
  input_signature: Sequence[tf.TensorSpec] | None = None,
) -> str:
  """`tf_largeconv.keras.export_portable` for a tf_keras model (see there): a SavedModel
  with no LargeConv op; `tf.saved_model.load(path).serve(x)` runs it."""
  return _export.export(model, path, input_signature=input_signature)


@_register
class FoldedBlock(_fold.FoldedBlockBase, tf_keras.layers.Layer):
  """`tf_largeconv.keras.FoldedBlock` for a tf_keras block (see there)."""

  _serialize_block = staticmethod(tf_keras.layers.serialize)
  _deserialize_block = staticmethod(tf_keras.layers.deserialize)
