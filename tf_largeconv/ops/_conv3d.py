"""`tf_largeconv.conv3d`: tf.nn.conv3d's semantics on the LargeConv 3-D ops.

The ops run the core's 3-D kernels (direct, or FFT overlap-save over volumes, chosen per
pass by the planner under a hard workspace limit); their gradients, to second order, are
registered by `tf_largeconv.ops.gradients`. `tf_largeconv.plan_conv3d` shows what the op
will do for given shapes: the same C++ planner the kernels call, per pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tf_largeconv import _args
from tf_largeconv import _loader
from tf_largeconv._options import takes_options
from tf_largeconv._problem import ConvProblem
from tf_largeconv._types import TensorLike


@takes_options
def conv3d(
  input: TensorLike,
  filters: TensorLike,
  strides: Sequence[int],
  padding: str,
  data_format: str = "NDHWC",
  dilations: Sequence[int] | None = None,
  name: str | None = None,
  **options: Any,
) -> tf.Tensor:
  """Computes a 3-D convolution with tf.nn.conv3d's semantics, lean for large filters.

  Same arguments and result as `tf.nn.conv3d`; a grouped convolution is computed when the
  filter's in-depth divides the input depth (depthwise when it is 1), and NCDHW, dilations
  and their gradients work on the CPU.

  Args:
    input: 5-D tensor of dtype float16, bfloat16, float32, float64 or int32: [batch, depth,
      height, width, channels] (NDHWC) or [batch, channels, depth, height, width] (NCDHW).
      int32 is summed exactly (modulo 2^32) by the direct kernels.
    filters: tensor of the same dtype, shape [depth, height, width, in_channels / groups,
      out_channels].
    strides: list of 5 ints in data_format order, batch and channel entries 1.
    padding: 'SAME' or 'VALID'.
    data_format: 'NDHWC' (default) or 'NCDHW'.
    dilations: list of 5 ints in data_format order (batch and channel entries 1); None
      means no dilation.
    name: optional name for the operation.
    algorithm: 'auto' (the planner's choice per pass), 'direct', 'fft' (floating dtypes
      only), or 'tf' / 'portable' (TensorFlow's own tf.nn.conv3d). Gradients use the same
      setting. Under XLA compilation 'auto' runs tf.nn.conv3d.
    workspace_limit: hard bound in bytes on the temporary memory of each pass (forward and
      both gradients); None means 64 MiB.

  Returns:
    A tensor of input's dtype: [batch, out_depth, out_height, out_width, out_channels] for
    NDHWC.

  Raises:
    ValueError: malformed strides, dilations, padding, data_format, algorithm or
      workspace_limit, or algorithm='fft' with int32.
    TypeError: unsupported or mismatched dtypes.
    tf.errors.InvalidArgumentError: shapes that do not fit together (eager execution).
  """
  problem = ConvProblem.conv3d(strides, padding, data_format, dilations, **options).resolved()
  with tf.name_scope(name or "LargeConv3D"):
    input, filters = _args.as_tensors(input, filters)
    problem = problem.for_dtype(input.dtype)
    if problem.algorithm in ("tf", _args.PORTABLE):  # TensorFlow's own kernels
      return tf.nn.conv3d(input, filters, **problem.tf_kwargs())
    return _loader.ops().large_conv_conv3d(input, filters, **problem.attrs())
