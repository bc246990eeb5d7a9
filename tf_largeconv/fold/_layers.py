"""One handler per supported Keras layer class (keyed by the class name in HANDLERS): each
maps its operands' affine descriptions to its output's, through the composer's steps
(a spatial kernel, a per-channel scale and shift, a linear combination)."""

import dataclasses

import numpy as np
import tensorflow as tf

from tf_largeconv.fold import _affine
from tf_largeconv.fold import _graph
from tf_largeconv.fold import _kernels
from tf_largeconv.fold import _report

# The layers whose operands may be constants besides graph tensors.
TAKES_CONSTANTS = ("Add", "Subtract", "Multiply", "TrueDivide")


def _pairs(value):
  """Keras's ((top, bottom), (left, right)) from an int, a pair, or pairs."""
  if isinstance(value, int):
    return (value, value), (value, value)
  a, b = value
  if isinstance(a, int):
    return (a, a), (b, b)
  return tuple(a), tuple(b)


def _channel_constant(value, channels, desc):
  """A scalar or per-channel constant as a float64 vector of `channels`, or an error."""
  v = np.asarray(value.numpy() if hasattr(value, "numpy") else value, np.float64)
  if v.size == 1:
    return np.full(channels, float(v.reshape(-1)[0]))
  if v.size == channels and all(n == 1 for n in v.shape[:-1]):
    return v.reshape(-1)
  raise _report.Unfoldable(
    f"{desc} uses a constant of shape {v.shape}: only scalars and "
    f"per-channel vectors ({channels}) fold"
  )


def _check_channels_last(layer):
  fmt = layer.get_config().get("data_format", "channels_last")
  if fmt not in (None, "channels_last"):
    raise _report.Unfoldable(
      f"{_graph.describe(layer)} has data_format='{fmt}': fold supports channels_last only"
    )


def _input_layer(composer, layer, operands):
  return operands[0]


def _conv2d(composer, layer, operands):
  _check_channels_last(layer)
  bias = composer.var(layer.bias) if layer.use_bias else None
  return composer.spatial(
    layer,
    operands[0],
    composer.var(layer.kernel),
    layer.groups,
    tuple(layer.strides),
    layer.padding,
    bias,
    tuple(layer.dilation_rate),
  )


def _depthwise_conv2d(composer, layer, operands):
  _check_channels_last(layer)
  kernel = getattr(layer, "depthwise_kernel", None)  # tf_keras; Keras 3: kernel
  w = composer.var(layer.kernel if kernel is None else kernel)
  kh, kw, c, m = w.shape
  bias = composer.var(layer.bias) if layer.use_bias else None
  return composer.spatial(
    layer,
    operands[0],
    tf.reshape(w, [kh, kw, 1, c * m]),
    c,
    tuple(layer.strides),
    layer.padding,
    bias,
    tuple(layer.dilation_rate),
  )


def _separable_conv2d(composer, layer, operands):
  _check_channels_last(layer)
  w = composer.var(layer.depthwise_kernel)
  kh, kw, c, m = w.shape
  t = composer.spatial(
    layer,
    operands[0],
    tf.reshape(w, [kh, kw, 1, c * m]),
    c,
    tuple(layer.strides),
    layer.padding,
    None,
    tuple(layer.dilation_rate),
  )
  bias = composer.var(layer.bias) if layer.use_bias else None
  return composer.spatial(layer, t, composer.var(layer.pointwise_kernel), 1, (1, 1), "valid", bias)


def _batch_normalization(composer, layer, operands):
  t = operands[0]
  axis = layer.axis
  axis = axis[0] if isinstance(axis, (list, tuple)) and len(axis) == 1 else axis
  if axis not in (-1, 3):
    raise _report.Unfoldable(
      f"{_graph.describe(layer)} normalises axis {layer.axis}: fold needs the channel axis (-1)"
    )
  inv = tf.math.rsqrt(
    composer.var(layer.moving_variance) + tf.constant(layer.epsilon, composer.dtype)
  )
  scale = inv * composer.var(layer.gamma) if layer.scale else inv
  shift = -composer.var(layer.moving_mean) * scale
  if layer.center:
    shift = shift + composer.var(layer.beta)
  return composer.scaled(layer, t, scale, shift)


def _add(composer, layer, operands):
  terms = [(1.0, t) for t in operands if isinstance(t, _affine.Affine)]
  consts = [v for v in operands if not isinstance(v, _affine.Affine)]
  constant = None
  if consts:
    constant = sum(
      _channel_constant(v, terms[0][1].channels, _graph.describe(layer)) for v in consts
    )
  return composer.combine(layer, terms, constant)


def _subtract(composer, layer, operands):
  desc = _graph.describe(layer)
  if len(operands) != 2:
    raise _report.Unfoldable(f"{desc} needs exactly two inputs")
  a, b = operands
  if not isinstance(a, _affine.Affine):
    return composer.combine(layer, [(-1.0, b)], _channel_constant(a, b.channels, desc))
  if not isinstance(b, _affine.Affine):
    return composer.combine(layer, [(1.0, a)], -_channel_constant(b, a.channels, desc))
  return composer.combine(layer, [(1.0, a), (-1.0, b)])


def _average(composer, layer, operands):
  return composer.combine(layer, [(1.0 / len(operands), t) for t in operands])


def _negative(composer, layer, operands):
  return composer.combine(layer, [(-1.0, operands[0])])


def _multiply(composer, layer, operands):
  desc = _graph.describe(layer)
  tensors = [t for t in operands if isinstance(t, _affine.Affine)]
  if len(tensors) != 1:
    raise _report.Unfoldable(f"{desc} multiplies {len(tensors)} tensors: not linear")
  scale = np.ones(tensors[0].channels)
  for v in operands:
    if not isinstance(v, _affine.Affine):
      scale = scale * _channel_constant(v, tensors[0].channels, desc)
  return composer.scaled(layer, tensors[0], tf.constant(scale, composer.dtype))


def _true_divide(composer, layer, operands):
  desc = _graph.describe(layer)
  if not isinstance(operands[0], _affine.Affine) or isinstance(operands[1], _affine.Affine):
    raise _report.Unfoldable(f"{desc} divides by a tensor: not linear")
  t = operands[0]
  scale = 1.0 / _channel_constant(operands[1], t.channels, desc)
  return composer.scaled(layer, t, tf.constant(scale, composer.dtype))


def _rescaling(composer, layer, operands):
  desc = _graph.describe(layer)
  t = operands[0]
  config = layer.get_config()
  scale = _channel_constant(config["scale"], t.channels, desc)
  offset = _channel_constant(config["offset"], t.channels, desc)
  return composer.scaled(
    layer,
    t,
    tf.constant(scale, composer.dtype),
    tf.constant(offset, composer.dtype) if np.any(offset) else None,
  )


def _identity(composer, layer, operands):
  return operands[0]


def _activation(composer, layer, operands):
  return operands[0]  # linear (non-linear activations are refused before)


def _concatenate(composer, layer, operands):
  desc = _graph.describe(layer)
  axis = layer.axis
  if axis not in (-1, 3):
    raise _report.Unfoldable(
      f"{desc} concatenates along axis {axis}: fold needs the channel axis (-1)"
    )
  first = operands[0]
  for t in operands[1:]:
    if t.size != first.size or t.stride != first.stride:
      raise ValueError(f"{desc} concatenates tensors of different sizes or strides")
  kernels, off = _affine.aligned(operands)
  kernel = tf.concat([_kernels.regroup(k, t.groups, 1) for k, t in zip(kernels, operands)], -1)
  bias = None
  if any(t.bias is not None for t in operands):
    bias = tf.concat(
      [t.bias if t.bias is not None else tf.zeros([t.channels], composer.dtype) for t in operands],
      0,
    )
  return _affine.Affine(
    kernel=kernel,
    groups=1,
    bias=bias,
    offset=off,
    size=first.size,
    stride=first.stride,
    bias_from=next((t.bias_from for t in operands if t.bias_from), None),
    spill_from=next((t.spill_from for t in operands if t.spill_from), None),
    stride_from=first.stride_from,
    err=tf.concat([t.err for t in operands], -1) if composer.count else None,
  )


def _zero_padding2d(composer, layer, operands):
  _check_channels_last(layer)
  t = operands[0]
  (pt, pb), (pl, pr) = _pairs(layer.get_config()["padding"])
  pads = (pt, pb, pl, pr)
  desc = _graph.describe(layer)
  if any(pads):
    _affine.check_no_stride_before(t, desc, "zero padding")
  composer.border(t, pads, desc, f"by {pads}")
  return dataclasses.replace(
    t,
    offset=(t.offset[0] + pt, t.offset[1] + pl),
    size=(t.size[0] + pt + pb, t.size[1] + pl + pr),
    err=composer.padded_err(t, pads) if composer.count else None,
  )


def _cropping2d(composer, layer, operands):
  _check_channels_last(layer)
  t = operands[0]
  (ct, cb), (cl, cr) = _pairs(layer.get_config()["cropping"])
  if any((ct, cb, cl, cr)):
    _affine.check_no_stride_before(t, _graph.describe(layer), "a crop")
  size = (t.size[0] - ct - cb, t.size[1] - cl - cr)
  return dataclasses.replace(
    t,
    offset=(t.offset[0] - ct, t.offset[1] - cl),
    size=size,
    spill_from=_graph.describe(layer) if any((ct, cb, cl, cr)) else t.spill_from,
    err=t.err[:, ct : ct + size[0], cl : cl + size[1]] if composer.count else None,
  )


def _model(composer, layer, operands):
  graph = _graph.Graph(layer)
  if len(graph.inputs) != 1 or len(graph.outputs) != 1:
    raise _report.Unfoldable(
      f"nested {_graph.describe(layer)} has {len(graph.inputs)} "
      f"inputs and {len(graph.outputs)} outputs: fold needs one of "
      "each"
    )
  return composer.run(graph, operands[0], final=False)


def _folded_block(composer, layer, operands):
  if not layer.exact:
    raise _report.Unfoldable(f"{_graph.describe(layer)} was made with exact=False")
  return _model(composer, layer.block, operands)


# The handlers by the Keras class name they serve (a layer takes the handler of its class
# or of its nearest base class listed here).
HANDLERS = {
  "InputLayer": _input_layer,
  "Conv2D": _conv2d,
  "DepthwiseConv2D": _depthwise_conv2d,
  "SeparableConv2D": _separable_conv2d,
  "BatchNormalization": _batch_normalization,
  "Add": _add,
  "Subtract": _subtract,
  "Average": _average,
  "Negative": _negative,
  "Multiply": _multiply,
  "TrueDivide": _true_divide,
  "Rescaling": _rescaling,
  "Identity": _identity,
  "Activation": _activation,
  "Concatenate": _concatenate,
  "ZeroPadding2D": _zero_padding2d,
  "Cropping2D": _cropping2d,
  "Model": _model,
  "FoldedBlock": _folded_block,
}
