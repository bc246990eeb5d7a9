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
from tf_largeconv._passes import PerPass
from tf_largeconv._types import DTypeLike
from tf_largeconv._types import Padding
from tf_largeconv._types import ShapeLike
from tf_largeconv._types import TensorLike
from tf_largeconv._types import Window
from tf_largeconv.ops import _conv2d
from tf_largeconv.ops import _portable2d
from tf_largeconv.ops import _routing
from tf_largeconv.planning import _plan
from tf_largeconv.planning import device
from tf_largeconv.planning import routing
from tf_largeconv.planning.types import Plan

_CORE = _loader.core()


def conv2d_transpose(input: TensorLike, filters: TensorLike, output_shape: TensorLike,
                     strides: Window, padding: Padding = "SAME",
                     data_format: str | None = "NHWC", dilations: Window | None = None,
                     name: str | None = None, algorithm: str | None = "auto",
                     workspace_limit: int | None = None) -> tf.Tensor:
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
  attrs = _args.conv_attrs(strides, padding, data_format, dilations, algorithm,
                           workspace_limit)
  with tf.name_scope(name or "LargeConv2DTranspose"):
    input, filters = _args.as_tensors(input, filters)
    _args.check_algorithm(attrs["algorithm"], input.dtype)
    output_shape = _output_shape_tensor(output_shape)
    static = _check_shapes(input, filters, output_shape, attrs)
    resolved = _args.resolve_algorithm(attrs["algorithm"])

    def ours(x: tf.Tensor = input, w: tf.Tensor = filters) -> tf.Tensor:
      return _conv2d.conv2d_backprop_input(
          output_shape, w, x, attrs["strides"], padding, data_format=attrs["data_format"],
          dilations=attrs["dilations"], algorithm=attrs["algorithm"],
          workspace_limit=workspace_limit)

    if resolved == "tf":
      result = _tf_kernel(input, filters, output_shape, static, attrs)
    elif resolved == _args.PORTABLE:
      result = _portable(input, filters, output_shape, padding, attrs, workspace_limit)
    elif resolved == "auto":
      # As conv2d: each pass runs TensorFlow's kernel where the planner prefers it for that
      # pass of the conv2d this transposes (whose backprop_input pass is this forward one,
      # and whose input, by its batch, is this result), the op otherwise.
      schedule = routing.schedule(static, _routing.known_shape(filters), input.dtype, input,
                                  attrs)
      if any(any(routes) for _, routes in schedule):
        result = _routed_passes(input, filters, ours, schedule, output_shape, static, attrs)
      else:
        result = ours()
    else:
      result = ours()
    result.set_shape(static)
    return result


def _routed_passes(input: tf.Tensor, filters: tf.Tensor, ours: Callable[..., tf.Tensor],
                   schedule: Sequence[tuple[int, PerPass]], output_shape: tf.Tensor,
                   static: list[int | None], attrs: dict[str, Any]) -> tf.Tensor:
  """The transpose with its passes routed as conv2d's are (`schedule`: the routes, forward,
  backprop_input, backprop_filter of the transposed conv2d, by batch, as `_routing.by_batch`
  takes them): this forward pass is that conv2d's backprop_input pass, the input's gradient
  its forward pass, the filter's its backprop_filter pass. `ours(x, w)` is the op's
  forward pass."""
  def forward(x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
    return _routing.by_batch(x, schedule, lambda routes: (
        _tf_kernel(x, w, output_shape, static, attrs) if routes.backprop_input
        else ours(x, w)))

  if all(all(routes) for _, routes in schedule):  # TensorFlow's kernel and its own gradients
    return forward(input, filters)
  op_attrs = dict(attrs, algorithm="auto")  # the op's own choice between its algorithms
  if tf.executing_eagerly() and not device.runs_on_gpu(input):
    # As conv2d's eager routes: the gradient is the route op's, which costs an eager call
    # a fraction of tf.custom_gradient's.
    return _routing.route_op(forward(input, filters), input, filters, schedule,
                             _args.attrs_key(attrs), transpose=True)

  @tf.custom_gradient
  def run(x: tf.Tensor, w: tf.Tensor) -> tuple[tf.Tensor, Callable[..., Any]]:
    def grad(dy: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
      dx = _routing.by_batch(x, schedule,
                             lambda routes: routed_input_gradient(x, w, dy, routes, op_attrs))
      dw = _routing.by_batch(x, schedule,
                             lambda routes: routed_filter_gradient(x, w, dy, routes, op_attrs))
      return dx, dw

    return forward(x, w), grad

  return run(input, filters)


def routed_input_gradient(x: tf.Tensor, w: tf.Tensor, dy: tf.Tensor, routes: PerPass,
                          attrs: dict[str, Any]) -> tf.Tensor:
  """The transpose's gradient with respect to its input x: the conv2d it transposes, of
  dy, by TensorFlow's kernel where routes.forward (that conv2d's forward pass) holds,
  otherwise by the op with attrs' algorithm (`routes` and `attrs` of that conv2d, as
  _routing.routed_input_gradient takes them)."""
  if routes.forward:
    return tf.raw_ops.Conv2D(input=dy, filter=w, **_routing.tf_attrs(attrs))
  return _loader.ops().large_conv_conv2d(dy, w, **attrs)


def routed_filter_gradient(x: tf.Tensor, w: tf.Tensor, dy: tf.Tensor, routes: PerPass,
                           attrs: dict[str, Any]) -> tf.Tensor:
  """The transpose's gradient with respect to its filter w: the backprop_filter pass of the
  conv2d it transposes, for that conv2d's input dy and output gradient x."""
  if routes.backprop_filter:
    return tf.raw_ops.Conv2DBackpropFilter(input=dy, filter_sizes=tf.shape(w), out_backprop=x,
                                           **_routing.tf_attrs(attrs))
  return _loader.ops().large_conv_conv2d_backprop_filter(dy, tf.shape(w), x, **attrs)


def _tf_kernel(input: tf.Tensor, filters: tf.Tensor, output_shape: tf.Tensor,
               static: list[int | None], attrs: dict[str, Any]) -> tf.Tensor:
  """tf.nn.conv2d_transpose, for algorithm='tf': under XLA or without the op library
  always (XLA compiles it in every layout), otherwise where TensorFlow's kernels on the
  device support the configuration."""
  if not (_args.in_xla_context() or _loader.failure() is not None):
    if not routing.tf_kernel_runs(static, _routing.known_shape(filters), input.dtype, input,
                                  attrs):
      raise ValueError(
          "algorithm='tf' runs tf.nn.conv2d_transpose, which needs what TensorFlow's "
          "kernels support: a static output_shape (the batch may be unknown), no groups, "
          "and on the CPU NHWC, dilations 1 and float32/float64 (on a GPU "
          f"float16/bfloat16/float32); got output_shape {static}, filters shape "
          f"{filters.shape}, data_format={attrs['data_format']!r}, "
          f"dilations={attrs['dilations']}, dtype {input.dtype.name}")
  padding = _routing.tf_padding(attrs)
  return tf.nn.conv2d_transpose(input, filters, output_shape, attrs["strides"], padding,
                                data_format=attrs["data_format"],
                                dilations=attrs["dilations"])


def _portable(input: tf.Tensor, filters: tf.Tensor, output_shape: tf.Tensor,
              padding: Padding, attrs: dict[str, Any],
              workspace_limit: int | None) -> tf.Tensor:
  """The portable path (stock TF ops), with the transpose's two gradients as portable
  passes of their own. The forward pass is a tf.GradientTape gradient of the portable
  conv2d (a loop over the images where the batch is unknown); differentiating it would take
  a gradient of that loop's gradient, which XLA cannot (Keras fit under jit_compile)."""
  kwargs = dict(strides=attrs["strides"], padding=padding, data_format=attrs["data_format"],
                dilations=attrs["dilations"], algorithm=_args.PORTABLE,
                workspace_limit=workspace_limit)

  value = tf.get_static_value(output_shape)
  sizes = output_shape if value is None else [int(v) for v in value]

  def forward(x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
    return _conv2d.conv2d_backprop_input(sizes, w, x, **kwargs)

  if not tf.executing_eagerly():
    # Traced as a function of its own: an enclosing tape then records one call, not the
    # inner tape's gradient of that loop (which XLA cannot build for a watched loop).
    forward = tf.function(forward, autograph=False)

  @tf.custom_gradient
  def run(x: tf.Tensor, w: tf.Tensor) -> tuple[tf.Tensor, Callable[..., Any]]:
    def grad(dy: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
      return (_conv2d.conv2d(dy, w, **kwargs),
              _conv2d.conv2d_backprop_filter(dy, w.shape.as_list(), x, **kwargs))

    return forward(x, w), grad

  return run(input, filters)


def _output_shape_tensor(output_shape: TensorLike) -> tf.Tensor:
  """output_shape as an int32 tensor (ints, or an integer tensor)."""
  if isinstance(output_shape, (tf.Tensor, tf.Variable)) and output_shape.dtype != tf.int32:
    if not output_shape.dtype.is_integer:
      raise TypeError("output_shape must be a 1-D tensor of ints, got dtype "
                      f"{output_shape.dtype.name}")
    return tf.cast(output_shape, tf.int32, name="output_shape")
  try:
    return tf.convert_to_tensor(output_shape, dtype=tf.int32, name="output_shape")
  except (TypeError, ValueError) as e:
    raise TypeError(f"output_shape must be a 1-D tensor or list of ints, got "
                    f"output_shape={output_shape!r} ({e})") from None


def _shape_error(message: str) -> Exception:
  """A shape mismatch, raised as TensorFlow raises it: InvalidArgumentError when eager,
  ValueError while tracing."""
  return _portable2d.op_error(ValueError(message))


def _check_shapes(input: tf.Tensor, filters: tf.Tensor, output_shape: tf.Tensor,
                  attrs: dict[str, Any]) -> list[int | None]:
  """Checks what is known of the three shapes; returns the result's static shape (a list,
  None where unknown)."""
  fmt = attrs["data_format"]
  c_axis = _args.channel_index(fmt)
  hw = (2, 3) if fmt == "NCHW" else (1, 2)
  for what, shape, form in (("input", input.shape, "[batch, height, width, in_channels] "
                             "(NHWC) or [batch, in_channels, height, width] (NCHW)"),
                            ("filters", filters.shape,
                             "[height, width, output_channels, in_channels]")):
    if shape.rank is not None and shape.rank != 4:
      raise _shape_error(f"{what} must be 4-D {form}, got shape {shape}. {what} must be "
                         f"4-dimensional. Shape must be rank 4 but is rank {shape.rank}")
  x = input.shape.as_list() if input.shape.rank is not None else [None] * 4
  f = filters.shape.as_list() if filters.shape.rank is not None else [None] * 4
  if x[c_axis] is not None and f[3] is not None and x[c_axis] != f[3]:
    raise _shape_error(
        f"filters dimension 3 (in_channels) {f[3]} must equal the input depth {x[c_axis]}: "
        f"input channels does not match filter's input channels, {x[c_axis]} != {f[3]}")
  if output_shape.shape.rank is not None and (
      output_shape.shape.rank != 1 or output_shape.shape[0] not in (None, 2, 4)):
    raise _shape_error(
        "output_shape must be a vector of 4 sizes in data_format order (or 2: height and "
        f"width), got shape {output_shape.shape}. Conv2DBackpropInput requires input_sizes "
        "to contain 4 values or 2 values")
  value = tf.get_static_value(output_shape, partial=True)
  out: list[int | None]
  if value is None or value.ndim != 1:
    out = [None] * 4
  else:
    sizes = [None if v is None else int(v) for v in value]
    for v in sizes:
      if v is not None and v < 0:
        raise _shape_error(f"output_shape must be non-negative, got {sizes}. Conv2DBackprop"
                           "Input: elements of input_sizes must be >= 0")
    if len(sizes) == 2:
      out = [None] * 4
      out[hw[0]], out[hw[1]] = sizes
      out[c_axis] = f[2]
    else:
      out = sizes
  if out[0] is None:
    out[0] = x[0]
  elif x[0] is not None and out[0] != x[0]:
    raise _shape_error(f"output_shape's batch {out[0]} must equal the input's batch {x[0]} "
                       f"(output_shape {out}, input shape {x})")
  depth = out[c_axis]
  if depth is not None and f[2] is not None and (
      (f[2] == 0 and depth != 0) or (f[2] > 0 and depth % f[2] != 0)):
    raise _shape_error(
        f"output_shape's depth {depth} must be a multiple of the filters' dimension 2 "
        f"(output_channels) {f[2]}: output_shape does not match filter's output channels, "
        f"{depth} != {f[2]}")
  _check_spatial(x, f, out, attrs)
  return out


def _check_spatial(x: Sequence[int | None], f: Sequence[int | None],
                   out: Sequence[int | None], attrs: dict[str, Any],
                   raised: Callable[[Exception], Exception] = _portable2d.op_error) -> None:
  """Where they are all known, checks that the conv2d of an output_shape tensor gives
  input's height and width; `raised` turns the ValueError into the error raised."""
  fmt = attrs["data_format"]
  c_axis = _args.channel_index(fmt)
  hw = (2, 3) if fmt == "NCHW" else (1, 2)
  if None in f or any(out[i] is None or x[i] is None for i in hw):
    return
  conv_input = list(out)
  conv_input[0] = 1
  if conv_input[c_axis] is None:
    conv_input[c_axis] = f[2]
  try:
    want = _CORE.geometry(conv_input, f, attrs["strides"], attrs["padding"],
                          attrs["explicit_paddings"], fmt, attrs["dilations"])["output_shape"]
  except (ValueError, NotImplementedError) as e:
    raise raised(type(e)(f"for output_shape {out} and filters {f}: {e}")) from None
  if any(want[i] != x[i] for i in hw):
    raise raised(ValueError(
        f"output_shape {out} does not fit the input's shape {x}: the conv2d that this "
        f"transposes maps a tensor of output_shape to height {want[hw[0]]} and width "
        f"{want[hw[1]]}, so input must have them. Size of out_backprop doesn't match "
        "computed"))


def plan_transpose(input_shape: ShapeLike, filter_shape: ShapeLike, output_shape: ShapeLike,
                   strides: Window, padding: Padding = "SAME", data_format: str | None = "NHWC",
                   dilations: Window | None = None, dtype: DTypeLike = tf.float32,
                   algorithm: str | None = "auto", workspace_limit: int | None = None,
                   num_threads: int | None = None) -> Plan:
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
  attrs = _args.conv_attrs(strides, padding, data_format, dilations, algorithm,
                           workspace_limit)
  x = [int(v) for v in input_shape]
  f = [int(v) for v in filter_shape]
  sizes = [int(v) for v in output_shape]
  if len(x) != 4 or len(f) != 4 or len(sizes) not in (2, 4):
    raise ValueError("plan_transpose needs input_shape and filter_shape of 4 ints and an "
                     f"output_shape of 4 (or 2), got {x}, {f} and {sizes}")
  c_axis = _args.channel_index(attrs["data_format"])
  if len(sizes) == 2:
    sizes = ([x[0], f[2]] + sizes if c_axis == 1 else [x[0]] + sizes + [f[2]])
  if x[c_axis] != f[3] or sizes[0] != x[0]:
    raise ValueError(f"input_shape {x} does not fit filter_shape {f} and output_shape "
                     f"{sizes}: the input depth must equal the filters' dimension 3 and the "
                     "batches must be equal")
  _check_spatial(x, f, sizes, attrs, raised=lambda e: e)
  return _plan.plan_from_attrs(sizes, f, attrs, dtype, num_threads)
