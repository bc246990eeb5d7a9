"""The LargeConv layers' bases, one per layer family, shared by Keras 3 and tf_keras.

Imports no Keras: each flavour's layer is a thin subclass
`Large<Family>(<flavour mixin>, <Family>Base, <its Keras layer>)` in `keras/_layers.py`
(Keras 3) or `tf_keras.py` (Keras 2), and neither may depend on the other's Keras. A base
takes its Keras layer's arguments as they are (positional ones in Keras's order, so each
means what it means there) plus the package's options (`tf_largeconv._options`, keyword
only), and computes the layer with the family's op.
"""

import inspect

import tensorflow as tf

from tf_largeconv import _options
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


class _KerasSignature:
  """`inspect.signature` of a Large layer class: its Keras layer's, with the options
  keyword-only before `**kwargs`. Instances have none (their signature
  is their `__call__`'s), nor have the bases (no Keras layer below them)."""

  def __get__(self, instance, owner):
    keras_class = next(
      (c for c in owner.__mro__ if "__init__" in vars(c) and not issubclass(c, LargeConvBase)),
      object,
    )
    if instance is not None or keras_class is object:
      raise AttributeError("__signature__")
    return _options.with_options(inspect.signature(keras_class))


class LargeConvBase(_options.Settings):
  """What every LargeConv layer adds to its Keras layer: the options (`Settings`: cleaned,
  kept and serialised once), the op's keyword arguments and the bias and activation.

  Mixed in before the Keras convolution layer, whose `rank`, `data_format`, `strides`,
  `dilation_rate`, `use_bias`, `bias`, `activation` and `get_config` it uses.
  """

  __signature__ = _KerasSignature()

  def __init__(self, *args, **kwargs):
    self._init_settings(kwargs)
    super().__init__(*args, **kwargs)
    self._made()

  def _made(self):
    """Checks and settings once the Keras layer has taken its own arguments."""

  def _op_kwargs(self):
    return dict(
      data_format=op_data_format(self.data_format, self.rank),
      dilations=list(self.dilation_rate),
      **self.settings(),
    )

  def _bias_and_activation(self, outputs):
    """Adds the layer's bias (if any) and applies its activation (if any)."""
    if self.use_bias:
      ones = (1,) * self.rank
      shape = (1, *ones, -1) if self.data_format == "channels_last" else (1, -1, *ones)
      outputs = outputs + tf.reshape(tf.cast(self.bias, outputs.dtype), shape)
    if self.activation is not None:
      return self.activation(outputs)
    return outputs


class Conv1DBase(LargeConvBase):
  """Conv1D computed by `tf_largeconv.conv1d`, Keras's causal padding passed as explicit
  padding (no padded copy of the input)."""

  # Whether the Keras layer's call pads causal inputs before convolution_op (tf_keras's
  # does; the Keras 3 layer's call leaves it to convolution_op).
  _call_pads_causal = True

  def convolution_op(self, inputs, kernel):
    padding = self.padding.upper()
    if padding == "CAUSAL":
      left = self.dilation_rate[0] * (self.kernel_size[0] - 1)
      padding = "VALID" if self._call_pads_causal else [[left, 0]]
    return _ops.conv1d(inputs, kernel, list(self.strides), padding, **self._op_kwargs())


class Conv2DBase(LargeConvBase):
  """Conv2D computed by `tf_largeconv.conv2d`."""

  def convolution_op(self, inputs, kernel):
    return _ops.conv2d(
      inputs, kernel, list(self.strides), self.padding.upper(), **self._op_kwargs()
    )


class DepthwiseConv2DBase(LargeConvBase):
  """DepthwiseConv2D computed by `tf_largeconv.depthwise_conv2d` (the flavours name its
  kernel differently, so each call passes it)."""

  def convolution_op(self, inputs, kernel):
    return _ops.depthwise_conv2d(
      inputs, kernel, list(self.strides), self.padding.upper(), **self._op_kwargs()
    )


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


class Conv2DTransposeBase(LargeConvBase):
  """Conv2DTranspose computed by `tf_largeconv.conv2d_transpose`; both flavours name the
  kernel alike, so the call is this one."""

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


class Conv3DBase(LargeConvBase):
  """Conv3D computed by `tf_largeconv.conv3d`, which takes strides and dilations with five
  entries and the 5-D data_format names."""

  def _made(self):
    """Keras 3 stores a list or tuple `padding` (and fails when called); tf.nn.conv3d has
    no explicit padding, so the layer refuses it when made."""
    super()._made()
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
