"""FoldedBlock's body, shared by both Keras flavours: the block's own weights, folded at
every call into one `tf_largeconv.conv2d`."""

import copy

import tensorflow as tf

from tf_largeconv import _args
from tf_largeconv import _loader
from tf_largeconv import ops as _ops
from tf_largeconv._problem import ConvProblem
from tf_largeconv.fold import _composer
from tf_largeconv.fold import _geometry
from tf_largeconv.fold import _graph
from tf_largeconv.fold import _kernels
from tf_largeconv.fold import _report


class FoldedBlockBase:
  """The body of the FoldedBlock layers, mixed in before the Keras `Layer` of either flavour
  (which sets `_serialize_block` / `_deserialize_block`).

  At construction the block is folded once in float64 to check it and fix the geometry;
  each call composes the kernel again from the block's variables with TensorFlow ops (so
  gradients reach every original weight) and runs one `tf_largeconv.conv2d`. Only the
  block input (and kernel-sized tensors) are kept for the backward pass.
  """

  def __init__(
    self, block, exact=True, input_size=None, algorithm="auto", workspace_limit=None, **kwargs
  ):
    super().__init__(**kwargs)
    self.algorithm = _args.normalize_algorithm(algorithm)
    _args.normalize_workspace_limit(workspace_limit)
    self.workspace_limit = workspace_limit
    self.block = block
    self.exact = bool(exact)
    self.input_size = None if input_size is None else tuple(int(s) for s in input_size)
    spec = _graph.model_block(block, input_size)
    state, composer = _composer.compose(
      spec, _composer.read64, tf.float64, self.exact, count=not self.exact
    )
    self._fold_spec = (spec,) + _geometry.explicit_geometry(state, spec) + (state.stride,)
    self.fold_report = _report.report(state, composer, spec)
    self._out_channels = state.channels
    self._out_size = state.size
    # Under XLA, 'auto' runs conv2d's portable path (see call).
    self.supports_jit = _args.compiles_under_xla(self.algorithm)
    self.built = True

  def call(self, inputs):
    spec, pads, ext, strides = self._fold_spec
    state, _ = _composer.compose(spec, lambda v: v, inputs.dtype, exact=False)
    kernel = _kernels.pad_kernel(state.kernel, *ext)
    padding = [[0, 0], list(pads[0]), list(pads[1]), [0, 0]]
    if _args.resolve_algorithm(self.algorithm) == "auto":
      # The op's own planner (direct or FFT), whose workspace stays within the limit.
      # conv2d's "auto" may hand the passes to TensorFlow's kernel, whose gradients take
      # temporaries growing with the image, beyond the plan's estimate: not what a layer
      # for lean training should do by default. Under XLA, without the op library, or
      # while exporting, conv2d's portable path runs.
      problem = ConvProblem.conv2d(
        list(strides), padding, "NHWC", None, "auto", self.workspace_limit
      )
      y = _loader.ops().large_conv_conv2d(inputs, kernel, **problem.attrs())
    else:
      y = _ops.conv2d(
        inputs,
        kernel,
        list(strides),
        padding,
        algorithm=self.algorithm,
        workspace_limit=self.workspace_limit,
      )
    return y if state.bias is None else y + state.bias

  def compute_output_shape(self, input_shape):
    spec, _, _, strides = self._fold_spec
    size = list(self._out_size)
    for a in (0, 1):
      if strides[a] == 1:  # the size difference is independent of the input size
        h = input_shape[1 + a]
        size[a] = None if h is None else h + self._out_size[a] - spec.size[a]
    return (input_shape[0], size[0], size[1], self._out_channels)

  def get_config(self):
    config = super().get_config()
    config.update(
      block=self._serialize_block(self.block),
      exact=self.exact,
      input_size=self.input_size,
      algorithm=self.algorithm,
      workspace_limit=self.workspace_limit,
    )
    return config

  @classmethod
  def from_config(cls, config):
    config = dict(config)
    # Keras's deserialisation empties the dictionaries it reads: leave the caller's intact.
    config["block"] = cls._deserialize_block(copy.deepcopy(config["block"]))
    return cls(**config)
