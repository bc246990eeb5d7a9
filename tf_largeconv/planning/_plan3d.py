"""`tf_largeconv.plan_conv3d`: what the 3-D op will do for given shapes."""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tf_largeconv import _args
from tf_largeconv import _loader
from tf_largeconv._options import takes_options
from tf_largeconv._problem import ConvProblem
from tf_largeconv._types import DTypeLike
from tf_largeconv._types import ShapeLike
from tf_largeconv.planning import device
from tf_largeconv.planning.types import PassPlan
from tf_largeconv.planning.types import Plan


def _shape(value: Any, name: str, form: str) -> list[int]:
  """input_shape or filter_shape (a list, tuple, array or TensorShape) as 5 non-negative
  ints."""
  try:
    values = value.as_list() if isinstance(value, tf.TensorShape) else list(value)
  except (TypeError, ValueError):
    values = None
  if (
    values is None
    or len(values) != 5
    or not all(
      isinstance(v, numbers.Integral) and not isinstance(v, bool) and int(v) >= 0 for v in values
    )
  ):
    raise ValueError(f"{name} must be 5 non-negative ints, {form}, got {name}={value!r}")
  return [int(v) for v in values]


def tf_kernel_eligible(
  input_shape: Sequence[int], filter_shape: Sequence[int], problem: ConvProblem, dtype: tf.DType
) -> bool:
  """Whether TensorFlow's CPU Conv3D kernels (and their gradients) run this convolution:
  NDHWC, dilations 1, floating dtypes, no groups (TF's CPU kernel refuses each of these)."""
  return (
    problem.data_format == "NDHWC"
    and all(d == 1 for d in problem.dilations)
    and dtype.is_floating
    and input_shape[4] == filter_shape[3]
  )


@takes_options
def plan_conv3d(
  input_shape: ShapeLike,
  filter_shape: ShapeLike,
  strides: Sequence[int],
  padding: str,
  data_format: str = "NDHWC",
  dilations: Sequence[int] | None = None,
  dtype: DTypeLike = tf.float32,
  *,
  num_threads: int | None = None,
  **options: Any,
) -> Plan:
  """Plans `conv3d` without running it: what each of its three passes will do.

  The same C++ planner the LargeConv 3-D kernels call (on the CPU), so the plan is the
  op's: per pass the algorithm, the 3-D transform size (depth x height x width), the tile
  of outputs each transform yields and the tiles per dimension, channel blocks, slots, the
  exact workspace bytes (what the op takes through TensorFlow's allocator, never more than
  workspace_limit), GFLOP, and the cost model's single-thread estimate of each algorithm
  (why it chose what it chose). `print()` it for a table.

  Args:
    input_shape: 5 ints in data_format order: [batch, depth, height, width, channels]
      (NDHWC) or [batch, channels, depth, height, width] (NCDHW).
    filter_shape: [depth, height, width, in_channels / groups, out_channels].
    strides, padding, data_format, dilations, algorithm, workspace_limit: as for
      `tf_largeconv.conv3d`. algorithm='tf' (tf.nn.conv3d) plans TensorFlow's kernel,
      where its CPU kernel runs the convolution; its temporary memory is TensorFlow's, shown
      as an estimate.
    dtype: the tensors' dtype (float16/bfloat16/float32 compute in float32; int32 is summed
      exactly, by the direct kernels only).
    num_threads: threads to plan for; default: TensorFlow's intra-op thread count.

  Returns:
    A `tf_largeconv.Plan` whose output_shape is conv3d's result shape; its passes' sizes
    (fft_size, tile, tiles) have 3 entries (depth, height, width).

  Raises:
    ValueError: malformed arguments (naming the argument), shapes that do not fit together,
      algorithm='fft' with int32, algorithm='portable' (stock TF ops, which the plan does
      not describe), algorithm='tf' where TensorFlow's CPU kernel cannot run the
      convolution, or a workspace_limit that even the smallest FFT plan exceeds when
      algorithm='fft' (the message gives the minimum).
    NotImplementedError: strides or dilations other than 1 in the batch or channel
      dimension, as TensorFlow (the op raises UnimplementedError).
  """
  problem = ConvProblem.conv3d(strides, padding, data_format, dilations, **options)
  if problem.algorithm == _args.PORTABLE:
    raise ValueError(
      "algorithm='portable' runs stock TensorFlow ops, not the LargeConv ops "
      "that plan_conv3d() describes; plan with algorithm='auto', 'direct', "
      "'fft' or 'tf'"
    )
  x = _shape(
    input_shape,
    "input_shape",
    "[batch, depth, height, width, channels] (NDHWC) "
    "or [batch, channels, depth, height, width] (NCDHW)",
  )
  f = _shape(
    filter_shape, "filter_shape", "[depth, height, width, in_channels / groups, out_channels]"
  )
  problem = problem.bind(x, f)
  dtype = _args.normalize_dtype(dtype)
  threads = int(num_threads) if num_threads else device.intra_op_threads()
  try:
    geometry = problem.geometry()
    passes = problem.plan(num_threads=threads, dtype=dtype.name, allow_tf=_allow_tf(problem, dtype))
  except (ValueError, NotImplementedError) as e:
    raise type(e)(f"input_shape {x}, filter_shape {f}: {e}") from None
  return Plan(
    [PassPlan(d) for d in passes],
    geometry["output_shape"],
    problem.workspace_bound,
    threads,
    _loader.failure(),
  )


def _allow_tf(problem: ConvProblem, dtype: tf.DType) -> bool:
  """Whether the planner may plan TensorFlow's kernel: where algorithm='tf' asks for it,
  which raises ValueError unless TF's CPU kernel runs this bound 3-D problem."""
  if problem.algorithm != "tf":
    return False
  x, f = ([v or 0 for v in shape] for shape in problem.shapes())  # known: planned
  as_ndhwc = x if problem.data_format == "NDHWC" else [x[0], x[2], x[3], x[4], x[1]]
  if not tf_kernel_eligible(as_ndhwc, f, problem, dtype):
    raise ValueError(
      "algorithm='tf' runs tf.nn.conv3d, whose CPU kernel needs NDHWC, dilations 1, a "
      "floating dtype and no groups; got "
      f"data_format={problem.data_format!r}, dilations={list(problem.dilations)}, dtype "
      f"{dtype.name}, input channels {as_ndhwc[4]} and filter in-channels {f[3]}"
    )
  return True
