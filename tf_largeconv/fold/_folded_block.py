"""FoldedBlock's body, shared by both Keras flavours: the block's own weights, folded at
every call into one `tf_largeconv.conv2d`."""

import copy
import dataclasses
import operator

import tensorflow as tf

from tf_largeconv import _args
from tf_largeconv import _loader
from tf_largeconv import _options
from tf_largeconv import ops as _ops
from tf_largeconv._problem import ConvProblem
from tf_largeconv.fold import _composer
from tf_largeconv.fold import _geometry
from tf_largeconv.fold import _graph
from tf_largeconv.fold import _kernels
from tf_largeconv.fold import _report


@dataclasses.dataclass(frozen=True)
class FoldedConv:
  """The one convolution a FoldedBlock computes, from its weights at the time of asking:
  `tf_largeconv.conv2d(x, kernel, strides, [[0, 0], *padding, [0, 0]])` (NHWC) plus `bias`.

  Attributes:
    kernel: [kh, kw, input channels / groups, output channels], differentiable with
      respect to the block's variables.
    bias: [output channels], or None where the block adds none.
    strides: (rows, columns).
    padding: explicit ((top, bottom), (left, right)).
  """

  kernel: tf.Tensor
  bias: tf.Tensor | None
  strides: tuple[int, int]
  padding: tuple[tuple[int, int], tuple[int, int]]


def _explicit_padding(padding):
  """((top, bottom), (left, right)) as non-negative ints, or ValueError naming the form."""
  try:
    pairs = tuple(tuple(operator.index(v) for v in pair) for pair in padding)
  except TypeError:
    pairs = None
  if pairs is None or [len(p) for p in pairs] != [2, 2] or min(min(p) for p in pairs) < 0:
    raise ValueError(
      "padding must be None or explicit ((top, bottom), (left, right)) of non-negative "
      f"ints, got {padding!r}"
    )
  return pairs


class FoldedBlockBase(_options.Settings):
  """The body of the FoldedBlock layers, mixed in before the Keras `Layer` of either flavour
  (which sets `_serialize_block` / `_deserialize_block`).

  At construction the block is folded once in float64 to check it and fix the geometry;
  each call composes the kernel again from the block's variables with TensorFlow ops (so
  gradients reach every original weight) and runs one `tf_largeconv.conv2d`. Only the
  block input (and kernel-sized tensors) are kept for the backward pass.
  """

  __signature__ = _options.ClassSignature()

  def __init__(self, block, exact=True, input_size=None, **kwargs):
    self._init_settings(kwargs)
    super().__init__(**kwargs)
    self.block = block
    self.exact = bool(exact)
    self.input_size = None if input_size is None else tuple(int(s) for s in input_size)
    self._spec = _graph.model_block(block, input_size)
    state, composer = _composer.compose(
      self._spec, _composer.read64, tf.float64, self.exact, count=not self.exact
    )
    self._padding, self._kernel_zeros = _geometry.explicit_geometry(state, self._spec)
    self._strides = tuple(state.stride)
    self.fold_report = _report.report(state, composer, self._spec)
    self._out_channels = state.channels
    self._out_size = state.size
    # Under XLA, 'auto' runs conv2d's portable path (see convolve).
    self.supports_jit = _args.compiles_under_xla(self.algorithm)
    self.built = True

  def folded_conv(self, dtype=None):
    """The `FoldedConv` this layer computes, its kernel and bias composed in `dtype` (None:
    the layer's compute dtype) from the block's current weights."""
    dtype = tf.as_dtype(self.compute_dtype if dtype is None else dtype)
    state, _ = _composer.compose(self._spec, lambda v: v, dtype, exact=False)
    kernel = _kernels.pad_kernel(state.kernel, *self._kernel_zeros)
    return FoldedConv(kernel, state.bias, self._strides, self._padding)

  def convolve(self, inputs, padding=None):
    """The layer's output for `inputs` (NHWC) padded by `padding` (explicit ((top, bottom),
    (left, right)); None: the layer's own): the kernel folded from the current weights, run
    by the op, algorithm and workspace limit the layer's call runs, plus the bias."""
    conv = self.folded_conv(inputs.dtype)
    pads = conv.padding if padding is None else _explicit_padding(padding)
    padding = [[0, 0], list(pads[0]), list(pads[1]), [0, 0]]
    if _args.resolve_algorithm(self.algorithm) == "auto":
      # The op's own planner (direct or FFT), whose workspace stays within the limit.
      # conv2d's "auto" may hand the passes to TensorFlow's kernel, whose gradients take
      # temporaries growing with the image, beyond the plan's estimate: not what a layer
      # for lean training should do by default. Under XLA, without the op library, or
      # while exporting, conv2d's portable path runs.
      options = dict(self.settings(), algorithm="auto")
      problem = ConvProblem.conv2d(list(conv.strides), padding, "NHWC", **options)
      y = _loader.ops().large_conv_conv2d(inputs, conv.kernel, **problem.attrs())
    else:
      y = _ops.conv2d(inputs, conv.kernel, list(conv.strides), padding, **self.settings())
    return y if conv.bias is None else y + conv.bias

  def call(self, inputs):
    return self.convolve(inputs)

  def compute_output_shape(self, input_shape):
    size = list(self._out_size)
    for a in (0, 1):
      if self._strides[a] == 1:  # the size difference is independent of the input size
        h = input_shape[1 + a]
        size[a] = None if h is None else h + self._out_size[a] - self._spec.size[a]
    return (input_shape[0], size[0], size[1], self._out_channels)

  def get_config(self):
    config = super().get_config()
    config.update(
      block=self._serialize_block(self.block),
      exact=self.exact,
      input_size=self.input_size,
    )
    return config

  @classmethod
  def from_config(cls, config):
    config = dict(config)
    # Keras's deserialisation empties the dictionaries it reads: leave the caller's intact.
    config["block"] = cls._deserialize_block(copy.deepcopy(config["block"]))
    return cls(**config)
