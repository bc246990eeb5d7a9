"""conv2d_transpose's shapes: its output_shape argument, the checks that name the
transpose's arguments where the shapes do not fit, and `plan_transpose`."""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tf_largeconv import _loader
from tf_largeconv._options import takes_options
from tf_largeconv._problem import ConvProblem
from tf_largeconv._types import DTypeLike
from tf_largeconv._types import Padding
from tf_largeconv._types import ShapeLike
from tf_largeconv._types import TensorLike
from tf_largeconv._types import Window
from tf_largeconv.ops import _portable2d
from tf_largeconv.planning import _plan
from tf_largeconv.planning.types import Plan

_CORE = _loader.core()


def output_shape_tensor(output_shape: TensorLike) -> tf.Tensor:
  """output_shape as an int32 tensor (ints, or an integer tensor)."""
  if isinstance(output_shape, (tf.Tensor, tf.Variable)) and output_shape.dtype != tf.int32:
    if not output_shape.dtype.is_integer:
      raise TypeError(
        f"output_shape must be a 1-D tensor of ints, got dtype {output_shape.dtype.name}"
      )
    return tf.cast(output_shape, tf.int32, name="output_shape")
  try:
    return tf.convert_to_tensor(output_shape, dtype=tf.int32, name="output_shape")
  except (TypeError, ValueError) as e:
    raise TypeError(
      f"output_shape must be a 1-D tensor or list of ints, got output_shape={output_shape!r} ({e})"
    ) from None


def _shape_error(message: str) -> Exception:
  """A shape mismatch, raised as TensorFlow raises it: InvalidArgumentError when eager,
  ValueError while tracing."""
  return _portable2d.op_error(ValueError(message))


def check_shapes(
  input: tf.Tensor, filters: tf.Tensor, output_shape: tf.Tensor, problem: ConvProblem
) -> list[int | None]:
  """Checks what is known of the three shapes; returns the result's static shape (a list,
  None where unknown)."""
  c_axis, hw = problem.channel_axis, problem.spatial_axes
  for what, shape, form in (
    (
      "input",
      input.shape,
      "[batch, height, width, in_channels] (NHWC) or [batch, in_channels, height, width] (NCHW)",
    ),
    ("filters", filters.shape, "[height, width, output_channels, in_channels]"),
  ):
    if shape.rank is not None and shape.rank != 4:
      raise _shape_error(
        f"{what} must be 4-D {form}, got shape {shape}. {what} must be "
        f"4-dimensional. Shape must be rank 4 but is rank {shape.rank}"
      )
  x = input.shape.as_list() if input.shape.rank is not None else [None] * 4
  f = filters.shape.as_list() if filters.shape.rank is not None else [None] * 4
  if x[c_axis] is not None and f[3] is not None and x[c_axis] != f[3]:
    raise _shape_error(
      f"filters dimension 3 (in_channels) {f[3]} must equal the input depth {x[c_axis]}: "
      f"input channels does not match filter's input channels, {x[c_axis]} != {f[3]}"
    )
  if output_shape.shape.rank is not None and (
    output_shape.shape.rank != 1 or output_shape.shape[0] not in (None, 2, 4)
  ):
    raise _shape_error(
      "output_shape must be a vector of 4 sizes in data_format order (or 2: height and "
      f"width), got shape {output_shape.shape}. Conv2DBackpropInput requires input_sizes "
      "to contain 4 values or 2 values"
    )
  value = tf.get_static_value(output_shape, partial=True)
  out: list[int | None]
  if value is None or value.ndim != 1:
    out = [None] * 4
  else:
    sizes = [None if v is None else int(v) for v in value]
    for v in sizes:
      if v is not None and v < 0:
        raise _shape_error(
          f"output_shape must be non-negative, got {sizes}. Conv2DBackprop"
          "Input: elements of input_sizes must be >= 0"
        )
    if len(sizes) == 2:
      out = [None] * 4
      out[hw[0]], out[hw[1]] = sizes
      out[c_axis] = f[2]
    else:
      out = sizes
  if out[0] is None:
    out[0] = x[0]
  elif x[0] is not None and out[0] != x[0]:
    raise _shape_error(
      f"output_shape's batch {out[0]} must equal the input's batch {x[0]} "
      f"(output_shape {out}, input shape {x})"
    )
  depth = out[c_axis]
  if (
    depth is not None
    and f[2] is not None
    and ((f[2] == 0 and depth != 0) or (f[2] > 0 and depth % f[2] != 0))
  ):
    raise _shape_error(
      f"output_shape's depth {depth} must be a multiple of the filters' dimension 2 "
      f"(output_channels) {f[2]}: output_shape does not match filter's output channels, "
      f"{depth} != {f[2]}"
    )
  _check_spatial(x, f, out, problem)
  return out


def _check_spatial(
  x: Sequence[int | None],
  f: Sequence[int | None],
  out: Sequence[int | None],
  problem: ConvProblem,
  raised: Callable[[Exception], Exception] = _portable2d.op_error,
) -> None:
  """Where they are all known, checks that the conv2d of an output_shape tensor gives
  input's height and width; `raised` turns the ValueError into the error raised."""
  c_axis, hw = problem.channel_axis, problem.spatial_axes
  if None in f or any(out[i] is None or x[i] is None for i in hw):
    return
  conv_input = list(out)
  conv_input[0] = 1
  if conv_input[c_axis] is None:
    conv_input[c_axis] = f[2]
  try:
    want = problem.bind(conv_input, f).geometry()["output_shape"]
  except (ValueError, NotImplementedError) as e:
    raise raised(type(e)(f"for output_shape {out} and filters {f}: {e}")) from None
  if any(want[i] != x[i] for i in hw):
    raise raised(
      ValueError(
        f"output_shape {out} does not fit the input's shape {x}: the conv2d that this "
        f"transposes maps a tensor of output_shape to height {want[hw[0]]} and width "
        f"{want[hw[1]]}, so input must have them. Size of out_backprop doesn't match "
        "computed"
      )
    )


@takes_options
def plan_transpose(
  input_shape: ShapeLike,
  filter_shape: ShapeLike,
  output_shape: ShapeLike,
  strides: Window,
  padding: Padding = "SAME",
  data_format: str | None = "NHWC",
  dilations: Window | None = None,
  dtype: DTypeLike = tf.float32,
  *,
  num_threads: int | None = None,
  **options: Any,
) -> Plan:
  """Plans `conv2d_transpose` without running it: the plan of the conv2d it transposes.

  The transpose's forward pass is that conv2d's backprop_input pass, its gradient with
  respect to input that conv2d's forward pass, and its gradient with respect to filters
  that conv2d's backprop_filter pass (with the roles of image and output gradient
  swapped), so the returned `Plan` (`tf_largeconv.plan` of the conv2d: input shaped
  `output_shape`) describes all three; its `output_shape` is the transpose's input shape.

  Args:
    input_shape: the transpose's input shape (4 ints, data_format order).
    filter_shape: [height, width, output_channels / groups, in_channels].
    output_shape: the transpose's output shape, 4 ints (or 2: height and width).
    strides, padding, data_format, dilations, dtype, algorithm, workspace_limit, num_threads:
      as for `tf_largeconv.plan`.

  Returns:
    A `Plan`.

  Raises:
    ValueError: as `tf_largeconv.plan`, and shapes that do not fit together.
  """
  problem = ConvProblem.transpose(strides, padding, data_format, dilations, **options)
  x = [int(v) for v in input_shape]
  f = [int(v) for v in filter_shape]
  sizes = [int(v) for v in output_shape]
  if len(x) != 4 or len(f) != 4 or len(sizes) not in (2, 4):
    raise ValueError(
      "plan_transpose needs input_shape and filter_shape of 4 ints and an "
      f"output_shape of 4 (or 2), got {x}, {f} and {sizes}"
    )
  c_axis = problem.channel_axis
  if len(sizes) == 2:
    sizes = [x[0], f[2]] + sizes if c_axis == 1 else [x[0]] + sizes + [f[2]]
  if x[c_axis] != f[3] or sizes[0] != x[0]:
    raise ValueError(
      f"input_shape {x} does not fit filter_shape {f} and output_shape "
      f"{sizes}: the input depth must equal the filters' dimension 3 and the "
      "batches must be equal"
    )
  _check_spatial(x, f, sizes, problem, raised=lambda e: e)
  return _plan.plan_problem(problem.bind(sizes, f), dtype, num_threads)
