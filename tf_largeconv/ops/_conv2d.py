"""conv2d, depthwise_conv2d and conv2d's two gradients: tf.nn's signatures on the
LargeConv 2-D ops.

Which kernel runs each pass is chosen in `_dispatch`; the registered gradients are in
`tf_largeconv.ops.gradients`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tf_largeconv import _args
from tf_largeconv import _loader
from tf_largeconv._options import takes_options
from tf_largeconv._problem import ConvProblem
from tf_largeconv._types import Padding
from tf_largeconv._types import TensorLike
from tf_largeconv._types import Window
from tf_largeconv.ops import _dispatch
from tf_largeconv.ops import _portable2d
from tf_largeconv.ops import _routing


def _known(static: tf.TensorShape, dynamic: tf.Tensor) -> list[int] | tf.Tensor:
  """The sizes of `static` (a TensorShape) as a list where all are known, else `dynamic`."""
  return static.as_list() if static.is_fully_defined() else dynamic


def _joined(*parts: list[int] | tf.Tensor) -> list[int] | tf.Tensor:
  """Shape parts (lists or int32 tensors) as one list, or one tensor if any is a tensor."""
  if all(isinstance(p, list) for p in parts):
    return sum(parts, [])
  return tf.concat(parts, 0)


def _merge_batch_dims(input: tf.Tensor, op: Callable[[tf.Tensor], tf.Tensor]) -> tf.Tensor:
  """Runs `op` on `input` with its batch dimensions merged into one.

  tf.nn.conv2d takes inputs of rank >= 4: batch_shape + 3 inner dimensions ([H, W, C] in
  NHWC, [C, H, W] in NCHW). The batch dimensions are merged by a reshape (no copy, and its
  gradient is a reshape too), and split again in `op`'s result. Inputs of rank 4 or of
  unknown rank go to `op` as they are.
  """
  rank = input.shape.rank
  if rank is None or rank <= 4:
    return op(input)
  batch_shape = input.shape[:-3]
  batch = _known(batch_shape, tf.shape(input)[:-3])
  # The merged size is given, never -1, which a reshape cannot infer for empty inputs.
  merged = [batch_shape.num_elements()] if isinstance(batch, list) else [tf.reduce_prod(batch)]
  inner = _known(input.shape[-3:], tf.shape(input)[-3:])
  output = op(tf.reshape(input, _joined(merged, inner)))
  out_inner = _known(output.shape[1:], tf.shape(output)[1:])
  result = tf.reshape(output, _joined(batch, out_inner))
  result.set_shape(batch_shape.concatenate(output.shape[1:]))
  return result


@takes_options
def conv2d(
  input: TensorLike,
  filters: TensorLike,
  strides: Window,
  padding: Padding,
  data_format: str | None = "NHWC",
  dilations: Window | None = None,
  name: str | None = None,
  **options: Any,
) -> tf.Tensor:
  """Computes a 2-D convolution with tf.nn.conv2d's semantics, lean for large filters.

  Same arguments and result as `tf.nn.conv2d`. Unlike TF's CPU kernels, NCHW and dilated
  gradients work on the CPU too, and a grouped convolution is computed when the filter's
  in-depth divides the input depth.

  Args:
    input: tensor of dtype float16, bfloat16, float32, float64 or int32 and rank >= 4:
      batch_shape + [height, width, channels] (NHWC) or batch_shape + [channels, height,
      width] (NCHW); extra leading batch dimensions are merged by a reshape, as
      tf.nn.conv2d does. int32 is summed exactly, wrapping modulo 2^32 as TensorFlow's
      kernel does, by the direct kernels.
    filters: tensor of the same dtype, shape [height, width, in_channels / groups,
      out_channels].
    strides: int or list of 1, 2 or 4 ints: the window stride (4 ints in data_format order,
      batch and depth entries 1).
    padding: 'SAME', 'VALID', or a list of four [before, after] pairs in data_format order
      (explicit padding; batch and depth pairs [0, 0]).
    data_format: 'NHWC' (default) or 'NCHW'.
    dilations: int or list of 1, 2 or 4 ints: the filter dilation; default 1.
    name: optional name for the operation.
    algorithm: 'auto' (the planner's choice per pass), 'direct', 'fft' (floating dtypes
      only), 'tf' or 'portable' (stock TF ops only: FFT overlap-save in `tf.signal`,
      floating dtypes, static image and filter shapes). Under XLA compilation
      (jit_compile=True) 'auto' runs 'portable' and 'direct'/'fft' raise ValueError.
      Gradients use the same setting. An eager 'auto' call (keep_memory True) whose filter
      tensor is among the last few of calls with the same shapes and arguments may run the
      forward pass through the op's FFT with the filter spectra it kept (see
      `tf_largeconv.planning.kept_spectra`), where the first call ran TensorFlow's kernel
      or the op's direct kernels: results then differ in the last bits.
    workspace_limit: hard bound in bytes on the temporary memory of each pass (forward and
      both gradients); None means 64 MiB. See `tf_largeconv.plan`.
    keep_memory: whether a CPU call may keep memory for later calls: its workspace in the
      pool of idle workspaces (up to LARGECONV_WORKSPACE_POOL_MIB, default 128 MiB) and its
      filter spectra (up to LARGECONV_SPECTRUM_CACHE_MIB, default 64 MiB), which spare
      later calls the allocation and the filter's transforms. False frees both when the
      call returns (it still uses spectra an earlier call kept): a call then holds its
      output and at most workspace_limit. Gradients use the same setting.

  Returns:
    A tensor of input's dtype: batch_shape + [out_height, out_width, out_channels] for NHWC.

  Raises:
    ValueError: malformed strides, dilations, padding, data_format, algorithm or
      workspace_limit, algorithm='fft' with int32, or (while tracing a graph) shapes that
      do not fit together.
    TypeError: unsupported or mismatched dtypes.
    tf.errors.InvalidArgumentError: shapes that do not fit together (eager execution).
  """
  key = _dispatch.eager_key(
    input, filters, (strides, padding, data_format, dilations, *options.items())
  )
  kernel = _dispatch.EAGER_KERNELS.get(key) if key is not None else None
  if kernel is not None:
    return kernel(input, filters)
  problem = ConvProblem.conv2d(strides, padding, data_format, dilations, **options)
  with tf.name_scope(name or "LargeConv2D"):
    input, filters, problem = operands(problem, input, filters)
    return run(input, filters, problem, key)


def operands(
  problem: ConvProblem, a: TensorLike, b: TensorLike
) -> tuple[tf.Tensor, tf.Tensor, ConvProblem]:
  """What every 2-D op does with its two data operands before it runs: the algorithm
  resolved under the current context, the operands as tensors of one dtype (`a`'s), and
  that dtype checked against the problem."""
  problem = problem.resolved()
  a, b = _args.as_tensors(a, b)
  return a, b, problem.for_dtype(a.dtype)


def run(
  input: tf.Tensor, filters: tf.Tensor, problem: ConvProblem, key: tuple | None = None
) -> tf.Tensor:
  """conv2d of tensors for a resolved problem checked for their dtype; input of rank >= 4
  (extra batch dimensions merged). With the eager cache's `key`, the kernel is kept."""
  if problem.algorithm == _args.PORTABLE:
    return _merge_batch_dims(input, lambda x: _portable2d.conv2d(x, filters, problem))
  if key is not None and input.shape.rank == 4:
    kernel = _dispatch.kernel_for(input, filters, problem, eager=True)
    return _dispatch.remember(key, kernel)(input, filters)
  return _merge_batch_dims(input, lambda x: _dispatch.kernel_for(x, filters, problem)(x, filters))


def _static_list(t: tf.Tensor) -> list[int] | None:
  value = tf.get_static_value(t)
  return None if value is None else [int(v) for v in value]


@takes_options
def depthwise_conv2d(
  input: TensorLike,
  filter: TensorLike,
  strides: Window,
  padding: Padding,
  data_format: str | None = None,
  dilations: Window | None = None,
  name: str | None = None,
  **options: Any,
) -> tf.Tensor:
  """Depthwise 2-D convolution with tf.nn.depthwise_conv2d's semantics.

  Each input channel c is convolved with its own `channel_multiplier` filters; output
  channel c * channel_multiplier + m comes from filter[:, :, c, m]. Unlike
  tf.nn.depthwise_conv2d this also supports unequal strides, strides together with
  dilations (which TF computes wrongly, with a warning) and extra leading batch dimensions
  (as tf.nn.conv2d does), on the CPU in NHWC and NCHW. It is the grouped convolution with
  one group per input channel.

  Args:
    input: tensor of rank >= 4 in data_format order (batch_shape + 3 dimensions),
      float16/bfloat16/float32/float64 (as tf.nn.depthwise_conv2d, no int32).
    filter: tensor of the same dtype, [height, width, in_channels, channel_multiplier].
    strides: int or list of 1, 2 or 4 ints (4 in data_format order).
    padding: 'SAME', 'VALID', or four [before, after] pairs in data_format order.
    data_format: 'NHWC' (default when None) or 'NCHW'.
    dilations: int or list of 1, 2 (TF's `rate`) or 4 ints; default 1.
    name: optional name for the operation.
    algorithm, workspace_limit: as for `conv2d`.

  Returns:
    A tensor with in_channels * channel_multiplier output channels.

  Raises:
    ValueError: malformed arguments, an input of rank < 4, or a filter whose in_channels
      differs from the input's depth (or whose rank is not 4).
    TypeError: a dtype tf.nn.depthwise_conv2d does not take, or mismatched dtypes.
    tf.errors.InvalidArgumentError: the same mismatch found only at run time.
  """
  problem = ConvProblem.depthwise(strides, padding, data_format, dilations, **options)
  with tf.name_scope(name or "LargeDepthwiseConv2D"):
    input, filter, problem = operands(problem, input, filter)
    if input.shape.rank is not None and input.shape.rank < 4:
      raise ValueError(
        "input must be 4-dimensional (or have more leading batch dimensions), "
        f"got shape {input.shape}"
      )
    axis = _args.channel_axis_from_end(problem.data_format)
    depth = input.shape[axis] if input.shape.rank is not None else None
    checks = []
    if filter.shape.rank == 4 and (depth is None or filter.shape[2] is None):
      checks.append(
        tf.debugging.assert_equal(
          tf.shape(input)[axis],
          tf.shape(filter)[2],
          message="filter in_channels (dimension 2) must equal the input depth",
        )
      )
    with tf.control_dependencies(checks):
      grouped = _args.grouped_filter(filter, depth)
    return run(input, grouped, problem.replace(kind="conv2d"))


def _required(**values: object) -> None:
  """Raises ValueError naming the first argument given as None (TF's defaults, which it
  refuses too)."""
  for name, value in values.items():
    if value is None:
      raise ValueError(f"{name} is required")


def _cudnn_flag(use_cudnn_on_gpu: object) -> None:
  if not isinstance(use_cudnn_on_gpu, bool):
    raise ValueError(f"use_cudnn_on_gpu must be a bool, got use_cudnn_on_gpu={use_cudnn_on_gpu!r}")


@takes_options
def conv2d_backprop_input(
  input_sizes: TensorLike,
  filter: TensorLike | None = None,
  out_backprop: TensorLike | None = None,
  strides: Window | None = None,
  padding: Padding | None = None,
  use_cudnn_on_gpu: bool = True,
  data_format: str | None = "NHWC",
  dilations: Window | None = None,
  name: str | None = None,
  filters: TensorLike | None = None,
  **options: Any,
) -> tf.Tensor:
  """Gradient of `conv2d` with respect to its input.

  Has TensorFlow 2's tf.compat.v1.nn.conv2d_backprop_input's signature (TensorFlow 2 has
  no tf.nn.conv2d_backprop_input): the same positional arguments in the same order
  (use_cudnn_on_gpu sixth, accepted and ignored), the filter as `filter=` or, as there,
  `filters=`; then the keyword-only options (`algorithm`, `workspace_limit`,
  `keep_memory`). Beyond TF's, strides and dilations may be an int or 1 or 2 ints, as for
  `conv2d`.

  Args:
    input_sizes: int32 vector of 4: the shape of the convolution's input; or of 2, its
      height and width (batch from out_backprop, depth from the filter's dimension 2), as
      TF accepts.
    filter: the convolution's filter (float16, bfloat16, float32, float64 or int32).
    out_backprop: gradient with respect to the convolution's output.
    strides, padding, data_format, dilations: as for `conv2d`.
    use_cudnn_on_gpu: a bool, ignored.
    name: optional name for the operation.
    filters: another name for `filter` (give one of them).
    algorithm, workspace_limit: as for `conv2d`.

  Returns:
    Gradient with respect to the input, shaped `input_sizes`.

  Raises:
    ValueError: both or neither of filter and filters, a missing out_backprop, strides or
      padding, and as for `conv2d`.
    TypeError: as for `conv2d`.
  """
  if filter is not None and filters is not None:
    raise ValueError("give the filter as filter= or filters=, not both")
  filter = filters if filter is None else filter
  _required(filter=filter, out_backprop=out_backprop, strides=strides, padding=padding)
  _cudnn_flag(use_cudnn_on_gpu)
  problem = ConvProblem.conv2d(strides, padding, data_format, dilations, **options)
  with tf.name_scope(name or "LargeConv2DBackpropInput"):
    out_backprop, filter, problem = operands(problem, out_backprop, filter)
    input_sizes = tf.convert_to_tensor(input_sizes, dtype=tf.int32, name="input_sizes")
    return backprop_input(input_sizes, filter, out_backprop, problem)


def backprop_input(
  input_sizes: tf.Tensor, filters: tf.Tensor, out_backprop: tf.Tensor, problem: ConvProblem
) -> tf.Tensor:
  """conv2d's input gradient of tensors for a resolved problem checked for their dtype."""
  if problem.algorithm == _args.PORTABLE:
    return _portable2d.backprop_input(input_sizes, filters, out_backprop, problem)
  if problem.algorithm == "tf":
    sizes = _static_list(input_sizes)
    f_shape = filters.shape.as_list() if filters.shape.rank is not None else None
    if sizes is not None and len(sizes) == 2 and f_shape:  # batch and depth implied
      nchw = problem.data_format == "NCHW"
      sizes = ([0, f_shape[2]] + sizes) if nchw else ([0] + sizes + [f_shape[2]])
    _routing.check_tf_kernel(sizes, f_shape, out_backprop.dtype, out_backprop, problem)
    return tf.compat.v1.nn.conv2d_backprop_input(
      input_sizes, filters, out_backprop, **problem.tf_kwargs()
    )
  return _loader.ops().large_conv_conv2d_backprop_input(
    input_sizes, filters, out_backprop, **problem.attrs()
  )


@takes_options
def conv2d_backprop_filter(
  input: TensorLike,
  filter_sizes: TensorLike,
  out_backprop: TensorLike,
  strides: Window,
  padding: Padding,
  use_cudnn_on_gpu: bool = True,
  data_format: str | None = "NHWC",
  dilations: Window | None = None,
  name: str | None = None,
  **options: Any,
) -> tf.Tensor:
  """Gradient of `conv2d` with respect to its filter.

  Has TensorFlow 2's tf.compat.v1.nn.conv2d_backprop_filter's signature (TensorFlow 2 has
  no tf.nn.conv2d_backprop_filter): the same positional arguments in the same order
  (use_cudnn_on_gpu sixth, accepted and ignored), then the keyword-only `algorithm` and
  `workspace_limit`. Beyond TF's, strides and dilations may be an int or 1 or 2 ints, as
  for `conv2d`.

  Args:
    input: the convolution's input (float16, bfloat16, float32, float64 or int32).
    filter_sizes: int32 vector of 4: the filter's shape.
    out_backprop: gradient with respect to the convolution's output.
    strides, padding, data_format, dilations: as for `conv2d`.
    use_cudnn_on_gpu: a bool, ignored.
    name: optional name for the operation.
    algorithm, workspace_limit: as for `conv2d`.

  Returns:
    Gradient with respect to the filter, shaped `filter_sizes`.
  """
  _cudnn_flag(use_cudnn_on_gpu)
  problem = ConvProblem.conv2d(strides, padding, data_format, dilations, **options)
  with tf.name_scope(name or "LargeConv2DBackpropFilter"):
    input, out_backprop, problem = operands(problem, input, out_backprop)
    filter_sizes = tf.convert_to_tensor(filter_sizes, dtype=tf.int32, name="filter_sizes")
    if problem.algorithm == _args.PORTABLE:
      return _portable2d.backprop_filter(input, filter_sizes, out_backprop, problem)
    if problem.algorithm == "tf":
      x_shape = input.shape.as_list() if input.shape.rank == 4 else None
      _routing.check_tf_kernel(x_shape, _static_list(filter_sizes), input.dtype, input, problem)
      return tf.compat.v1.nn.conv2d_backprop_filter(
        input, filter_sizes, out_backprop, **problem.tf_kwargs()
      )
    return _loader.ops().large_conv_conv2d_backprop_filter(
      input, filter_sizes, out_backprop, **problem.attrs()
    )
