"""The Keras 2 (tf_keras, `TF_USE_LEGACY_KERAS=1`) twin of `tf_largeconv.keras`.

A Keras 3 layer inside a tf_keras model silently loses its weights, so tf_keras models need
layers built on tf_keras itself. Importing this module requires the tf_keras package.
"""

import tf_keras

from tf_largeconv import _layer_settings
from tf_largeconv import ops as _ops


@tf_keras.utils.register_keras_serializable(package="tf_largeconv")
class LargeConv2D(_layer_settings.LargeConvSettings, tf_keras.layers.Conv2D):
  """`tf_keras.layers.Conv2D` computed by `tf_largeconv.conv2d`.

  Args: those of `tf_keras.layers.Conv2D`, plus `algorithm` and `workspace_limit` (see
  `tf_largeconv.conv2d`).
  """

  def __init__(self, filters, kernel_size, algorithm="auto", workspace_limit=None, **kwargs):
    self._init_settings(algorithm, workspace_limit)
    super().__init__(filters, kernel_size, **kwargs)

  def convolution_op(self, inputs, kernel):
    return _ops.conv2d(inputs, kernel, list(self.strides), self.padding.upper(),
                       **self._op_kwargs())
