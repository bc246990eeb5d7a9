"""Keras 3 layers over the LargeConv ops, and a converter for existing models.

`LargeConv2D` and `LargeDepthwiseConv2D` are `keras.layers.Conv2D` / `DepthwiseConv2D`
argument for argument, default for default and weight for weight (so `set_weights` moves
weights both ways); they add `algorithm` and `workspace_limit`. TensorFlow backend only;
models using them load (.keras or SavedModel) after `import tf_largeconv`.
"""

import keras

from tf_largeconv import _args
from tf_largeconv import _conv3d
from tf_largeconv import _export
from tf_largeconv import _layer_settings
from tf_largeconv import _loader
from tf_largeconv import fold as _fold
from tf_largeconv import ops as _ops

_PACKAGE = "tf_largeconv"


def _check_backend():
  if keras.backend.backend() != "tensorflow":
    raise ValueError("tf_largeconv layers need the TensorFlow backend, got "
                     f"keras.backend.backend()={keras.backend.backend()!r}")


def conv_output_shape(input_shape, filter_shape, strides, padding, data_format,
                      dilations):
  """Static output shape from the package's one geometry (tf_largeconv._core), keeping
  unknown (None) dimensions unknown. data_format is 'NHWC' or 'NCHW' (filter_shape
  [height, width, in, out], strides and dilations as tf_largeconv.conv2d takes them) or
  'NDHWC' or 'NCDHW' ([depth, height, width, in, out], strides and dilations of 5 entries
  as tf_largeconv.conv3d takes them)."""
  rank = len(data_format) - 2  # spatial dimensions
  if rank == 3:
    attrs = _conv3d.conv3d_attrs(strides, padding, data_format, dilations)
  else:
    attrs = _args.conv_attrs(strides, padding, data_format, dilations)
  c = 1 if attrs["data_format"][1] == "C" else rank + 1
  spatial = [i for i in range(1, rank + 2) if i != c]
  shape = list(input_shape)
  probe = list(shape)
  # Each unknown dimension is computed with a stand-in as large as the largest dilated
  # filter (so valid for any padding), then reported unknown again: output sizes are
  # independent per dimension.
  stand_in = max(_args.filter_extent(int(filter_shape[k]), attrs["dilations"][i])
                 for k, i in enumerate(spatial))
  for i, size in enumerate(shape):
    if size is None:
      probe[i] = stand_in if i in spatial else 1
  if shape[c] is None:
    probe[c] = filter_shape[rank]
  probe, filter_shape = [int(v) for v in probe], [int(v) for v in filter_shape]
  if rank == 3:
    geometry = _loader.core().geometry3d(probe, filter_shape, attrs["strides"],
                                         attrs["padding"], attrs["data_format"],
                                         attrs["dilations"])
  else:
    geometry = _loader.core().geometry(probe, filter_shape, attrs["strides"],
                                       attrs["padding"], attrs["explicit_paddings"],
                                       attrs["data_format"], attrs["dilations"])
  out = list(geometry["output_shape"])
  for i, size in enumerate(shape):
    if size is None and i != c:
      out[i] = None
  return tuple(out)


class _LargeConvSettings(_layer_settings.LargeConvSettings):
  """The shared settings, on the TensorFlow backend only, and the layers' output shape."""

  def _init_settings(self, algorithm, workspace_limit):
    _check_backend()
    super()._init_settings(algorithm, workspace_limit)

  def _output_shape(self, input_shape, filter_shape):
    return conv_output_shape(input_shape, filter_shape,
                             _layer_settings.op_window(self.data_format, self.strides),
                             self.padding.upper(),
                             _layer_settings.op_data_format(self.data_format, self.rank),
                             _layer_settings.op_window(self.data_format, self.dilation_rate))

  def _conv_call(self, inputs):
    """The convolution layers' call: keras's BaseConv.call, but with the bias added by
    tf.add. BaseConv.call uses keras.ops.add, which on the TensorFlow backend runs
    tf.nn.bias_add with the channel axis guessed from sizes, so a channels_first output
    whose width equals `filters` gets its bias along the width (Keras 3.15; its own Conv1D,
    Conv2D and Conv3D do that too)."""
    return self._bias_and_activation(self.convolution_op(inputs, self.kernel))

  def _conv_output_shape(self, input_shape):
    """compute_output_shape of a (grouped) convolution: its kernel is kernel_size +
    (input channels / groups, filters)."""
    c = -1 if self.data_format == "channels_last" else 1
    in_c = input_shape[c]
    filter_shape = (*self.kernel_size, (in_c // self.groups) if in_c else 1, self.filters)
    return self._output_shape(input_shape, filter_shape)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class LargeConv2D(_LargeConvSettings, keras.layers.Conv2D):
  """`keras.layers.Conv2D` computed by `tf_largeconv.conv2d`.

  Args: those of `keras.layers.Conv2D`, plus
    algorithm: 'auto', 'direct', 'fft', 'tf' or 'portable' (see `tf_largeconv.conv2d`).
      `supports_jit` is True except for 'direct' and 'fft': under XLA (jit_compile=True)
      'auto' runs the portable path.
    workspace_limit: bytes of temporary memory per pass; None means 64 MiB.
  Like `keras.layers.Conv2D` it rejects strides > 1 together with dilation_rate > 1 (the op
  itself supports that combination; `tf_largeconv.conv2d` offers it).
  """

  def __init__(self, filters, kernel_size, strides=(1, 1), padding="valid",
               data_format=None, dilation_rate=(1, 1), groups=1, activation=None,
               use_bias=True, kernel_initializer="glorot_uniform", bias_initializer="zeros",
               kernel_regularizer=None, bias_regularizer=None, activity_regularizer=None,
               kernel_constraint=None, bias_constraint=None, algorithm="auto",
               workspace_limit=None, **kwargs):
    self._init_settings(algorithm, workspace_limit)
    super().__init__(filters=filters, kernel_size=kernel_size, strides=strides,
                     padding=padding, data_format=data_format, dilation_rate=dilation_rate,
                     groups=groups, activation=activation, use_bias=use_bias,
                     kernel_initializer=kernel_initializer, bias_initializer=bias_initializer,
                     kernel_regularizer=kernel_regularizer, bias_regularizer=bias_regularizer,
                     activity_regularizer=activity_regularizer,
                     kernel_constraint=kernel_constraint, bias_constraint=bias_constraint,
                     **kwargs)
    self.supports_jit = _args.compiles_under_xla(self.algorithm)

  def convolution_op(self, inputs, kernel):
    return _ops.conv2d(inputs, kernel, list(self.strides), self.padding.upper(),
                       **self._op_kwargs())

  def call(self, inputs):
    return self._conv_call(inputs)

  def compute_output_shape(self, input_shape):
    return self._conv_output_shape(input_shape)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class LargeDepthwiseConv2D(_LargeConvSettings, keras.layers.DepthwiseConv2D):
  """`keras.layers.DepthwiseConv2D` computed by `tf_largeconv.depthwise_conv2d`.

  Args: those of `keras.layers.DepthwiseConv2D`, plus `algorithm` and `workspace_limit`
  as for `LargeConv2D`.
  """

  def __init__(self, kernel_size, strides=(1, 1), padding="valid", depth_multiplier=1,
               data_format=None, dilation_rate=(1, 1), activation=None, use_bias=True,
               depthwise_initializer="glorot_uniform", bias_initializer="zeros",
               depthwise_regularizer=None, bias_regularizer=None, activity_regularizer=None,
               depthwise_constraint=None, bias_constraint=None, algorithm="auto",
               workspace_limit=None, **kwargs):
    self._init_settings(algorithm, workspace_limit)
    super().__init__(kernel_size=kernel_size, strides=strides, padding=padding,
                     depth_multiplier=depth_multiplier, data_format=data_format,
                     dilation_rate=dilation_rate, activation=activation, use_bias=use_bias,
                     depthwise_initializer=depthwise_initializer,
                     bias_initializer=bias_initializer,
                     depthwise_regularizer=depthwise_regularizer,
                     bias_regularizer=bias_regularizer,
                     activity_regularizer=activity_regularizer,
                     depthwise_constraint=depthwise_constraint,
                     bias_constraint=bias_constraint, **kwargs)
    self.supports_jit = _args.compiles_under_xla(self.algorithm)

  def call(self, inputs):
    return self._depthwise_call(inputs, self.kernel)

  def compute_output_shape(self, input_shape):
    c = -1 if self.data_format == "channels_last" else 1
    in_c = input_shape[c]
    if in_c is None:
      raise ValueError("LargeDepthwiseConv2D needs a known input channel count")
    filter_shape = (*self.kernel_size, 1, in_c * self.depth_multiplier)
    return self._output_shape(input_shape, filter_shape)


def convert(model, min_kernel_size=15, algorithm="auto", workspace_limit=None):
  """Clones a Keras model with its large-kernel convolutions on tf_largeconv.

  Every `keras.layers.Conv2D` / `DepthwiseConv2D` / `Conv1D` / `Conv2DTranspose` /
  `Conv3D` whose kernel has a side of at least `min_kernel_size` becomes a `LargeConv2D` /
  `LargeDepthwiseConv2D` / `LargeConv1D` / `LargeConv2DTranspose` / `LargeConv3D` with the
  same configuration; all weights are copied.

  Args:
    model: a Sequential or functional Keras model.
    min_kernel_size: the smallest kernel side to replace.
    algorithm, workspace_limit: for the new layers.

  Returns:
    The converted clone (the input model is left as it was).
  """
  def clone(layer):
    config = layer.get_config()
    large = max(getattr(layer, "kernel_size", (0,))) >= min_kernel_size
    if type(layer) is keras.layers.Conv2D and large:  # pylint: disable=unidiomatic-typecheck
      return LargeConv2D(**config, algorithm=algorithm, workspace_limit=workspace_limit)
    if type(layer) is keras.layers.DepthwiseConv2D and large:  # pylint: disable=unidiomatic-typecheck
      return LargeDepthwiseConv2D(**config, algorithm=algorithm,
                                  workspace_limit=workspace_limit)
    if type(layer) is keras.layers.Conv1D and large:  # pylint: disable=unidiomatic-typecheck
      return LargeConv1D(**config, algorithm=algorithm, workspace_limit=workspace_limit)
    if type(layer) is keras.layers.Conv2DTranspose and large:  # pylint: disable=unidiomatic-typecheck
      return LargeConv2DTranspose(**config, algorithm=algorithm,
                                  workspace_limit=workspace_limit)
    if type(layer) is keras.layers.Conv3D and large:  # pylint: disable=unidiomatic-typecheck
      return LargeConv3D(**config, algorithm=algorithm, workspace_limit=workspace_limit)
    return layer.__class__.from_config(config)

  converted = keras.models.clone_model(model, clone_function=clone)
  converted.set_weights(model.get_weights())
  return converted


def export_portable(model, path, input_signature=None):
  """Saves `model` for inference as a SavedModel that needs no tf_largeconv to load.

  The model's forward pass (`training=False`) is traced with every tf_largeconv op on
  `algorithm="portable"`: stock TensorFlow ops only, so the SavedModel holds no LargeConv
  op and loads in any TensorFlow (TensorFlow Serving, a process that never imports
  tf_largeconv). The model is not changed: the switch is a context
  (`tf_largeconv.ops.portable_only`, thread-local) around the trace and the save, restored
  on exit, so the Large layers keep their own `algorithm` for everything else. Any layer
  that calls tf_largeconv's public ops is covered (LargeConv2D, LargeDepthwiseConv2D,
  FoldedBlock, your own).

  Load it with `loaded = tf.saved_model.load(path)` (keep `loaded` referenced while calling
  it: TensorFlow deletes the variables of a dropped object); then `loaded.serve(x)` (one
  input; `loaded.serve(x1, x2, ...)` for several, in the model's input order) returns what
  the model returns, and `loaded.signatures["serving_default"](input_0=x)` returns a dict
  (`{"output_0": ...}`), the entry point TensorFlow Serving uses. The batch dimension is
  free (None); the other dimensions and the dtypes are the model's inputs'. The portable
  path needs static image sizes, so every input's height and width must be known. TFLite
  cannot run the export today (see the README, "Exporting for serving without the package").

  Args:
    model: a built Keras model with defined inputs (functional, or Sequential starting
      with `keras.Input`).
    path: the SavedModel directory to write (str or os.PathLike).
    input_signature: for a model without defined inputs (subclassed), a list of
      `tf.TensorSpec`, one per input; the batch dimension may be None.

  Returns:
    `path` as a str.

  Raises:
    ValueError: a model without defined inputs and no input_signature (naming what to
      do), a malformed `path` or `input_signature`, inputs of unknown height or width, or a
      layer that calls the op library directly so that a LargeConv op would be saved.
  """
  return _export.export(model, path, input_signature=input_signature)


# Folding linear blocks (the algebra is in _fold.py, shared with tf_keras)

def fold(block, exact=True, input_size=None, dtype=None, algorithm="auto",
         workspace_limit=None, name=None):
  """Folds a block of linear layers into one `LargeConv2D` or `LargeDepthwiseConv2D`.

  The block is a built Keras model (functional, or Sequential with an Input) with one
  input and one output, made of: Conv2D (any kernel, dilation, groups, bias),
  DepthwiseConv2D, SeparableConv2D, the Large* layers, BatchNormalization (its moving
  statistics), Add, Subtract, Average, Concatenate on channels, ZeroPadding2D, Cropping2D,
  Identity, linear Activation, Rescaling, `a + b`, `a - b`, `-a`, `c * a`, `a / c` with
  constants c, nested such models and (exact) FoldedBlock layers. A stride is allowed
  where no spatial layer follows.

  The returned layer's output equals the block's everywhere, borders included (within the
  op's float tolerance). It is depthwise when the fold is channel-diagonal
  (depth_multiplier = output / input channels), grouped when block-diagonal; the kernel
  carries zero rows or columns where that makes the padding 'same' or 'valid'.

  Args:
    block: the Keras model to fold (left unchanged).
    exact: with False, fold even where the block is not one convolution at the border,
      warn (`FoldWarning`) with the number of output pixels that differ, and set
      `layer.fold_report` (a `FoldReport`).
    input_size: (height, width) for a block whose input size is unknown: needed for
      strides and for exact=False.
    dtype: the new layer's dtype (policy); None for Keras's default.
    algorithm, workspace_limit: for the new layer (see `tf_largeconv.conv2d`).
    name: the new layer's name.

  Returns:
    A built `LargeConv2D` or `LargeDepthwiseConv2D` with the folded weights.

  Raises:
    ValueError: naming the layer and the reason, for a layer that is not linear or not
      supported; a padding (SAME, ZeroPadding2D) reading beyond the border of a tensor
      that is not zero there (after a bias, a spatial kernel or a crop) unless
      exact=False; a stride before a spatial kernel; a block that no 'same' or 'valid'
      convolution computes (e.g. one whose output is larger than its input).
  """
  return _fold.fold(block, _FLAVOUR, exact=exact, input_size=input_size, dtype=dtype,
                    algorithm=algorithm, workspace_limit=workspace_limit, name=name)


def reparameterize(model, algorithm="auto", workspace_limit=None):
  """A copy of `model` with every maximal foldable linear sub-graph as one Large layer.

  A sub-graph is foldable when it is the cone of linear layers (see `fold`) behind one
  tensor, reaching back to one input tensor, with none of its inner tensors used outside
  it, at least one convolution among at least two layers, and `fold` finds it exact: e.g.
  parallel branches of convolution + BatchNormalization summed (RepLKNet, RepVGG), or a
  residual `x + BN(conv(x))`. The layer ending it may carry an activation, which the
  Large layer keeps. Depthwise folds stay depthwise. Other layers are copied with their
  weights; outputs are equal (BatchNormalization folds with its moving statistics, as in
  inference). Nested models are copied as they are, or folded whole when linear; so is
  a FoldedBlock, which makes `reparameterize` the deployment step of a model trained with
  FoldedBlock layers.

  Args:
    model: a built Keras model (left unchanged).
    algorithm, workspace_limit: for the new Large layers.

  Returns:
    A functional `keras.Model`.
  """
  return _fold.reparameterize(model, _FLAVOUR, algorithm=algorithm,
                              workspace_limit=workspace_limit)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class FoldedBlock(_fold.FoldedBlockBase, keras.layers.Layer):
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

  Args:
    block: the Keras model.
    exact, input_size: as for `fold` (with exact=False, `fold_report` says what differs).
    algorithm: 'auto' (default) lets the op's planner choose direct or FFT for each pass,
      so every pass's temporary memory stays within `workspace_limit` (unlike
      `tf_largeconv.conv2d`'s 'auto', it never hands the passes to TensorFlow's kernel,
      whose gradients' temporaries grow with the image); 'direct', 'fft' and 'tf' are
      passed to `tf_largeconv.conv2d`.
    workspace_limit: bytes of temporary memory per pass; None means 64 MiB.
    **kwargs: those of `keras.layers.Layer` (name, dtype, ...).
  """

  _serialize_block = staticmethod(keras.saving.serialize_keras_object)
  _deserialize_block = staticmethod(keras.saving.deserialize_keras_object)

  def __init__(self, block, **kwargs):
    _check_backend()
    super().__init__(block, **kwargs)


_FLAVOUR = _fold.Flavour(input=keras.Input, model=keras.Model, conv=LargeConv2D,
                         depthwise=LargeDepthwiseConv2D)
FoldReport = _fold.FoldReport
FoldWarning = _fold.FoldWarning


# LargeConv1D


@keras.saving.register_keras_serializable(package=_PACKAGE)
class LargeConv1D(_LargeConvSettings, _layer_settings.LargeConv1DSettings, keras.layers.Conv1D):
  """`keras.layers.Conv1D` computed by `tf_largeconv.conv1d`.

  Args: those of `keras.layers.Conv1D` (causal padding and groups included, same defaults
  and weights), plus `algorithm` and `workspace_limit` as for `LargeConv2D`. Causal padding
  is passed to the op as explicit padding rather than copied into a padded input.
  """

  def __init__(self, filters, kernel_size, algorithm="auto", workspace_limit=None, **kwargs):
    self._init_settings(algorithm, workspace_limit)
    super().__init__(filters, kernel_size, **kwargs)
    self.supports_jit = _args.compiles_under_xla(self.algorithm)

  def convolution_op(self, inputs, kernel):
    return self._conv1d_call(inputs, kernel)

  def call(self, inputs):
    # Not keras.layers.Conv1D.call, which pads causal inputs itself and calls keras.ops.conv:
    # convolution_op passes causal padding to the op.
    return self._conv_call(inputs)


# Transposed convolution


@keras.saving.register_keras_serializable(package=_PACKAGE)
class LargeConv2DTranspose(_LargeConvSettings, _layer_settings.LargeConvTransposeSettings,
                           keras.layers.Conv2DTranspose):
  """`keras.layers.Conv2DTranspose` computed by `tf_largeconv.conv2d_transpose`.

  Args: those of `keras.layers.Conv2DTranspose` (output_padding included), plus
  `algorithm` and `workspace_limit` as for `LargeConv2D` (keyword arguments after
  `filters` and `kernel_size` go to `keras.layers.Conv2DTranspose`, with its defaults).
  Weights, output shape and checks are Keras's own.
  """

  def __init__(self, filters, kernel_size, algorithm="auto", workspace_limit=None, **kwargs):
    self._init_settings(algorithm, workspace_limit)
    super().__init__(filters, kernel_size, **kwargs)
    self.supports_jit = _args.compiles_under_xla(self.algorithm)


# LargeConv3D


@keras.saving.register_keras_serializable(package=_PACKAGE)
class LargeConv3D(_LargeConvSettings, _layer_settings.LargeConv3DSettings,
                  keras.layers.Conv3D):
  """`keras.layers.Conv3D` computed by `tf_largeconv.conv3d`.

  Args: those of `keras.layers.Conv3D`, positional ones in its order and with its defaults
  (padding 'valid' or 'same', strides, dilation_rate, groups, channels_first too), plus the
  keyword arguments `algorithm` and `workspace_limit` as for `LargeConv2D` (see
  `tf_largeconv.conv3d`). Weights, their names and the output shape are Keras's. Like
  `keras.layers.Conv3D` it rejects strides > 1 together with dilation_rate > 1; unlike it,
  it rejects a list `padding` when made (Keras fails only when called).
  """

  def __init__(self, filters, kernel_size, *args, algorithm="auto", workspace_limit=None,
               **kwargs):
    self._init_settings(algorithm, workspace_limit)
    super().__init__(filters, kernel_size, *args, **kwargs)
    self._check_padding()
    self.supports_jit = _args.compiles_under_xla(self.algorithm)

  def call(self, inputs):
    return self._conv_call(inputs)

  def compute_output_shape(self, input_shape):
    return self._conv_output_shape(input_shape)
