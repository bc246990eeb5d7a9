"""`tf_largeconv.conv2d_transpose`: tf.nn.conv2d_transpose's semantics on the LargeConv ops.

A transposed convolution is the input-gradient pass of the conv2d that maps a tensor of
`output_shape` to one of input's shape. As TensorFlow does, it runs that pass (the
LargeConv>Conv2DBackpropInput op, whose registered gradients give both of the transpose's
gradients to every order), after checks of its own that name the transpose's arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tf_largeconv import _args
from tf_largeconv import _loader
from tf_largeconv._options import takes_options
from tf_largeconv._passes import PerPass
from tf_largeconv._problem import ConvProblem
from tf_largeconv._types import Padding
from tf_largeconv._types import TensorLike
from tf_largeconv._types import Window
from tf_largeconv.ops import _conv2d
from tf_largeconv.ops import _portable2d
from tf_largeconv.ops import _routing
from tf_largeconv.ops import _transpose_shapes
from tf_largeconv.planning import device
from tf_largeconv.planning import routing

_CORE = _loader.core()


@takes_options
def conv2d_transpose(
  input: TensorLike,
  filters: TensorLike,
  output_shape: TensorLike,
  strides: Window,
  padding: Padding = "SAME",
  data_format: str | None = "NHWC",
  dilations: Window | None = None,
  name: str | None = None,
  **options: Any,
) -> tf.Tensor:
  """The transpose of `conv2d`, with tf.nn.conv2d_transpose's semantics.

  Same arguments and result as `tf.nn.conv2d_transpose`: the gradient of `conv2d` (input
  shaped `output_shape`, these filters, strides, padding and dilations) with respect to its
  input, for the output gradient `input`. Unlike TF's CPU kernels, NCHW and dilations work
  on the CPU too (strides and dilations together as well), and the convolution is grouped
  when output_shape's depth is a multiple of the filters' dimension 2.

  Args:
    input: 4-D tensor (float16, bfloat16, float32, float64 or int32), [batch, height, width,
      in_channels] (NHWC) or [batch, in_channels, height, width] (NCHW). As
      tf.nn.conv2d_transpose, no extra leading batch dimensions.
    filters: tensor of the same dtype, [height, width, output_channels / groups,
      in_channels]: its dimension 3 must equal input's depth.
    output_shape: 1-D int32 (or int64) tensor or list: the result's shape, 4 sizes in
      data_format order, or 2 (height and width: the batch from input, the depth from the
      filters' dimension 2), as tf.nn.conv2d_transpose accepts. Its known entries set the
      result's static shape; a partly known one (e.g. `tf.stack([tf.shape(x)[0], 64, 64,
      8])`) leaves only its unknown entries unknown.
    strides: int or list of 1, 2 or 4 ints (4 in data_format order).
    padding: 'SAME' (default), 'VALID', or four [before, after] pairs in data_format order:
      the padding of the conv2d this transposes.
    data_format: 'NHWC' (default) or 'NCHW'.
    dilations: int or list of 1, 2 or 4 ints; default 1.
    name: optional name for the operation.
    algorithm: as for `conv2d`: 'auto' (the planner's choice per pass; where it prefers
      TensorFlow's kernel for the conv2d this transposes, as conv2d's 'auto' does, the
      whole transpose runs tf.nn.conv2d_transpose), 'direct', 'fft', 'portable' (stock TF
      ops; static shapes) or 'tf' (tf.nn.conv2d_transpose itself, where TensorFlow's
      kernels support the configuration). Gradients use the same setting.
    workspace_limit: bytes of temporary memory per pass; None means 64 MiB.

  Returns:
    A tensor of input's dtype, shaped `output_shape`.

  Raises:
    ValueError: malformed strides, dilations, padding, data_format, algorithm or
      workspace_limit; algorithm='fft' with int32; (while tracing a graph) shapes that do
      not fit together, naming input, filters or output_shape.
    TypeError: unsupported or mismatched dtypes, or a non-integer output_shape.
    tf.errors.InvalidArgumentError: shapes that do not fit together (eager execution, or
      at run time where they are known only then: the op's message then names
      output_shape `input_sizes` and input `out_backprop`, as TensorFlow's does).
  """
  problem = ConvProblem.transpose(strides, padding, data_format, dilations, **options)
  with tf.name_scope(name or "LargeConv2DTranspose"):
    input, filters, problem = _conv2d.operands(problem, input, filters)
    output_shape = _transpose_shapes.output_shape_tensor(output_shape)
    static = _transpose_shapes.check_shapes(input, filters, output_shape, problem)
    result = _run(input, filters, (output_shape, static), problem)
    result.set_shape(static)
    return result


def _run(
  input: tf.Tensor, filters: tf.Tensor, shape: tuple[tf.Tensor, list], problem: ConvProblem
) -> tf.Tensor:
  """The transpose of checked tensors by the problem's (resolved) algorithm; `shape`:
  output_shape as a tensor and its static value (None where unknown)."""
  output_shape, static = shape

  def ours(x: tf.Tensor = input, w: tf.Tensor = filters) -> tf.Tensor:
    return _conv2d.backprop_input(output_shape, w, x, problem)

  if problem.algorithm == "tf":
    return _tf_kernel(input, filters, output_shape, static, problem)
  if problem.algorithm == _args.PORTABLE:
    return _portable(input, filters, output_shape, problem)
  if problem.algorithm == "auto":
    # As conv2d: each pass runs TensorFlow's kernel where the planner prefers it for that
    # pass of the conv2d this transposes (whose backprop_input pass is this forward one,
    # and whose input, by its batch, is this result), the op otherwise.
    schedule = routing.schedule(static, _routing.known_shape(filters), input.dtype, input, problem)
    if any(any(routes) for _, routes in schedule):
      return _routed_passes(input, filters, ours, schedule, output_shape, static, problem)
  return ours()


def _routed_passes(
  input: tf.Tensor,
  filters: tf.Tensor,
  ours: Callable[..., tf.Tensor],
  schedule: Sequence[tuple[int, PerPass]],
  output_shape: tf.Tensor,
  static: list[int | None],
  problem: ConvProblem,
) -> tf.Tensor:
  """The transpose with its passes routed as conv2d's are (`schedule`: the routes, forward,
  backprop_input, backprop_filter of the transposed conv2d, by batch, as `_routing.by_batch`
  takes them): this forward pass is that conv2d's backprop_input pass, the input's gradient
  its forward pass, the filter's its backprop_filter pass. `ours(x, w)` is the op's
  forward pass."""

  def forward(x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
    return _routing.by_batch(
      x,
      schedule,
      lambda routes: (
        _tf_kernel(x, w, output_shape, static, problem) if routes.backprop_input else ours(x, w)
      ),
    )

  if all(all(routes) for _, routes in schedule):  # TensorFlow's kernel and its own gradients
    return forward(input, filters)
  key = problem.unbound()
  op_problem = key.replace(algorithm="auto")  # the op's own choice between its algorithms
  if tf.executing_eagerly() and not device.runs_on_gpu(input):
    # As conv2d's eager routes: the gradient is the route op's, which costs an eager call
    # a fraction of tf.custom_gradient's.
    return _routing.route_op(forward(input, filters), input, filters, schedule, key, transpose=True)

  @tf.custom_gradient
  def run(x: tf.Tensor, w: tf.Tensor) -> tuple[tf.Tensor, Callable[..., Any]]:
    def grad(dy: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
      dx = _routing.by_batch(
        x, schedule, lambda routes: routed_input_gradient(x, w, dy, routes, op_problem)
      )
      dw = _routing.by_batch(
        x, schedule, lambda routes: routed_filter_gradient(x, w, dy, routes, op_problem)
      )
      return dx, dw

    return forward(x, w), grad

  return run(input, filters)


def routed_input_gradient(
  x: tf.Tensor, w: tf.Tensor, dy: tf.Tensor, routes: PerPass, problem: ConvProblem
) -> tf.Tensor:
  """The transpose's gradient with respect to its input x: the conv2d it transposes, of
  dy, by TensorFlow's kernel where routes.forward (that conv2d's forward pass) holds,
  otherwise by the op with the problem's algorithm (`routes` and `problem` of that
  conv2d, as _routing.routed_input_gradient takes them)."""
  if routes.forward:
    return tf.raw_ops.Conv2D(input=dy, filter=w, **_routing.tf_attrs(problem))
  return _loader.ops().large_conv_conv2d(dy, w, **problem.attrs())


def routed_filter_gradient(
  x: tf.Tensor, w: tf.Tensor, dy: tf.Tensor, routes: PerPass, problem: ConvProblem
) -> tf.Tensor:
  """The transpose's gradient with respect to its filter w: the backprop_filter pass of the
  conv2d it transposes, for that conv2d's input dy and output gradient x."""
  if routes.backprop_filter:
    return tf.raw_ops.Conv2DBackpropFilter(
      input=dy, filter_sizes=tf.shape(w), out_backprop=x, **_routing.tf_attrs(problem)
    )
  return _loader.ops().large_conv_conv2d_backprop_filter(dy, tf.shape(w), x, **problem.attrs())


def _tf_kernel(
  input: tf.Tensor,
  filters: tf.Tensor,
  output_shape: tf.Tensor,
  static: list[int | None],
  problem: ConvProblem,
) -> tf.Tensor:
  """tf.nn.conv2d_transpose, for algorithm='tf': under XLA or without the op library
  always (XLA compiles it in every layout), otherwise where TensorFlow's kernels on the
  device support the configuration."""
  if not (_args.in_xla_context() or _loader.failure() is not None):
    if not routing.tf_kernel_runs(
      static, _routing.known_shape(filters), input.dtype, input, problem
    ):
      raise ValueError(
        "algorithm='tf' runs tf.nn.conv2d_transpose, which needs what TensorFlow's "
        "kernels support: a static output_shape (the batch may be unknown), no groups, "
        "and on the CPU NHWC, dilations 1 and float32/float64 (on a GPU "
        f"float16/bfloat16/float32); got output_shape {static}, filters shape "
        f"{filters.shape}, data_format={problem.data_format!r}, "
        f"dilations={list(problem.dilations)}, dtype {input.dtype.name}"
      )
  return tf.nn.conv2d_transpose(input, filters, output_shape, **problem.tf_kwargs())


def _portable(
  input: tf.Tensor, filters: tf.Tensor, output_shape: tf.Tensor, problem: ConvProblem
) -> tf.Tensor:
  """The portable path (stock TF ops), with the transpose's two gradients as portable
  passes of their own. The forward pass is a tf.GradientTape gradient of the portable
  conv2d (a loop over the images where the batch is unknown); differentiating it would take
  a gradient of that loop's gradient, which XLA cannot (Keras fit under jit_compile)."""
  value = tf.get_static_value(output_shape)
  sizes = output_shape if value is None else tf.constant([int(v) for v in value], tf.int32)

  def forward(x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
    return _portable2d.backprop_input(sizes, w, x, problem)

  if not tf.executing_eagerly():
    # Traced as a function of its own: an enclosing tape then records one call, not the
    # inner tape's gradient of that loop (which XLA cannot build for a watched loop).
    forward = tf.function(forward, autograph=False)

  @tf.custom_gradient
  def run(x: tf.Tensor, w: tf.Tensor) -> tuple[tf.Tensor, Callable[..., Any]]:
    def grad(dy: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
      w_shape = tf.constant(w.shape.as_list(), tf.int32)
      return (
        _conv2d.run(dy, w, problem),
        _portable2d.backprop_filter(dy, w_shape, x, problem),
      )

    return forward(x, w), grad

  return run(input, filters)
