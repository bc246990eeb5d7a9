"""fold(): a block as one Large layer of the caller's Keras flavour, with its weights set."""

import dataclasses
import warnings

import tensorflow as tf

from tf_largeconv._options import public_options
from tf_largeconv.fold import _composer
from tf_largeconv.fold import _geometry
from tf_largeconv.fold import _graph
from tf_largeconv.fold import _kernels
from tf_largeconv.fold import _report


@dataclasses.dataclass(frozen=True)
class Flavour:
  """What a Keras flavour supplies: its Input/Model and the Large layer classes."""

  input: object  # keras.Input
  model: type  # keras.Model
  conv: type  # LargeConv2D
  depthwise: type  # LargeDepthwiseConv2D


def large_layer(state, composer, block, flavour, dtype, name, options):
  """The Large layer computing `state` from the block input, with its weights set;
  `options`: the package's options by keyword, for the layer."""
  padding, ext = _geometry.keras_geometry(state, block)
  kernel = _kernels.pad_kernel(state.kernel, *ext).numpy()
  c0, c, g = block.channels, state.channels, state.groups
  kh, kw = kernel.shape[:2]
  common = dict(
    kernel_size=(kh, kw),
    strides=state.stride,
    padding=padding,
    use_bias=state.bias is not None,
    activation=composer.activation,
    dtype=dtype,
    name=name,
    **options,
  )
  if g == c0 and c0 > 1:
    layer = flavour.depthwise(depth_multiplier=c // c0, **common)
    kernel = kernel.reshape(kh, kw, c0, c // c0)
  else:
    layer = flavour.conv(filters=c, groups=g, **common)
  shape = tuple(s if block.known else None for s in block.size)
  layer.build((None,) + shape + (c0,))
  layer.set_weights([kernel] + ([state.bias.numpy()] if state.bias is not None else []))
  return layer


def fold(model, flavour, exact=True, input_size=None, dtype=None, *, name=None, **options):
  """See `tf_largeconv.keras.fold`."""
  public_options(options)  # bad options are refused before any work
  block = _graph.model_block(model, input_size)
  state, composer = _composer.compose(block, _composer.read64, tf.float64, exact, count=not exact)
  layer = large_layer(state, composer, block, flavour, dtype, name, options)
  report = _report.report(state, composer, block)
  if report is not None:
    layer.fold_report = report
    if report.differing_pixels:
      warnings.warn(
        f"fold(exact=False): {report.differing_pixels} of {report.total_pixels} "
        f"output pixels differ from block '{model.name}' at the border (input "
        f"size {report.input_size}): " + "; ".join(report.reasons),
        _report.FoldWarning,
        stacklevel=3,
      )
  return layer
