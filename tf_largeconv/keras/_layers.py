"""The Keras 3 layers over the LargeConv ops.

`LargeConv1D`, `LargeConv2D`, `LargeDepthwiseConv2D`, `LargeConv2DTranspose` and
`LargeConv3D` are their Keras layers argument for argument (positional ones in Keras's
order), default for default and weight for weight (so `set_weights` moves weights both
ways); they add the package's options, keyword-only (`tf_largeconv._options`). Each is its family's
base (`_settings`, shared with tf_keras) bound to Keras 3 by `_Keras3`. TensorFlow backend
only. Each is registered under the package name "tf_largeconv", so models using them load
(.keras or SavedModel) after `import tf_largeconv`.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf

from tf_largeconv import _args
from tf_largeconv import fold as _fold
from tf_largeconv._problem import ConvProblem
from tf_largeconv.keras import _settings as _layer_settings

_PACKAGE = "tf_largeconv"


def _check_backend() -> None:
  if keras.backend.backend() != "tensorflow":
    raise ValueError(
      "tf_largeconv layers need the TensorFlow backend, got "
      f"keras.backend.backend()={keras.backend.backend()!r}"
    )


def conv_output_shape(
  input_shape: Sequence[int | None],
  filter_shape: Sequence[int],
  strides: Sequence[int],
  padding: str,
  data_format: str,
  dilations: Sequence[int],
) -> tuple[int | None, ...]:
  """Static output shape from the package's one geometry (tf_largeconv._core), keeping
  unknown (None) dimensions unknown. data_format is 'NHWC' or 'NCHW' (filter_shape
  [height, width, in, out], strides and dilations as tf_largeconv.conv2d takes them) or
  'NDHWC' or 'NCDHW' ([depth, height, width, in, out], strides and dilations of 5 entries
  as tf_largeconv.conv3d takes them)."""
  if len(data_format) == 5:
    problem = ConvProblem.conv3d(strides, padding, data_format, dilations)
  else:
    problem = ConvProblem.conv2d(strides, padding, data_format, dilations)
  problem = problem.bind(input_shape, filter_shape)
  try:
    return problem.static_output_shape()
  except ValueError as e:
    sizes = [problem.shapes()[0][i] for i in problem.spatial_axes]
    too_small = problem.padding == "VALID" and any(
      s is not None and s < problem.extent(k) for k, s in enumerate(sizes)
    )
    if too_small:  # as Keras's own layers say it
      raise ValueError(
        f"Computed output size would be zero or negative. Received "
        f"inputs shape={tuple(input_shape)}, kernel shape={tuple(filter_shape)}: "
        f"{e}"
      ) from None
    raise


class _TensorFlowBackend:
  """The Keras 3 layers run on the TensorFlow backend only: checked when a layer is made."""

  def _init_settings(self, kwargs: dict[str, Any]) -> None:
    _check_backend()
    super()._init_settings(kwargs)  # type: ignore[misc]


class _Keras3(_TensorFlowBackend, _layer_settings.LargeConvBase):
  """The Keras 3 flavour of the LargeConv layers: `supports_jit`, the layers' output shape
  and call with the bias added along the channel axis."""

  # What the Keras convolution layer this is mixed into holds, and an option it reads.
  algorithm: str
  rank: int
  filters: int
  kernel_size: tuple[int, ...]
  strides: tuple[int, ...]
  padding: str
  data_format: str
  dilation_rate: tuple[int, ...]
  groups: int
  kernel: Any
  convolution_op: Callable[[tf.Tensor, tf.Tensor], tf.Tensor]
  compute_output_shape: Callable[[tuple[int | None, ...]], tuple[int | None, ...]]

  def _made(self) -> None:
    super()._made()
    # 'direct' and 'fft' have no XLA kernel; under XLA 'auto' runs the portable path.
    self.supports_jit = _args.compiles_under_xla(self.algorithm)

  def _output_shape(
    self, input_shape: Sequence[int | None], filter_shape: Sequence[int]
  ) -> tuple[int | None, ...]:
    return conv_output_shape(
      input_shape,
      filter_shape,
      _layer_settings.op_window(self.data_format, self.strides),
      self.padding.upper(),
      _layer_settings.op_data_format(self.data_format, self.rank),
      _layer_settings.op_window(self.data_format, self.dilation_rate),
    )

  def _conv_call(self, inputs: tf.Tensor) -> tf.Tensor:
    """The layers' call: keras's BaseConv.call, but with the bias added by tf.add.
    BaseConv.call uses keras.ops.add, which on the TensorFlow backend runs tf.nn.bias_add
    with the channel axis guessed from sizes, so a channels_first output whose width
    equals `filters` gets its bias along the width (Keras 3.15; its own Conv1D, Conv2D and
    Conv3D do that too)."""
    return self._bias_and_activation(
      self._sized(inputs, lambda: self.convolution_op(inputs, self.kernel))
    )

  def _sized(self, inputs: tf.Tensor, run: Callable[[], tf.Tensor]) -> tf.Tensor:
    """run(), the layer's convolution; where it fails on an input too small for any output,
    the ValueError Keras's own layers raise then (from compute_output_shape), whose
    message Keras's tests look for, as traced calls raise it."""
    try:
      return run()
    except (ValueError, tf.errors.InvalidArgumentError):
      if inputs.shape.rank is not None:
        self.compute_output_shape(tuple(inputs.shape))
      raise

  def _conv_output_shape(self, input_shape: Sequence[int | None]) -> tuple[int | None, ...]:
    """compute_output_shape of a (grouped) convolution: its kernel is kernel_size +
    (input channels / groups, filters)."""
    c = -1 if self.data_format == "channels_last" else 1
    in_c = input_shape[c]
    filter_shape = (*self.kernel_size, (in_c // self.groups) if in_c else 1, self.filters)
    return self._output_shape(input_shape, filter_shape)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class LargeConv1D(_Keras3, _layer_settings.Conv1DBase, keras.layers.Conv1D):
  """`keras.layers.Conv1D` computed by `tf_largeconv.conv1d`.

  Args: those of `keras.layers.Conv1D`, positional ones in its order, with its defaults
  (causal padding and groups included), plus the options as for `LargeConv2D`. Causal
  padding is passed to the op as explicit padding rather than copied into a padded input.
  """

  _call_pads_causal = False
  # Not keras.layers.Conv1D.call, which pads causal inputs itself and calls keras.ops.conv.
  call = _Keras3._conv_call


@keras.saving.register_keras_serializable(package=_PACKAGE)
class LargeConv2D(_Keras3, _layer_settings.Conv2DBase, keras.layers.Conv2D):
  """`keras.layers.Conv2D` computed by `tf_largeconv.conv2d`.

  Args:
    *args, **kwargs: those of `keras.layers.Conv2D`, positional ones in its order, with its
      defaults.
    algorithm: keyword only; 'auto', 'direct', 'fft', 'tf' or 'portable' (see
      `tf_largeconv.conv2d`). `supports_jit` is True except for 'direct' and 'fft': under
      XLA (jit_compile=True) 'auto' runs the portable path.
    workspace_limit: keyword only; bytes of temporary memory per pass; None means 64 MiB.

  Like `keras.layers.Conv2D` it rejects strides > 1 together with dilation_rate > 1 (the op
  itself supports that combination; `tf_largeconv.conv2d` offers it).
  """

  call = _Keras3._conv_call
  compute_output_shape = _Keras3._conv_output_shape


@keras.saving.register_keras_serializable(package=_PACKAGE)
class LargeDepthwiseConv2D(
  _Keras3, _layer_settings.DepthwiseConv2DBase, keras.layers.DepthwiseConv2D
):
  """`keras.layers.DepthwiseConv2D` computed by `tf_largeconv.depthwise_conv2d`.

  Args: those of `keras.layers.DepthwiseConv2D`, positional ones in its order, with its
  defaults, plus the options as for `LargeConv2D`.
  """

  call = _Keras3._conv_call

  def compute_output_shape(self, input_shape: Sequence[int | None]) -> tuple[int | None, ...]:
    c = -1 if self.data_format == "channels_last" else 1
    in_c = input_shape[c]
    if in_c is None:
      raise ValueError("LargeDepthwiseConv2D needs a known input channel count")
    filter_shape = (*self.kernel_size, 1, in_c * self.depth_multiplier)
    return self._output_shape(input_shape, filter_shape)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class LargeConv2DTranspose(
  _Keras3, _layer_settings.Conv2DTransposeBase, keras.layers.Conv2DTranspose
):
  """`keras.layers.Conv2DTranspose` computed by `tf_largeconv.conv2d_transpose`.

  Args: those of `keras.layers.Conv2DTranspose`, positional ones in its order, with its
  defaults (output_padding included), plus the options as for `LargeConv2D`. Weights,
  output shape and checks are Keras's own.
  """


@keras.saving.register_keras_serializable(package=_PACKAGE)
class LargeConv3D(_Keras3, _layer_settings.Conv3DBase, keras.layers.Conv3D):
  """`keras.layers.Conv3D` computed by `tf_largeconv.conv3d`.

  Args: those of `keras.layers.Conv3D`, positional ones in its order, with its defaults
  (padding 'valid' or 'same', strides, dilation_rate, groups, channels_first too), plus
  the options as for `LargeConv2D` (see `tf_largeconv.conv3d`).
  Weights, their names and the output shape are Keras's. Like `keras.layers.Conv3D` it
  rejects strides > 1 together with dilation_rate > 1; unlike it, it rejects a list
  `padding` when made (Keras fails only when called).
  """

  call = _Keras3._conv_call
  compute_output_shape = _Keras3._conv_output_shape


@keras.saving.register_keras_serializable(package=_PACKAGE)
class FoldedBlock(_TensorFlowBackend, _fold.FoldedBlockBase, keras.layers.Layer):
  """A trainable layer computing a linear block as one folded convolution.

  It owns the block (a model `fold` accepts) and its weights: training updates the
  block's own variables exactly as training the block would (gradients with respect to
  every weight equal the block's). Each call folds the kernel from the current weights
  with differentiable TensorFlow ops and runs one `tf_largeconv.conv2d` with explicit
  padding, so only the block input and kernel-sized tensors are kept for the backward
  pass, not the block's intermediate activations. BatchNormalization layers act with their
  moving statistics (as frozen BN, or the block called with training=False) and are not
  updated. Unlike `fold`, any output size is fine (the padding is explicit). Serialises
  (.keras, SavedModel) like the other layers; load after `import tf_largeconv`.
  `folded_conv()` gives the convolution it runs (kernel, bias, strides, padding) and
  `convolve(x, padding)` runs it, as `tf_largeconv.stream` does on tiles.

  Args:
    block: the Keras model.
    exact, input_size: as for `fold` (with exact=False, `fold_report` says what differs).
    algorithm: keyword only; 'auto' (default) lets the op's planner choose direct or FFT
      for each pass, so every pass's temporary memory stays within `workspace_limit`
      (unlike `tf_largeconv.conv2d`'s 'auto', it never hands the passes to TensorFlow's
      kernel, whose gradients' temporaries grow with the image); 'direct', 'fft' and 'tf'
      are passed to `tf_largeconv.conv2d`.
    workspace_limit: keyword only; bytes of temporary memory per pass; None means 64 MiB.
    **kwargs: those of `keras.layers.Layer` (name, dtype, ...).
  """

  _serialize_block = staticmethod(keras.saving.serialize_keras_object)
  _deserialize_block = staticmethod(keras.saving.deserialize_keras_object)
