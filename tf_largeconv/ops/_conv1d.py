"""`tf_largeconv.conv1d`: tf.nn.conv1d's semantics on the LargeConv ops.

As in TensorFlow, a 1-D convolution is a 2-D one of height 1: the input gets a height-1
axis (batch_shape + [1, width, channels] in NWC, batch_shape + [channels, 1, width] in NCW),
the filter a leading height-1 axis, `tf_largeconv.conv2d` runs with the stride and dilation
on the width axis, and the height axis is squeezed away again. Gradients (first and second
order) are conv2d's. The planner recognises such height-1 geometries and gives their FFT
passes single-row transforms (height exactly 1) long enough for filters of tens of
thousands of taps; `plan_conv1d` shows the plan.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tf_largeconv._options import takes_options
from tf_largeconv._problem import ConvProblem
from tf_largeconv._types import DTypeLike
from tf_largeconv._types import Padding1d
from tf_largeconv._types import ShapeLike
from tf_largeconv._types import TensorLike
from tf_largeconv._types import Window
from tf_largeconv.ops import _conv2d
from tf_largeconv.ops import _dispatch
from tf_largeconv.planning import _plan
from tf_largeconv.planning.types import Plan


@takes_options
def conv1d(
  input: TensorLike,
  filters: TensorLike,
  stride: Window,
  padding: Padding1d,
  data_format: str | None = "NWC",
  dilations: Window | None = None,
  name: str | None = None,
  **options: Any,
) -> tf.Tensor:
  """Computes a 1-D convolution with tf.nn.conv1d's semantics, lean for long filters.

  Same arguments and result as `tf.nn.conv1d`. The filter's in_channels may divide the
  input's channels (a grouped convolution, as tf.nn.conv1d allows through conv2d). Runs
  as `tf_largeconv.conv2d` of height 1; its FFT passes use single-row transforms, which
  makes filters of thousands to tens of thousands of taps cheap.

  Args:
    input: tensor of dtype float16, bfloat16, float32, float64 or int32 and rank >= 3:
      batch_shape + [width, channels] (NWC) or batch_shape + [channels, width] (NCW).
    filters: tensor of the same dtype, [width, in_channels / groups, out_channels].
    stride: int or list of 1 or 3 ints (3 in data_format order, batch and channel entries
      1).
    padding: 'SAME' or 'VALID'; or (beyond tf.nn.conv1d) explicit padding: one
      [before, after] pair for the width, or three pairs in data_format order (batch and
      channel pairs [0, 0]). Keras's causal padding is [[dilation * (width - 1), 0]].
    data_format: 'NWC' (default) or 'NCW' ('NHWC' / 'NCHW' are accepted as aliases, as in
      TensorFlow).
    dilations: int or list of 1 or 3 ints; default 1.
    name: optional name for the operation.
    algorithm, workspace_limit: as for `tf_largeconv.conv2d`.

  Returns:
    A tensor of input's dtype: batch_shape + [out_width, out_channels] for NWC.

  Raises:
    ValueError: malformed stride, dilations, padding, data_format, algorithm or
      workspace_limit; an input of rank < 3 or a filter whose rank is not 3; (while
      tracing) shapes that do not fit together.
    TypeError: unsupported or mismatched dtypes.
    tf.errors.InvalidArgumentError: shapes that do not fit together (eager execution).
  """
  problem = ConvProblem.conv1d(stride, padding, data_format, dilations, **options)
  with tf.name_scope(name or "LargeConv1D"):
    input, filters, problem = _conv2d.operands(problem, input, filters)
    if input.shape.rank is not None and input.shape.rank < 3:
      raise ValueError(
        "input must have rank >= 3: batch_shape + [width, channels] (NWC) or "
        f"batch_shape + [channels, width] (NCW), got shape {input.shape}"
      )
    if filters.shape.rank is not None and filters.shape.rank != 3:
      raise ValueError(
        "filters must be 3-D [width, in_channels / groups, out_channels], got "
        f"shape {filters.shape}"
      )
    # The height axis sits just before the width: -3 from the end in NWC, -2 in NCW.
    height_axis = -3 if problem.data_format == "NHWC" else -2
    x, w = tf.expand_dims(input, height_axis), tf.expand_dims(filters, 0)
    result = _conv2d.run(x, w, problem, _dispatch.eager_key(x, w, (problem,)))
    return tf.squeeze(result, [height_axis])


@takes_options
def plan_conv1d(
  input_shape: ShapeLike,
  filter_shape: ShapeLike,
  stride: Window,
  padding: Padding1d,
  data_format: str | None = "NWC",
  dilations: Window | None = None,
  dtype: DTypeLike = tf.float32,
  *,
  num_threads: int | None = None,
  **options: Any,
) -> Plan:
  """Plans `conv1d` without running it: `tf_largeconv.plan` of its height-1 conv2d.

  The FFT passes of a 1-D convolution plan single-row transforms: `fft_size` is
  (1, width) and `tile` (1, outputs per transform), never a 2-D transform of height > 1.

  Args:
    input_shape: batch_shape + [width, channels] (NWC) or batch_shape + [channels, width].
    filter_shape: [width, in_channels / groups, out_channels].
    stride, padding, data_format, dilations, algorithm, workspace_limit: as for `conv1d`.
    dtype, num_threads: as for `tf_largeconv.plan`.

  Returns:
    A `tf_largeconv.Plan` whose output_shape is the 1-D output's shape; its passes' sizes
    (fft_size, tile, tiles) are those of the height-1 conv2d: (1, width).

  Raises:
    ValueError: as `conv1d` and `tf_largeconv.plan`.
  """
  problem = ConvProblem.conv1d(stride, padding, data_format, dilations, **options)
  input_shape, filter_shape = list(input_shape), list(filter_shape)
  if len(input_shape) < 3:
    raise ValueError(
      "input_shape must have rank >= 3: batch_shape + [width, channels] (NWC) "
      f"or batch_shape + [channels, width] (NCW), got {input_shape}"
    )
  if len(filter_shape) != 3:
    raise ValueError(
      f"filter_shape must be [width, in_channels / groups, out_channels], got {filter_shape}"
    )
  height_axis = len(input_shape) - (2 if problem.data_format == "NHWC" else 1)
  p = _plan.plan_problem(problem.bind(input_shape, filter_shape), dtype, num_threads)
  out = list(p.output_shape)
  p.output_shape = tuple(out[:height_axis] + out[height_axis + 1 :])
  return p
