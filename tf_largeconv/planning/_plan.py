"""`tf_largeconv.plan`: what the op will do for given shapes, before running it.

The numbers come from the same C++ planner the kernels call, so `workspace_bytes` is
exactly the temporary memory each pass takes (through TensorFlow's allocator). The same
planner decides which passes of `conv2d` run TensorFlow's own kernel instead of the op
(`routing`).
"""

from __future__ import annotations

import math
from typing import Any

import tensorflow as tf

from tf_largeconv import _args
from tf_largeconv import _loader
from tf_largeconv._options import takes_options
from tf_largeconv._passes import PerPass
from tf_largeconv._problem import ConvProblem
from tf_largeconv._types import DTypeLike
from tf_largeconv._types import Padding
from tf_largeconv._types import ShapeLike
from tf_largeconv._types import Window
from tf_largeconv.planning import _plan3d
from tf_largeconv.planning import device
from tf_largeconv.planning import routing
from tf_largeconv.planning.types import PassPlan
from tf_largeconv.planning.types import Plan

_CORE = _loader.core()


@takes_options
def plan(
  input_shape: ShapeLike,
  filter_shape: ShapeLike,
  strides: Window,
  padding: Padding,
  data_format: str | None = "NHWC",
  dilations: Window | None = None,
  dtype: DTypeLike = tf.float32,
  *,
  num_threads: int | None = None,
  **options: Any,
) -> Plan:
  """Plans a convolution without running it.

  Args:
    input_shape: the input's shape in data_format order: 4 ints, or more where the input
      has extra leading batch dimensions (planned as one batch of their product).
    filter_shape: the filter's shape [height, width, in_channels / groups, out_channels].
    strides, padding, data_format, dilations, algorithm, workspace_limit: as for
      `tf_largeconv.conv2d`. A pass planned as 'tf' runs TensorFlow's own kernel (chosen
      for small filters where it is faster; its temporary memory is TensorFlow's, shown as
      an estimate that must fit the limit).
    dtype: the tensors' dtype (float16/bfloat16/float32 compute in float32; int32 is summed
      exactly, by the direct kernels only).
    num_threads: threads to plan for; default: TensorFlow's intra-op thread count.

  A 3-D convolution (`tf_largeconv.conv3d`) is planned by `tf_largeconv.plan_conv3d`,
  which this calls when filter_shape has 5 entries ([depth, height, width, in_channels /
  groups, out_channels]; a 5-D input_shape with a 4-entry filter_shape is a 2-D
  convolution with two batch dimensions, as above): input_shape then has 5 entries,
  strides and dilations 5, and data_format is 'NDHWC' or 'NCDHW' (the 2-D names stand for
  the 3-D layout with the channels in the same place, as in tf.nn.convolution: the default
  'NHWC' means 'NDHWC').

  A transposed convolution (`tf_largeconv.conv2d_transpose`) is planned by
  `tf_largeconv.plan_transpose`: the plan of the conv2d it transposes, whose
  backprop_input pass is the transpose's forward pass.

  Returns:
    A `Plan`; its output_shape keeps the input's batch dimensions.

  Raises:
    ValueError: malformed arguments, shapes that do not fit, algorithm='fft' with int32,
      algorithm='portable' (which runs stock TF ops, not the planned ops), or
      a workspace_limit that even the smallest FFT plan exceeds when algorithm='fft' (the
      message gives the minimum).
  """
  if _rank(filter_shape) == 5:
    # plan_conv3d checks that these have its forms (narrower than plan's types).
    plan3d: Any = _plan3d.plan_conv3d
    return plan3d(
      input_shape,
      filter_shape,
      strides,
      padding,
      _FORMATS_3D.get(data_format or "", data_format),
      dilations,
      dtype,
      num_threads=num_threads,
      **options,
    )
  problem = ConvProblem.conv2d(strides, padding, data_format, dilations, **options)
  return plan_problem(problem.bind(input_shape, filter_shape), dtype, num_threads)


# plan()'s 2-D data_format names for a 3-D convolution: the channels in the same place.
_FORMATS_3D = {"NHWC": "NDHWC", "NCHW": "NCDHW"}


def _rank(shape: Any) -> int | None:
  """The number of entries of a shape given as a list, tuple, array or TensorShape (None
  where it has no length)."""
  try:
    return len(shape)
  except (TypeError, ValueError):
    return None


def plan_problem(
  problem: ConvProblem, dtype: DTypeLike = tf.float32, num_threads: int | None = None
) -> Plan:
  """`plan` of a 2-D ConvProblem bound to its shapes (the input's may have extra leading
  batch dimensions, planned as one batch of their product)."""
  if problem.algorithm == _args.PORTABLE:
    raise ValueError(
      "algorithm='portable' runs stock TensorFlow ops, not the LargeConv ops "
      "that plan() describes; plan with algorithm='auto', 'direct', 'fft' or "
      "'tf'"
    )
  dtype = _args.normalize_dtype(dtype)
  threads = int(num_threads) if num_threads else device.intra_op_threads()
  x, f = problem.shapes()
  if None in x or None in f:
    raise ValueError(
      f"plan needs known shapes, got input_shape {list(x)} and filter_shape {list(f)}"
    )
  input_shape, filter_shape = [v for v in x if v is not None], [v for v in f if v is not None]
  batch_shape = input_shape[:-3] if len(input_shape) > 4 else input_shape[:1]
  if len(input_shape) > 4:  # extra batch dimensions, merged as conv2d merges them
    input_shape = [math.prod(batch_shape)] + input_shape[-3:]
    problem = problem.replace(input_shape=tuple(input_shape))
  geometry = problem.geometry()
  kwargs = dict(num_threads=threads, dtype=dtype.name)
  # Each pass runs TensorFlow's kernel or the op's, whichever the planner prices lower
  # (TF's backprop kernels are far slower than its forward one with few channels, where the
  # op's FFT passes win), as the CPU schedule has it for this batch.
  routes = PerPass.every(problem.algorithm == "tf")
  eligible = routing.tf_kernel_eligible(input_shape, filter_shape, problem, dtype)
  if problem.algorithm == "auto" and eligible:
    routes = routing.at_batch(
      routing.planned_schedule(
        tuple(input_shape[1:]), tuple(filter_shape), problem.unbound(), dtype.name, threads
      ),
      input_shape[0],
    )
  theirs = ours = None
  if any(routes) or eligible:  # raises where 'tf' was asked for and TF's kernels cannot
    theirs = problem.plan(algorithm="tf", allow_tf=eligible, **kwargs)
  if not all(routes):
    ours = problem.plan(allow_tf=False, **kwargs)
    for mine, tfs in zip(ours, theirs or ()):  # what TF's kernel costs, for the table
      mine["cost_tf"] = tfs["cost_tf"]
  passes = [t if r else o for r, t, o in zip(routes, theirs or routes, ours or routes)]
  output_shape = batch_shape + list(geometry["output_shape"][1:])
  return Plan(
    [PassPlan(d) for d in passes], output_shape, problem.workspace_bound, threads, _loader.failure()
  )
