"""The settings the LargeConv layers add to a Keras convolution, for Keras 3 and tf_keras.

Imports no Keras: `keras/_layers.py` (Keras 3) and `tf_keras.py` (Keras 2) both mix these
classes into their layers, and neither may depend on the other's Keras.
"""

import tensorflow as tf

from tf_largeconv import _args
from tf_largeconv import ops as _ops
from tf_largeconv._problem import dilated_extent


def op_data_format(keras_format, rank=2):
  """The op's data_format for a Keras one ('channels_last' or 'channels_first') and the
  layer's number of spatial dimensions (its `rank`): 'NDHWC' / 'NCDHW' for 3, 'NHWC' /
  'NCHW' for 2 and 1 (conv1d takes these too)."""
  spatial = "DHW" if rank == 3 else "HW"
  return f"N{spatial}C" if keras_format == "channels_last" else f"NC{spatial}"


def op_window(keras_format, values):
  """A layer's strides or dilation_rate (one entry per spatial dimension) as the op's list
  over every dimension in data_format order, 1 for the batch and the channels."""
  values = [int(v) for v in values]
  return [1] + values + [1] if keras_format == "channels_last" else [1, 1] + values


class LargeConvSettings:
  """The two settings our layers add to Keras's, validated and serialised once.

  Mixed in before the Keras convolution layer, whose `rank`, `data_format`, `dilation_rate`
  and `get_config` it uses.
  """

  def _init_settings(self, algorithm, workspace_limit):
    self.algorithm = _args.normalize_algorithm(algorithm)
    _args.normalize_workspace_limit(workspace_limit)
    self.workspace_limit = workspace_limit

  def _op_kwargs(self):
    return dict(
      data_format=op_data_format(self.data_format, self.rank),
      dilations=list(self.dilation_rate),
      algorithm=self.algorithm,
      workspace_limit=self.workspace_limit,
    )

  def get_config(self):
    config = super().get_config()
    config.update(algorithm=self.algorithm, workspace_limit=self.workspace_limit)
    return config

  def _depthwise_call(self, inputs, kernel):
    """The depthwise layers' call (Keras 3 and tf_keras name the kernel differently)."""
    outputs = _ops.depthwise_conv2d(
      inputs, kernel, list(self.strides), self.padding.upper(), **self._op_kwargs()
    )
    return self._bias_and_activation(outputs)

  def _bias_and_activation(self, outputs):
    """Adds the layer's bias (if any) and applies its activation (if any)."""
    if self.use_bias:
      ones = (1,) * self.rank
      shape = (1, *ones, -1) if self.data_format == "channels_last" else (1, -1, *ones)
      outputs = outputs + tf.reshape(tf.cast(self.bias, outputs.dtype), shape)
    if self.activation is not None:
      return self.activation(outputs)
    return outputs


# LargeConv1D (Keras 3 and tf_keras)


class LargeConv1DSettings(LargeConvSettings):
  """The LargeConv1D layers' convolution: `tf_largeconv.conv1d` with the layer's settings,
  Keras's causal padding as explicit padding (no padded copy of the input)."""

  def _conv1d_call(self, inputs, kernel, causal_done=False):
    """conv1d of `inputs`; `causal_done`: the caller has already padded them causally
    (tf_keras's call does), so 'causal' runs VALID."""
    padding = self.padding.upper()
    if padding == "CAUSAL":
      left = self.dilation_rate[0] * (self.kernel_size[0] - 1)
      padding = "VALID" if causal_done else [[left, 0]]
    return _ops.conv1d(inputs, kernel, list(self.strides), padding, **self._op_kwargs())


# Transposed convolutions (Conv2DTranspose)


def transpose_output_size(size, kernel, stride, padding, output_padding, dilation):
  """The output height (or width) of a Keras Conv2DTranspose: Keras 3 and tf_keras agree.
  `size` may be an int or a scalar tensor; padding is 'same' or 'valid'."""
  extent = dilated_extent(kernel, dilation)
  if output_padding is None:
    if padding == "same":
      return size * stride
    return size * stride + max(extent - stride, 0)
  pad = extent // 2 if padding == "same" else 0
  return (size - 1) * stride + extent - 2 * pad + output_padding


class LargeConvTransposeSettings(LargeConvSettings):
  """The settings, and the call of the Conv2DTranspose layers (Keras 3 and tf_keras), which
  name their kernel alike."""

  def call(self, inputs):
    inputs = tf.convert_to_tensor(inputs)
    channels_last = self.data_format == "channels_last"
    axes = (1, 2) if channels_last else (2, 3)
    static = inputs.shape.as_list() if inputs.shape.rank is not None else [None] * 4
    dynamic = tf.shape(inputs)
    size = [dynamic[i] if static[i] is None else static[i] for i in range(4)]
    output_padding = self.output_padding or (None, None)
    spatial = [
      transpose_output_size(size[a], k, s, self.padding, p, d)
      for a, k, s, p, d in zip(
        axes, self.kernel_size, self.strides, output_padding, self.dilation_rate
      )
    ]
    if all(isinstance(v, int) for v in spatial):
      # Height and width only (the batch from inputs, the depth from the kernel): constant
      # whatever the batch, as the portable path (XLA, export_portable) needs.
      shape = spatial
    else:
      shape = tf.stack(
        [size[0]] + spatial + [self.filters] if channels_last else [size[0], self.filters] + spatial
      )
    outputs = _ops.conv2d_transpose(
      inputs, self.kernel, shape, list(self.strides), self.padding.upper(), **self._op_kwargs()
    )
    return self._bias_and_activation(outputs)


# LargeConv3D (Keras 3 and tf_keras)


class LargeConv3DSettings(LargeConvSettings):
  """The LargeConv3D layers' convolution: `tf_largeconv.conv3d`, which takes strides and
  dilations with five entries and the 5-D data_format names."""

  def _check_padding(self):
    """Keras 3 stores a list or tuple `padding` (and fails when called); tf.nn.conv3d has
    no explicit padding, so the layer refuses it when made."""
    if not isinstance(self.padding, str):
      raise ValueError(
        "LargeConv3D takes padding 'valid' or 'same' (tf.nn.conv3d has no "
        f"explicit padding), got padding={self.padding!r}"
      )

  def _op_kwargs(self):
    return dict(super()._op_kwargs(), dilations=op_window(self.data_format, self.dilation_rate))

  def convolution_op(self, inputs, kernel):
    return _ops.conv3d(
      inputs,
      kernel,
      op_window(self.data_format, self.strides),
      self.padding.upper(),
      **self._op_kwargs(),
    )
